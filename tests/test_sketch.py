"""A request's sketch is read once (`sketch.Sketch`): the session takes a chat answer's code, finds the
format, parses a patch and merges by lines, and the draft and the judgement use what it read. A heavy
sketch's merge keeps its deadline by itself: its loops check it and stop with a clear error."""

from __future__ import annotations

import doctest
import gc
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from specedit.engine.loop.rewrite import prepare_rewrite
from specedit.engine.records.errors import InputError
from specedit.engine.records.requests import RewriteRequest
from specedit.engine.session import session as session_module
from specedit.engine.session.session import Session
from specedit.engine.sketch import deadline, merge, patches, sketch
from specedit.engine.sketch.deadline import Deadline
from specedit.engine.sketch.sketch import Sketch

from conftest import LINES_SKETCH, AnsweringBackend, tiny_engine

TWICE = "value = 1\ntotal = 2\n\nvalue = 1\ntotal = 2\n"
# A diff whose lines the file has twice, with no line number to say which: the lines cannot place it.
DOUBTFUL_DIFF = "--- a/t.py\n+++ b/t.py\n@@ ... @@\n value = 1\n-total = 2\n+total = 3\n"
FIRST_CHANGED = "value = 1\ntotal = 3\n\nvalue = 1\ntotal = 2\n"


def counting(monkeypatch: pytest.MonkeyPatch, *functions: Callable[..., object]) -> Counter[str]:
    """How often each of `functions` is called from now on, under whatever name a specedit module holds it."""
    calls: Counter[str] = Counter()
    for function in functions:

        def counted(*args: object, _function: Callable[..., object] = function, **kwargs: object) -> object:
            calls[_function.__name__] += 1
            return _function(*args, **kwargs)

        for module in list(sys.modules.values()):
            if module is not None and module.__name__.startswith("specedit."):
                for name, value in list(vars(module).items()):
                    if value is function:
                        monkeypatch.setattr(module, name, counted)
    return calls


def test_the_worked_examples() -> None:
    assert doctest.testmod(sketch).failed == 0
    assert doctest.testmod(deadline).failed == 0


def test_a_requests_sketch_is_read_once_for_the_session_the_draft_and_the_judgement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The format is found once, the patch parsed once and merged once: the draft takes the partial merge
    the session made, and the judgement checks the answer with the format and hunks it read."""
    calls = counting(monkeypatch, patches.detect, patches.parse_patch, patches.apply_patch)
    backend = AnsweringBackend(FIRST_CHANGED)
    outcome = Session(backend).run(RewriteRequest(TWICE, sketch=DOUBTFUL_DIFF))
    assert outcome.complete and outcome.text == FIRST_CHANGED  # the model's answer, judged a merge of the diff
    [asked], [read] = backend.asked, backend.sketches
    assert read is not None and read.format == "udiff" and read.patch is not None
    assert read.merge is not None and not read.merge.resolved and asked.sketch == read.text
    prepared = prepare_rewrite(tiny_engine("qwen2"), asked, read)
    assert prepared.sketch_merge is read.merge and prepared.prompt.sketch_format == "udiff"
    assert calls == {"detect": 1, "parse_patch": 1, "apply_patch": 1}


def test_the_model_gets_the_sketch_read_and_merges_it_in_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `merge` model, the session reads the sketch without merging it: the merge by lines is the
    model's draft, made in its turn (after an outsized request is refused), once."""
    calls = counting(monkeypatch, merge.merge_sketch)
    original, lazy, merged = LINES_SKETCH
    backend = AnsweringBackend(merged)
    assert Session(backend).run(RewriteRequest(original, sketch=lazy, merge="model")).complete
    [asked], [read] = backend.asked, backend.sketches
    assert read is not None and read.format == "lazy" and read.merge is None and calls["merge_sketch"] == 0
    prepared = prepare_rewrite(tiny_engine("qwen2"), asked, read)
    assert prepared.sketch_merge is not None and prepared.sketch_merge.text == merged
    assert calls["merge_sketch"] == 1


