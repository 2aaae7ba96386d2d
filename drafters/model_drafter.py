"""Drafting with a model, where the copy has nothing to propose: a small draft model, or the target itself
on a subset of its layers (self-speculation: Zhang et al. 2023, "Draft & Verify"; Elhoushi et al. 2024,
"LayerSkip").

Both draft one token per forward and stop at the first token the drafter is unsure of: its probability
below `p_min`. A long draft of unsure tokens costs forwards and is mostly rejected; a threshold near 0.5
removed that cost on every task of the project's seed measurements (docs/drafting.md).

- `ModelDrafter`: a second model with the target's tokenizer and its own KV cache. Before drafting it
  feeds the cache what was committed since it last drafted (its backlog: the whole prompt the first time,
  after a copy run a few hundred tokens, in one forward), so it always drafts from the full committed
  context. On a CPU that forward computes as many rows as it reads: the cost governor weighs it before
  asking (`loop.governor`).
- `LayerSkipDrafter`: the target with some layers left out, on the target's own cache: the kept layers
  read the keys and values the full model wrote for the committed tokens, so there is nothing to catch
  up and no second model in memory. The drafted positions are cropped away before the target verifies.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from specedit.drafters.base import NO_DRAFT, Draft
from specedit.engine.model import kv_cache
from specedit.engine.model.kv_cache import Cache
from specedit.engine.model.loading import LoadedModel
from specedit.engine.model.protocols import Tokenizer
from specedit.engine.model.sampling import DRAFT_STREAM, SamplingConfig, draw_token, target_probs
from specedit.engine.records.errors import ModelLoadError


@dataclass(frozen=True)
class ModelDraftConfig:
    """How far a model drafts. Built by keyword."""

    # Stop drafting at the first token whose probability is below this. 0.5: see the module docstring.
    p_min: float = 0.5
    # The longest draft. A drafted token costs a forward of the drafter; past 8 confident tokens the
    # chance that all hold is small, and the copy drafter covers the long runs.
    max_draft: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {self.p_min}")
        if self.max_draft < 1:
            raise ValueError("max_draft must be >= 1")


def draft_tokens(
    first_logits: torch.Tensor,
    next_logits: Callable[[int], torch.Tensor],
    *,
    k: int,
    config: ModelDraftConfig,
    sampling: SamplingConfig,
    position: int,
) -> Draft:
    """Draft up to `k` tokens from `first_logits` (V,), calling `next_logits(token)` for each next one.

    Greedy decoding drafts the argmax (a deterministic draft). Sampling draws from the drafter's own
    distribution, with the request's temperature and top-p, and returns it as `p_draft` for the
    verifier's min(1, p_target / p_draft) rule. Either way drafting stops before the first token whose
    probability is below `p_min`, and `next_logits` is not called for the last drafted token.
    """
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    logits = first_logits
    while len(tokens) < k:
        if sampling.greedy:
            probs = torch.softmax(logits.float(), dim=-1)
            confidence, token = (float(v) for v in probs.max(dim=-1))
        else:
            probs = target_probs(logits.unsqueeze(0), sampling)[0]
            confidence = float(probs.max())
            token = draw_token(probs, sampling.seed, position + len(tokens), DRAFT_STREAM)
        if confidence < config.p_min:
            break
        tokens.append(int(token))
        rows.append(probs)
        if len(tokens) < k:
            logits = next_logits(int(token))
    if not tokens:
        return NO_DRAFT
    return Draft(tuple(tokens), None if sampling.greedy else torch.stack(rows))


def check_same_tokenizer(target: Tokenizer, draft: Tokenizer) -> None:
    """The draft model must speak the target's tokens: the same vocabulary, token for token."""
    if len(target) != len(draft):
        raise ModelLoadError(
            f"the draft model's tokenizer has {len(draft)} tokens and the target's {len(target)}: "
            "a draft model needs the target's tokenizer"
        )
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if target_vocab != draft_vocab:
        differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))[:3]
        raise ModelLoadError(
            "the draft model's tokenizer maps tokens differently from the target's "
            f"(for example {differing}): a draft model needs the target's tokenizer"
        )


class ModelDrafter:
    """Drafts with a separate (small) model that shares the target's tokenizer, on its own cache."""

    def __init__(
        self,
        draft_model: LoadedModel,
        *,
        output_start: int,
        config: ModelDraftConfig | None = None,
        sampling: SamplingConfig | None = None,
    ) -> None:
        self._model = draft_model
        self._config = config or ModelDraftConfig()
        self._sampling = sampling or SamplingConfig()
        self._output_start = output_start
        self.cache = draft_model.new_cache()
        self.cached_tokens: list[int] = []  # what the cache holds, position by position
        self._proposed_from = 0  # context length at the last proposal, until its feedback
        self.caught_up = (0, 0.0)  # the last proposal's catch-up: tokens fed, seconds

    def backlog(self, context: Sequence[int]) -> int:
        """The tokens a proposal on `context` would feed the model before drafting."""
        return len(context) - self._kept(context)

    def _kept(self, context: Sequence[int]) -> int:
        """The cached positions a proposal on `context` keeps: the prefix the context still agrees with (all
        of it, unless a caller rewound), less the last context token, which gives the first prediction."""
        return min(_common_prefix(self.cached_tokens, context), len(context) - 1)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        k = min(k, self._config.max_draft)
        if k < 1 or not context:
            return NO_DRAFT
        with torch.inference_mode():
            # 1. Catch up: keep what the cache still agrees with, then feed the rest.
            keep = self._kept(context)
            kv_cache.rollback(self.cache, keep)
            del self.cached_tokens[keep:]
            started = time.perf_counter()
            first_logits = self._forward(context[keep:])
            self.caught_up = (len(context) - keep, time.perf_counter() - started)
            # 2. Draft; every drafted token but the last goes through the model, and so into the cache.
            draft = draft_tokens(
                first_logits,
                self._forward_one,
                k=k,
                config=self._config,
                sampling=self._sampling,
                position=len(context) - self._output_start,
            )
        self._proposed_from = len(context)
        return draft

    def observe(self, n_accepted: int) -> None:
        """Drop the rejected drafted positions from the cache; the accepted ones stay, committed."""
        keep = min(len(self.cached_tokens), self._proposed_from + n_accepted)
        kv_cache.rollback(self.cache, keep)
        del self.cached_tokens[keep:]

    def _forward(self, ids: Sequence[int]) -> torch.Tensor:
        logits = self._model.forward(ids, self.cache, logits_to_keep=1)[-1]  # (V,)
        self.cached_tokens.extend(ids)
        return logits

    def _forward_one(self, token: int) -> torch.Tensor:
        return self._forward([token])


