"""The engine daemon (`specedit serve`): one model in memory, shared by every editor and the command line.

Connections are served by asyncio; generation runs on one worker thread, one request at a time, so a
second request waits for the one running to finish (or be cancelled), then for the requests queued
before it. The queue is FIFO with round robin across clients: a client's k-th outstanding request waits
behind every other client's earlier-numbered ones, so one busy client cannot starve another. Each request
learns its place (`queued`), then streams `text` and `step` frames, and ends with exactly one `done`.

Cancelling (a `cancel` message, or the client disconnecting) sets a flag that the speculative loop checks
before every step, so the engine is free within one step; a request still waiting is dropped at once.

When no request waits, the worker prefills the documents editors said are open (`warm`, the most recent
first; a newer text of the same document replaces the older) into the engine's prefix cache, so that a
request on one of them pays only for its instruction. Warming gives way between two layers of a forward
as soon as a request arrives, and resumes after it.

Starting is race-free: the daemon holds an exclusive flock on `<socket>.lock` for its whole life, so of
two daemons started at the same moment one serves and the other exits (status 0, "already running").
Whoever holds the lock owns the socket path: a socket file left by a crashed daemon is stale by
definition and is replaced. The lock file itself is never deleted (deleting lock files reopens the race).
Next to the socket: `<socket>.json` (pid, address, model) and, when a client spawned the daemon,
`<socket>.log`. Rewrites run through a `session.LocalSession` on the worker thread. This module imports
neither torch nor transformers until it loads the model. `python -m specedit.engine.serving.daemon` serves
the `DaemonConfig` it reads as JSON on standard input (how `ensure_daemon` starts one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import itertools
import json
import logging
import os
import secrets
import signal
import socket
import stat
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specedit.engine.errors import EngineUnavailableError, SpeceditError
from specedit.engine.requests import RewriteOutcome, RewriteRequest, StepInfo, WarmRequest
from specedit.engine.serving.config import LOOPBACK_HOSTS, DaemonConfig, peer_uid, prepare_state_dir, read_token
from specedit.engine.serving.protocol import (
    END_OF_STREAM,
    HANDSHAKE_NONCE_BYTES,
    HELLO_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    Challenge,
    ClientMessage,
    DaemonMessage,
    Done,
    Error,
    ErrorCode,
    HelloOk,
    ProtocolError,
    Queued,
    Rewrite,
    Started,
    StatusOk,
    Step,
    StopOk,
    Text,
    Warm,
    WarmOk,
    encode_frame,
    error_code_for,
    from_wire,
    handshake_proof,
    is_handshake_proof,
    parse_client_message,
    read_payload,
    to_wire,
)
from specedit.engine.session import LocalSession

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0  # seconds a new connection has to say hello
STOP_GRACE = 30.0  # seconds to wait for the running request to notice its cancel flag when stopping
RECENT_REQUESTS = 16  # finished requests kept for `status`
WARM_PENDING = 8  # documents waiting to be warmed; the least recently offered go
_SHUTTING_DOWN: tuple[ErrorCode, str] = ("shutting_down", "the engine daemon is stopping")


# -------------------------------------------------------------------------------------------- serve


def serve(
    config: DaemonConfig,
    *,
    session: LocalSession | None = None,
    on_ready: Callable[[Daemon], None] | None = None,
) -> int:
    """Run the daemon until `stop`, a signal, or the idle timeout; the exit status.

    0 also when another daemon already serves this address (it keeps serving; nothing is started).
    `session`: serve this session (say, with an engine already loaded: tests, embedding) instead of one
    that loads `config.options`.
    `on_ready`: called on the daemon's event loop once it accepts connections (before the model is
    loaded); from then on `Daemon.stop` works from any thread.
    """
    prepare_state_dir(config)
    token = read_token(config.token_file) if config.token_file is not None else None
    # Port 0 asks for a fresh port, which nobody else can be serving: no lock needed.
    lock_fd = _acquire_lock(config.lock_path) if not (config.tcp and config.port == 0) else None
    if lock_fd is None and not (config.tcp and config.port == 0):
        log.warning("a daemon already serves %s (%s); not starting another", config.address, _owner(config))
        return 0
    listener: socket.socket | None = None
    socket_id: tuple[int, int] | None = None
    info_path: Path | None = None
    try:
        if config.socket_path is not None:
            if not _clear_stale_socket(config.socket_path):
                log.warning("a daemon that holds no lock answers on %s; not starting another", config.address)
                return 0
            listener, socket_id = _bind_unix(config.socket_path)
        else:
            listener = _bind_tcp(config)
        daemon = Daemon(config, listener, session=session or LocalSession(config.options), token=token)
        info_path = config._state_file(".json", port=listener.getsockname()[1]) if config.tcp else config.info_path
        _write_info(info_path, daemon)
        log.info("serving on %s (pid %d)", daemon.address, os.getpid())
        return asyncio.run(daemon.run(on_ready))
    finally:
        if listener is not None:
            listener.close()
        if config.socket_path is not None and socket_id is not None:
            _remove_if_same(config.socket_path, socket_id)
        if info_path is not None:
            with contextlib.suppress(FileNotFoundError):
                info_path.unlink()
        if lock_fd is not None:
            os.close(lock_fd)  # releases the flock; the lock file stays


def _acquire_lock(path: Path) -> int | None:
    """An exclusive flock held until the fd is closed (or the process dies); None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _owner(config: DaemonConfig) -> str:
    try:
        return f"pid {json.loads(config.info_path.read_text())['pid']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "still starting"


