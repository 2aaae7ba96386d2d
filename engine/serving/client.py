"""A blocking client of the engine daemon, and `ensure_daemon`: connect to one, or start one and connect.

    with ensure_daemon(DaemonConfig(options=EngineOptions(model="/path/to/model"))) as client:
        outcome = client.rewrite(RewriteRequest(original, "Rename add to plus."), on_text=print)

Front ends use it through `session.RemoteSession`.

Addresses: a filesystem path for a unix socket (`unix://PATH` also works), `tcp://HOST:PORT` for TCP,
which needs the daemon's token (`token_file=`). Over TCP the client sends nothing but its hello until the
daemon has proved it holds the token (`protocol`'s handshake); the token itself is never sent. Like
`protocol`, this module imports neither torch nor the engine, so a thin client (the CLI with `--engine`)
starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from specedit.engine.errors import EngineUnavailableError, SpeceditError
from specedit.engine.options import EngineOptions
from specedit.engine.requests import Phase, RewriteOutcome, RewriteRequest, StepInfo, WarmRequest
from specedit.engine.serving.config import DaemonConfig, check_own_socket, peer_uid, prepare_state_dir, read_token
from specedit.engine.serving.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    HANDSHAKE_NONCE_BYTES,
    PROTOCOL_VERSION,
    Cancel,
    ClientMessage,
    DaemonMessage,
    FrameBuffer,
    Hello,
    Proof,
    ProtocolError,
    Rewrite,
    Status,
    Stop,
    Warm,
    decode_payload,
    encode_frame,
    error_from,
    from_wire,
    handshake_proof,
    is_handshake_proof,
    parse_daemon_message,
    to_wire,
)

Record = TypeVar("Record")

DEFAULT_SPAWN_IDLE_TIMEOUT = 300.0  # a daemon a client started exits after 5 minutes without clients
CONNECT_TIMEOUT = 10.0  # seconds for connect + hello, and for status / stop replies
SEND_TIMEOUT = 60.0  # seconds one frame may take to go out (the daemon reads all the time)
_POLL = 0.1  # seconds between checks of the cancel flag while waiting for frames
_LOG_ROTATE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class EngineAddress:
    """Where a daemon listens: a unix socket path, or a TCP host and port."""

    path: Path | None = None
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str | os.PathLike[str]) -> EngineAddress:
        """`/run/user/1000/specedit/engine.sock`, `unix:///tmp/x.sock` or `unix:/tmp/x.sock`,
        `tcp://127.0.0.1:7341`, `tcp://[::1]:7341`."""
        text = os.fspath(text)
        if text.startswith("tcp://"):
            rest = text[len("tcp://") :].rstrip("/")
            host, colon, port = rest.rpartition(":")
            host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise EngineUnavailableError(f"not an engine address: {text!r} (expected tcp://HOST:PORT)")
            return cls(host=host, port=int(port))
        for scheme in ("unix://", "unix:"):  # the URL form, and the short one the editors' settings show
            if text.startswith(scheme):
                text = text[len(scheme) :]
                break
        if not text or "://" in text:
            raise EngineUnavailableError(f"not an engine address: {text!r} (a socket path or tcp://HOST:PORT)")
        return cls(path=Path(text).expanduser())

    @classmethod
    def of(cls, config: DaemonConfig) -> EngineAddress:
        return cls.parse(config.address)

    @property
    def tcp(self) -> bool:
        return self.port is not None

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


class EngineClient:
    """One connection to a daemon. Blocking; one call at a time (a lock serialises them), while another
    thread may set the `cancel` event of a running `rewrite`. Closing the connection cancels whatever it
    still has running on the daemon."""

    def __init__(self, sock: socket.socket, address: EngineAddress, pid: int, max_frame_size: int) -> None:
        self._sock = sock
        self.address = address
        self.daemon_pid = pid
        self._buffer = FrameBuffer(max_frame_size)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    @classmethod
    def connect(
        cls,
        address: str | os.PathLike[str] | EngineAddress,
        *,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float = CONNECT_TIMEOUT,
        client_name: str | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> EngineClient:
        """Connect and say hello (over TCP: the handshake, `_authenticate`); `EngineUnavailableError` when
        nobody answers, the daemon refuses, or what answers over TCP does not prove it holds the token."""
        where = address if isinstance(address, EngineAddress) else EngineAddress.parse(address)
        token_path = Path(token_file) if token_file is not None else None
        token = read_token(token_path) if token_path is not None else None
        if where.tcp and token is None:
            raise EngineUnavailableError(f"{where} is a TCP address: give the daemon's token file")
        try:
            sock = _open_unix(where.path, timeout) if where.path is not None else _open_tcp(where, timeout)
        except OSError as error:
            raise EngineUnavailableError(f"no engine daemon answers at {where}: {error.strerror or error}") from None
        client = cls(sock, where, 0, max_frame_size)
        try:
            deadline = time.monotonic() + timeout
            name = client_name or f"{Path(sys.argv[0]).name or 'python'} pid {os.getpid()}"
            nonce = secrets.token_bytes(HANDSHAKE_NONCE_BYTES) if where.tcp else None
            client._send(Hello(type="hello", version=PROTOCOL_VERSION, nonce=nonce, client=name))
            reply = client._next(deadline)
            if nonce is not None and token is not None and token_path is not None:  # TCP
                reply = client._authenticate(reply, token, nonce, token_path, deadline)
            if reply["type"] == "error":
                raise EngineUnavailableError(f"the engine daemon at {where} refused: {reply['message']}")
            if reply["type"] != "hello_ok":
                raise EngineUnavailableError(f"the engine daemon at {where} answered {reply['type']!r} to hello")
            client.daemon_pid = reply["pid"]
        except BaseException:
            client.close()
            raise
        return client

    def _authenticate(
        self, reply: DaemonMessage, token: str, nonce: bytes, token_file: Path, deadline: float
    ) -> DaemonMessage:
        """TCP: check the daemon's answer to the hello proves it holds the token, and only then prove ours;
        the daemon's answer to that. Anything else (another user's listener on the port: an old daemon's
        welcome, a forged proof) ends the connection with nothing more sent."""
        if reply["type"] == "error":
            return reply  # a refusal: said as such by the caller
        if reply["type"] != "challenge" or not is_handshake_proof(
            reply["proof"], token, "server", nonce, reply["nonce"]
        ):
            raise EngineUnavailableError(
                f"the process listening on {self.address} did not prove it holds the token in {token_file}: it is "
                "not your engine daemon (another user's process on the port?), or that daemon has another token; "
                "refusing to send it your code"
            )
        self._send(Proof(type="proof", proof=handshake_proof(token, "client", nonce, reply["nonce"])))
        return self._next(deadline)

    # -- requests

    def rewrite(
        self,
        request: RewriteRequest,
        *,
        on_text: Callable[[str], None] | None = None,
        on_step: Callable[[StepInfo], None] | None = None,
        on_phase: Callable[[Phase], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        """Rewrite through the daemon, streaming like `session.LocalSession.run`.

        Setting `cancel` (from any thread) cancels the request; the outcome then has status "cancelled".
        `on_phase` tells where the request is before its first step (loading, queued, started).
        Errors the engine reports are raised as the matching `SpeceditError`.
        """
        with self._lock:
            request_id = f"r{next(self._ids)}"
            try:
                outcome = self._rewrite(request_id, request, on_text, on_step, on_phase, cancel)
            except BaseException:
                # A broken stream, a callback that raised, or Ctrl-C: frames of this request may still
                # be in flight, so drop the connection, which also cancels the request on the daemon.
                self.close()
                raise
        if isinstance(outcome, RewriteOutcome):
            return outcome
        raise outcome  # the engine's error, reported cleanly: the connection stays usable

    def _rewrite(
        self,
        request_id: str,
        request: RewriteRequest,
        on_text: Callable[[str], None] | None,
        on_step: Callable[[StepInfo], None] | None,
        on_phase: Callable[[Phase], None] | None,
        cancel: threading.Event | None,
    ) -> RewriteOutcome | SpeceditError:
        self._send(Rewrite(type="rewrite", id=request_id, request=to_wire(request)))
        cancel_sent = False
        while True:
            if cancel is not None and cancel.is_set() and not cancel_sent:
                self._send(Cancel(type="cancel", id=request_id))
                cancel_sent = True
            message = self._receive(None, cancel=None if cancel_sent else cancel)
            if message is None:
                continue  # the cancel flag was set: send the cancel, keep reading
            if message.get("id") != request_id:
                if message["type"] == "error" and message["id"] is None:
                    raise EngineUnavailableError(f"the engine daemon reported: {message['message']}")
                continue
            if message["type"] == "queued" and on_phase is not None:
                on_phase(Phase("loading" if message["loading"] else "queued", message["position"]))
            elif message["type"] == "started" and on_phase is not None:
                on_phase(Phase("started"))
            elif message["type"] == "text" and on_text is not None:
                on_text(message["delta"])
            elif message["type"] == "step" and on_step is not None:
                on_step(self._decoded(StepInfo, message["info"]))
            elif message["type"] == "error":
                return error_from(message["code"], message["message"])
            elif message["type"] == "done":
                if message["outcome"] is None:
                    return error_from(message["error_code"] or "engine_error", message["error_message"] or "")
                return self._decoded(RewriteOutcome, message["outcome"])

    def warm(self, request: WarmRequest, *, timeout: float = CONNECT_TIMEOUT) -> bool:
        """Offer a document to prefill while the daemon is idle (`session.Session.warm`); False when the
        daemon keeps no prefix cache."""
        with self._lock:
            self._send(Warm(type="warm", request=to_wire(request)))
            deadline = time.monotonic() + timeout
            while True:
                message = self._next(deadline)
                if message["type"] == "warm_ok":
                    return message["accepted"]

    def status(self, *, timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
        """The daemon's state: model, device, dtype, uptime, queue, clients, pid, recent requests."""
        with self._lock:
            self._send(Status(type="status"))
            deadline = time.monotonic() + timeout
            while True:
                message = self._next(deadline)
                if message["type"] == "status_ok":
                    info: dict[str, Any] = message["info"]
                    return info

    def stop(self, *, wait: float = CONNECT_TIMEOUT) -> None:
        """Ask the daemon to shut down, and wait (up to `wait` seconds) until it no longer answers."""
        with self._lock:
            self._send(Stop(type="stop"))
            deadline = time.monotonic() + wait
            with contextlib.suppress(EngineUnavailableError):
                while self._next(deadline)["type"] != "stop_ok":
                    pass
        self.close()
        while time.monotonic() < deadline:
            if not _answers(self.address) and (self.address.path is None or not self.address.path.exists()):
                return
            time.sleep(0.05)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # -- frames

    def _decoded(self, cls: type[Record], value: object) -> Record:
        try:
            return from_wire(cls, value)
        except (ProtocolError, ValueError, TypeError) as error:
            message = f"the engine daemon at {self.address} sent a bad {cls.__name__}: {error}"
            raise EngineUnavailableError(message) from None

    def _send(self, message: ClientMessage) -> None:
        if self._closed:
            raise EngineUnavailableError("the connection to the engine daemon is closed")
        try:
            self._sock.settimeout(SEND_TIMEOUT)
            self._sock.sendall(encode_frame(message))
        except OSError as error:
            raise EngineUnavailableError(f"lost the engine daemon at {self.address}: {error}") from None

    def _next(self, deadline: float | None) -> DaemonMessage:
        message = self._receive(deadline)
        assert message is not None  # None only comes back to callers that pass `cancel`
        return message

    def _receive(self, deadline: float | None, cancel: threading.Event | None = None) -> DaemonMessage | None:
        """The next message; with `cancel`, None as soon as it is set. `EngineUnavailableError` when the
        daemon goes away, breaks the protocol, or says nothing before `deadline`."""
        while True:
            try:
                payload = self._buffer.next_payload()
                if payload is not None:
                    return parse_daemon_message(decode_payload(payload))
            except ProtocolError as error:
                raise EngineUnavailableError(f"the engine daemon at {self.address} sent a bad frame: {error}") from None
            if cancel is not None and cancel.is_set():
                return None
            timeout = _POLL if cancel is not None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineUnavailableError(f"the engine daemon at {self.address} did not answer in time")
                timeout = min(timeout, left) if timeout is not None else left
            try:
                self._sock.settimeout(timeout)
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError as error:
                raise EngineUnavailableError(f"lost the engine daemon at {self.address}: {error}") from None
            if not chunk:
                raise EngineUnavailableError(f"the engine daemon at {self.address} closed the connection")
            self._buffer.feed(chunk)


