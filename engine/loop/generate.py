"""The speculative loop. Plain decoding is the same loop with a drafter that never proposes.

One step: draft -> one target forward over the draft -> verify -> commit and roll the cache back ->
feedback to the drafter -> emit the committed text. See `engine.model.kv_cache` for the cache invariant.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from specedit.drafters.base import NO_DRAFT, Draft, Drafter, NoDrafter
from specedit.engine.loop.detokenizer import IncrementalDetokenizer
from specedit.engine.loop.governor import CostGovernor
from specedit.engine.loop.step import StepRecord
from specedit.engine.loop.verify import verify
from specedit.engine.model import kv_positions
from specedit.engine.model.energy import EnergyMeter
from specedit.engine.model.kv_positions import Cache
from specedit.engine.model.protocols import Target, Tokenizer
from specedit.engine.records.events import Step
from specedit.engine.records.requests import FinishReason, SamplingConfig
from specedit.engine.records.stats import Stats

if TYPE_CHECKING:  # (not imported here: this loop runs a target without torch too, `model.torchless`)
    from specedit.drafters.fallback import FallbackConfig
    from specedit.engine.model.loading import LoadedModel
    from specedit.engine.model.prefix_cache import PrefixCache


@dataclass
class Generation:
    tokens: list[int]  # output token ids, EOS included when the model wrote one
    text: str  # the output text (special tokens skipped); what `on_text` streamed, joined
    finish_reason: FinishReason
    stats: Stats


# Prompt tokens a prefill forwards at a time where others may want the model between (`generate`'s
# `pause`): about a second of a 0.5B model's prefill on 2 cores, what a short rewrite waits at most
# behind a long one.
PREFILL_CHUNK = 512


class Engine:
    """A loaded target model that generates, with or without a drafter.

    `fallback` says what drafts where the copy drafter has nothing (see `drafters.fallback`); None: plain
    decoding there. `prefix_cache`: the caches of recent prompts, which requests that share a prompt's
    start reuse (see `model.prefix_cache`); None: every request prefills its whole prompt.
    """

    def __init__(
        self, loaded: Target, fallback: FallbackConfig | None = None, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.loaded = loaded
        self.fallback = fallback
        self.prefix_cache = prefix_cache  # recent prompts' caches, reused by the next request (a daemon's)
        self.energy = EnergyMeter(loaded.device)
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.eos_token_ids = _eos_token_ids(loaded.model, loaded.tokenizer)

    @property
    def max_positions(self) -> int | None:
        return self.loaded.max_positions

    @property
    def torch_target(self) -> LoadedModel:
        """The target as torch loaded it, for what only that one has: layer skip, the prefix cache's own
        prefills, the bench's stock kernels. (A target without torch is a one-off rewrite's, which uses none
        of these; a test's stand-in for a `LoadedModel` passes as one.)"""
        return cast("LoadedModel", self.loaded)

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        drafter: Drafter | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: Callable[[str], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
        cancel: Callable[[], bool] | None = None,
        on_step: Callable[[Step], None] | None = None,
        governor: CostGovernor | None = None,
        cache: Cache | None = None,
        pause: Callable[[], None] | None = None,
    ) -> Generation:
        """Continue `prompt_ids` by at most `max_new_tokens` tokens.

        `stop` is fed the text of each committed token and returns True to end generation after it.
        `cancel` is checked before every step. The output is exactly what plain decoding of the
        target gives (greedy: token for token; sampling with a seed and a deterministic draft: also
        token for token, since draws are keyed by position).
        `governor` hears what every step cost, to back off drafters that stop paying. `cache` is the
        target's cache, shared with a drafter that drafts on it (layer skip); by default a new one. It may
        hold a prefix of the prompt already (from `PrefixCache.take`): only the rest is prefilled, and the
        answer is the same (the prefill is row-invariant). `pause` is called between two parts of a long
        prefill (`PREFILL_CHUNK` tokens each), where the prefill is row-invariant (the parts then give the
        cache the whole would): it may let other work use the model meanwhile (`backends.local`).
        """
        if not prompt_ids:
            raise ValueError("the prompt must hold at least one token")
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        drafter = drafter or NoDrafter()
        cache = self.loaded.new_cache() if cache is None else cache
        clock, joules_at_start = Clock(), self.energy.read()
        tokens = list(prompt_ids)  # committed: prompt, then output
        start = len(tokens)
        exactness = self.loaded.exactness
        stats = Stats(prompt_tokens=start, exactness=exactness.to_dict() if exactness is not None else None)
        output = _OutputText(IncrementalDetokenizer(self.tokenizer, prompt_ids), stop)
        finish: FinishReason = "length"
        with self.loaded.inference():
            stats.reused_tokens, stats.prefill_tokens = self._prefill(tokens, cache, pause, cancel)
            stats.prefill_seconds = clock.wall()
            while (budget := max_new_tokens - (len(tokens) - start)) > 0:
                if cancel is not None and cancel():
                    finish = "cancelled"
                    break
                wall, cpu, committed = time.perf_counter(), time.process_time(), len(tokens)
                # 1. Draft: at most budget - 1 tokens, since the bonus takes one more slot.
                draft = _cap(drafter.propose(tokens, budget - 1), budget - 1) if budget > 1 else NO_DRAFT
                # 2. One target forward over the pending token and the draft: (k + 1, V) logits.
                logits = self.loaded.forward([tokens[-1], *draft.tokens], cache)
                # 3. Verify: the accepted prefix and the target's bonus token.
                verdict = verify(draft, logits, sampling, position=len(tokens) - start)
                # 4. Commit token by token (EOS or a stop may cut the step short), then roll the cache
                #    back to the committed tokens: rejected draft positions are dropped.
                for token in [*draft.tokens[: verdict.n_accepted], verdict.bonus]:
                    tokens.append(token)
                    if token in self.eos_token_ids:
                        finish = "eos"
                        break
                    if output.push(token):
                        finish = "stop"
                        break
                kv_positions.rollback(cache, keep=len(tokens) - 1)
                # 5. Feedback to the drafter; the step's one record to the governor and the stats.
                drafter.observe(verdict.n_accepted)
                step = StepRecord(
                    draft.source, len(draft), verdict.n_accepted, len(tokens) - committed,
                    time.perf_counter() - wall, time.process_time() - cpu, len(tokens),
                )  # fmt: skip
                if governor is not None:
                    governor.record(step)
                stats.add(step.drafted, step.accepted, step.source)
                # 6. Emit the committed text, and the step.
                if finish == "eos" or (finish == "length" and len(tokens) - start >= max_new_tokens):
                    output.flush()  # the end: release text held back for an incomplete character
                output.emit(on_text)
                if on_step is not None:
                    on_step(_event(step, stats, kv_positions.length(cache), start, clock.wall()))
                if finish != "length":
                    break
        stats.ended(len(tokens) - start, clock.wall(), clock.cpu())
        if joules_at_start is not None:
            stats.joules = (self.energy.read() or joules_at_start) - joules_at_start
        if governor is not None:
            governor.report(stats)
        return Generation(tokens[start:], output.text, finish, stats)

    def _prefill(
        self, tokens: list[int], cache: Cache, pause: Callable[[], None] | None, cancel: Callable[[], bool] | None
    ) -> tuple[int, int]:
        """Prefill every prompt token but the last (and those the cache already holds). The last is pending:
        it is the first input of the first step's forward, which predicts the first output. Returns the
        tokens the cache held, and those prefilled. A cancel between two parts stops it: the first step
        says so, and the cache holds a prefix."""
        reused = kv_positions.length(cache)
        if reused >= len(tokens):
            raise ValueError("the cache must hold less than the prompt: its last token is the first step's input")
        chunk = PREFILL_CHUNK if pause is not None and self.loaded.row_invariant else len(tokens)
        for begin in range(reused, len(tokens) - 1, chunk):
            if begin > reused and pause is not None:
                pause()
                if cancel is not None and cancel():
                    break
            self.loaded.forward(tokens[begin : min(begin + chunk, len(tokens) - 1)], cache, logits_to_keep=1)
        return reused, len(tokens) - 1 - reused