def _answering_uid(path: Path) -> int | None:
    """The uid of the process that answers on the socket at `path` (-1 when the system does not say);
    None when nobody answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return None
        uid = peer_uid(probe)
    return -1 if uid is None else uid


def _clear_stale_socket(path: Path) -> bool:
    """Remove a socket file nobody answers on (with the lock held); False when our own daemon answers.
    Another user's socket or process there is an error: never reported as "already running"."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return True
    if not stat.S_ISSOCK(info.st_mode):
        raise EngineUnavailableError(f"{path} exists and is not a socket; not touching it")
    uid = _answering_uid(path)
    if uid is not None:
        if info.st_uid != os.getuid() or uid not in (os.getuid(), -1):
            raise EngineUnavailableError(f"another user's process listens on {path}; not starting a daemon there")
        return False
    log.info("removing the stale socket %s", path)
    path.unlink()
    return True


def _bind_unix(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """Bind under a temporary name, make it 0600, listen, then rename into place: the socket is never
    reachable with a looser mode, and no process-wide umask is touched."""
    temporary = path.with_name(f".{os.getpid()}.s")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(temporary))
        os.chmod(temporary, 0o600)
        listener.listen(64)
        os.rename(temporary, path)
        info = path.lstat()
    except OSError as error:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise EngineUnavailableError(f"cannot listen on {path}: {error}") from error
    listener.setblocking(False)
    return listener, (info.st_dev, info.st_ino)


def _bind_tcp(config: DaemonConfig) -> socket.socket:
    host = str(config.host)
    if host not in LOOPBACK_HOSTS:
        log.warning("listening on %s (--allow-remote): reachable from other machines; only the token guards it", host)
    try:
        listener = socket.create_server((host, int(config.port or 0)), backlog=64)
    except OSError as error:
        raise EngineUnavailableError(f"cannot listen on {config.address}: {error}") from error
    listener.setblocking(False)
    return listener


def _remove_if_same(path: Path, socket_id: tuple[int, int]) -> None:
    with contextlib.suppress(FileNotFoundError):
        info = path.lstat()
        if (info.st_dev, info.st_ino) == socket_id:
            path.unlink()


