"""The engine daemon's wire protocol: msgpack maps in length-prefixed frames, over a unix socket or TCP.

A frame is a 4-byte big-endian payload length, then the payload: one msgpack map with a string `type`.
The length is checked against the receiver's maximum *before* anything is allocated for the payload.

    client                                   daemon
    hello {version, nonce, client}     ->
                                       <-    challenge {nonce, proof}          (TCP only: the daemon's proof)
    proof {proof}                      ->                                      (TCP only: the client's)
                                       <-    hello_ok {version, pid}          (or error + close)
    rewrite {id, request}              ->
                                       <-    event {id, event}                 (the rewrite's events, `events`:
                                                                                phases, text and steps, and
                                                                                last done or error)
    cancel {id}                        ->                                      (any time; unknown ids ignored)
    warm {request}                     ->                                      (a document the user has open)
                                       <-    warm_ok {accepted}                (prefilled when nothing else runs)
    status {}                          ->
                                       <-    status_ok {info}
    stop {}                            ->
                                       <-    stop_ok {}                        (then the daemon shuts down)
                                       <-    error {code, message, id}         (a message it could not take)

Over TCP, both sides prove they hold the daemon's token, and the token itself never crosses the connection
(another local user can listen on the port first, or once a daemon left it on its idle timeout): the hello
carries a fresh client nonce; the daemon answers with its own nonce and `handshake_proof(token, "server",
client nonce, daemon nonce)`; the client checks that proof (in constant time) before it sends anything
else, so an impostor gets the hello and nothing more, then sends `handshake_proof(token, "client", ...)`,
which the daemon checks before it takes any request. Over a unix socket there is no challenge (the
hello's nonce is None): the socket's folder and file modes and the peer's uid guard it instead.
What the handshake does not do: encrypt, or bind the proofs to an address. Whoever holds the port and can
reach a daemon with the same token elsewhere could relay the handshake and read what follows; and each
connection hands out a proof that makes the token guessable offline if it is weak: use a random token
(`openssl rand -hex 32`), and TLS in front (with --allow-remote) beyond the machine.

Every message type is declared once, below, as a TypedDict; the runtime check (`parse_client_message`,
`parse_daemon_message`) is derived from those declarations, so the two cannot drift. Every field is
always present (None where it does not apply); extra fields are ignored, for forward compatibility.
What a rewrite asks for travels as the dataclass the engine uses (`RewriteRequest`, `wire.to_wire`), and
its events as `events` encodes them, the same as over HTTP: a field or an event added there is on the
wire with nothing to change here. This module imports neither torch nor the engine: clients stay light.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import struct
import typing
from collections.abc import Mapping
from typing import Literal, TypedDict, cast

import msgpack

from specedit.engine.records.wire import ProtocolError, conforms

# A new version whenever a message, or a record it carries, changes shape: the hello compares them, and a
# client and a daemon of different versions part with `version_mismatch` before anything else.
PROTOCOL_VERSION = 9
# A request holds at most MAX_INPUT_BYTES (1 MB) each of original, instruction and sketch (`requests`).
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024
HELLO_MAX_FRAME_SIZE = 64 * 1024  # before the hello is accepted (TCP: until the client's proof checks out)
HANDSHAKE_NONCE_BYTES = 32  # each side's fresh random nonce over TCP; of a fixed size, so proofs parse one way
_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size

# --------------------------------------------------------------------------------- client -> daemon


class Hello(TypedDict):
    type: Literal["hello"]
    version: int
    nonce: bytes | None  # TCP: HANDSHAKE_NONCE_BYTES fresh random bytes; None over a unix socket
    client: str  # who is asking, for the daemon's log: "specedit-lsp 0.1.0 pid 123"


class Proof(TypedDict):
    """TCP: the client's answer to the daemon's `challenge`, sent only once the daemon's proof checked out."""

    type: Literal["proof"]
    proof: bytes  # handshake_proof(token, "client", hello's nonce, challenge's nonce)


class Rewrite(TypedDict):
    type: Literal["rewrite"]
    id: str  # chosen by the client, unique among its own outstanding requests
    request: dict[str, object]  # a `RewriteRequest` (`to_wire`)


class Cancel(TypedDict):
    type: Literal["cancel"]
    id: str


class Warm(TypedDict):
    """Prefill this document's shared prompt start while idle; a newer one of the same name replaces it."""

    type: Literal["warm"]
    request: dict[str, object]  # a `WarmRequest` (`to_wire`)


