"""What one request cost and how well speculation did."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class Stats:
    """Counters of one generation. `target_forwards` counts decode forwards (prefill is timed apart).

    Every decode forward verifies one draft (possibly empty) and commits accepted + 1 tokens, so
    generated_tokens <= target_forwards + accepted_tokens (less only when a stop cut a step short).
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
    joules: float | None = None  # the GPU's energy counter (NVML), on CUDA only
    drafters: dict[str, DrafterStats] = field(default_factory=dict)  # by drafter name: copy, fallback
    cost_probes: int = 0  # plain steps the cost governor took to measure plain decoding
    threads: int | None = None  # the CPU threads it ran on (fewer than configured while cores were busy)
    exactness: dict[str, Any] | None = None  # the target's self-check verdict (`Exactness.to_dict()`)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per target forward; each forward also commits one bonus token."""
        return self.accepted_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time, end to end (prefill included)."""
        return self.generated_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
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
            "first_text_seconds": round(self.first_text_seconds, 4) if self.first_text_seconds is not None else None,
            "decode_seconds": round(self.decode_seconds, 4),
            "wall_seconds": round(self.wall_seconds, 4),
            "cpu_seconds": round(self.cpu_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "decode_tokens_per_second": round(self.decode_tokens_per_second, 2),
            "joules": round(self.joules, 3) if self.joules is not None else None,
            "drafters": {name: drafter.to_dict() for name, drafter in sorted(self.drafters.items())},
            "cost_probes": self.cost_probes,
            "threads": self.threads,
            "exactness": self.exactness,
        }


class Clock:
    """Wall and process-CPU time since creation."""

    def __init__(self) -> None:
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()

    def wall(self) -> float:
        return time.perf_counter() - self.wall_start

    def cpu(self) -> float:
        return time.process_time() - self.cpu_start
