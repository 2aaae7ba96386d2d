"""Decoding on the cores other programs leave free (`loop.threads`): fewer threads while cores are busy,
only on counts the self-check found to give the same logits, and the same answer."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specedit.engine.backends.local import LocalBackend
from specedit.engine.doors.bench.bench import as_transformers_runs_it, busy_processes
from specedit.engine.loop import threads
from specedit.engine.loop.rewrite import prepare_rewrite, run_rewrite
from specedit.engine.model.model_thread import on_model_thread
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest
from specedit.engine.session.session import Session

from conftest import MEMORISED_REWRITES

CORES = len(os.sched_getaffinity(0))


def running(count: int) -> int:
    """`busy_elsewhere()` once it counts `count` (started processes run within a moment), or after 5 s."""
    deadline, seen = time.monotonic() + 5, 0
    while seen < count and time.monotonic() < deadline:
        seen = max(seen, threads.busy_elsewhere())
        time.sleep(0.02)
    return seen


def test_the_count_follows_the_free_cores_among_the_allowed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert threads.threads_for(8, (7, 1), busy=0) == 8  # idle
    assert threads.threads_for(8, (7, 1), busy=1) == 7  # one core busy
    assert threads.threads_for(8, (7, 1), busy=3) == 1  # 5 free, but 5 was not checked
    assert threads.threads_for(8, (7, 1), busy=9) == 1  # every core busy: the fewest
    assert threads.threads_for(8, (), busy=5) == 8  # none checked: as configured
    assert threads.threads_for(4, (3, 1), busy=4) == 4  # 4 threads of 8 cores: 4 free are enough
    assert threads.threads_for(4, (3, 1), busy=5) == 3


def test_the_count_is_decided_again_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that starts (or ends) during a rewrite: the next decision, `RECHECK` seconds later, follows
    it; torch gets the configured count back at the end; `mostly` is the count most steps ran on."""
    configured = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(threads, "RECHECK", 0.0)
    readings = iter([0, 1, 1, 1, 0])  # idle as it starts, then one core busy for three steps, then idle
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: next(readings))
    torch.set_num_threads(8)
    try:
        torch_threads = SimpleNamespace(get_threads=torch.get_num_threads, set_threads=torch.set_num_threads)
        cores = threads.FreeCores((7, 1), torch_threads)
        seen = [cores.current]
        for _ in range(4):
            cores.between_steps()
            seen.append(torch.get_num_threads())
        assert seen == [8, 7, 7, 7, 8] and cores.mostly == 7
        cores.restore()
        assert torch.get_num_threads() == 8
    finally:
        torch.set_num_threads(configured)


def test_busy_processes_are_counted() -> None:
    idle = threads.busy_elsewhere()
    assert idle >= 0
    with busy_processes(2):
        assert running(2) >= 2


def test_this_process_own_running_threads_are_not_counted_as_busy_elsewhere() -> None:
    """A worker thread of ours still computing (as one spinning after a forward) is ours, not another
    program's: it is counted among our running threads, which `busy_elsewhere` takes off."""
    stop = threading.Event()

    def work() -> None:
        a = torch.ones(256, 256)
        while not stop.is_set():
            a @ a  # releases the GIL: runs beside the thread that reads /proc

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert max(threads._own_running() for _ in range(50)) >= 2
    finally:
        stop.set()
        worker.join(5)


@pytest.mark.skipif(CORES < 2, reason="one core: there is no fewer count to fall back on")
def test_a_rewrite_on_a_busy_machine_runs_on_fewer_threads_with_the_same_answer(
    memorising_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, instruction, answer = MEMORISED_REWRITES[0]
    request = RewriteRequest(original, instruction=instruction, language="python")
    backend = LocalBackend(EngineOptions(model=str(memorising_model_dir), threads=2))
    session, engine = Session(backend), backend.load()
    assert engine.loaded.exactness is not None and 1 in engine.loaded.exactness.fewer_threads
    idle = session.run(request)
    with busy_processes(CORES):
        assert running(CORES) >= CORES
        busy = session.run(request)
        with as_transformers_runs_it(engine):  # the bench's peer: kernels the probe did not check
            prepared = prepare_rewrite(engine, request)
            stock = on_model_thread(lambda: run_rewrite(engine, prepared, draft="none"))  # as the bench runs it
        monkeypatch.setenv("SPECEDIT_ADAPT_THREADS", "0")
        kept = session.run(request)
    assert idle.text == busy.text == kept.text == answer
    assert busy.stats.threads == 1 and kept.stats.threads == 2 and stock.generation.stats.threads == 2
    assert on_model_thread(torch.get_num_threads) == 2  # restored after the rewrite, where it ran