class Status(TypedDict):
    type: Literal["status"]


class Stop(TypedDict):
    type: Literal["stop"]


# --------------------------------------------------------------------------------- daemon -> client


class Challenge(TypedDict):
    """TCP: the daemon's answer to a hello: its proof that it holds the token, and its nonce for the client's."""

    type: Literal["challenge"]
    nonce: bytes  # HANDSHAKE_NONCE_BYTES fresh random bytes
    proof: bytes  # handshake_proof(token, "server", hello's nonce, this nonce)


class HelloOk(TypedDict):
    type: Literal["hello_ok"]
    version: int
    pid: int


class Event(TypedDict):
    """One event of a rewrite (`events.event_to_wire`): its phases, text and steps, and last its `done`
    (its judged outcome) or an `error` (the error that ended it)."""

    type: Literal["event"]
    id: str
    event: dict[str, object]


class WarmOk(TypedDict):
    type: Literal["warm_ok"]
    accepted: bool  # False: the daemon keeps no prefix cache, or the request was not a `WarmRequest`


class StatusOk(TypedDict):
    type: Literal["status_ok"]
    info: dict[str, object]  # `doors.daemon.DaemonStatus`


class StopOk(TypedDict):
    type: Literal["stop_ok"]


class Error(TypedDict):
    type: Literal["error"]
    code: str  # an `ErrorCode`
    message: str
    id: str | None  # the request it is about, when there is one


ClientMessage = Hello | Proof | Rewrite | Cancel | Warm | Status | Stop
DaemonMessage = Challenge | HelloOk | Event | WarmOk | StatusOk | StopOk | Error
Message = ClientMessage | DaemonMessage


def _schemas(*declarations: type) -> dict[str, dict[str, object]]:
    """`type` value -> {field: type hint}, read from the TypedDicts above."""
    schemas = {}
    for declaration in declarations:
        hints = typing.get_type_hints(declaration)
        (kind,) = typing.get_args(hints["type"])
        schemas[kind] = hints
    return schemas


_CLIENT_SCHEMAS = _schemas(Hello, Proof, Rewrite, Cancel, Warm, Status, Stop)
_DAEMON_SCHEMAS = _schemas(Challenge, HelloOk, Event, WarmOk, StatusOk, StopOk, Error)


def _parse(payload: object, schemas: Mapping[str, dict[str, object]]) -> dict[str, object]:
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        raise ProtocolError("malformed_frame", "a message is a msgpack map with a string 'type'")
    request_id = payload.get("id") if isinstance(payload.get("id"), str) else None
    kind = payload["type"]
    schema = schemas.get(kind)
    if schema is None:
        known = ", ".join(schemas)
        raise ProtocolError("unknown_type", f"unknown message type {kind!r} (known: {known})", request_id=request_id)
    for name, hint in schema.items():
        if name not in payload:
            raise ProtocolError("bad_message", f"{kind}: missing field {name!r}", request_id=request_id)
        if not conforms(payload[name], hint):
            raise ProtocolError("bad_message", f"{kind}: field {name!r} has the wrong type", request_id=request_id)
    return {name: payload[name] for name in schema}  # extra fields dropped


def parse_client_message(payload: object) -> ClientMessage:
    """Check a decoded payload against the client message declarations; `ProtocolError` if it fails."""
    return cast(ClientMessage, _parse(payload, _CLIENT_SCHEMAS))


def parse_daemon_message(payload: object) -> DaemonMessage:
    return cast(DaemonMessage, _parse(payload, _DAEMON_SCHEMAS))


# -------------------------------------------------------------------------------- the TCP handshake


def handshake_proof(token: str, side: Literal["server", "client"], client_nonce: bytes, daemon_nonce: bytes) -> bytes:
    """HMAC-SHA256(token, label || client nonce || daemon nonce): what one side of a TCP connection shows to
    prove it holds the token without sending it. The label names the side and the protocol, so that one
    side's proof cannot be played back as the other's, nor across versions; the two fresh nonces (of a
    fixed size) keep a proof from being played back on another connection.

    >>> len(handshake_proof("t", "server", bytes(32), bytes(32)))
    32
    >>> handshake_proof("t", "server", bytes(32), bytes(32)) != handshake_proof("t", "client", bytes(32), bytes(32))
    True
    """
    label = f"specedit {PROTOCOL_VERSION} {side}\0".encode()
    return hmac.new(token.encode("utf-8"), label + client_nonce + daemon_nonce, hashlib.sha256).digest()


