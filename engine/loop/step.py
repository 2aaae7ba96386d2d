"""One speculative step's record: built once by the loop, read by the cost governor, the stats and the
step event (`loop.generate`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepRecord:
    source: str  # the drafter that drafted, "" for a plain step
    drafted: int
    accepted: int
    committed: int  # accepted + the bonus, or fewer where EOS or a stop cut the step short
    wall_seconds: float  # what the step cost, drafting included
    cpu_seconds: float
    position: int  # committed length after the step: prompt and output
