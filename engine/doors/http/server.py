"""The HTTP door's server: uvicorn, on its h11 protocol (whose parser refuses a request's head over
`HEAD_BYTES`), with the daemon's budget of connections (`doors.listening`).

A connection is unproven until a request's head carrying the token has come whole. Unproven connections
are few (`listening.Unproven`: the oldest is closed to make room for a new one) and short-lived: a head
must come within `HEAD_SECONDS` of the connection (or of the last answer), and a request without the
token is answered, then its connection closed. So idle or slow peers cost a bounded number of
descriptors, and the owner's requests are served beside them. uvicorn's own limits do the rest:
`limit_concurrency` (a 503 at the door's limit), `timeout_keep_alive`, h11's head size. Not
`limit_max_requests`: it ends the server, which here is the daemon's door.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from specedit.engine.doors import listening

HEAD_BYTES = 32 * 1024  # a request's line and headers (an OpenAI client's take under 2 KB); h11 answers 400 past it
HEAD_SECONDS = listening.PROVE_SECONDS  # for a request's head, from the connection or the last answer
KEEP_ALIVE_SECONDS = 5  # uvicorn's default, said here: an idle connection closes after it


def server_config(app: ASGIApp, *, authorized: Callable[[bytes], bool], connections: int) -> uvicorn.Config:
    """uvicorn's config for the door's `app`, holding at most `connections` connections at once;
    `authorized`: whether an `Authorization` header's value carries the token."""
    unproven = listening.Unproven(
        in_all=min(listening.UNPROVEN_IN_ALL, connections // 4),
        per_peer=min(listening.UNPROVEN_PER_PEER, connections // 4),
    )
    protocol = budgeted_protocol(unproven, authorized=authorized, connections=connections, head_seconds=HEAD_SECONDS)
    return uvicorn.Config(
        app,
        http=protocol,
        ws="none",  # no upgrade out of the budget: the door has no websockets
        log_level="warning",
        lifespan="off",
        access_log=False,
        limit_concurrency=connections,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        h11_max_incomplete_event_size=HEAD_BYTES,
    )


def budgeted_protocol(
    unproven: listening.Unproven, *, authorized: Callable[[bytes], bool], connections: int, head_seconds: float
) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection budget the module docstring describes."""

    class Budgeted(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > connections and not unproven.make_room():
                transport.abort()  # full of proven connections: this descriptor is the owner's reserve
                return
            unproven.admit(self, self.client[0] if self.client else "?", transport.abort)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            unproven.proven(self)  # gone
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is cycle:
                return
            # A request's head came whole: the deadline is met, and the token says who it is.
            self._stop_waiting()
            token = next((value for name, value in self.headers if name == b"authorization"), b"")
            if authorized(token):
                unproven.proven(self)
            else:  # answered (401, 404), then closed, as the answer says
                self.cycle.keep_alive = False
                self.cycle.default_headers = [*self.cycle.default_headers, CLOSE_HEADER]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._await_head()  # the next request's

        def _await_head(self) -> None:
            self._stop_waiting()
            self._head_timer = self.loop.call_later(head_seconds, self._head_late)

        def _stop_waiting(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self.cycle is None or self.cycle.response_complete:  # no request runs: none came in time
                self.transport.abort()

    return Budgeted
