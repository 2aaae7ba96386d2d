"""A daemon's rewrites: each request streamed from the session to the connection that asked for it, and a
record of the last ones for `status`.

A request is checked on a thread first (its texts of up to 1 MB each are measured), and its sketch is read
on the session's thread (`sketch.Sketch`): the event loop serves every door. Its events go back as
`event` frames, its phases first, then text and steps, and last its judged `done` (or an error). A job
refused while the daemon stops sends nothing more; one whose connection is gone is cancelled and sends
nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TypedDict

from specedit.engine.backends.connection import Connection
from specedit.engine.backends.protocol import Event as EventMessage
from specedit.engine.backends.protocol import Rewrite
from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.events import Done, Phase, Step, error_to_wire, event_to_wire
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest
from specedit.engine.records.stats import Stats
from specedit.engine.records.wire import ErrorCode, ProtocolError, error_code_for, from_wire
from specedit.engine.session.session import Session

log = logging.getLogger(__name__)

RECENT_REQUESTS = 16  # finished requests kept for `status`


@dataclass(eq=False)
class Job:
    """One rewrite a connection asked for, from its request to its end."""

    id: str
    connection: Connection[Job]
    wire: dict[str, object]  # the request as it came (`RewriteRequest`, checked off the event loop)
    cancel: threading.Event = field(default_factory=threading.Event)
    started_at: float | None = None  # when its turn came
    steps: int = 0
    refused: bool = False  # told the daemon is stopping before its turn came: nothing more is sent for it


class RunningJob(TypedDict):
    """`status`'s view of the rewrite that has the model now."""

    id: str
    connection: int
    steps: int
    seconds: float
    cancelled: bool


class FinishedJob(TypedDict):
    """`status`'s record of a finished request."""

    id: str
    connection: int
    status: str  # the outcome's status, or "refused" or "error"
    finish_reason: str | None
    steps: int
    steps_after_cancel: int | None
    queue_seconds: float | None
    wall_seconds: float | None
    error_code: ErrorCode | None


class Jobs:
    """The daemon's rewrites in flight (their tasks, the one running) and a record of the last ones."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.tasks: set[asyncio.Task[None]] = set()
        self.running: Job | None = None
        self.served: Counter[str] = Counter()  # finished requests by status
        self.recent: deque[FinishedJob] = deque(maxlen=RECENT_REQUESTS)

    def submit(self, connection: Connection[Job], message: Rewrite, refusal: tuple[ErrorCode, str] | None) -> None:
        """Queue a connection's rewrite, or refuse it at once: a duplicate id, or `refusal` (why the daemon
        takes no more)."""
        request_id = message["id"]
        if request_id in connection.jobs:
            connection.error("duplicate_id", f"request {request_id!r} is already queued or running", request_id)
            return
        if refusal is not None:
            connection.send(error_event(request_id, ProtocolError(*refusal)))
            return
        job = Job(request_id, connection, message["request"])
        connection.jobs[request_id] = job
        log.info("connection %d: request %s", connection.number, request_id)
        task = asyncio.create_task(self._serve(job))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def running_info(self) -> RunningJob | None:
        running = self.running
        if running is None:
            return None
        return {
            "id": running.id,
            "connection": running.connection.number,
            "steps": running.steps,
            "seconds": round(time.monotonic() - (running.started_at or time.monotonic()), 3),
            "cancelled": running.cancel.is_set(),
        }

    async def _serve(self, job: Job) -> None:
        """Stream one rewrite's events to its connection (nothing, once it is refused or gone)."""
        connection = job.connection
        try:
            request = await asyncio.to_thread(from_wire, RewriteRequest, job.wire)
        except (ProtocolError, ValueError) as error:
            connection.jobs.pop(job.id, None)
            if not job.refused:
                connection.send(error_event(job.id, ProtocolError("bad_request", str(error))))
            return
        if job.refused:  # the daemon began to stop meanwhile: it said so
            connection.jobs.pop(job.id, None)
            self._remember(job, None, None)
            return
        events = self._session.stream(request, cancel=job.cancel, client=f"connection {connection.number}")
        outcome: RewriteOutcome | None = None
        failure: Exception | None = None
        try:
            async for event in events:
                if isinstance(event, Phase) and event.name == "started":
                    job.started_at, self.running = time.monotonic(), job
                elif isinstance(event, Step):
                    job.steps = event.step
                elif isinstance(event, Done):
                    outcome = event.outcome
                if not job.refused:
                    connection.send(EventMessage(type="event", id=job.id, event=event_to_wire(event)))
        except Exception as error:  # the client is told; the daemon carries on
            if not isinstance(error, SpeceditError):
                log.exception("request %s failed", job.id)
            failure = error
            if not job.refused:
                connection.send(error_event(job.id, error))
        finally:
            if self.running is job:
                self.running = None
            connection.jobs.pop(job.id, None)
            self._remember(job, outcome, failure)

    def _remember(self, job: Job, outcome: RewriteOutcome | None, failure: Exception | None) -> None:
        """The request is over: remember it for `status`."""
        status = "refused" if job.refused else outcome.status if outcome is not None else "error"
        stats = outcome.stats if outcome is not None else Stats.before_start()
        self.served[status] += 1
        self.recent.append(
            {
                "id": job.id,
                "connection": job.connection.number,
                "status": status,
                "finish_reason": outcome.finish_reason if outcome is not None else None,
                "steps": job.steps,
                "steps_after_cancel": stats.steps_after_cancel,
                "queue_seconds": stats.queue_seconds,
                "wall_seconds": stats.wall_seconds if stats.ran else None,
                "error_code": error_code_for(failure) if failure is not None else None,
            }
        )
        log.info("request %s: %s after %d steps", job.id, status, job.steps)


def error_event(request_id: str, error: Exception) -> EventMessage:
    """The message that ends a request with `error` (`ProtocolError`s carry their own code)."""
    return EventMessage(type="event", id=request_id, event=error_to_wire(error))