class LayerSkipDrafter:
    """Drafts with the target itself, the layers outside `kept_layers` left out, on the target's cache.

    The engine's invariant holds between steps: the cache holds every committed token but the pending
    one, in every layer. Drafting appends positions to the kept layers only; they are cropped away before
    `propose` returns, so the target's verify forward starts from the same cache as without a draft.
    """

    def __init__(
        self,
        target: LoadedModel,
        cache: Cache,
        kept_layers: Sequence[int],
        *,
        output_start: int,
        config: ModelDraftConfig | None = None,
        sampling: SamplingConfig | None = None,
    ) -> None:
        self._target = target
        self._cache = cache
        self._skipped = skipped_layers(target.model, kept_layers)
        self._config = config or ModelDraftConfig()
        self._sampling = sampling or SamplingConfig()
        self._output_start = output_start

    def propose(self, context: Sequence[int], k: int) -> Draft:
        k = min(k, self._config.max_draft)
        if k < 1 or not context:
            return NO_DRAFT
        committed = len(context) - 1  # what the target's cache holds (the engine's invariant)
        with torch.inference_mode(), skipping_layers(self._target.model, self._skipped):
            try:
                first_logits = self._target.forward(context[-1:], self._cache, logits_to_keep=1)[-1]
                draft = draft_tokens(
                    first_logits,
                    lambda token: self._target.forward([token], self._cache, logits_to_keep=1)[-1],
                    k=k,
                    config=self._config,
                    sampling=self._sampling,
                    position=len(context) - self._output_start,
                )
            finally:
                kv_cache.rollback(self._cache, committed)
        return draft

    def observe(self, n_accepted: int) -> None:
        pass  # nothing to keep: the target's verify forward wrote the committed positions


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The list of decoder blocks of a transformers causal LM (Llama/Qwen2/Mistral `layers`, GPT-2 `h`)."""
    base = model.base_model
    for name in ("layers", "h", "blocks"):
        layers = getattr(base, name, None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    raise ModelLoadError(f"layer skip: cannot find the decoder layers of {type(model).__name__}")


def skipped_layers(model: torch.nn.Module, kept_layers: Sequence[int]) -> tuple[int, ...]:
    """The layers left out when drafting with `kept_layers`. The first layer is always kept: positions
    and attention masks are read from its cache."""
    count = len(decoder_layers(model))
    kept = set(kept_layers)
    if not kept <= set(range(count)):
        raise ValueError(f"layer numbers must be in 0..{count - 1}, got {sorted(kept)}")
    if 0 not in kept:
        raise ValueError("layer skip must keep layer 0")
    if len(kept) == count:
        raise ValueError("layer skip must leave out at least one layer")
    return tuple(i for i in range(count) if i not in kept)


class _SkippedLayer(torch.nn.Module):
    """Stands in for a decoder block while drafting: the residual stream passes through unchanged."""

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return hidden_states


@contextmanager
def skipping_layers(model: torch.nn.Module, skipped: Sequence[int]) -> Iterator[None]:
    """Within the block, `model` runs without the `skipped` decoder layers."""
    layers = decoder_layers(model)
    originals = {i: layers[i] for i in skipped}
    try:
        for i in skipped:
            layers[i] = _SkippedLayer()
        yield
    finally:
        for i, layer in originals.items():
            layers[i] = layer


def parse_layers(spec: str) -> tuple[int, ...]:
    """Layer numbers from a spec like `0-5,12,20-23` (ranges inclusive).

    >>> parse_layers("0-3,8,10-11")
    (0, 1, 2, 3, 8, 10, 11)
    """
    layers: set[int] = set()
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ValueError(f"bad layer list {spec!r}: expected numbers and ranges like 0-5,12,20-23")
        first, last = int(match[1]), int(match[2] or match[1])
        layers.update(range(first, last + 1))
    if not layers:
        raise ValueError(f"bad layer list {spec!r}: a range runs backwards")
    return tuple(sorted(layers))


def format_layers(layers: Sequence[int]) -> str:
    """The inverse of `parse_layers`: `(0, 1, 2, 3, 8)` -> `0-3,8`."""
    parts: list[str] = []
    ordered = sorted(set(layers))
    start = previous = ordered[0]
    for layer in [*ordered[1:], None]:
        if layer is not None and layer == previous + 1:
            previous = layer
            continue
        parts.append(f"{start}-{previous}" if previous > start else str(start))
        if layer is not None:
            start = previous = layer
    return ",".join(parts)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])