def is_handshake_proof(
    proof: object, token: str, side: Literal["server", "client"], client_nonce: bytes, daemon_nonce: object
) -> bool:
    """Whether `proof` is `side`'s proof for these nonces (both of HANDSHAKE_NONCE_BYTES), compared in
    constant time: a peer learns nothing from how long a wrong one takes to refuse."""
    if not (isinstance(proof, bytes) and isinstance(daemon_nonce, bytes)):
        return False
    if len(client_nonce) != HANDSHAKE_NONCE_BYTES or len(daemon_nonce) != HANDSHAKE_NONCE_BYTES:
        return False
    return hmac.compare_digest(proof, handshake_proof(token, side, client_nonce, daemon_nonce))


# ---------------------------------------------------------------------------------------- frames


def encode_frame(message: Message | Mapping[str, object]) -> bytes:
    payload: bytes = msgpack.packb(message, use_bin_type=True)
    return _HEADER.pack(len(payload)) + payload


def frame_length(header: bytes, max_frame_size: int) -> int:
    """The payload length from a header; `ProtocolError` (fatal) if it is over the maximum."""
    (length,) = _HEADER.unpack(header)
    if length > max_frame_size:
        raise ProtocolError(
            "frame_too_large", f"frame of {length} bytes is over the limit of {max_frame_size}", fatal=True
        )
    return int(length)


def decode_payload(payload: bytes) -> object:
    """msgpack -> Python objects; `ProtocolError("malformed_frame")` (not fatal) if it is not msgpack."""
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as error:  # msgpack raises several kinds (ExtraData, FormatError, ValueError, ...)
        raise ProtocolError("malformed_frame", f"the frame is not valid msgpack: {error}") from None


class FrameBuffer:
    """Incremental frame decoder for blocking sockets read with timeouts: feed bytes, take payloads.

    >>> buffer = FrameBuffer(1024)
    >>> frame = encode_frame({"type": "stop"})
    >>> buffer.feed(frame[:3]); buffer.next_payload() is None
    True
    >>> buffer.feed(frame[3:]); decode_payload(buffer.next_payload() or b"")
    {'type': 'stop'}
    """

    def __init__(self, max_frame_size: int) -> None:
        self._max = max_frame_size
        self._data = bytearray()

    def feed(self, data: bytes) -> None:
        self._data += data

    def next_payload(self) -> bytes | None:
        if len(self._data) < HEADER_SIZE:
            return None
        length = frame_length(bytes(self._data[:HEADER_SIZE]), self._max)
        if len(self._data) < HEADER_SIZE + length:
            return None
        payload = bytes(self._data[HEADER_SIZE : HEADER_SIZE + length])
        del self._data[: HEADER_SIZE + length]
        return payload


# ------------------------------------------------------------------------------- blocking sockets


def _truncated() -> ProtocolError:
    return ProtocolError("truncated_frame", "the connection closed in the middle of a frame", fatal=True)


def _recv_exactly(sock: socket.socket, count: int, *, at_boundary: bool) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(min(count - len(chunks), 1 << 20))
        if not chunk:
            if at_boundary and not chunks:
                return None
            raise _truncated()
        chunks += chunk
    return bytes(chunks)


def recv_payload(sock: socket.socket, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> object | None:
    """One decoded payload from a blocking socket; None at a clean end of stream."""
    header = _recv_exactly(sock, HEADER_SIZE, at_boundary=True)
    if header is None:
        return None
    payload = _recv_exactly(sock, frame_length(header, max_frame_size), at_boundary=False)
    return decode_payload(payload or b"")


# --------------------------------------------------------------------------------------- asyncio


END_OF_STREAM = object()  # what `read_payload` returns when the peer closed cleanly (a payload may be nil)


async def read_payload(reader: asyncio.StreamReader, max_frame_size: int) -> object:
    """One decoded payload from a stream; `END_OF_STREAM` at a clean end. The length is checked before
    the payload is read, so an oversized frame costs nothing but its header."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return END_OF_STREAM
        raise _truncated() from None
    length = frame_length(header, max_frame_size)
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise _truncated() from None
    return decode_payload(payload)
