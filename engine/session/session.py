"""What a rewrite is, once for every front end: `Session(backend)`.

    session = local_session(EngineOptions(model="qwen2.5-coder-1.5b-instruct"))   # the model in this process
    session = remote_session("/run/user/1000/specedit/engine.sock")                # a running daemon
    session = remote_session("https://team-engine:8000", token_file="team.token")  # a Ray Serve cluster
    session = remote_session(None, spawn=EngineOptions())                          # the shared daemon, on demand
    outcome = session.run(RewriteRequest(original, "Rename add to plus."), on_event=print)

The session owns the rules around the model. It reads a request's sketch once (`sketch.Sketch`: a chat
answer's code, the format, the patch, the merge by lines). A sketch whose lines say where each part goes
is merged by them here, in milliseconds, and no backend is asked (no model loads, no daemon starts).
Anything else streams from the backend (`Backend`: in process, a daemon, a cluster, which move events and
nothing else), with the sketch as read for the draft. The answer is judged (`judged`: an answer to a
sketch that is no merge of it, an empty answer, a budget run out) into the outcome's status. The events
come out as one typed stream (`events`), to a callback (`run`, blocking) or to an asyncio host (`stream`,
the one bridge from the thread that runs to the event loop). The command line, the language server, the
daemon, the cluster's replicas and the HTTP door all run rewrites here and switch on the outcome's
status; none holds a rule of its own. This module imports no torch until a local backend loads its model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from specedit.engine.records.events import Done, Event, Step, Text
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome, RewriteRequest, WarmRequest

if TYPE_CHECKING:
    from specedit.engine.backends.local import LocalBackend
    from specedit.engine.loop.generate import Engine
    from specedit.engine.sketch.sketch import Sketch
    from specedit.engine.store.fetch import ProgressCallback

log = logging.getLogger(__name__)

EventCallback = Callable[[Event], None]
Request = RewriteRequest | CompletionRequest
T = TypeVar("T")
# A heavy sketch's merge by its lines holds a turn while the others wait: its loops stop it past this long
# (a merge takes about a second for 1 MB; more is a case the merge handles badly, not a bigger input).
MERGE_SECONDS = 10.0


class Backend(Protocol):
    """Where a rewrite runs. It moves events (`Text`, `Step`, `Phase`; the session adds `Done`) and
    returns the outcome as the model left it; it holds no rule of what a rewrite is."""

    def run(
        self,
        request: Request,
        emit: EventCallback,
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,
    ) -> RewriteOutcome:
        """Run one rewrite (or a completion: an OpenAI request, which only a backend in this process runs)
        to its end, or until `cancel` is set (from any thread); blocking. `client` names who asks, for fair
        turns among clients. `sketch` is the request's sketch as the session read it, for the draft of a
        model in this process; a backend elsewhere sends the request's text, and its host reads it there.
        Errors are raised as `SpeceditError`s."""
        ...

    def in_turn(self, work: Callable[[], T], emit: EventCallback, cancel: threading.Event, client: str) -> T | None:
        """Run `work`, the session's own work on a heavy request (`RewriteRequest.heavy`: a long sketch
        read and merged by its lines), where it slows no other client's rewrite: in a turn of its own where the
        model runs in this process (told `Phase("queued")` while it waits), at once where it runs elsewhere.
        None if `cancel` was set while it waited."""
        ...

    def warm(self, request: WarmRequest) -> bool:
        """Offer a document the user has open, to prefill its prompt's start while the engine is idle (see
        `model.prefix_cache`). Returns at once; never loads a model or starts a daemon; errors are logged."""
        ...

    def keep_alive(self, wanted: bool) -> None:
        """While `wanted` (an editor has documents open), keep the engine from exiting when idle; never
        loads a model or starts a daemon."""
        ...

    def start(self) -> None:
        """Have the engine ready before the first rewrite: the model loaded (a daemon started, which loads
        it, if none answers); blocking. Errors are raised, and the next rewrite meets them again."""
        ...

    def close(self) -> None: ...


class Session:
    """Rewrites on one backend, with the rules of what a rewrite is (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def run(
        self,
        request: Request,
        on_event: EventCallback | None = None,
        *,
        cancel: threading.Event | None = None,
        client: str = "",
    ) -> RewriteOutcome:
        """Run one rewrite to its end (blocking), or until `cancel` is set (from any thread): its events to
        `on_event` as they come, `Done` last; the judged outcome. Errors are raised as `SpeceditError`s."""
        from specedit.engine.sketch.deadline import Cancelled

        emit = on_event or _ignore
        cancel = cancel or threading.Event()
        counted = _StepsAfterCancel(emit, cancel)
        outcome: RewriteOutcome | None = None
        sketch: Sketch | None = None
        if isinstance(request, RewriteRequest) and request.sketch is not None:
            read = functools.partial(_timed, read_sketch, request, cancel)
            try:  # a heavy sketch merged by its lines takes a turn (None: cancelled while it waited)
                by_lines = request.merge == "auto" and request.heavy
                found = self.backend.in_turn(read, counted, cancel, client) if by_lines else read()
            except Cancelled:
                found, outcome = None, RewriteOutcome.cancelled_before_start()
            if found is not None:
                sketch, seconds = found
                request = sketch.asked(request)  # a chat answer: its code
                outcome = merged_by_lines(sketch, seconds)
        if outcome is not None:
            if outcome.text:
                emit(Text(outcome.text))
        else:
            outcome = self.backend.run(request, counted, cancel, client, sketch)
        outcome = counted.stamped(outcome)
        if isinstance(request, RewriteRequest):
            outcome = judged(request, outcome, sketch)
        emit(Done(outcome))
        return outcome

    def stream(self, request: Request, *, cancel: threading.Event | None = None, client: str = "") -> EventStream:
        """The rewrite's events for an asyncio host (`async for event in session.stream(request)`): it runs
        on a thread of its own; leaving the stream early (`aclose`, or the host's task ending) cancels it."""
        return EventStream(self, request, cancel or threading.Event(), client)

    def warm(self, request: WarmRequest) -> bool:
        return self.backend.warm(request)

    def keep_alive(self, wanted: bool) -> None:
        self.backend.keep_alive(wanted)

    def start(self) -> None:
        self.backend.start()

    def close(self) -> None:
        self.backend.close()


class EventStream:
    """The one bridge from the thread a rewrite runs on to an event loop: an async iterator of its events,
    `Done` last (or the error it ended with, raised). A task cancelled while it waits for the next event
    (the language server's `$/cancelRequest`) may go on reading: the stream is intact, and the host sets
    `cancel` to end the rewrite within a step. `ended` resolves when the rewrite's thread is done, read or
    not: its outcome, or None if it failed."""

    def __init__(self, session: Session, request: Request, cancel: threading.Event, client: str) -> None:
        self.cancel = cancel
        self._queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self._ended = False
        loop = asyncio.get_running_loop()
        self.ended: asyncio.Future[RewriteOutcome | None] = loop.create_future()

        def put(item: Event | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the host's loop has closed: nobody reads any more
                loop.call_soon_threadsafe(self._queue.put_nowait, item)

        def work() -> None:
            outcome = None
            try:
                outcome = session.run(request, put, cancel=cancel, client=client)
            except BaseException as error:  # raised where the stream is read; the host carries on
                put(error)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.ended.set_result, outcome)

        threading.Thread(target=work, name="specedit-rewrite", daemon=True).start()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._ended:
            raise StopAsyncIteration
        # Let other tasks run between two events: a burst (a fast model's steps) read whole would delay
        # what the host does with the first of them (the language server's writer) until the last.
        await asyncio.sleep(0)
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        self._ended = isinstance(item, Done)
        return item

    async def aclose(self) -> None:
        """Stop reading: the rewrite is cancelled (within a step) if it still runs."""
        if not self._ended:
            self.cancel.set()
        self._ended = True


def read_sketch(request: RewriteRequest, cancel: threading.Event) -> Sketch:
    """The request's sketch read once (`Sketch.of`), merged by its lines where the answer may be that merge
    (`merge` auto; for the model the merge is its draft, made in its turn). A heavy one's merge holds a turn:
    its loops stop past `MERGE_SECONDS` with a clear `InputError`, or at once when `cancel` is set
    (`deadline.Cancelled`)."""
    from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline
    from specedit.engine.sketch.sketch import Sketch

    by_lines = request.merge == "auto"
    deadline = NO_DEADLINE
    if by_lines and request.heavy:
        deadline = Deadline(MERGE_SECONDS, cancel, late=_too_long(request))
    return Sketch.of(request, merge=by_lines, deadline=deadline)


def merged_by_lines(sketch: Sketch, seconds: float) -> RewriteOutcome | None:
    """The answer to a sketch whose every chunk says where it goes (`merge.merge_sketch`): its merge by
    lines, made in `seconds` with no model; else None (not merged, or not resolved)."""
    from specedit.engine.records.stats import Stats

    if sketch.merge is None:
        return None
    if not sketch.merge.resolved:
        log.info("the model merges the sketch: %s", "; ".join(sketch.merge.unresolved))
        return None
    return RewriteOutcome.finished(sketch.merge.text, "stop", Stats(wall_seconds=seconds, merge="lines"))


def judged(request: RewriteRequest, outcome: RewriteOutcome, sketch: Sketch | None = None) -> RewriteOutcome:
    """The outcome with the status its answer deserves, the one place that says which answers are written:
    a complete answer to a sketch that is no merge of it (`Sketch.check`; nor one that writes the prose or
    fences of the chat answer the sketch came in) is `not_a_merge`; an empty or whitespace-only answer for a
    region that has code is `empty`, unless the request allows it; a budget run out is `incomplete`. Each
    says why (`problem`). `sketch` is the request's sketch as the session read it; without it, the
    request's sketch is read here, as it is (no chat answer taken out)."""
    from specedit.engine.sketch.sketch import Sketch

    if sketch is not None and sketch.chat_answer is not None:  # the stats say where the sketch came from
        stats = dataclasses.replace(outcome.stats, sketch_from=sketch.chat_answer.describe())
        outcome = dataclasses.replace(outcome, stats=stats)

    if outcome.status == "incomplete":
        generated = outcome.stats.generated_tokens
        return dataclasses.replace(
            outcome,
            problem=f"the model used all {generated} tokens of its budget without finishing the code; "
            "nothing was written (raise --max-new-tokens)",
        )
    if not outcome.complete:
        return outcome
    if not outcome.text.strip() and request.original.strip() and not request.allow_empty:
        return dataclasses.replace(
            outcome,
            status="empty",
            problem="the model answered nothing for code that has some; nothing was written (--allow-empty "
            "writes such an answer)",
        )
    if request.sketch is not None:
        if sketch is None:
            sketch = Sketch.read(request.original, request.sketch, request.sketch_format, from_chat=False, merge=False)
        check = sketch.check(outcome.text)
        if not check.ok:
            return dataclasses.replace(
                outcome,
                status="not_a_merge",
                problem=f"the answer is not a merge of the edit sketch: {check.describe()}; nothing was written",
            )
    return outcome


def _timed(
    work: Callable[[RewriteRequest, threading.Event], T], request: RewriteRequest, cancel: threading.Event
) -> tuple[T, float]:
    """`work(request, cancel)`, and the seconds it took."""
    started = time.perf_counter()
    return work(request, cancel), time.perf_counter() - started


def _too_long(request: RewriteRequest) -> str:
    """What a heavy sketch's merge past `MERGE_SECONDS` says (`deadline.Deadline`'s `InputError`)."""
    size = len(request.original) + len(request.sketch or "")
    return (
        f"the edit sketch took over {MERGE_SECONDS:.0f} s to merge into the code ({size:,} characters together); "
        "nothing was written: send a smaller region or sketch"
    )


class _StepsAfterCancel:
    """Passes the backend's events on, counting the steps that came after `cancel` was set (the engine
    checks before every step: at most one), for the outcome's stats."""

    def __init__(self, emit: EventCallback, cancel: threading.Event) -> None:
        self._emit, self._cancel = emit, cancel
        self.steps = 0

    def __call__(self, event: Event) -> None:
        if isinstance(event, Step) and self._cancel.is_set():
            self.steps += 1
        self._emit(event)

    def stamped(self, outcome: RewriteOutcome) -> RewriteOutcome:
        if not self._cancel.is_set():
            return outcome
        return dataclasses.replace(outcome, stats=dataclasses.replace(outcome.stats, steps_after_cancel=self.steps))


def _ignore(event: Event) -> None:
    pass


def local_session(
    options: EngineOptions | None = None,
    *,
    engine: Engine | None = None,
    progress: ProgressCallback | None = None,
    one_off: bool = False,
) -> Session:
    """The model in this process (`backends.local.LocalBackend`), loaded on first use (or `engine`);
    `one_off`: in a process that runs a rewrite or a few and exits (`backends.local.load_target`)."""
    from specedit.engine.backends.local import LocalBackend

    return Session(LocalBackend(options, engine=engine, progress=progress, one_off=one_off))


def local_backend(session: Session) -> LocalBackend | None:
    """The session's model in this process, if it runs here (for what only that has: the loaded engine)."""
    from specedit.engine.backends.local import LocalBackend

    return session.backend if isinstance(session.backend, LocalBackend) else None


def remote_session(
    address: str | None,
    *,
    token_file: str | None = None,
    spawn: EngineOptions | None = None,
    client_name: str | None = None,
) -> Session:
    """The session for an engine address: a cluster's (`http(s)://HOST:PORT`, `backends.cluster`; the
    model `spawn` names, if any, is chosen among the deployment's), or a daemon's (a socket path,
    `tcp://HOST:PORT`; None: the shared one, started with `spawn`)."""
    if address is not None and address.startswith(("http://", "https://")):
        from specedit.engine.backends.cluster import ClusterBackend

        return Session(ClusterBackend(address, token_file=token_file, model=spawn.model if spawn else None))
    from specedit.engine.backends.remote import DaemonBackend

    return Session(DaemonBackend(address, token_file=token_file, spawn=spawn, client_name=client_name))
