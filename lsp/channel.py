"""The client's channel: JSON-RPC messages read off stdin, each one answered even when it is malformed.

pygls reads its own messages (`pygls.io_.run_async`) and drops any it cannot read: a body that is not
UTF-8 or not JSON, or params its types refuse (a negative position in `textDocument/codeAction`). A
request dropped so is never answered, and its client waits forever. `serve` reads the same framing
(`Content-Length` headers, then the body) and answers as JSON-RPC says: -32700 for a body that is not
JSON (or not UTF-8), -32600 for JSON that is no message, -32602 for a request whose params do not fit
its method. A notification that cannot be read is logged and dropped: no one waits for an answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from cattrs import BaseValidationError, transform_error
from cattrs.v import format_exception
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdinAsyncReader, StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import JsonRPCProtocol
from pygls.protocol.json_rpc import RPCMessage

log = logging.getLogger("specedit.lsp")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
_CONTENT_LENGTH = re.compile(rb"Content-Length: (\d+)\r\n")


class ClientInput:
    """The client's end of the channel, as the server reads it (on pygls' threads). When it ends without
    an `exit` (the editor was killed), `on_end` runs before the reader sees the end and cancels what is
    still running."""

    def __init__(self, stream: BinaryIO, on_end: Callable[[], None]) -> None:
        self._stream = stream
        self._on_end = on_end

    def readline(self) -> bytes:
        return self._seen(self._stream.readline())

    def read(self, size: int) -> bytes:
        return self._seen(self._stream.read(size))

    def _seen(self, data: bytes) -> bytes:
        if not data:
            self._on_end()
        return data


def serve_io(server: LanguageServer, stdin: ClientInput, stdout: BinaryIO) -> None:
    """pygls' `start_io`, with this module's reader: serve until the client says exit or the input ends."""
    server._stop_event = stop = threading.Event()
    server.protocol.set_writer(StdoutWriter(stdout))
    reader = StdinAsyncReader(stdin, server.thread_pool)  # type: ignore[arg-type]  # (readline and read only)
    try:
        asyncio.run(serve(stop, reader, server.protocol))
    except BrokenPipeError:
        log.error("the client's channel closed; stopping")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()  # type: ignore[no-untyped-call]


async def serve(stop: threading.Event, reader: StdinAsyncReader, protocol: JsonRPCProtocol) -> None:
    """Read messages until `stop` or the end of the input; hand each readable one to `protocol`."""
    while not stop.is_set():
        body = await _next_body(reader)
        if body is None:
            return
        message = read_message(protocol, body)
        if message is not None:
            protocol.handle_message(message)


async def _next_body(reader: StdinAsyncReader) -> bytes | None:
    """The next message's body (None at the end of the input): headers up to a blank line, then as many
    bytes as `Content-Length` says. A blank line with no length before it is skipped, as pygls does."""
    length = 0
    while True:
        header = await reader.readline()
        if not header:
            return None
        if match := _CONTENT_LENGTH.fullmatch(header):
            length = int(match.group(1))
        elif not header.strip() and length:
            body = await reader.readexactly(length)
            return body or None


def read_message(protocol: JsonRPCProtocol, body: bytes) -> RPCMessage | None:
    """The message in `body`, structured as pygls' handlers take it; None when it cannot be read (a
    request among those is answered with its error here)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        # The id, read past the bad bytes, lets the client match the answer to its request.
        where = f"byte {error.start}: {error.reason}"
        _refuse(protocol, _id_in(body), PARSE_ERROR, f"the message is not valid UTF-8 ({where})")
        return None
    except ValueError as error:
        _refuse(protocol, None, PARSE_ERROR, f"the message is not JSON: {error}")
        return None
    if not isinstance(data, dict) or data.get("jsonrpc") != JsonRPCProtocol.VERSION:
        _refuse(protocol, _id_of(data), INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        return None
    try:
        message: RPCMessage = protocol.structure_message(data)
        return message
    except Exception as error:  # pygls' converter: attrs and cattrs errors of many kinds
        cause = error.__cause__ or error
        what = f"{data.get('method', 'a response')}: {_described(cause)}"
        if "method" not in data and _id_of(data) is not None:  # a response to one of our requests
            log.warning("unreadable response to %r: %s", data["id"], what)
            error_out = types.ResponseError(code=JsonRpcInvalidParams.CODE, message=f"unreadable: {what}")
            protocol._handle_response(data["id"], None, error_out)  # its waiter hears of it now
            return None
        if "method" not in data or "id" not in data:
            log.warning("dropped an unreadable notification: %s", what)
            return None
        _refuse(protocol, _id_of(data), JsonRpcInvalidParams.CODE, f"invalid params for {what}")
        return None


def _refuse(protocol: JsonRPCProtocol, msg_id: int | str | None, code: int, message: str) -> None:
    log.warning("refused a message (%d): %s", code, message)
    # pygls has no public way to answer a request it never read.
    protocol._send_response(msg_id, None, types.ResponseError(code=code, message=message))  # type: ignore[arg-type]


def _id_of(data: object) -> int | str | None:
    msg_id = data.get("id") if isinstance(data, dict) else None
    return msg_id if isinstance(msg_id, (int, str)) and not isinstance(msg_id, bool) else None


def _id_in(body: bytes) -> int | str | None:
    """The id of a message that is not UTF-8, read with its bad bytes replaced (None if it has none)."""
    try:
        return _id_of(json.loads(body.decode("utf-8", "replace")))
    except ValueError:
        return None


def _exception_text(error: BaseException, kind: type | None) -> str:
    """lsprotocol's validators say what they expected ("Position.line should be in range ...")."""
    return str(error) if type(error) is ValueError else format_exception(error, kind)


def _described(error: BaseException) -> str:
    """One line on what did not fit: cattrs' paths (`... @ $.params.range.start.line`) where it has them."""
    if isinstance(error, BaseValidationError):
        return "; ".join(transform_error(error, format_exception=_exception_text))[:300]
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def stdio(server: LanguageServer, on_end: Callable[[], None]) -> None:
    """Serve on stdin and stdout. stdout is the LSP channel: the server gets it, and a stray print()
    anywhere lands on stderr instead."""
    channel = sys.stdout.buffer
    sys.stdout = sys.stderr
    serve_io(server, ClientInput(sys.stdin.buffer, on_end), channel)
