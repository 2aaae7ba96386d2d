"""Decoding on the cores other programs leave free.

A forward's threads meet at a barrier after every operator, so one thread sharing its core with another
program holds back all the others: with one of 2 cores busy (another process spinning), a rewrite on 2
threads took 2.6-3.0x its idle time, and on 1 thread 1.6-2.0x (AVX2, 0.5B, float32; see the README,
"A busy machine"). So a rewrite counts the cores busy elsewhere as it starts, and runs on fewer threads
while they are: only on a count the self-check found to give the same logits, bit for bit, as the
configured one (`Exactness.fewer_threads`), so that the answer never depends on the machine's load.

`SPECEDIT_ADAPT_THREADS=0` keeps the configured count (to measure what adapting saves).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

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


@contextmanager
def on_free_cores(allowed: Sequence[int]) -> Iterator[int]:
    """Run inside on the threads `threads_for` chooses (torch's count is this thread's: restored on exit);
    yields the count."""
    configured = torch.get_num_threads()
    adapt = os.environ.get("SPECEDIT_ADAPT_THREADS", "1") != "0" and allowed
    chosen = threads_for(configured, allowed, busy_elsewhere()) if adapt else configured
    if chosen != configured:
        torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        if chosen != configured:
            torch.set_num_threads(configured)