def _event(step: StepRecord, stats: Stats, cache_length: int, start: int, seconds: float) -> Step:
    """The step as its callback hears it (`events.Step`)."""
    return Step(
        step=stats.target_forwards,
        committed_length=step.position,
        cache_length=cache_length,
        drafted=step.drafted,
        accepted=step.accepted,
        generated_tokens=step.position - start,
        drafted_total=stats.drafted_tokens,
        accepted_total=stats.accepted_tokens,
        seconds=round(seconds, 4),
    )


class Clock:
    """Wall and process-CPU time since creation."""

    def __init__(self) -> None:
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()

    def wall(self) -> float:
        return time.perf_counter() - self.wall_start

    def cpu(self) -> float:
        return time.process_time() - self.cpu_start


class _OutputText:
    """The output text as it is committed: every piece goes through `stop`, then out in one emit a step."""

    def __init__(self, detokenizer: IncrementalDetokenizer, stop: Callable[[str], bool] | None) -> None:
        self._detokenizer = detokenizer
        self._stop = stop
        self._parts: list[str] = []
        self._unsent = 0  # parts not yet passed to on_text

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def push(self, token: int) -> bool:
        """Add one token's text; True when `stop` says to end here."""
        return self._add(self._detokenizer.push(token))

    def flush(self) -> None:
        """Release text held back for an incomplete character, at the end of generation."""
        self._add(self._detokenizer.flush())

    def emit(self, on_text: Callable[[str], None] | None) -> None:
        text = "".join(self._parts[self._unsent :])
        self._unsent = len(self._parts)
        if text and on_text is not None:
            on_text(text)

    def _add(self, piece: str) -> bool:
        if not piece:
            return False
        self._parts.append(piece)
        return self._stop is not None and self._stop(piece)


def _cap(draft: Draft, k: int) -> Draft:
    """A drafter may not propose more than the budget allows; cut its proposal to k tokens."""
    if len(draft) <= k:
        return draft
    p_draft = draft.p_draft[:k] if draft.p_draft is not None else None
    return Draft(draft.tokens[:k], p_draft, draft.source)


def _eos_token_ids(model: object, tokenizer: Tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
