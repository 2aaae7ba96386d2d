"""The session's rules, once for every front end, on a backend that only moves events (a test double beside
the real ones, which the daemon, cluster and command-line tests run): what is merged without a backend,
which answers are written, the steps after a cancel, and the one bridge to asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

from specedit.engine.records.errors import ContextLengthError, EmptyAnswerError, IncompleteOutputError, MergeError
from specedit.engine.records.events import Done, Event, Phase, Step, Text, error_to_wire, event_from_wire, event_to_wire
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest
from specedit.engine.records.stats import Stats
from specedit.engine.session.session import Session
from specedit.engine.sketch.sketch import Sketch

from conftest import ECHOED_SKETCH, LINES_SKETCH, AnsweringBackend

ORIGINAL = "def add(a, b):\n    return a + b\n"


def step(number: int) -> Step:
    return Step(number, 10 + number, 9 + number, 4, 3, number, 4 * number, 3 * number, 0.1 * number)


class ScriptedBackend(AnsweringBackend):
    """Answers every rewrite with `answer` after `events`; `wait` (if set) holds it until set, or until
    the rewrite is cancelled. Counts what it was asked."""

    def __init__(self, answer: str, events: Sequence[Event] = (), *, finish: str = "stop") -> None:
        super().__init__(answer)
        self.events, self.finish = events, finish
        self.wait: threading.Event | None = None

    def run(
        self,
        request: RewriteRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,
    ) -> RewriteOutcome:
        self.asked.append(request)
        self.sketches.append(sketch)
        for event in self.events:
            emit(event)
        if self.wait is not None:
            while not self.wait.is_set() and not cancel.is_set():
                self.wait.wait(0.01)
            if cancel.is_set():
                emit(step(99))  # the one step a cancel may still see
                return RewriteOutcome.finished("", "cancelled", Stats.before_start())
        emit(Text(self.answer))
        return RewriteOutcome.finished(self.answer, self.finish, Stats(generated_tokens=7))  # type: ignore[arg-type]


def test_a_sketch_its_lines_place_is_merged_without_the_backend() -> None:
    original, sketch, merged = LINES_SKETCH
    backend = ScriptedBackend("never asked")
    events: list[Event] = []
    outcome = Session(backend).run(RewriteRequest(original, sketch=sketch), events.append)
    assert outcome.text == merged and outcome.complete and outcome.stats.merge == "lines"
    assert events == [Text(merged), Done(outcome)] and backend.asked == []


def test_an_answer_that_is_no_merge_of_its_sketch_is_judged_so() -> None:
    original, sketch, echoed = ECHOED_SKETCH
    outcome = Session(ScriptedBackend(echoed)).run(RewriteRequest(original, sketch=sketch))
    assert outcome.status == "not_a_merge" and "still holds elision markers" in outcome.problem
    error = outcome.error()
    assert isinstance(error, MergeError) and error.exit_code == 11


@pytest.mark.parametrize("answer", ["", "\n  \n"])
def test_an_empty_answer_for_code_is_judged_so_unless_allowed(answer: str) -> None:
    session = Session(ScriptedBackend(answer))
    outcome = session.run(RewriteRequest(ORIGINAL, "Delete it."))
    assert outcome.status == "empty" and isinstance(outcome.error(), EmptyAnswerError)
    assert session.run(RewriteRequest(ORIGINAL, "Delete it.", allow_empty=True)).complete
    assert session.run(RewriteRequest("\n", "Write nothing.")).complete  # nothing there to lose


def test_a_budget_run_out_is_incomplete_and_says_so() -> None:
    outcome = Session(ScriptedBackend("def add(a, b):\n", finish="length")).run(RewriteRequest(ORIGINAL, "Grow."))
    assert outcome.status == "incomplete" and "all 7 tokens of its budget" in outcome.problem
    assert isinstance(outcome.error(), IncompleteOutputError)


def test_the_events_come_in_order_and_the_steps_after_a_cancel_are_counted() -> None:
    backend = ScriptedBackend("", [Phase("queued", 1), Phase("started"), step(1)])
    backend.wait = threading.Event()
    cancel = threading.Event()
    events: list[Event] = []
    thread = threading.Thread(
        target=lambda: Session(backend).run(RewriteRequest(ORIGINAL, "Wait."), events.append, cancel=cancel)
    )
    thread.start()
    cancel.set()
    thread.join(5)
    assert events[:3] == [Phase("queued", 1), Phase("started"), step(1)]
    done = events[-1]
    assert isinstance(done, Done) and done.outcome.status == "cancelled"
    assert done.outcome.stats.steps_after_cancel == 1


def test_the_stream_bridges_to_asyncio_and_leaving_it_cancels_the_rewrite() -> None:
    async def read_all() -> list[Event]:
        return [
            event
            async for event in Session(ScriptedBackend("x = 2\n", [step(1)])).stream(RewriteRequest("x = 1\n", "Two."))
        ]

    events = asyncio.run(read_all())
    assert events[0] == step(1) and events[1] == Text("x = 2\n") and isinstance(events[-1], Done)

    backend = ScriptedBackend("", [Phase("started")])
    backend.wait = threading.Event()

    async def leave_early() -> RewriteOutcome | None:
        stream = Session(backend).stream(RewriteRequest(ORIGINAL, "Wait."))
        assert await anext(stream) == Phase("started")
        await stream.aclose()  # the host went away (a client hung up)
        return await asyncio.wait_for(stream.ended, 5)

    ended = asyncio.run(leave_early())
    assert ended is not None and ended.status == "cancelled"


def test_a_task_cancelled_while_it_waits_may_read_on() -> None:
    """The language server's `$/cancelRequest` cancels the task that reads; it answers the request with
    the rewrite's end all the same, so the stream survives the cancellation."""
    backend = ScriptedBackend("", [Phase("started")])
    backend.wait = threading.Event()

    async def read() -> RewriteOutcome:
        stream = Session(backend).stream(RewriteRequest(ORIGINAL, "Wait."))
        task = asyncio.ensure_future(anext(stream))
        assert await task == Phase("started")
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        stream.cancel.set()
        async for event in stream:
            if isinstance(event, Done):
                return event.outcome
        raise AssertionError("no end")

    assert asyncio.run(read()).status == "cancelled"


def test_an_error_ends_the_stream_where_it_is_read() -> None:
    class Failing(ScriptedBackend):
        def run(self, *args: object, **kwargs: object) -> RewriteOutcome:
            raise ContextLengthError("too long for the model")

    async def read() -> None:
        async for _ in Session(Failing("")).stream(RewriteRequest(ORIGINAL, "x")):
            pass

    with pytest.raises(ContextLengthError, match="too long"):
        asyncio.run(read())


@pytest.mark.parametrize(
    "event",
    [
        Text("é 🙂\n"),
        step(3),
        Phase("loading"),
        Phase("queued", 2),
        Done(RewriteOutcome("x\n", "not_a_merge", "stop", Stats(generated_tokens=1, merge="model"), "why")),
    ],
)
def test_one_encoding_each_way(event: Event) -> None:
    assert event_from_wire(event_to_wire(event)) == event


def test_an_error_record_raises_the_error_it_carries() -> None:
    with pytest.raises(ContextLengthError, match="too long"):
        event_from_wire(error_to_wire(ContextLengthError("too long")))
