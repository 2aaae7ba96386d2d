"""Decoding on the cores other programs leave free.

A forward's threads meet at a barrier after every operator, so one thread sharing its core with another
program holds back all the others: with one of 2 cores busy (another process spinning), a rewrite on 2
threads took 2.6-3.0x its idle time, and on 1 thread 1.6-2.0x (AVX2, 0.5B, float32; see docs/benchmarks.md,
"A busy machine"). So a rewrite counts the cores busy elsewhere as it starts, and again every second
between its steps, and runs on fewer threads while they are busy: only on a count the self-check found
to give the same logits, bit for bit, as the configured one (`Exactness.fewer_threads`), so that the
answer never depends on the machine's load.

`SPECEDIT_ADAPT_THREADS=0` keeps the configured count (to measure what adapting saves).
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

RECHECK = 1.0  # seconds between two decisions during a rewrite (a decision reads /proc for ~8 ms)
SAMPLES = 3  # readings of the run queue, SAMPLE_GAP apart: the fewest is taken (another program's thread
SAMPLE_GAP = 0.004  # may be between two bursts of a short task)


def busy_elsewhere() -> int:
    """How many threads of other programs are running or ready to run now: `procs_running` of /proc/stat
    less this process's own running threads (the one asking, a worker still spinning after the last
    forward); 0 where it cannot be read."""
    readings = []
    for sample in range(SAMPLES):
        if sample:
            time.sleep(SAMPLE_GAP)
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                running = next(int(line.split()[1]) for line in stat if line.startswith("procs_running"))
        except (OSError, StopIteration, ValueError, IndexError):
            return 0
        readings.append(running - _own_running())
    return max(0, min(readings))


def _own_running() -> int:
    """This process's threads in the running state (`R` in /proc/self/task/*/stat); at least the caller."""
    count = 0
    try:
        tasks = list(os.scandir("/proc/self/task"))
    except OSError:
        return 1
    for task in tasks:
        try:
            with open(f"{task.path}/stat", encoding="ascii", errors="replace") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # a thread that just ended
        count += state == "R"
    return max(1, count)


def threads_for(configured: int, allowed: Sequence[int], busy: int) -> int:
    """The thread count to decode on: the configured one while the cores it needs are free, else the most
    of the `allowed` fewer counts that the free cores hold (the fewest allowed if none does)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    free = cores - busy
    if free >= configured or not allowed:
        return configured
    return max((count for count in allowed if count <= free), default=min(allowed))


class Threads(Protocol):
    """A target's thread count (torch's, or its kernels' without torch: this thread's)."""

    def get_threads(self) -> int: ...

    def set_threads(self, count: int) -> None: ...


class FreeCores:
    """The threads a rewrite decodes on: chosen by `threads_for` as it starts, and again between its steps
    every `RECHECK` seconds (a compiler started or ended meanwhile); `restore` gives the target back the
    configured count. `mostly`: the count most steps ran on."""

    def __init__(self, allowed: Sequence[int], target: Threads) -> None:
        self.target = target
        self.configured = self.current = target.get_threads()
        self.allowed = tuple(allowed) if os.environ.get("SPECEDIT_ADAPT_THREADS", "1") != "0" else ()
        self.steps: Counter[int] = Counter()
        self._checked = -math.inf
        self.between_steps(counted=False)

    def between_steps(self, *, counted: bool = True) -> None:
        if counted:
            self.steps[self.current] += 1
        now = time.monotonic()
        if not self.allowed or now - self._checked < RECHECK:
            return
        self._checked = now
        chosen = threads_for(self.configured, self.allowed, busy_elsewhere())
        if chosen != self.current:
            self.target.set_threads(chosen)
            self.current = chosen

    @property
    def mostly(self) -> int:
        return self.steps.most_common(1)[0][0] if self.steps else self.current

    def restore(self) -> None:
        if self.current != self.configured:
            self.target.set_threads(self.configured)
            self.current = self.configured
