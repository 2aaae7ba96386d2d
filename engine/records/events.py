"""One rewrite's events, the one stream every host and every transport moves: `Text | Step | Phase | Done`.

In order: `Phase`s while the rewrite waits (the model loading, queued behind others, started), then `Text`
and `Step` as the engine commits tokens (the texts joined are the answer), and last one `Done` with the
outcome, which the session has judged (`session.Session`: a complete answer that is no merge of its sketch,
or empty, says so in its status). A stream that fails ends with an error instead, raised where it is read.

One encoding each way (`event_to_wire` / `event_from_wire`), the same dict in the daemon's msgpack frames
and in the JSON lines of the cluster: `{"type": "text", "delta": ...}`, `{"type": "step", ...Step's
fields}`, `{"type": "phase", "name": ..., "ahead": ...}`, `{"type": "done", "outcome": {...}}`, and
`{"type": "error", "code": ..., "message": ...}` for an error (`error_to_wire`). Adding an event kind
touches this module and the hosts that render it, nothing between.

>>> event_from_wire(event_to_wire(Phase("queued", 2)))
Phase(name='queued', ahead=2)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from specedit.engine.records.requests import RewriteOutcome
from specedit.engine.records.wire import ProtocolError, error_code_for, error_from, from_wire, to_wire


@dataclass(frozen=True)
class Text:
    """The next piece of the rewritten region."""

    delta: str


@dataclass(frozen=True)
class Step:
    """One speculative step, reported after it committed: for progress, tests and profiling."""

    step: int  # 1, 2, ...: the target forwards so far
    committed_length: int  # prompt + output tokens
    cache_length: int  # always committed_length - 1: the newest token is pending
    drafted: int  # this step's draft length
    accepted: int  # this step's accepted draft tokens
    generated_tokens: int  # output tokens so far (a step commits accepted + 1, or fewer at EOS or a stop)
    drafted_total: int  # drafted tokens over all steps so far
    accepted_total: int  # accepted tokens over all steps so far
    seconds: float  # since the rewrite started running (prefill included)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_total / self.drafted_total if self.drafted_total else 0.0


@dataclass(frozen=True)
class Phase:
    """Where a rewrite is before its first step: the model loading, waiting behind `ahead` other
    rewrites, or started (its prompt being prefilled, then its steps)."""

    name: Literal["loading", "queued", "started"]
    ahead: int = 0


@dataclass(frozen=True)
class Done:
    """The end of the rewrite, judged (`RewriteOutcome.status`)."""

    outcome: RewriteOutcome


Event = Text | Step | Phase | Done
_KINDS: dict[str, type[Event]] = {"text": Text, "step": Step, "phase": Phase, "done": Done}
_NAMES = {kind: name for name, kind in _KINDS.items()}


def event_to_wire(event: Event) -> dict[str, object]:
    return {"type": _NAMES[type(event)], **to_wire(event)}


def error_to_wire(error: BaseException) -> dict[str, object]:
    """The record that ends a stream an error ended (`event_from_wire` raises it again)."""
    return {"type": "error", "code": error_code_for(error), "message": str(error)}


def event_from_wire(value: object) -> Event:
    """The event `event_to_wire` made; the error `error_to_wire` made is raised (a `SpeceditError`);
    `ProtocolError` for anything else."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProtocolError("malformed_frame", "an event is a map with a string 'type'")
    if value["type"] == "error":
        raise error_from(str(value.get("code", "engine_error")), str(value.get("message", "")))
    kind = _KINDS.get(value["type"])
    if kind is None:
        raise ProtocolError("unknown_type", f"unknown event type {value['type']!r} (known: {', '.join(_KINDS)})")
    return from_wire(kind, value)


@dataclass
class DecodingRate:
    """Tokens per second of decoding alone, for progress: the tokens since the first step over the time
    since (the model's load and the prefill come before it)."""

    first: tuple[float, int] | None = None  # when the first step was seen (perf_counter), and its tokens

    def step(self, info: Step) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), info.generated_tokens)

    def rate(self, generated_tokens: int) -> float | None:
        """None until a tenth of a second has passed since the first step."""
        if self.first is None or time.perf_counter() - self.first[0] < 0.1:
            return None
        return (generated_tokens - self.first[1]) / (time.perf_counter() - self.first[0])