def _write_info(path: Path, daemon: Daemon) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(
            {
                "pid": os.getpid(),
                "address": daemon.address,
                "model": daemon.config.options.model,
                "options": daemon.config.to_dict()["options"],  # what `client.running_daemon` compares
                "protocol": PROTOCOL_VERSION,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
            file,
        )
    os.replace(temporary, path)


# ------------------------------------------------------------------------------------------ daemon


class _Connection:
    """One client connection; lives on the event loop thread."""

    def __init__(self, number: int, writer: asyncio.StreamWriter) -> None:
        self.number = number
        self.writer = writer
        self.greeted = False
        self.nonces: tuple[bytes, bytes] | None = None  # TCP, between the challenge and the proof: (hello's, ours)
        self.client = "?"
        self.jobs: dict[str, _Job] = {}
        self.dropped = False  # the peer is gone (or going): nothing more is written

    @property
    def open(self) -> bool:
        return not self.dropped and not self.writer.is_closing()

    def send(self, message: DaemonMessage) -> None:
        self.send_frame(encode_frame(message))

    def send_frame(self, frame: bytes) -> None:
        if self.open:
            self.writer.write(frame)

    def error(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        self.send(Error(type="error", code=code, message=message, id=request_id))

    async def close(self) -> None:
        if self.writer.is_closing():
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.writer.drain()
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.writer.wait_closed()


@dataclass(eq=False)
class _Job:
    id: str
    connection: _Connection
    request: RewriteRequest
    key: tuple[int, int]  # (round, arrival): the queue order
    queued_at: float = field(default_factory=time.monotonic)
    cancel_flag: threading.Event = field(default_factory=threading.Event)
    position: int = -1  # last position sent
    started_at: float | None = None
    steps: int = 0  # written by the worker thread, read by the loop (an int: no lock needed)
    steps_at_cancel: int | None = None

    def cancel(self) -> None:
        if not self.cancel_flag.is_set():
            self.steps_at_cancel = self.steps
            self.cancel_flag.set()


class Daemon:
    """The serving state. Built by `serve`; `run` on its own event loop."""

    def __init__(
        self, config: DaemonConfig, listener: socket.socket, *, session: LocalSession, token: str | None
    ) -> None:
        self.config = config
        self._listener = listener
        self._session = session
        self._token = token
        self._state = "ready" if session.engine is not None else "loading"
        self._failure: tuple[ErrorCode, str] | None = None
        self._exit_code = 0
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._numbers = itertools.count(1)
        self._arrivals = itertools.count()
        self._waiting: list[_Job] = []
        self._running: _Job | None = None
        self._to_warm: OrderedDict[str, WarmRequest] = OrderedDict()  # by document name, newest last
        self._warming: str | None = None
        self._served: Counter[str] = Counter()
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REQUESTS)
        self._started_wall = time.time()
        self._started = time.monotonic()
        self._idle_since = time.monotonic()
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specedit-engine")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._wakeup: asyncio.Event | None = None
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
        self._wakeup = asyncio.Event()
        if self.config.tcp:
            server = await asyncio.start_server(self._serve_connection, sock=self._listener)
        else:
            server = await asyncio.start_unix_server(self._serve_connection, sock=self._listener)
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.add_signal_handler(signum, self.stop)
        scheduler = asyncio.create_task(self._schedule())
        idle_watch = asyncio.create_task(self._watch_idle())
        if on_ready is not None:
            on_ready(self)
        await self._stop_requested.wait()

        log.info("stopping")
        server.close()  # no new connections; the socket file goes when `serve` returns
        try:
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.shield(scheduler)
        except asyncio.TimeoutError:
            log.warning("the engine did not stop within %.0f s; exiting anyway", STOP_GRACE)
        idle_watch.cancel()
        await asyncio.gather(*(connection.close() for connection in list(self._connections)))
        # Let the connection handlers finish on their own: cancelling a stream handler makes Python 3.11
        # log a spurious CancelledError traceback.
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)
        self._executor.shutdown(wait=False)
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
        if self._stopping:
            return
        self._stopping = True
        self._state = "stopping" if self._state != "failed" else "failed"
        if self._running is not None:
            self._running.cancel()
        for job in list(self._waiting):
            self._waiting.remove(job)
            self._finish(job, self._done(job, error=_SHUTTING_DOWN))
        assert self._stop_requested is not None and self._wakeup is not None
        self._wakeup.set()
        self._stop_requested.set()

    async def _watch_idle(self) -> None:
        timeout = self.config.idle_timeout
        if timeout is None:
            return
        while not self._stopping:
            await asyncio.sleep(min(1.0, timeout / 4))
            if not self._clients() and time.monotonic() - self._idle_since >= timeout:
                log.info("no client for %.0f s: exiting", timeout)
                self._begin_stop()

    # -- connections

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(next(self._numbers), writer)
        self._connections.add(connection)
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

    def _peer_allowed(self, writer: asyncio.StreamWriter) -> bool:
        """Unix sockets: the peer must run as our user (the 0600 file mode already says so; this is
        a second check). TCP peers prove they hold the token in the handshake (`_hello`, `_proof`)."""
        sock = writer.get_extra_info("socket")
        if self.config.tcp or sock is None:
            return True
        uid = peer_uid(sock)
        return uid is None or uid in (os.getuid(), 0)

    async def _converse(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        while not self._stopping:
            # Until the hello is accepted, frames are small and must come soon: an unauthenticated peer
            # can make the daemon neither allocate much nor stay alive (idle timeout) by lingering.
            try:
                if connection.greeted:
                    payload = await read_payload(reader, self.config.max_frame_size)
                else:
                    limit = min(HELLO_MAX_FRAME_SIZE, self.config.max_frame_size)
                    async with asyncio.timeout(HELLO_TIMEOUT):
                        payload = await read_payload(reader, limit)
                if payload is END_OF_STREAM:
                    return
                asked = _version_of_another_hello(payload)  # before its fields are checked: they change with it
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

    def _dispatch(self, connection: _Connection, message: ClientMessage) -> bool:
        """Act on one message; False to close the connection."""
        if message["type"] == "hello":
            return self._hello(connection, message["nonce"], message["client"])
        if message["type"] == "proof":
            return self._proof(connection, message["proof"])
        if not connection.greeted:
            connection.error("hello_required", "the first message must be hello")
            return False
        if message["type"] == "rewrite":
            self._submit(connection, message)
        elif message["type"] == "cancel":
            job = connection.jobs.get(message["id"])
            if job is not None:
                self._cancel(job)
        elif message["type"] == "warm":
            connection.send(WarmOk(type="warm_ok", accepted=self._offer_warm(message)))
        elif message["type"] == "status":
            connection.send(StatusOk(type="status_ok", info=self.status_info()))
        elif message["type"] == "stop":
            log.info("connection %d (%s) asked to stop", connection.number, connection.client)
            connection.send(StopOk(type="stop_ok"))
            self._begin_stop()
        return True

    def _hello(self, connection: _Connection, nonce: bytes | None, client: str) -> bool:
        """A unix socket's peer (its uid checked) is welcome at once; over TCP, the daemon proves it holds
        the token (`challenge`) and waits for the client's proof (`_proof`) before it takes anything."""
        if connection.greeted:
            connection.error("bad_message", "hello twice")
            return True
        if connection.nonces is not None:
            connection.error("bad_message", "hello twice, before the proof")
            return False
        connection.client = "".join(c if c.isprintable() else "?" for c in client[:200])  # no forged log lines
        if self._token is None:
            self._welcome(connection)
            return True
        if nonce is None or len(nonce) != HANDSHAKE_NONCE_BYTES:
            log.warning("connection %d (%s): a hello without a nonce over TCP", connection.number, connection.client)
            connection.error("unauthorized", f"over TCP a hello carries a nonce of {HANDSHAKE_NONCE_BYTES} bytes")
            return False
        ours = secrets.token_bytes(HANDSHAKE_NONCE_BYTES)
        connection.nonces = (nonce, ours)
        proof = handshake_proof(self._token, "server", nonce, ours)
        connection.send(Challenge(type="challenge", nonce=ours, proof=proof))
        return True

    def _proof(self, connection: _Connection, proof: bytes) -> bool:
        """TCP: the client's proof that it holds the token, checked in constant time; only then is it a client."""
        if connection.greeted:
            connection.error("bad_message", "a proof after hello_ok")
            return True
        if self._token is None or connection.nonces is None:
            connection.error("hello_required", "a proof answers the challenge to a hello")
            return False
        if not is_handshake_proof(proof, self._token, "client", *connection.nonces):
            log.warning("connection %d (%s): wrong proof (not the token)", connection.number, connection.client)
            connection.error("unauthorized", "wrong or missing token")
            return False
        self._welcome(connection)
        return True

    def _welcome(self, connection: _Connection) -> None:
        connection.greeted = True
        connection.nonces = None
        log.info("connection %d: hello from %s", connection.number, connection.client)
        connection.send(HelloOk(type="hello_ok", version=PROTOCOL_VERSION, pid=os.getpid()))

    def _drop(self, connection: _Connection) -> None:
        """A connection closed: cancel what it asked for."""
        connection.dropped = True
        self._connections.discard(connection)
        for job in list(connection.jobs.values()):
            self._cancel(job)
        if connection.greeted and not self._clients():
            self._idle_since = time.monotonic()

    def _clients(self) -> list[_Connection]:
        """The connections that said hello: only they keep an idle daemon alive (a peer that connects
        and never authenticates, again and again, does not)."""
        return [connection for connection in self._connections if connection.greeted]

    # -- the queue

    def _submit(self, connection: _Connection, message: Rewrite) -> None:
        request_id = message["id"]
        if request_id in connection.jobs:
            connection.error("duplicate_id", f"request {request_id!r} is already queued or running", request_id)
            return
        try:
            request = from_wire(RewriteRequest, message["request"])
        except (ProtocolError, ValueError) as error:
            connection.send(_bare_done(request_id, error=("bad_request", str(error))))
            return
        if self._failure is not None or self._stopping:
            connection.send(_bare_done(request_id, error=self._failure or _SHUTTING_DOWN))
            return
        round_ = len(connection.jobs)  # how many of its own requests this client already has in line
        job = _Job(request_id, connection, request, (round_, next(self._arrivals)))
        connection.jobs[request_id] = job
        self._waiting.append(job)
        log.info("connection %d: request %s queued", connection.number, request_id)
        self._send_positions()
        assert self._wakeup is not None
        self._wakeup.set()

    def _offer_warm(self, message: Warm) -> bool:
        if self.config.options.prefix_cache_mb == 0 or self._failure is not None or self._stopping:
            return False
        try:
            request = from_wire(WarmRequest, message["request"])
        except (ProtocolError, ValueError):
            return False
        self._to_warm.pop(request.name, None)
        self._to_warm[request.name] = request
        while len(self._to_warm) > WARM_PENDING:
            self._to_warm.popitem(last=False)
        assert self._wakeup is not None
        self._wakeup.set()
        return True

    def _cancel(self, job: _Job) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
            job.cancel()
            self._finish(job, self._done(job, RewriteOutcome.cancelled_before_start()))
            self._send_positions()
        elif job is self._running:
            log.info("request %s: cancelling at step %d", job.id, job.steps)
            job.cancel()

    def _send_positions(self) -> None:
        ahead = 1 if self._running is not None else 0
        for position, job in enumerate(sorted(self._waiting, key=lambda j: j.key), start=ahead):
            if position != job.position:
                job.position = position
                loading = self._session.engine is None
                job.connection.send(Queued(type="queued", id=job.id, position=position, loading=loading))

    async def _schedule(self) -> None:
        """Load the model, then run the queued requests one at a time on the worker thread."""
        assert self._loop is not None and self._wakeup is not None
        if self._session.engine is None:
            try:
                # On the worker thread, which runs every rewrite: torch's thread count is per thread.
                await self._loop.run_in_executor(self._executor, self._session.load)
            except Exception as error:
                log.error("the model did not load: %s", error, exc_info=not isinstance(error, SpeceditError))
                self._state = "failed"
                self._failure = (error_code_for(error), str(error))
                self._exit_code = error.exit_code if isinstance(error, SpeceditError) else 1
                for job in list(self._waiting):
                    self._waiting.remove(job)
                    self._finish(job, self._done(job, error=self._failure))
                self._begin_stop()
                return
            if not self._stopping:
                self._state = "ready"
        while not self._stopping:
            await self._wakeup.wait()
            self._wakeup.clear()
            while not self._stopping:
                if self._waiting:
                    job = min(self._waiting, key=lambda j: j.key)
                    self._waiting.remove(job)
                    await self._run(job)
                elif self._to_warm:
                    await self._warm(*self._to_warm.popitem())
                else:
                    break

    async def _run(self, job: _Job) -> None:
        assert self._loop is not None
        self._running = job
        job.started_at = time.monotonic()
        job.connection.send(Started(type="started", id=job.id))
        self._send_positions()
        try:
            done = await self._loop.run_in_executor(self._executor, self._generate, job)
        finally:
            self._running = None
        self._finish(job, done)

    async def _warm(self, name: str, request: WarmRequest) -> None:
        """Prefill `request` on the worker until done or a request arrives (then it waits its turn again)."""
        assert self._loop is not None

        def should_stop() -> bool:  # read on the worker thread; the list's truth needs no lock
            return bool(self._waiting) or self._stopping

        self._warming = name
        try:
            cached, total = await self._loop.run_in_executor(
                self._executor, self._session.prefill, request, should_stop
            )
        except Exception:
            log.exception("warming %s failed", name)
            return
        finally:
            self._warming = None
        if cached < total and name not in self._to_warm and not self._stopping:
            self._to_warm[name] = request
            self._to_warm.move_to_end(name, last=False)  # after the documents offered since
        log.info("warm %s: %d of %d prompt tokens cached", name, cached, total)

    def _generate(self, job: _Job) -> Done:
        """On the worker thread: run one rewrite, streaming text and steps back through the loop."""
        loop, connection = self._loop, job.connection
        assert loop is not None

        def on_text(delta: str) -> None:
            frame = encode_frame(Text(type="text", id=job.id, delta=delta))
            loop.call_soon_threadsafe(connection.send_frame, frame)

        def on_step(info: StepInfo) -> None:
            job.steps = info.step
            frame = encode_frame(Step(type="step", id=job.id, info=to_wire(info)))
            loop.call_soon_threadsafe(connection.send_frame, frame)

        try:
            outcome = self._session.run(job.request, on_text=on_text, on_step=on_step, cancel=job.cancel_flag)
        except Exception as error:
            if not isinstance(error, SpeceditError):
                log.exception("request %s failed", job.id)
            return self._done(job, error=(error_code_for(error), str(error)))
        return self._done(job, outcome)

    def _done(self, job: _Job, outcome: RewriteOutcome | None = None, *, error: tuple[str, str] | None = None) -> Done:
        """The `done` of `job`: its outcome with the queue's figures added to its stats, or its error."""
        if outcome is None:
            return _bare_done(job.id, error=error)
        stats = dict(outcome.stats)
        stats["queue_seconds"] = round((job.started_at or time.monotonic()) - job.queued_at, 4)
        if job.steps_at_cancel is not None:
            stats["steps_after_cancel"] = job.steps - job.steps_at_cancel
        return _bare_done(job.id, outcome=dataclasses.replace(outcome, stats=stats))

    def _finish(self, job: _Job, done: Done) -> None:
        """The request is over: tell its client (if still connected) and remember it for `status`."""
        job.connection.jobs.pop(job.id, None)
        job.connection.send(done)
        outcome = done["outcome"] or {}
        stats = outcome.get("stats", {})
        status = outcome.get("status", "error")
        self._served[status] += 1
        self._recent.append(
            {
                "id": job.id,
                "connection": job.connection.number,
                "status": status,
                "finish_reason": outcome.get("finish_reason"),
                "steps": job.steps,
                "steps_after_cancel": stats.get("steps_after_cancel"),
                "queue_seconds": stats.get("queue_seconds"),
                "wall_seconds": stats.get("wall_seconds"),
                "error_code": done["error_code"],
            }
        )
        log.info("request %s: %s after %d steps", job.id, status, job.steps)

    # -- status

    def status_info(self) -> dict[str, Any]:
        engine = self._session.engine
        running = self._running
        options = self.config.options
        dtype = engine.loaded.dtype_name if engine is not None else options.dtype
        return {
            "pid": os.getpid(),
            "address": self.address,
            "protocol": PROTOCOL_VERSION,
            "state": self._state,  # loading | ready | stopping | failed
            "model": engine.loaded.name if engine is not None else options.model or "default",
            "device": str(engine.device) if engine is not None else options.device,
            "exactness": engine.loaded.exactness.to_dict() if engine is not None and engine.loaded.exactness else None,
            "dtype": dtype,
            "fallback": engine.fallback.describe() if engine is not None and engine.fallback is not None else None,
            "uptime_seconds": round(time.monotonic() - self._started, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self._started_wall)),
            "clients": len(self._clients()),
            "queue_length": len(self._waiting),
            "running": None
            if running is None
            else {
                "id": running.id,
                "connection": running.connection.number,
                "steps": running.steps,
                "seconds": round(time.monotonic() - (running.started_at or time.monotonic()), 3),
                "cancelled": running.cancel_flag.is_set(),
            },
            "served": dict(self._served),
            "prefix_cache": engine.prefix_cache.describe()
            if engine is not None and engine.prefix_cache is not None
            else None,
            "warming": self._warming,
            "to_warm": len(self._to_warm),
            "recent": list(self._recent),
            "idle_timeout": self.config.idle_timeout,
            "max_frame_size": self.config.max_frame_size,
        }


