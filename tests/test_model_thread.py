"""The one thread that runs the model (`model.model_thread`): whoever asks, the load and every rewrite run
there (a second thread running torch makes libgomp's workers sleep between operators); a call that
must wait for others (a prefill giving way) runs them meanwhile; errors reach the caller."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from specedit.engine.backends.local import LocalBackend
from specedit.engine.loop.generate import Engine
from specedit.engine.model.loading import load_model
from specedit.engine.model.model_thread import on_model_thread, serve_while
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import CompletionRequest, RewriteRequest
from specedit.engine.session.session import Session

TIMEOUT = 30


def in_threads(count: int, work: Any) -> list[Any]:
    """`work()` called from `count` threads at once; their results."""
    results: list[Any] = [None] * count

    def call(index: int) -> None:
        results[index] = work()

    threads = [threading.Thread(target=call, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    return results


def test_calls_from_any_thread_run_on_one_other_thread() -> None:
    model_thread = on_model_thread(threading.get_ident)
    assert model_thread != threading.get_ident()
    assert in_threads(4, lambda: on_model_thread(threading.get_ident)) == [model_thread] * 4


def test_a_call_on_the_model_thread_runs_at_once_and_errors_reach_the_caller() -> None:
    assert on_model_thread(lambda: on_model_thread(lambda: 7)) == 7  # no deadlock waiting for itself
    with pytest.raises(ZeroDivisionError):
        on_model_thread(lambda: 1 / 0)
    assert on_model_thread(lambda: "still serving") == "still serving"


def test_a_call_that_waits_runs_the_calls_handed_over_meanwhile() -> None:
    """A call waiting for another (a long prefill's turn after a short rewrite's) serves it, nested too."""
    inner_released, outer_released = threading.Event(), threading.Event()
    order: list[str] = []

    def outer() -> str:
        result = serve_while(lambda: outer_released.wait(TIMEOUT) and "outer waited")
        order.append("outer")
        return result

    def inner() -> str:  # handed over while the outer one waits; itself waits for the last call
        result = serve_while(lambda: inner_released.wait(TIMEOUT) and "inner waited")
        order.append("inner")
        outer_released.set()
        return result

    def last() -> str:
        order.append("last")
        inner_released.set()
        return "last"

    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda name=name, call=call: results.update({name: on_model_thread(call)}))
        for name, call in (("outer", outer), ("inner", inner), ("last", last))
    ]
    for thread in threads:
        thread.start()
        thread.join(0.2)  # each handed over after the one before
    for thread in threads:
        thread.join(TIMEOUT)
    assert results == {"outer": "outer waited", "inner": "inner waited", "last": "last"}
    assert order == ["last", "inner", "outer"]


class ThreadRecorder:
    """A loaded model that notes the thread of every forward."""

    def __init__(self, loaded: Any) -> None:
        self._loaded = loaded
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loaded, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.get_ident())
        return self._loaded.forward(*args, **kwargs)


def test_the_backend_loads_and_runs_everything_on_the_model_thread(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specedit.engine.backends import local

    loads: list[int] = []
    recorder: dict[str, ThreadRecorder] = {}

    def open_engine(options: EngineOptions, **_: Any) -> Engine:
        loads.append(threading.get_ident())
        recorder["model"] = ThreadRecorder(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
        return Engine(recorder["model"])  # type: ignore[arg-type]

    monkeypatch.setattr(local, "open_engine", open_engine)
    session = Session(LocalBackend(EngineOptions(model=str(tiny_model_dir))))
    rewrite = RewriteRequest("def add(a, b):\n    return a + b\n", "Rename add to plus.", max_new_tokens=4)
    completion = CompletionRequest(prompt="def add(a, b):", prediction="    return a + b\n", max_new_tokens=4)
    outcomes = in_threads(2, lambda: session.run(rewrite)) + in_threads(2, lambda: session.run(completion))
    assert all(outcome.complete or outcome.status == "incomplete" for outcome in outcomes)
    assert loads == [on_model_thread(threading.get_ident)]
    assert recorder["model"].threads == set(loads)
