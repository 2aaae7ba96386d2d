"""The engine daemon (`specedit serve`): one model in memory, shared by every editor and the command line.

The daemon's host serves connections on asyncio, over a unix socket or TCP, and each rewrite streams from its
session (`session.Session` over a `backends.local.LocalBackend`, which runs one rewrite at a time in turns
fair across connections and warms the documents editors said are open between them; `daemon_jobs`). It
can open the HTTP door on the same session (`http.door`). Every door keeps a budget of connections
(`listening`), and a request through any door keeps an idle-timed daemon alive. Cancelling (a `cancel`
message, or the client disconnecting) sets a flag the loop checks before every step, so the engine is free
within one step. Starting is race-free: the daemon holds an exclusive flock on `<socket>.lock` for its whole
life, so of two daemons started at once one serves and the other exits (status 0, "already running"); a
socket file left by a crashed daemon is stale by definition and is replaced, and the lock file is never
deleted (deleting lock files reopens the race). This module imports neither torch nor transformers until it
loads the model. `python -m specedit.engine.doors.daemon` serves the `DaemonConfig` it reads as JSON on
standard input (how `ensure_daemon` starts one).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from specedit.engine.backends.config import DaemonConfig, http_address, peer_uid, prepare_state_dir, read_token
from specedit.engine.backends.connection import Connection, QuietLoopErrors, version_of_another_hello
from specedit.engine.backends.local import LocalBackend
from specedit.engine.backends.protocol import (
    END_OF_STREAM,
    HELLO_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    ClientMessage,
    StatusOk,
    StopOk,
    Warm,
    WarmOk,
    parse_client_message,
    read_payload,
)
from specedit.engine.doors import listening
from specedit.engine.doors.daemon_jobs import FinishedJob, Job, Jobs, RunningJob, error_event
from specedit.engine.records.errors import EngineUnavailableError, SpeceditError
from specedit.engine.records.requests import WarmRequest
from specedit.engine.records.wire import ErrorCode, ProtocolError, error_code_for, from_wire
from specedit.engine.session.session import Session

if TYPE_CHECKING:
    import uvicorn

    from specedit.engine.doors.http.door import Door

log = logging.getLogger(__name__)

HELLO_TIMEOUT = listening.PROVE_SECONDS  # seconds a new connection has for its hello (and over TCP, its proof)
STOP_GRACE = 30.0  # seconds to wait for the running request to notice its cancel flag when stopping
_SHUTTING_DOWN: tuple[ErrorCode, str] = ("shutting_down", "the engine daemon is stopping")

DaemonState = Literal["loading", "ready", "stopping", "failed"]


class DaemonStatus(TypedDict):
    """What `status` answers (`StatusOk.info`, the HTTP door's `/status`)."""

    pid: int
    address: str
    protocol: int
    state: DaemonState
    model: str
    device: str | None  # None: the options leave it to the load
    exactness: dict[str, object] | None  # the self-check's verdict (`model.exactness`)
    dtype: str
    fallback: str | None
    uptime_seconds: float
    started: str
    clients: int  # connections through the hello
    queue_length: int
    running: RunningJob | None
    served: dict[str, int]  # finished requests by status
    prefix_cache: dict[str, object] | None
    warming: str | None  # the document being prefilled now
    to_warm: int
    recent: list[FinishedJob]
    idle_timeout: float | None
    max_frame_size: int
    http: str | None  # the HTTP door's address, once it listens
    door_limit: int  # connections each network door holds at most
    unproven: int  # TCP connections not through the handshake yet


# -------------------------------------------------------------------------------------------- serve


def serve(
    config: DaemonConfig,
    *,
    backend: LocalBackend | None = None,
    on_ready: Callable[[Daemon], None] | None = None,
) -> int:
    """Run the daemon until `stop`, a signal, or the idle timeout; the exit status.

    0 also when another daemon already serves this address (it keeps serving; nothing is started).
    `backend`: serve this model (say, with an engine already loaded: tests, embedding) instead of one that
    loads `config.options`.
    `on_ready`: called on the daemon's event loop once it accepts connections (before the model is
    loaded); from then on `Daemon.stop` works from any thread.
    """
    prepare_state_dir(config)
    descriptors = listening.raise_descriptor_limit()
    token = read_token(config.token_file) if config.token_file is not None else None
    # Port 0 asks for a fresh port, which nobody else can be serving: no lock needed.
    lock_fd = listening.acquire_lock(config.lock_path) if not (config.tcp and config.port == 0) else None
    if lock_fd is None and not (config.tcp and config.port == 0):
        log.warning("a daemon already serves %s (%s); not starting another", config.address, listening.owner(config))
        return 0
    listener: socket.socket | None = None
    socket_id: tuple[int, int] | None = None
    info_path: Path | None = None
    try:
        if config.socket_path is not None:
            if not listening.clear_stale_socket(config.socket_path):
                log.warning("a daemon that holds no lock answers on %s; not starting another", config.address)
                return 0
            listener, socket_id = listening.bind_unix(config.socket_path)
        else:
            listener = listening.bind_tcp(config)
        daemon = Daemon(
            config, listener, backend=backend or LocalBackend(config.options), token=token, descriptors=descriptors
        )
        info_path = config._state_file(".json", port=listener.getsockname()[1]) if config.tcp else config.info_path
        listening.write_info(info_path, daemon.address, config)
        log.info("serving on %s (pid %d)", daemon.address, os.getpid())
        return asyncio.run(daemon.run(on_ready))
    finally:
        if listener is not None:
            listener.close()
        if config.socket_path is not None and socket_id is not None:
            listening.remove_if_same(config.socket_path, socket_id)
        if info_path is not None:
            with contextlib.suppress(FileNotFoundError):
                info_path.unlink()
        if lock_fd is not None:
            os.close(lock_fd)  # releases the flock; the lock file stays


# ------------------------------------------------------------------------------------------ daemon


class Daemon:
    """The serving state: connections, and each rewrite streamed from the session (which keeps the turns,
    fair across connections, and warms open documents between them). Built by `serve`; `run` on its own
    event loop."""

    def __init__(
        self,
        config: DaemonConfig,
        listener: socket.socket,
        *,
        backend: LocalBackend,
        token: str | None,
        descriptors: int = 1024,
    ) -> None:
        """`descriptors`: the process's limit of open files, which the network doors' budgets leave a
        reserve of (`listening.door_connections`)."""
        self.config = config
        self._listener = listener
        self._backend = backend
        self._session = Session(backend)
        self._token = token if config.tcp else None  # the handshake's; a unix socket's peer is checked by uid
        self._state: DaemonState = "ready" if backend.engine is not None else "loading"
        self._failure: tuple[ErrorCode, str] | None = None
        self._exit_code = 0
        self._connections: set[Connection[Job]] = set()
        self.door_limit = listening.door_connections(descriptors)  # connections each network door holds at most
        self._unproven = listening.Unproven()  # TCP peers not through the handshake yet
        self._refused = 0  # TCP connections closed at once: the door was full of proven ones
        self._handlers: set[asyncio.Task[None]] = set()
        self._jobs = Jobs(self._session)
        self._numbers = itertools.count(1)
        self._started_wall = time.time()
        self._started = time.monotonic()
        self._idle_since = time.monotonic()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._door: Door | None = None  # the HTTP door, once it listens
        self.http_address: str | None = None  # the HTTP door's http://HOST:PORT, once it listens
        self._stop_requested: asyncio.Event | None = None
        if config.tcp:
            host, port = listener.getsockname()[:2]
            self.address = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
        else:
            self.address = config.address

    # -- lifecycle

    async def run(self, on_ready: Callable[[Daemon], None] | None = None) -> int:
        loop = self._loop = asyncio.get_running_loop()
        loop.set_exception_handler(QuietLoopErrors())
        self._stop_requested = asyncio.Event()
        if self.config.tcp:
            server = await asyncio.start_server(self._serve_connection, sock=self._listener)
        else:
            server = await asyncio.start_unix_server(self._serve_connection, sock=self._listener)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.add_signal_handler(signum, self.stop)
        loading = asyncio.create_task(self._load())
        idle_watch = asyncio.create_task(self._watch_idle())
        door = await self._open_http() if self.config.http is not None else None
        if on_ready is not None:
            on_ready(self)
        await self._stop_requested.wait()

        log.info("stopping")
        server.close()  # no new connections; the socket file goes when `serve` returns
        if self._jobs.tasks:
            _, late = await asyncio.wait(self._jobs.tasks, timeout=STOP_GRACE)
            if late:
                log.warning("the engine did not stop within %.0f s; exiting anyway", STOP_GRACE)
        loading.cancel()
        idle_watch.cancel()
        if door is not None and self._http_task is not None:
            door.should_exit = True
            await asyncio.wait([self._http_task], timeout=5.0)
        await asyncio.gather(*(connection.close() for connection in list(self._connections)))
        # Let the connection handlers finish on their own: cancelling a stream handler makes Python 3.11
        # log a spurious CancelledError traceback.
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        return self._exit_code

    def stop(self) -> None:
        """Begin a clean shutdown; callable from any thread."""
        if self._loop is None:
            return
        if _loop_thread_is_current(self._loop):
            self._begin_stop()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: it has stopped already
                self._loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        """The running rewrite is cancelled (it ends within a step, and says so); those waiting for their
        turn are refused, `shutting_down`."""
        if self._stopping:
            return
        self._stopping = True
        self._state = "stopping" if self._state != "failed" else "failed"
        for connection in self._connections:
            for job in connection.jobs.values():
                if job.started_at is None and not job.refused:
                    job.refused = True
                    connection.send(error_event(job.id, ProtocolError(*_SHUTTING_DOWN)))
                job.cancel.set()
        assert self._stop_requested is not None
        self._stop_requested.set()

    async def _open_http(self) -> uvicorn.Server:
        """The HTTP door (`http.door`: OpenAI's API and the cluster's wire) on the same session, served by
        uvicorn on this event loop within the door's budget of connections (`http.server`); its server (to
        stop). Signals stay the daemon's: it stops the server."""
        import uvicorn

        from specedit.engine.doors.http.door import Door
        from specedit.engine.doors.http.server import server_config
        from specedit.engine.store.store import DEFAULT_MODEL

        assert self.config.http is not None and self.config.token_file is not None
        host, port = http_address(self.config.http)
        try:
            listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as error:
            raise EngineUnavailableError(f"cannot listen on {self.config.http} for HTTP: {error}") from error
        bound = listener.getsockname()[1]
        self.http_address = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
        door = self._door = Door(
            self._session,
            token=read_token(self.config.token_file),
            model=self.config.options.model or DEFAULT_MODEL.name,
            status=self.status_info,
        )

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the daemon's own handlers stop everything, this server with it

        config = server_config(door.app, authorized=door.authorizes, connections=self.door_limit)
        server = Server(config)
        self._http_task = asyncio.create_task(server.serve(sockets=[listener]))
        log.info("the HTTP door (OpenAI's API) on %s", self.http_address)
        return server

    async def _load(self) -> None:
        """Load the model now, on a thread of its own; a model that does not load stops the daemon (the
        rewrites that waited for it get its error)."""
        assert self._loop is not None
        if self._backend.engine is not None:
            return
        try:
            await asyncio.to_thread(self._backend.load)
        except Exception as error:
            log.error("the model did not load: %s", error, exc_info=not isinstance(error, SpeceditError))
            self._state = "failed"
            self._failure = (error_code_for(error), str(error))
            self._exit_code = error.exit_code if isinstance(error, SpeceditError) else 1
            self._begin_stop()
            return
        if not self._stopping:
            self._state = "ready"

    async def _watch_idle(self) -> None:
        timeout = self.config.idle_timeout
        if timeout is None:
            return
        while not self._stopping:
            await asyncio.sleep(min(1.0, timeout / 4))
            door = self._door
            if self._clients() or self._jobs.tasks or (door is not None and door.running):
                continue
            last = max(self._idle_since, door.last_request if door is not None else 0.0)
            if time.monotonic() - last >= timeout:
                log.info("no client for %.0f s: exiting", timeout)
                self._begin_stop()

    # -- connections

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.config.tcp and not self._admitted(writer):
            return
        connection: Connection[Job] = Connection(next(self._numbers), writer)
        self._connections.add(connection)
        if self.config.tcp:
            peer = writer.get_extra_info("peername")
            self._unproven.admit(connection, str(peer[0]) if peer else "?", writer.transport.abort)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        try:
            if self._stopping:
                connection.error("shutting_down", "the engine daemon is stopping")
            elif not self._peer_allowed(writer):
                connection.error("unauthorized", "this socket serves only the user who started the daemon")
            else:
                await self._converse(connection, reader)
        except (ConnectionError, OSError):
            pass  # the peer went away; its jobs are cancelled below
        except Exception:  # a bug here must cost one connection, never the daemon
            log.exception("connection %d: unexpected error", connection.number)
        finally:
            self._drop(connection)
            await connection.close()

    def _admitted(self, writer: asyncio.StreamWriter) -> bool:
        """Whether the TCP door has room for one more connection: an unproven one closes to make it, if
        need be; with none, the new one is closed at once (its descriptor is the owner's reserve)."""
        if len(self._connections) < self.door_limit or self._unproven.make_room():
            return True
        self._refused += 1
        if self._refused in (1, 10, 100) or self._refused % 1000 == 0:
            log.warning("the TCP door is full (%d connections): %d refused so far", self.door_limit, self._refused)
        writer.transport.abort()
        return False

    def _peer_allowed(self, writer: asyncio.StreamWriter) -> bool:
        """Unix sockets: the peer must run as our user (the 0600 file mode already says so; this is
        a second check). TCP peers prove they hold the token in the handshake (`Connection.prove`)."""
        sock = writer.get_extra_info("socket")
        if self.config.tcp or sock is None:
            return True
        uid = peer_uid(sock)
        return uid is None or uid in (os.getuid(), 0)

    async def _converse(self, connection: Connection[Job], reader: asyncio.StreamReader) -> None:
        # Until the hello is accepted, frames are small and the whole handshake must be over soon: an
        # unauthenticated peer can make the daemon neither allocate much nor stay alive by lingering.
        deadline = asyncio.get_running_loop().time() + HELLO_TIMEOUT
        while not self._stopping:
            try:
                if connection.greeted:
                    payload = await read_payload(reader, self.config.max_frame_size)
                else:
                    limit = min(HELLO_MAX_FRAME_SIZE, self.config.max_frame_size)
                    async with asyncio.timeout_at(deadline):
                        payload = await read_payload(reader, limit)
                if payload is END_OF_STREAM:
                    return
                asked = version_of_another_hello(payload)  # before its fields are checked: they change with it
                if asked is not None:
                    connection.error(
                        "version_mismatch", f"protocol {asked} asked; this daemon speaks {PROTOCOL_VERSION}"
                    )
                    return
                message = parse_client_message(payload)
            except asyncio.TimeoutError:
                connection.error("hello_required", f"no hello within {HELLO_TIMEOUT:.0f} s")
                return
            except ProtocolError as error:
                log.info("connection %d: %s: %s", connection.number, error.code, error)
                connection.error(error.code, str(error), error.request_id)
                if error.fatal or not connection.greeted:
                    return
                continue
            if not self._dispatch(connection, message):
                return
            await connection.writer.drain()

    def _dispatch(self, connection: Connection[Job], message: ClientMessage) -> bool:
        """Act on one message; False to close the connection."""
        if message["type"] in ("hello", "proof"):
            if message["type"] == "hello":
                going_on = connection.hello(message["nonce"], message["client"], self._token)
            else:
                going_on = connection.prove(message["proof"], self._token)
            if connection.greeted:
                self._unproven.proven(connection)
            return going_on
        if not connection.greeted:
            connection.error("hello_required", "the first message must be hello")
            return False
        if message["type"] == "rewrite":
            refusal = self._failure or (_SHUTTING_DOWN if self._stopping else None)
            self._jobs.submit(connection, message, refusal)
        elif message["type"] == "cancel":
            job = connection.jobs.get(message["id"])
            if job is not None:
                log.info("request %s: cancelling at step %d", job.id, job.steps)
                job.cancel.set()
        elif message["type"] == "warm":
            connection.send(WarmOk(type="warm_ok", accepted=self._offer_warm(message)))
        elif message["type"] == "status":
            connection.send(StatusOk(type="status_ok", info=dict(self.status_info())))
        elif message["type"] == "stop":
            log.info("connection %d (%s) asked to stop", connection.number, connection.client)
            connection.send(StopOk(type="stop_ok"))
            self._begin_stop()
        return True

    def _drop(self, connection: Connection[Job]) -> None:
        """A connection closed: cancel what it asked for."""
        connection.dropped = True
        self._connections.discard(connection)
        self._unproven.proven(connection)  # gone: no longer held
        for job in list(connection.jobs.values()):
            job.cancel.set()
        if connection.greeted and not self._clients():
            self._idle_since = time.monotonic()

    def _clients(self) -> list[Connection[Job]]:
        """The connections that said hello: only they keep an idle daemon alive (a peer that connects
        and never authenticates, again and again, does not)."""
        return [connection for connection in self._connections if connection.greeted]

    # -- rewrites

    def _offer_warm(self, message: Warm) -> bool:
        if self._failure is not None or self._stopping:
            return False
        try:
            request = from_wire(WarmRequest, message["request"])
        except (ProtocolError, ValueError):
            return False
        return self._session.warm(request)

    # -- status

    def status_info(self) -> DaemonStatus:
        engine = self._backend.engine
        options = self.config.options
        dtype = engine.loaded.dtype_name if engine is not None else options.dtype
        return {
            "pid": os.getpid(),
            "address": self.address,
            "protocol": PROTOCOL_VERSION,
            "state": self._state,
            "model": engine.loaded.name if engine is not None else options.model or "default",
            "device": str(engine.device) if engine is not None else options.device,
            "exactness": engine.loaded.exactness.to_dict() if engine is not None and engine.loaded.exactness else None,
            "dtype": dtype,
            "fallback": engine.fallback.describe() if engine is not None and engine.fallback is not None else None,
            "uptime_seconds": round(time.monotonic() - self._started, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self._started_wall)),
            "clients": len(self._clients()),
            "queue_length": self._backend.waiting,
            "running": self._jobs.running_info(),
            "served": dict(self._jobs.served),
            "prefix_cache": engine.prefix_cache.describe()
            if engine is not None and engine.prefix_cache is not None
            else None,
            "warming": self._backend.warming,
            "to_warm": self._backend.to_warm(),
            "recent": list(self._jobs.recent),
            "idle_timeout": self.config.idle_timeout,
            "max_frame_size": self.config.max_frame_size,
            "http": self.http_address,
            "door_limit": self.door_limit,
            "unproven": len(self._unproven),
        }


def _loop_thread_is_current(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def main() -> int:
    """Serve the `DaemonConfig` given as JSON on standard input (`client.ensure_daemon` starts it so)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s specedit-daemon: %(message)s")
    try:
        config = DaemonConfig.from_dict(json.loads(sys.stdin.read()))
    except (ValueError, TypeError) as error:
        log.error("not a daemon config on standard input: %s", error)
        return 2
    try:
        return serve(config)
    except SpeceditError as error:
        log.error("%s", error)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
