"""The one thread that runs the model in this process.

torch's CPU threads are OpenMP's (libgomp): every thread that runs an operator in parallel keeps a team of
worker threads of its own for as long as it lives. Two such threads alive in one process make more OpenMP
threads than cores (torch takes one per core), and libgomp then stops its workers spinning between two
operators: they sleep, and every operator wakes them again. A whole-file rewrite of 313 tokens (AMD EPYC,
AVX512-BF16, 2 threads, int8) took 3.4 s on the thread that had loaded the model and 4.3-4.8 s on another
thread while that one lived, with no more CPU time: through the daemon, where the model loads on one
thread and each rewrite runs on another, every rewrite paid it.

So everything that runs the model (the load and its self-check, rewrites, completions, warming, the bench's
own methods) runs here, on one thread started on first use: `on_model_thread` hands it a call and waits
for its result. A call made on the model thread itself runs at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import TypeVar

T = TypeVar("T")

# Calls for the model thread; None wakes a `serve_while` whose wait is over.
_jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None
_serving = 0  # calls on the model thread now waiting in `serve_while` (each below the calls it serves)


def on_model_thread(work: Callable[[], T]) -> T:
    """`work()`, run on the model thread (now, if this is it); its result, or the exception it raised."""
    if threading.current_thread() is _thread:
        return work()
    future: Future[T] = Future()
    _start()
    _jobs.put(partial(_run, work, future))
    return future.result()


def serving() -> bool:
    """Whether a call on the model thread waits beneath this one (`serve_while`): this one must end before
    that one can go on, so it must not wait for it in turn."""
    return _serving > 0


def serve_while(wait: Callable[[], T]) -> T:
    """On the model thread, a call that must wait for others to be run first (a long prefill giving way to
    the rewrites ahead of it): `wait()` runs on a thread of its own, and the calls handed to the model
    thread meanwhile run here, until it returns; its result. A call run here resumes the one beneath only
    when it ends: it must not wait for that one (`serving`)."""
    global _serving
    assert threading.current_thread() is _thread, "serve_while is for calls on the model thread"
    waited: Future[T] = Future()

    def waiting() -> None:
        try:
            waited.set_result(wait())
        except BaseException as error:  # raised on the model thread, below
            waited.set_exception(error)
        finally:
            _jobs.put(None)

    threading.Thread(target=waiting, name="specedit-waits-its-turn", daemon=True).start()
    _serving += 1
    try:
        while not waited.done():
            job = _jobs.get()
            if job is not None:  # (a None is this wait's, or an outer one's that ended first: it checks again)
                job()
    finally:
        _serving -= 1
    return waited.result()


def _start() -> None:
    global _thread
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_serve, name="specedit-model", daemon=True)
            _thread.start()


def _serve() -> None:
    while True:
        job = _jobs.get()
        if job is not None:
            job()


def _run(work: Callable[[], T], future: Future[T]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = work()
    except BaseException as error:  # the caller's to handle
        future.set_exception(error)
    else:
        future.set_result(result)
