"""A blocking client of the engine daemon: one connection, its handshake, and the calls it makes.

    with EngineClient.connect("/run/user/1000/specedit/engine.sock") as client:
        outcome = client.rewrite(RewriteRequest(original, "Rename add to plus."), emit=print)

Front ends use it through a session (`session.remote_session`, whose backend is `remote.DaemonBackend`,
which also starts the shared daemon when none answers).

Addresses: a filesystem path for a unix socket (`unix://PATH` also works), `tcp://HOST:PORT` for TCP,
which needs the daemon's token (`token_file=`). Over TCP the client sends nothing but its hello until the
daemon has proved it holds the token (`protocol`'s handshake); the token itself is never sent. Like
`protocol`, this module imports neither torch nor the engine, so a thin client (the CLI with `--engine`)
starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from specedit.engine.backends.config import DaemonConfig, check_own_socket, peer_uid, read_token
from specedit.engine.backends.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    HANDSHAKE_NONCE_BYTES,
    PROTOCOL_VERSION,
    Cancel,
    ClientMessage,
    DaemonMessage,
    FrameBuffer,
    Hello,
    Proof,
    Rewrite,
    Status,
    Stop,
    Warm,
    decode_payload,
    encode_frame,
    handshake_proof,
    is_handshake_proof,
    parse_daemon_message,
)
from specedit.engine.records.errors import EngineUnavailableError, SpeceditError
from specedit.engine.records.events import Done, Event, event_from_wire
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.wire import ProtocolError, error_from, to_wire

CONNECT_TIMEOUT = 10.0  # seconds for connect + hello, and for status / stop replies
SEND_TIMEOUT = 60.0  # seconds one frame may take to go out (the daemon reads all the time)
_POLL = 0.1  # seconds between checks of the cancel flag while waiting for frames


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
        emit: Callable[[Event], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        """Rewrite through the daemon: its events to `emit` as they come, but its `Done`, whose outcome is
        returned. Setting `cancel` (from any thread) cancels the request; the outcome then has status
        "cancelled". Errors the engine reports are raised as the matching `SpeceditError`."""
        with self._lock:
            request_id = f"r{next(self._ids)}"
            try:
                return self._rewrite(request_id, request, emit or (lambda event: None), cancel)
            except SpeceditError as error:
                if not isinstance(error, EngineUnavailableError):
                    raise  # the engine's error, reported cleanly: the connection stays usable
                self.close()
                raise
            except BaseException:
                # A broken stream, a callback that raised, or Ctrl-C: frames of this request may still
                # be in flight, so drop the connection, which also cancels the request on the daemon.
                self.close()
                raise

    def _rewrite(
        self, request_id: str, request: RewriteRequest, emit: Callable[[Event], None], cancel: threading.Event | None
    ) -> RewriteOutcome:
        self._send(Rewrite(type="rewrite", id=request_id, request=to_wire(request)))
        cancel_sent = False
        while True:
            if cancel is not None and cancel.is_set() and not cancel_sent:
                self._send(Cancel(type="cancel", id=request_id))
                cancel_sent = True
            message = self._receive(None, cancel=None if cancel_sent else cancel)
            if message is None:
                continue  # the cancel flag was set: send the cancel, keep reading
            if message["type"] == "error" and message["id"] is None:
                raise EngineUnavailableError(f"the engine daemon reported: {message['message']}")
            if message.get("id") != request_id:
                continue
            if message["type"] == "error":
                raise error_from(message["code"], message["message"])
            if message["type"] == "event":
                try:
                    event = event_from_wire(message["event"])
                except (ProtocolError, ValueError, TypeError) as error:
                    bad = f"the engine daemon at {self.address} sent a bad event: {error}"
                    raise EngineUnavailableError(bad) from None
                if isinstance(event, Done):
                    return event.outcome
                emit(event)

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

    def status(self, *, timeout: float = CONNECT_TIMEOUT) -> dict[str, object]:
        """The daemon's state: model, device, dtype, uptime, queue, clients, pid, recent requests."""
        with self._lock:
            self._send(Status(type="status"))
            deadline = time.monotonic() + timeout
            while True:
                message = self._next(deadline)
                if message["type"] == "status_ok":
                    return message["info"]

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
            if not answers(self.address) and (self.address.path is None or not self.address.path.exists()):
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


def answers(address: EngineAddress) -> bool:
    """Whether something accepts connections at `address` (whoever it is)."""
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
