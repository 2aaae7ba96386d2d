"""What a rewrite cost and how well speculation did: one `Stats` value, from the loop to every front end.

The loop counts into it step by step (`loop.generate`); the session and the backends add what they
measured around the run (the merge, the wait for a turn, a cancel). Every boundary sends it as one dict
(`to_dict`): the daemon's msgpack, the cluster's JSON, the language server's `stats`, `specedit rewrite
--stats`, the bench's JSON. `from_dict` reads that dict back, so the value crosses any transport unchanged.

>>> stats = Stats(prompt_tokens=9, generated_tokens=4, target_forwards=2, drafted_tokens=3, accepted_tokens=2)
>>> stats.to_dict()["acceptance_rate"], Stats.from_dict(stats.to_dict()) == stats
(0.6667, True)
>>> Stats.before_start(queue_seconds=0.5).to_dict()  # a rewrite cancelled in the queue: no counters
{'queue_seconds': 0.5}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

MergedBy = Literal["lines", "model"]  # a sketch merged by its lines (no model), or by the model
_MERGED_BY: tuple[MergedBy, ...] = ("lines", "model")


@dataclass
class DrafterStats:
    """What one drafter proposed in a request, and how much of it the target kept."""

    proposals: int = 0  # steps on which it drafted
    drafted: int = 0
    accepted: int = 0
    held_back_steps: int = 0  # steps on which the cost governor held it back (backed off, or a probe)

    @property
    def wasted(self) -> int:
        """Drafted tokens the target rejected: verified for nothing."""
        return self.drafted - self.accepted

    def add(self, drafted: int, accepted: int) -> None:
        self.proposals += 1
        self.drafted += drafted
        self.accepted += accepted

    def to_dict(self) -> dict[str, int]:
        return {
            "proposals": self.proposals,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "wasted": self.wasted,
            "held_back_steps": self.held_back_steps,
        }

    @classmethod
    def from_dict(cls, value: object) -> DrafterStats:
        record = _mapping(value, "a drafter's stats")
        return cls(*(_int(record, name) for name in ("proposals", "drafted", "accepted", "held_back_steps")))


@dataclass
class Stats:
    """The counters of one rewrite. `target_forwards` counts decode forwards (prefill is timed apart).

    Every decode forward verifies one draft (possibly empty) and commits accepted + 1 tokens, so
    generated_tokens <= target_forwards + accepted_tokens (less only when a stop cut a step short).
    `ran` is False for a rewrite that ended before the model or the merge ran: its dict holds only the
    fields measured around it (the optional ones at the end).
    """

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the prefill computed (the last is computed by the first step)
    reused_tokens: int = 0  # prompt tokens whose keys and values came from a kept cache (`PrefixCache`)
    generated_tokens: int = 0
    target_forwards: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_length_histogram: Counter[int] = field(default_factory=Counter)
    prefill_seconds: float = 0.0
    first_text_seconds: float | None = None  # from the start to the first text of the answer (a rewrite's region)
    decode_seconds: float = 0.0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    tokens_per_second: float = 0.0  # generated tokens per second of wall time, end to end (prefill included)
    decode_tokens_per_second: float = 0.0
    joules: float | None = None  # the GPU's energy counter (NVML), on CUDA only
    drafters: dict[str, DrafterStats] = field(default_factory=dict)  # by drafter name: copy, context, fallback
    cost_probes: int = 0  # plain steps the cost governor took to measure plain decoding
    threads: int | None = None  # the CPU threads it ran on (fewer than configured while cores were busy)
    exactness: dict[str, object] | None = None  # the target's self-check verdict (`Exactness.to_dict()`)
    ran: bool = True
    # Measured around the run, by whoever ran it; None: not measured there, and left out of the dict.
    merge: MergedBy | None = None  # how a sketch was merged
    merge_unresolved: tuple[str, ...] | None = None  # with the model's merge: why not by the sketch's lines
    queue_seconds: float | None = None  # waited for a turn on the model (`backends.local`)
    steps_after_cancel: int | None = None  # steps the engine took after the cancel (at most one)
    sketch_from: str | None = None  # where the sketch came from: a chat answer (`chat_answer`)
    replica: int | None = None  # the cluster replica's pid that ran it

    @classmethod
    def before_start(cls, *, queue_seconds: float | None = None) -> Stats:
        """The stats of a rewrite cancelled before it ran."""
        return cls(ran=False, queue_seconds=queue_seconds)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per target forward; each forward also commits one bonus token."""
        return self.accepted_tokens / self.target_forwards if self.target_forwards else 0.0

    def add(self, drafted: int, accepted: int, source: str) -> None:
        """One decode step: its draft's length, how much of it the target accepted, and who drafted it."""
        self.target_forwards += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted_length_histogram[accepted] += 1
        if drafted:
            self.drafters.setdefault(source or "draft", DrafterStats()).add(drafted, accepted)

    def ended(self, generated_tokens: int, wall_seconds: float, cpu_seconds: float) -> None:
        """The run is over: its output and its time, the rates they make."""
        self.generated_tokens = generated_tokens
        self.wall_seconds, self.cpu_seconds = wall_seconds, cpu_seconds
        self.decode_seconds = wall_seconds - self.prefill_seconds
        self.tokens_per_second = generated_tokens / wall_seconds if wall_seconds > 0 else 0.0
        self.decode_tokens_per_second = generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        """The dict every boundary sends: the counters where it ran, then what was measured around it."""
        record: dict[str, object] = {}
        if self.ran:
            record = {
                "prompt_tokens": self.prompt_tokens,
                "prefill_tokens": self.prefill_tokens,
                "reused_tokens": self.reused_tokens,
                "generated_tokens": self.generated_tokens,
                "target_forwards": self.target_forwards,
                "drafted_tokens": self.drafted_tokens,
                "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "mean_accepted_length": round(self.mean_accepted_length, 3),
                "accepted_length_histogram": {str(k): v for k, v in sorted(self.accepted_length_histogram.items())},
                "prefill_seconds": round(self.prefill_seconds, 4),
                "first_text_seconds": _rounded(self.first_text_seconds, 4),
                "decode_seconds": round(self.decode_seconds, 4),
                "wall_seconds": round(self.wall_seconds, 4),
                "cpu_seconds": round(self.cpu_seconds, 4),
                "tokens_per_second": round(self.tokens_per_second, 2),
                "decode_tokens_per_second": round(self.decode_tokens_per_second, 2),
                "joules": _rounded(self.joules, 3),
                "drafters": {name: drafter.to_dict() for name, drafter in sorted(self.drafters.items())},
                "cost_probes": self.cost_probes,
                "threads": self.threads,
                "exactness": self.exactness,
            }
        around = {
            "merge": self.merge,
            "merge_unresolved": list(self.merge_unresolved) if self.merge_unresolved is not None else None,
            "queue_seconds": self.queue_seconds,
            "steps_after_cancel": self.steps_after_cancel,
            "sketch_from": self.sketch_from,
            "replica": self.replica,
        }
        record.update((key, value) for key, value in around.items() if value is not None)
        return record

    @classmethod
    def from_dict(cls, value: object) -> Stats:
        """The value `to_dict` made; `ValueError` for a dict it did not make."""
        record = _mapping(value, "stats")
        merge = record.get("merge")
        if merge is not None and merge not in _MERGED_BY:
            raise ValueError(f"stats: merge is one of {_MERGED_BY}, not {merge!r}")
        unresolved = _optional(record, "merge_unresolved", _list)
        stats = cls(
            ran="prompt_tokens" in record,
            merge=merge,
            merge_unresolved=tuple(map(str, unresolved)) if unresolved is not None else None,
            queue_seconds=_optional(record, "queue_seconds", _float),
            steps_after_cancel=_optional(record, "steps_after_cancel", _int),
            sketch_from=_optional(record, "sketch_from", _str),
            replica=_optional(record, "replica", _int),
        )
        if stats.ran:
            stats._read_counters(record)
        return stats

    def _read_counters(self, record: Mapping[str, object]) -> None:
        histogram = _mapping(record.get("accepted_length_histogram"), "stats: accepted_length_histogram")
        drafters = _mapping(record.get("drafters"), "stats: drafters")
        exactness = record.get("exactness")
        self.prompt_tokens = _int(record, "prompt_tokens")
        self.prefill_tokens = _int(record, "prefill_tokens")
        self.reused_tokens = _int(record, "reused_tokens")
        self.generated_tokens = _int(record, "generated_tokens")
        self.target_forwards = _int(record, "target_forwards")
        self.drafted_tokens = _int(record, "drafted_tokens")
        self.accepted_tokens = _int(record, "accepted_tokens")
        self.accepted_length_histogram = Counter({int(length): _int(histogram, length) for length in histogram})
        self.prefill_seconds = _float(record, "prefill_seconds")
        self.first_text_seconds = _optional(record, "first_text_seconds", _float)
        self.decode_seconds = _float(record, "decode_seconds")
        self.wall_seconds = _float(record, "wall_seconds")
        self.cpu_seconds = _float(record, "cpu_seconds")
        self.tokens_per_second = _float(record, "tokens_per_second")
        self.decode_tokens_per_second = _float(record, "decode_tokens_per_second")
        self.joules = _optional(record, "joules", _float)
        self.drafters = {name: DrafterStats.from_dict(drafter) for name, drafter in drafters.items()}
        self.cost_probes = _int(record, "cost_probes")
        self.threads = _optional(record, "threads", _int)
        self.exactness = dict(_mapping(exactness, "stats: exactness")) if exactness is not None else None


def _rounded(value: float | None, digits: int) -> float | None:
    return round(value, digits) if value is not None else None


# Reading `to_dict`'s form back: each value checked to be of its field's type (a bool is no number).


def _mapping(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{what} is a map with string keys")
    return value


def _int(record: Mapping[str, object], key: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"stats: {key} is an integer, not {value!r}")
    return value


def _float(record: Mapping[str, object], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"stats: {key} is a number, not {value!r}")
    return value


def _str(record: Mapping[str, object], key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise ValueError(f"stats: {key} is a string, not {value!r}")
    return value


def _list(record: Mapping[str, object], key: str) -> list[object]:
    value = record.get(key)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"stats: {key} is a list, not {value!r}")
    return list(value)


T = TypeVar("T")


def _optional(record: Mapping[str, object], key: str, read: Callable[[Mapping[str, object], str], T]) -> T | None:
    return None if record.get(key) is None else read(record, key)
