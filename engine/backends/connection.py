"""One client connection of the daemon, and its handshake (`protocol` describes it): the hello, over TCP
the proofs each way, the welcome; and a quiet handler for the event loop's own errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections import Counter
from typing import Generic, TypeVar

from specedit.engine.backends.protocol import (
    HANDSHAKE_NONCE_BYTES,
    PROTOCOL_VERSION,
    Challenge,
    DaemonMessage,
    Error,
    HelloOk,
    encode_frame,
    handshake_proof,
    is_handshake_proof,
)
from specedit.engine.records.wire import ErrorCode

log = logging.getLogger(__name__)
Job = TypeVar("Job")  # the daemon's record of a rewrite (`doors.daemon_jobs.Job`)


class Connection(Generic[Job]):
    """One client connection of the daemon, and the rewrites it asked for; lives on the event loop thread."""

    def __init__(self, number: int, writer: asyncio.StreamWriter) -> None:
        self.number = number
        self.writer = writer
        self.greeted = False
        self.nonces: tuple[bytes, bytes] | None = None  # TCP, between the challenge and the proof: (hello's, ours)
        self.client = "?"
        self.jobs: dict[str, Job] = {}  # the daemon's rewrites for it, by id
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

    def hello(self, nonce: bytes | None, client: str, token: str | None) -> bool:
        """The hello: a unix socket's peer (its uid checked; `token` None) is welcome at once; over TCP, the
        daemon proves it holds the token (`challenge`) and waits for the client's proof (`prove`) before it
        takes anything. False: close the connection."""
        if self.greeted:
            self.error("bad_message", "hello twice")
            return True
        if self.nonces is not None:
            self.error("bad_message", "hello twice, before the proof")
            return False
        self.client = "".join(c if c.isprintable() else "?" for c in client[:200])  # no forged log lines
        if token is None:
            self._welcome()
            return True
        if nonce is None or len(nonce) != HANDSHAKE_NONCE_BYTES:
            log.warning("connection %d (%s): a hello without a nonce over TCP", self.number, self.client)
            self.error("unauthorized", f"over TCP a hello carries a nonce of {HANDSHAKE_NONCE_BYTES} bytes")
            return False
        ours = secrets.token_bytes(HANDSHAKE_NONCE_BYTES)
        self.nonces = (nonce, ours)
        proof = handshake_proof(token, "server", nonce, ours)
        self.send(Challenge(type="challenge", nonce=ours, proof=proof))
        return True

    def prove(self, proof: bytes, token: str | None) -> bool:
        """TCP: the client's proof that it holds the token, checked in constant time; only then is it a client.
        False: close the connection."""
        if self.greeted:
            self.error("bad_message", "a proof after hello_ok")
            return True
        if token is None or self.nonces is None:
            self.error("hello_required", "a proof answers the challenge to a hello")
            return False
        if not is_handshake_proof(proof, token, "client", *self.nonces):
            log.warning("connection %d (%s): wrong proof (not the token)", self.number, self.client)
            self.error("unauthorized", "wrong or missing token")
            return False
        self._welcome()
        return True

    def _welcome(self) -> None:
        self.greeted = True
        self.nonces = None
        log.info("connection %d: hello from %s", self.number, self.client)
        self.send(HelloOk(type="hello_ok", version=PROTOCOL_VERSION, pid=os.getpid()))


class QuietLoopErrors:
    """The event loop's exception handler: each kind of error logged once per `interval`, in one line.
    Under a low descriptor limit asyncio reports every failed accept (measured: ~11,000 tracebacks in 12 s)."""

    def __init__(self, interval: float = 10.0) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
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


def version_of_another_hello(payload: object) -> int | None:
    """The version a hello asks for, if it is not ours, whatever else the hello holds (a version-5 client's
    has a token and no nonce): refused as such, not as a message with the wrong fields."""
    if not isinstance(payload, dict) or payload.get("type") != "hello":
        return None
    version = payload.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version != PROTOCOL_VERSION:
        return version
    return None
