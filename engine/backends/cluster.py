"""A team's shared engine on Ray Serve: one loaded engine per replica, rewrites streamed over HTTP.

    ray start --head                                           # or an existing cluster
    specedit cluster deploy --model qwen2.5-coder-0.5b-instruct --replicas 1:4 --token-file team.token
    specedit rewrite app.py -i "..." --engine http://HOST:8000 --token-file team.token

A replica holds one loaded engine (`cluster_deploy`, the Ray side); Serve spreads requests over the
replicas and scales them. This module is the client's side and the wire, and needs nothing but the
standard library.

The wire, HTTP/1.1 (HTTPS when the deployment has a certificate; the client trusts what Python's default
context trusts, `SSL_CERT_FILE` included):

    POST /rewrite   Authorization: Bearer TOKEN   [serve_multiplexed_model_id: MODEL]   {"request": RewriteRequest}
        200, newline-delimited JSON, one event per line (`events.event_to_wire`, as the daemon sends them):
        {"type": "phase", ...}, {"type": "text", "delta": str}, {"type": "step", ...}, and last
        {"type": "done", "outcome": RewriteOutcome} (its stats name the replica's pid) or
        {"type": "error", "code", "message"}
    GET /status     Authorization: Bearer TOKEN   -> {"model", "models", "pid", "running", "cancelled"} (of one replica)
    401 (no or wrong token: nothing runs), 400 (a body that is not JSON, nested too deep, of the wrong shape, or
    a request the engine cannot take), 413 (a body over MAX_BODY_BYTES), 404: {"error_code", "error_message"}

The token travels as a bearer header, in every request: whoever receives a request holds the token. HTTP
cannot prove the server before it is sent (as the daemon's TCP handshake does, `protocol`), so over plain
HTTP the door must stay on loopback (the default, 127.0.0.1), where no other machine sees it; anywhere
else, put TLS in front (`--tls-cert`/`--tls-key`, or a proxy that terminates it), so that the client checks
the server's certificate before the token leaves. Even on loopback, another local user who takes the port
first (the cluster down, a restart) receives the token: on a shared machine, use TLS there too.

A request names a model (Serve's multiplexing header) only to choose one of the deployment's other models
(`models` in status); without it, the deployment's own model answers. Serve then prefers a replica that has
that model loaded (one that has not loads it first: the request waits, told it is loading).

The records travel as `protocol.to_wire` writes them (the daemon's forms, in JSON). Closing the connection
cancels the rewrite within one step: HTTP has no other way back. An edit sketch goes to the cluster too
(its replica merges it by its lines when they say where it goes, without the model).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from specedit.engine.backends.config import read_token
from specedit.engine.records.errors import EngineUnavailableError, InputError, SpeceditError
from specedit.engine.records.events import Done, Event, Text, event_from_wire
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.stats import Stats
from specedit.engine.records.wire import ProtocolError, error_from, to_wire

if TYPE_CHECKING:
    from specedit.engine.sketch.sketch import Sketch

T = TypeVar("T")
DEFAULT_PORT = 8000
CONNECT_TIMEOUT = 10.0  # s to connect and to get the answer's head (the stream itself has no limit)
MAX_BODY_BYTES = 4 * 1024 * 1024  # a request's JSON, as the daemon's frames
MODEL_HEADER = "serve_multiplexed_model_id"  # Serve routes by it (`serve.get_multiplexed_model_id`)


def error_body(code: str, message: str) -> dict[str, str]:
    return {"error_code": code, "error_message": message}


def json_object(body: bytes) -> dict[str, object]:
    """`body` as a JSON object, or `ProtocolError("malformed_frame")` whatever is wrong with it, so that a
    door answers 400, never 500: not JSON (`NaN` and `Infinity` included, which Python's parser takes), not
    UTF-8, nested deeper than the parser recurses (a 200k-deep `[[[...]]]` is a `RecursionError`), an
    integer over Python's digits limit (a plain `ValueError`), or strings with lone surrogates (`"\\ud800"`
    parses, but is no text: the tokenizer would fail on it later, inside the engine).

    >>> json_object(b'{"a": [1, null]}')
    {'a': [1, None]}
    """
    try:
        value = json.loads(body, parse_constant=_not_a_number)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # UnicodeEncodeError on a lone surrogate
    except RecursionError:
        raise ProtocolError("malformed_frame", "not JSON this door takes: nested too deep") from None
    except ValueError as error:  # JSONDecodeError, UnicodeError, the digits limit, NaN
        raise ProtocolError("malformed_frame", f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ProtocolError("malformed_frame", "not a JSON object")
    return value


def _not_a_number(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# -------------------------------------------------------------------------------------------- the client


class ClusterBackend:
    """Rewrites on a cluster engine at an `http(s)://HOST:PORT` address (a `session.Backend`)."""

    def __init__(
        self, address: str, *, token_file: str | os.PathLike[str] | None = None, model: str | None = None
    ) -> None:
        url = urlsplit(address)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise EngineUnavailableError(f"not an engine address: {address!r} (expected http(s)://HOST:PORT)")
        if token_file is None:
            raise EngineUnavailableError(f"{address} is a cluster engine: give its token file")
        self.address = address
        self._url = url
        self._token = read_token(Path(token_file))
        self._model = model  # one of the deployment's other models; None: its own

    def run(
        self,
        request: RewriteRequest | CompletionRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,  # not sent: the host reads the request's sketch once there
    ) -> RewriteOutcome:
        if not isinstance(request, RewriteRequest):
            raise InputError(f"{self.address} takes rewrites; completions (OpenAI's API) go to its HTTP door")
        connection = self._connect()
        text: list[str] = []
        stopped = threading.Event()  # the rewrite is over: the cancel watcher ends
        threading.Thread(target=_hang_up_on, args=(cancel, stopped, connection), daemon=True).start()
        try:
            response = self._send(connection, "POST", "/rewrite", {"request": to_wire(request)}, stream=True)
            for line in response:
                event = event_from_wire(json_object(line))
                if isinstance(event, Done):
                    return event.outcome
                if isinstance(event, Text):
                    text.append(event.delta)
                emit(event)
            if cancel.is_set():
                return RewriteOutcome.finished("".join(text), "cancelled", Stats.before_start())
            raise EngineUnavailableError(f"the cluster engine at {self.address} ended the rewrite half-way")
        except (OSError, http.client.HTTPException, ProtocolError, ValueError, EngineUnavailableError) as error:
            if cancel.is_set():  # we hung up
                return RewriteOutcome.finished("".join(text), "cancelled", Stats.before_start())
            if isinstance(error, EngineUnavailableError):
                raise
            raise EngineUnavailableError(f"the cluster engine at {self.address}: {error}") from error
        finally:
            stopped.set()
            connection.close()

    def status(self) -> dict[str, object]:
        connection = self._connect()
        try:
            return json_object(self._send(connection, "GET", "/status", None).read())
        except (OSError, http.client.HTTPException) as error:
            raise EngineUnavailableError(f"the cluster engine at {self.address}: {error}") from error
        finally:
            connection.close()

    def in_turn(self, work: Callable[[], T], emit: Callable[[Event], None], cancel: threading.Event, client: str) -> T:
        return work()  # the replica's model runs there: the work here takes no turn

    def warm(self, request: WarmRequest) -> bool:
        return False  # a replica is chosen per request: there is no one cache to warm

    def keep_alive(self, wanted: bool) -> None:
        pass  # the cluster's replicas live as long as the deployment

    def start(self) -> None:
        pass  # its replicas load their models when the deployment starts

    def close(self) -> None:
        pass

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self._url.hostname or "", self._url.port
        if self._url.scheme == "https":
            context = ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT, context=context)
        return http.client.HTTPConnection(host, port or 80, timeout=CONNECT_TIMEOUT)

    def _send(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        path: str,
        body: Mapping[str, object] | None,
        *,
        stream: bool = False,
    ) -> http.client.HTTPResponse:
        """The answer's head, once it is 200. A `stream` waits for it as long as it takes (Serve may hold
        the request until a replica is free; cancelling hangs up): only connecting has a time limit."""
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        if self._model:
            headers[MODEL_HEADER] = self._model
        try:
            connection.connect()
        except OSError as error:
            raise EngineUnavailableError(f"no cluster engine answers at {self.address}: {error}") from error
        if stream and connection.sock is not None:
            connection.sock.settimeout(None)
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, self._url.path.rstrip("/") + path, payload, headers)
        response = connection.getresponse()
        if response.status != 200:
            raise _refusal(response, self.address)
        return response


def _refusal(response: http.client.HTTPResponse, address: str) -> SpeceditError:
    """The error an answer other than 200 says (unauthorized: the engine is unavailable to us)."""
    try:
        detail = json_object(response.read())
        return error_from(str(detail["error_code"]), str(detail["error_message"]))
    except (ProtocolError, KeyError, OSError):
        return EngineUnavailableError(f"{address} answered {response.status} {response.reason}")


def _hang_up_on(cancel: threading.Event, stopped: threading.Event, connection: http.client.HTTPConnection) -> None:
    """Close the connection when `cancel` is set: the replica sees its client go and stops the engine."""
    while not stopped.wait(0.05):
        if cancel.is_set() and connection.sock is not None:  # (not connected yet: it soon is, or fails)
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
            return