def test_a_prompt_for_a_sketch_names_the_format_its_reading_found() -> None:
    request = RewriteRequest(TWICE, sketch=DOUBTFUL_DIFF)
    with pytest.raises(ValueError, match="found by reading it"):
        request.prompt()
    assert request.prompt(Sketch.of(request, merge=False).format).sketch_format == "udiff"
    assert RewriteRequest(TWICE, sketch=DOUBTFUL_DIFF, sketch_format="lazy").prompt().sketch_format == "lazy"


# --- the deadline: kept by the merge's own loops ---------------------------------------------------------


def handlers(count: int) -> str:
    """A file of `count` functions alike, whose lines but two repeat in every one."""
    return "".join(
        f"def handler_{n}(items):\n    total = 0\n    for item in items:\n        total += item.price * {n % 7 + 1}\n"
        f"    log.info('order %s', {n})\n    return total\n\n\n"
        for n in range(count)
    )


def sketches(count: int) -> Iterator[tuple[str, str]]:
    """Sketches changing the log line of each of `count` handlers: lazy, and as a unified diff."""
    original = handlers(count)
    new = original.replace("log.info('order", "log.info('large order")
    blocks = new.split("\n\n\n")[:count]
    yield "lazy", "".join(f"# ... existing code ...\n{block}\n\n\n" for block in blocks)
    hunks = [
        f"@@ -{8 * n + 5},2 +{8 * n + 5},2 @@\n-    log.info('order %s', {n})\n"
        f"+    log.info('large order %s', {n})\n     return total\n"
        for n in range(count)
    ]
    yield "udiff", "--- a/h.py\n+++ b/h.py\n" + "".join(hunks)


def cpu_seconds(work: Callable[[], object]) -> float:
    started = time.thread_time()
    work()
    return time.thread_time() - started


@pytest.mark.parametrize("kind", ["lazy", "udiff"])
def test_a_merge_past_its_deadline_stops_soon_with_a_clear_error(kind: str) -> None:
    """The merge's loops check the deadline between two pieces of work (a chunk placed, a hunk applied, a
    chunk's span checked): past it, the merge stops within a small share of its whole work. Counted in
    this thread's CPU time (a clock of the test's own), with the collector off: the work alone."""
    original = handlers(1500)
    text = dict(sketches(1500))[kind]
    assert Sketch.read(original, text).merge == Sketch.read(original, text, sketch_format=kind).merge
    gc.disable()
    try:
        whole = min(cpu_seconds(lambda: Sketch.read(original, text)) for _ in range(2))
        limit = Deadline(whole / 10, late="the sketch took too long", clock=time.thread_time)
        started = time.thread_time()
        with pytest.raises(InputError, match="took too long"):
            Sketch.read(original, text, deadline=limit)
        spent = time.thread_time() - started
    finally:
        gc.enable()
    assert spent < whole / 2, (spent, whole)


def test_a_heavy_sketch_past_its_deadline_is_refused_by_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's turn for a heavy merge ends with the clear error, on the session's own thread: no
    thread is left merging, and the backend is never asked."""
    monkeypatch.setattr(session_module, "MERGE_SECONDS", 0.0)
    original = handlers(2000)
    heavy = RewriteRequest(original, sketch=dict(sketches(2000))["lazy"])
    assert heavy.heavy
    backend = AnsweringBackend("never asked")
    threads = threading.active_count()
    with pytest.raises(InputError, match=r"took over 0 s to merge .* send a smaller region or sketch"):
        Session(backend).run(heavy)
    assert backend.asked == [] and threading.active_count() <= threads  # no thread left merging


def test_a_heavy_merge_cancelled_is_a_cancelled_outcome() -> None:
    original = handlers(2000)
    heavy = RewriteRequest(original, sketch=dict(sketches(2000))["lazy"])
    cancel = threading.Event()
    cancel.set()
    backend = AnsweringBackend("never asked")
    outcome = Session(backend).run(heavy, cancel=cancel)
    assert outcome.status == "cancelled" and outcome.finish_reason is None and backend.asked == []