class QuietLoopErrors:
    """The event loop's exception handler: each kind of error logged once per `interval`, in one line.
    Under a low descriptor limit asyncio reports every failed accept (measured: ~11,000 tracebacks in 12 s)."""

    def __init__(self, interval: float = 10.0) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "event loop error")
        error = context.get("exception")
        key = f"{message}: {type(error).__name__}" if error is not None else message
        now = time.monotonic()
        if now - self._last.get(key, -self._interval) < self._interval:
            self._suppressed[key] += 1
            return
        self._last[key] = now
        repeated = self._suppressed.pop(key, 0)
        log.warning(
            "%s%s%s", message, f": {error}" if error is not None else "", f" (and {repeated} more)" * bool(repeated)
        )


def _version_of_another_hello(payload: object) -> int | None:
    """The version a hello asks for, if it is not ours, whatever else the hello holds (a version-5 client's
    has a token and no nonce): refused as such, not as a message with the wrong fields."""
    if not isinstance(payload, dict) or payload.get("type") != "hello":
        return None
    version = payload.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version != PROTOCOL_VERSION:
        return version
    return None


def _bare_done(request_id: str, *, outcome: RewriteOutcome | None = None, error: tuple[str, str] | None = None) -> Done:
    return Done(
        type="done",
        id=request_id,
        outcome=to_wire(outcome) if outcome is not None else None,
        error_code=error[0] if error else None,
        error_message=error[1] if error else None,
    )


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
