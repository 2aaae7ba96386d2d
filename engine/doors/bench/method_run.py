"""One method's run on one bench case, and its timer: what `bench` and its peers (`llama_cpp`) report."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from specedit.engine.doors.bench.records import MethodExtra, MethodRecord


@dataclass
class MethodRun:
    """One method on one case."""

    tokens: list[int]
    text: str
    wall_seconds: float
    cpu_seconds: float
    prefill_seconds: float  # start to the first generated token
    decode_seconds: float  # first generated token to the last
    target_forwards: int
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    joules: float | None = None  # GPU energy (NVML), on CUDA only
    drafters: dict[str, dict[str, int]] = field(default_factory=dict)  # per drafter: drafted, accepted, ...
    identical_to_plain: bool | None = None
    first_difference: int | None = None  # index of the first token that differs from plain's, if any
    extra: MethodExtra = field(default_factory=lambda: MethodExtra())
    # What each phase computed a second (`model.peak.forward_ops`), our methods only: the prefill's prompt
    # tokens, and decoding's verified rows (a forward's pending token and its draft).
    prefill_gops: float | None = None
    decode_gops: float | None = None

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)

    def to_dict(self) -> MethodRecord:
        """The run's figures, its tokens and text left out."""
        return {
            "wall_seconds": self.wall_seconds,
            "cpu_seconds": self.cpu_seconds,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "target_forwards": self.target_forwards,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "joules": self.joules,
            "drafters": {name: dict(counts) for name, counts in self.drafters.items()},
            "identical_to_plain": self.identical_to_plain,
            "first_difference": self.first_difference,
            "extra": copy.deepcopy(self.extra),
            "generated_tokens": self.generated_tokens,
            "tokens_per_second": round(self.generated_tokens / self.wall_seconds, 3) if self.wall_seconds else 0.0,
            "acceptance_rate": round(self.accepted_tokens / self.drafted_tokens, 4) if self.drafted_tokens else None,
            "prefill_gops": self.prefill_gops,
            "decode_gops": self.decode_gops,
        }


class Timer:
    """Start, time of the first generated token, time of the last, and process CPU time."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        self.first: float | None = None

    def mark_first(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def finish(self) -> tuple[float, float, float, float]:
        end = time.perf_counter()
        first = self.first if self.first is not None else end
        return end - self.start, time.process_time() - self.cpu_start, first - self.start, end - first
