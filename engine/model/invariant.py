"""Row-invariant arithmetic: a position's logits do not depend on how many positions one forward computes.

Speculative decoding is exact only if the target's verdict on a position is the same whether a forward
computes it alone (plain decoding) or among a draft of k tokens (verification). On a CPU it is not by
default: kernels are chosen by the shape of the call and sum in another order, so a near-tie between the
two best tokens flips now and then. Thinking Machines' "Defeating Nondeterminism in LLM Inference" (2025)
calls this batch invariance. This module removes the three causes found: linear layers run on oneDNN's
prepacked weights (`PackedLinear`), rotary angles come from a table computed once (`install_rotary_table`),
and attention sees keys of a length that depends on the position alone, in calls of 4 to 32 query rows
(`invariant_attention`; in float32 specedit's own kernel, row-invariant by construction). Which linear
kernel holds, and whether a one-token step must run as two rows, is asked of the machine at load
(`model.exactness`). The kernels here are for the CPU only; docs/kernels.md has the measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F

from specedit.engine.model import kernels
from specedit.engine.model.linears import children, device_of, linear_bias, linear_weight, replace_modules

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Rotary = tuple[torch.Tensor, torch.Tensor]  # a position's cos and sin

ATTENTION_NAME = "specedit_row_invariant"

KV_BUCKET = 64  # keys are padded to a multiple of this: at most 63 wasted key positions per query
MIN_QUERY_ROWS = 4  # calls of 1 and of 2-3 query rows take other code paths in the kernel
MAX_QUERY_ROWS = 32  # the kernel's query block below 192 rows; a call of 33 ends with a 1-row block
# Heads narrower than this are zero-padded: with 8-wide heads the kernel's answer for a row changes with
# the call's row count even within a block; from 16 on, calls of 4..32 rows agree (only tiny models have
# such heads).
MIN_HEAD_DIM = 16


def install_attention(model: torch.nn.Module) -> bool:
    """Make `model` (a transformers model on the CPU) compute attention row-invariantly.

    Returns False, changing nothing, where it does not apply: a model off the CPU, or one whose attention
    does not go through transformers' attention interface.
    """
    own = getattr(model, "invariant_attention", False)  # `model.decoder`'s: always row-invariant
    if device_of(model).type != "cpu" or not (own or _transformers(model)._can_set_attn_implementation()):
        return False
    kernels.available()  # specedit's own products, where they build: row-invariant on every CPU
    if own:
        return True
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, invariant_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the prefill's mask, as for "sdpa"
    _transformers(model).set_attn_implementation(ATTENTION_NAME)
    return True


@runtime_checkable
class HasTwin(Protocol):
    """A model of specedit's own (`decoder.Decoder`), which makes transformers' class on its weights."""

    def transformers_twin(self) -> PreTrainedModel: ...


def _transformers(model: torch.nn.Module) -> PreTrainedModel:
    """A model that is not `model.decoder`'s: transformers' own (not imported here for the other)."""
    return cast("PreTrainedModel", model)


STATIC_ROPE_TYPES = ("default", "linear", "llama3")  # inverse frequencies that do not depend on the length


def install_rotary_table(model: torch.nn.Module) -> int:
    """Give each rotary embedding of `model` a table of every position's cos and sin, computed once, so
    that a position's angles do not depend on the forward (RoPE types whose frequencies change with the
    length are left alone). Returns how many were given one; `stock_kernels` takes them away for a while."""
    installed = 0
    for module in model.modules():
        inverse_frequencies = getattr(module, "inv_freq", None)
        if not (type(module).__name__.endswith("RotaryEmbedding") and isinstance(inverse_frequencies, torch.Tensor)):
            continue
        if getattr(module, "rope_type", "default") not in STATIC_ROPE_TYPES or "forward" in vars(module):
            continue
        positions = getattr(module, "max_seq_len_cached", 0) or _transformers(model).config.max_position_embeddings
        probe = torch.zeros(1, dtype=torch.float32, device=inverse_frequencies.device)
        with torch.no_grad():
            cos, sin = module.forward(probe, torch.arange(int(positions), device=probe.device)[None])  # (1, L, D) each
        vars(module)["forward"] = _table_forward(cos[0], sin[0])
        installed += 1
    return installed


def _table_forward(cos: torch.Tensor, sin: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], Rotary]:
    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> Rotary:
        return cos[position_ids].to(x.dtype), sin[position_ids].to(x.dtype)  # (B, T, D) each

    return forward


def remove_rotary_tables(model: torch.nn.Module) -> list[tuple[torch.nn.Module, object]]:
    """Take the tables away (transformers' own computation again); returns what to give back."""
    removed = []
    for module in model.modules():
        if "forward" in vars(module) and hasattr(module, "inv_freq"):
            removed.append((module, vars(module).pop("forward")))
    return removed


class PackedLinear(torch.nn.Module):
    """A linear layer on oneDNN's prepacked weights (`torch.ops.mkldnn`, the kernel Inductor's freezing
    uses on the CPU): the weights are reordered once into the kernel's blocked layout, so a forward of a
    few rows streams them once instead of packing them again on every call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:  # weight: (out, in)
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)  # opaque oneDNN layout
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        output: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return output

    def unpacked(self) -> torch.nn.Linear:
        """The plain `nn.Linear` with the same weights, bit for bit (a reorder only moves numbers)."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        linear.weight = torch.nn.Parameter(self.packed.to_dense(), requires_grad=False)
        if self.bias is not None:
            linear.bias = torch.nn.Parameter(self.bias.detach(), requires_grad=False)
        return linear.to(self.packed.dtype)


def can_pack(dtype: torch.dtype) -> bool:
    """True where oneDNN has a linear kernel for `dtype` on this CPU (float32; bf16 with AVX-512 or
    AVX-NE-CONVERT). float64 and float16 stay on ATen's kernels."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    try:
        PackedLinear(torch.ones(8, 8, dtype=dtype), None)(torch.ones(2, 8, dtype=dtype))
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, ..."
        return False
    return True


def pack_linears(model: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Replace every `nn.Linear` (and GPT-2's `Conv1D`, its transpose) of a CPU model by a `PackedLinear`,
    its weights converted to `dtype` on the way (a model loaded in the dtype it was stored in is upcast
    layer by layer: one copy of its weights in memory, not two; then `model.to(dtype)` for the rest).

    A weight shared with another module (an output layer tied to the embeddings) stays where it is, so
    that the embedding keeps it; any other original weight is freed. Returns how many were packed.
    """

    def packed(module: torch.nn.Module) -> PackedLinear | None:
        weight = linear_weight(module)
        if weight is None:
            return None
        bias = linear_bias(module)
        if dtype is not None and bias is not None:
            bias = torch.nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        return PackedLinear((weight if dtype is None else weight.to(dtype)).contiguous(), bias)

    return replace_modules(model, packed)


def unpack_linears(model: torch.nn.Module) -> int:
    """Undo `pack_linears` (a GPT-2 `Conv1D` comes back as the `nn.Linear` it is equal to)."""
    return replace_modules(model, lambda module: module.unpacked() if isinstance(module, PackedLinear) else None)


@contextmanager
def stock_kernels(model: torch.nn.Module) -> Iterator[PreTrainedModel]:
    """transformers' own attention and ATen's linear kernels while inside: the model as a user of
    transformers runs it, for a peer's baseline (`specedit bench`). Yields the model to run: `model`
    itself, or for a model of specedit's own (`model.decoder`), transformers' class on its weights. Its
    weights are materialised in the plain layout for the while (for the 0.5B model in float32: about 2 GB
    more, for a few milliseconds of reordering; int8 weights dequantized, as the int8 kernel computes them)."""
    from specedit.engine.model.quantized import QuantizedLinear

    kinds = (PackedLinear, QuantizedLinear)
    packed = {(parent, name): child for parent, name, child in children(model) if isinstance(child, kinds)}
    for (parent, name), child in packed.items():
        setattr(parent, name, child.unpacked())
    own = isinstance(model, HasTwin)
    attention = None if own else _transformers(model).config._attn_implementation
    if attention == ATTENTION_NAME:
        _transformers(model).set_attn_implementation("sdpa")
    tables = [] if own else remove_rotary_tables(model)
    try:
        yield model.transformers_twin() if isinstance(model, HasTwin) else _transformers(model)
    finally:
        for module, forward in tables:
            vars(module)["forward"] = forward
        if attention == ATTENTION_NAME:
            _transformers(model).set_attn_implementation(ATTENTION_NAME)
        for (parent, name), child in packed.items():
            setattr(parent, name, child)


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
    if query.shape[0] != 1 or dropout or kwargs.get("sliding_window"):
        # What the row-invariant path does not cover (batches, training, sliding windows): transformers' own.
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return attention(query, key, value, kv_length - q_length, scaling), None


def attention(
    query: torch.Tensor,  # (1, H, q, D): positions first .. first + q - 1
    key: torch.Tensor,  # (1, H_kv, kv, D): positions 0 .. first + q - 1 at least; any past them are zeros
    value: torch.Tensor,  # (1, H_kv, kv, D)
    first: int,
    scaling: float | None = None,
) -> torch.Tensor:
    """Causal attention of one sequence's queries, row-invariantly (module docstring): (1, q, H, D)."""
    q_length, head_dim = query.shape[2], query.shape[-1]
    scale = scaling if scaling is not None else head_dim**-0.5
    if query.dtype == torch.float32 and kernels.loaded():
        return _attention_on_own_kernels(query, key, value, first, scale)
    if head_dim < MIN_HEAD_DIM:  # zeros change no dot product; the extra output columns are dropped below
        query, key, value = (F.pad(states, (0, MIN_HEAD_DIM - head_dim)) for states in (query, key, value))
    outputs = []
    for start, stop in _query_calls(first, first + q_length):
        keys = _kv_length(stop - 1)
        rows = list(range(start, stop)) + [stop - 1] * (MIN_QUERY_ROWS - (stop - start))
        positions = torch.tensor(rows, device=query.device)
        mask = torch.arange(keys, device=query.device) <= positions[:, None]  # (rows, keys)
        output = F.scaled_dot_product_attention(
            query[:, :, positions - first],
            _fit(key, keys),
            _fit(value, keys),
            attn_mask=mask,
            scale=scale,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        outputs.append(output[:, :, : stop - start, :head_dim])
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def _attention_on_own_kernels(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, first: int, scale: float
) -> torch.Tensor:
    """The same attention on specedit's own kernel (`kernels.attention`), row-invariant by construction: a
    query's scores, softmax and weighted values run over the keys up to its own position, in their order,
    whatever the queries beside it. (1, H, q, D) queries -> (1, q, H, D)."""
    head_dim = query.shape[3]
    width = -(-head_dim // kernels.HEAD_WIDTHS) * kernels.HEAD_WIDTHS  # heads widened to whole vectors
    if width != head_dim:  # zeros change no dot product; the extra output columns are dropped
        query, key, value = (F.pad(states, (0, width - head_dim)) for states in (query, key, value))
    output = kernels.attention(query[0], key[0], value[0], first, scale)  # (q, H, width)
    return (output if width == head_dim else output[..., :head_dim].contiguous()).unsqueeze(0)


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
