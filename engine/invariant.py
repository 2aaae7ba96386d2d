"""Row-invariant arithmetic: a position's logits do not depend on how many positions one forward computes.

Speculative decoding is exact only if the target's verdict on a position is the same whether a forward
computes that position alone (plain decoding: one token per forward) or among a draft of k tokens
(verification). In exact arithmetic it is; in bf16 on a CPU it was not: kernels are chosen by the shape of
the call and sum in another order, and a near-tie between the two best tokens flips now and then (measured
on Qwen2.5-Coder-0.5B, 2 cores, torch 2.13: logits differ by up to 0.3 between a 1-token and a 16-token
forward; 1 whole-file rewrite in 30, 3 polyglot edits in 10 and 5 docstrings in 10 came out different).
Thinking Machines' "Defeating Nondeterminism in LLM Inference" (2025) calls this batch invariance.

What varies, measured on this CPU (oneDNN bf16 kernels, 1 and 2 threads):
- a linear layer: a 1-row product differs from the same row in a product of 2 or more rows; products of
  2..200 rows agree row for row. So a 1-token forward runs as 2 rows (`LoadedModel.forward`).
- attention (`scaled_dot_product_attention`'s CPU flash kernel): a row's result depends on the length of
  the keys it is given (masked or not) and on the rows beside it: calls of 1, of 2-3 and of 4 or more query
  rows give three different answers, and the kernel works through the queries in blocks of 32 rows.

`invariant_attention` therefore computes every query at position p against the keys of positions
0 .. `_kv_length(p)` - 1, a length that depends on p alone (p + 1 rounded up to `KV_BUCKET`; the keys past
the cache are zeros, masked), in calls of 4 to 32 query rows (a short call repeats its last row). The
prefill (a forward on an empty cache) is the same forward for every method and keeps transformers' own
attention. On CUDA none of this holds as such (cuBLAS picks kernels by shape too, differently): `install`
leaves other devices alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "specedit_row_invariant"

KV_BUCKET = 64  # keys are padded to a multiple of this: at most 63 wasted key positions per query
MIN_QUERY_ROWS = 4  # calls of 1 and of 2-3 query rows take other code paths in the kernel
MAX_QUERY_ROWS = 32  # the kernel's query block below 192 rows; a call of 33 ends with a 1-row block


def install(model: Any) -> bool:
    """Make `model` (a transformers model on the CPU) compute attention row-invariantly.

    Returns False, changing nothing, where it does not apply: a model off the CPU, or one whose attention
    does not go through transformers' attention interface (then its logits may differ between plain and
    speculative decoding in low precision, as they did before).
    """
    if model.device.type != "cpu" or not model._can_set_attn_implementation():
        return False
    AttentionInterface.register(ATTENTION_NAME, invariant_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the prefill's mask, as for "sdpa"
    model.set_attn_implementation(ATTENTION_NAME)
    return True


@contextmanager
def transformers_attention(model: Any) -> Iterator[None]:
    """transformers' own SDPA attention while inside: for a peer's baseline (`specedit bench`)."""
    if model.config._attn_implementation != ATTENTION_NAME:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(ATTENTION_NAME)


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (1, H, q, D): the last q positions of the sequence
    key: torch.Tensor,  # (1, H_kv, kv, D): the cache and the new positions
    value: torch.Tensor,  # (1, H_kv, kv, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ((1, q, H, D), None). Causal, one sequence."""
    q_length, kv_length = query.shape[2], key.shape[2]
    if q_length == kv_length or query.shape[0] != 1 or dropout or kwargs.get("sliding_window"):
        # The prefill, or what the row-invariant path does not cover: transformers' SDPA path.
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    first = kv_length - q_length  # position of the first query
    outputs = []
    for start, stop in _query_calls(first, kv_length):
        keys = _kv_length(stop - 1)
        rows = list(range(start, stop)) + [stop - 1] * (MIN_QUERY_ROWS - (stop - start))
        positions = torch.tensor(rows, device=query.device)
        mask = torch.arange(keys, device=query.device) <= positions[:, None]  # (rows, keys)
        output = F.scaled_dot_product_attention(
            query[:, :, positions - first],
            _fit(key, keys),
            _fit(value, keys),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        outputs.append(output[:, :, : stop - start])
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _kv_length(position: int) -> int:
    """The number of keys a query at `position` attends over: position + 1 rounded up to KV_BUCKET."""
    return (position // KV_BUCKET + 1) * KV_BUCKET


def _query_calls(first: int, end: int) -> list[tuple[int, int]]:
    """Positions first..end-1 split into calls [start, stop): one key length each, at most 32 rows.

    >>> _query_calls(60, 70)  # positions 60-63 attend over 64 keys, 64-69 over 128
    [(60, 64), (64, 70)]
    >>> _query_calls(0, 33)  # 33 rows: two calls of 16 and 17 rows, none of 1
    [(0, 16), (16, 33)]
    """
    calls = []
    start = first
    while start < end:
        stop = min(end, _kv_length(start))  # the end of this key-length bucket
        pieces = -(-(stop - start) // MAX_QUERY_ROWS)
        calls += [
            (start + i * (stop - start) // pieces, start + (i + 1) * (stop - start) // pieces) for i in range(pieces)
        ]
        start = stop
    return calls


def _fit(states: torch.Tensor, length: int) -> torch.Tensor:
    """Keys or values cut or zero-padded to `length` positions (dim 2)."""
    have = states.shape[2]
    return states[:, :, :length] if have >= length else F.pad(states, (0, 0, 0, length - have))