def _open_unix(path: Path, timeout: float) -> socket.socket:
    """A connection to the socket at `path`, if it is this user's: its folder and the socket belong to the
    user, and so does the process that answers (`EngineUnavailableError` naming the path otherwise). A
    full listen backlog (EAGAIN) is waited out, up to `timeout`."""
    check_own_socket(path)
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except BlockingIOError:  # the daemon's listen backlog is full: it is busy accepting, not gone
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
            continue
        except BaseException:
            sock.close()
            raise
        break
    uid = peer_uid(sock)
    if uid is not None and uid != os.getuid():
        sock.close()
        raise EngineUnavailableError(
            f"the process listening on {path} runs as uid {uid}, not as you; refusing to send it your code"
        )
    return sock


def _open_tcp(where: EngineAddress, timeout: float) -> socket.socket:
    return socket.create_connection((str(where.host), int(where.port or 0)), timeout=timeout)


def _answers(address: EngineAddress) -> bool:
    try:
        if address.path is not None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(str(address.path))
        else:
            socket.create_connection((str(address.host), int(address.port or 0)), timeout=1.0).close()
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------------- ensure_daemon


def running_daemon(options: EngineOptions) -> str | None:
    """The address of the shared daemon if one runs and answers, serving the engine `options` describe (as
    its info file says: the same model and settings, so the same answers); else None. Nothing is started."""
    config = DaemonConfig(options=options)
    try:  # (an older daemon's file has no options; a newer one's may have options this one does not know)
        served = EngineOptions.from_dict(json.loads(config.info_path.read_text(encoding="utf-8"))["options"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if served != EngineOptions.from_dict(config.to_dict()["options"]):
        return None
    try:
        EngineClient.connect(EngineAddress.of(config), client_name="specedit (is a daemon there?)").close()
    except EngineUnavailableError:
        return None  # a stale info file, or a daemon on its way out
    return config.address


def ensure_daemon(
    config: DaemonConfig,
    start_timeout: float = 120.0,
    *,
    client_name: str | None = None,
) -> EngineClient:
    """A client of the daemon at `config.address`, starting the daemon first when none answers.

    The daemon is spawned detached (its own session; output to `config.log_path`) with an idle timeout
    (`config.idle_timeout`, else `DEFAULT_SPAWN_IDLE_TIMEOUT`), so it exits once its last client is gone.
    Concurrent callers share one daemon: they take turns (an flock) at starting one, and the daemon's
    own lock settles any race that remains. `start_timeout` bounds the wait for the socket to answer;
    the model loads after that, and the first request waits for it.
    """
    address = EngineAddress.of(config)
    token_file = config.token_file
    try:
        return EngineClient.connect(address, token_file=token_file, client_name=client_name)
    except EngineUnavailableError:
        if _answers(address):
            raise  # a daemon is there but refused us (token, version): starting another cannot help
    if config.idle_timeout is None:
        config = dataclasses.replace(config, idle_timeout=DEFAULT_SPAWN_IDLE_TIMEOUT)
    deadline = time.monotonic() + start_timeout
    prepare_state_dir(config)
    with _spawn_turn(config.lock_path.with_name(config.lock_path.name + ".spawn"), deadline):
        with contextlib.suppress(EngineUnavailableError):  # whoever had the turn before may have started it
            return EngineClient.connect(address, token_file=token_file, client_name=client_name)
        process = _spawn(config)
        while time.monotonic() < deadline:
            try:
                client = EngineClient.connect(address, token_file=token_file, client_name=client_name)
            except EngineUnavailableError:
                code = process.poll()
                if code not in (None, 0):  # 0: another daemon had the lock; it will answer soon
                    raise EngineUnavailableError(
                        f"the engine daemon exited with status {code}: {_tail(config.log_path)}"
                    ) from None
                time.sleep(0.1)
                continue
            if process.returncode is None:  # reap it whenever it exits: no zombie in a long-lived client
                threading.Thread(target=process.wait, name="specedit-daemon-reaper", daemon=True).start()
            return client
    raise EngineUnavailableError(
        f"no engine daemon answered at {address} within {start_timeout:.0f} s (log: {config.log_path})"
    )


@contextlib.contextmanager
def _spawn_turn(path: Path, deadline: float) -> Any:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EngineUnavailableError(f"timed out waiting to start the engine daemon ({path})") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _spawn(config: DaemonConfig) -> subprocess.Popen[bytes]:
    log_path = config.log_path
    with contextlib.suppress(OSError):
        if log_path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(log_path, log_path.with_name(log_path.name + ".old"))
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    # The config goes as data on the daemon's standard input, not as a command line to parse again.
    command = [sys.executable, "-m", "specedit.engine.serving.daemon"]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,  # no terminal signals from the starter's session (Ctrl-C in an editor)
            close_fds=True,
        )
    except OSError as error:
        raise EngineUnavailableError(f"cannot start the engine daemon ({' '.join(command)}): {error}") from error
    finally:
        os.close(log_fd)
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError), process.stdin:
        process.stdin.write(json.dumps(config.to_dict()).encode())
    return process


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return " | ".join(text.strip().splitlines()[-lines:]) or f"(empty log at {path})"
