"""A team's shared engine on Ray Serve: one loaded engine per replica, rewrites streamed over HTTP.

    ray start --head                                           # or an existing cluster
    specedit cluster deploy --model qwen2.5-coder-0.5b-instruct --replicas 1:4 --token-file team.token
    specedit rewrite app.py -i "..." --engine http://HOST:8000 --token-file team.token

A replica holds one loaded engine (`cluster_deploy`, the Ray side); Serve spreads requests over the
replicas and scales them. This module is the client's side and the wire, and needs nothing but the
standard library.

The wire, HTTP/1.1 (HTTPS when the deployment has a certificate; the client trusts what Python's default
context trusts, `SSL_CERT_FILE` included):

    POST /rewrite   Authorization: Bearer TOKEN   [serve_multiplexed_model_id: MODEL]   [specedit-document: KEY]
                    {"request": RewriteRequest}
        200, newline-delimited JSON, one event per line (`events.event_to_wire`, as the daemon sends them):
        {"type": "phase", ...}, {"type": "text", "delta": str}, {"type": "step", ...}, and last
        {"type": "done", "outcome": RewriteOutcome} (its stats name the replica's pid) or
        {"type": "error", "code", "message"}
    POST /warm      Authorization: Bearer TOKEN   specedit-document: KEY   {"request": WarmRequest}
        200, {"accepted": bool, "replica": pid}: the replica prefills the document while it has nothing
        else to do (`session.Session.warm`); accepted is False where it keeps no prompts
    GET /status     Authorization: Bearer TOKEN   [specedit-document: KEY]
        -> {"model", "models", "pid", "running", "cancelled", "warming", "to_warm"} (of one replica)
    401 (no or wrong token: nothing runs), 400 (a body that is not JSON, nested too deep, of the wrong shape, or
    a request the engine cannot take), 413 (a body over MAX_BODY_BYTES), 404: {"error_code", "error_message"}

The token travels as a bearer header, in every request: whoever receives a request holds the token. HTTP
cannot prove the server before it is sent (as the daemon's TCP handshake does, `protocol`), so over plain
HTTP the door must stay on loopback (the default, 127.0.0.1), where no other machine sees it; anywhere
else, put TLS in front (`--tls-cert`/`--tls-key`, or a proxy that terminates it), so that the client checks
the server's certificate before the token leaves. Even on loopback, another local user who takes the port
first (the cluster down, a restart) receives the token: on a shared machine, use TLS there too.

Every request on a document names it in a header (`DOCUMENT_HEADER`, `document_key`): a hash of its path,
or of its first characters where it has none. Serve's router sends a document's requests to the replica
that served it last, which holds its prompt in its prefix cache (`cluster_router`), unless that one is busy.
So the editors' warm-ups (`warm`) land where the document's rewrites will. A request without the header
goes wherever Serve's default router sends it.

A request names a model (Serve's multiplexing header) only to choose one of the deployment's other models
(`models` in status); without it, the deployment's own model answers. Serve then prefers a replica that has
that model loaded (one that has not loads it first: the request waits, told it is loading).

The records travel as `protocol.to_wire` writes them (the daemon's forms, in JSON). Closing the connection
cancels the rewrite within one step: HTTP has no other way back. An edit sketch goes to the cluster too
(its replica merges it by its lines when they say where it goes, without the model).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote, urlparse, urlsplit

from specedit.engine.backends.config import read_token
from specedit.engine.records.errors import EngineUnavailableError, InputError, SpeceditError
from specedit.engine.records.events import Done, Event, Text, event_from_wire
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.stats import Stats
from specedit.engine.records.wire import ProtocolError, error_from, to_wire

if TYPE_CHECKING:
    from specedit.engine.sketch.sketch import Sketch

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_PORT = 8000
CONNECT_TIMEOUT = 10.0  # s to connect and to get the answer's head (the stream itself has no limit)
MAX_BODY_BYTES = 4 * 1024 * 1024  # a request's JSON, as the daemon's frames
MODEL_HEADER = "serve_multiplexed_model_id"  # Serve routes by it (`serve.get_multiplexed_model_id`)
DOCUMENT_HEADER = "specedit-document"  # the router sends a document to its replica by it (`cluster_router`)
# A document without a path is known by its start: what every prompt on it shares (the prefix cache's
# part), and what an edit lower down leaves as it was.
HEAD_CHARS = 2_000
WARM_KEPT = 8  # documents kept warm while an editor has them open (the replica warms as many)
KEEP_WARM_SECONDS = 120.0  # how often they are offered again: a replica that came since warms them


def document_key(path: str | None, text: str) -> str:
    """The key a document is routed by: a hash of its path where it has one, else of its first
    `HEAD_CHARS` characters (a hash, so that no path crosses a proxy or lands in its logs).

    >>> document_key("/src/app.py", "x = 1") == document_key("/src/app.py", "x = 2")
    True
    >>> head = "x = 1\\n" * 400  # 2,400 characters: an edit after them keeps the key
    >>> document_key(None, head + "y = 2\\n") == document_key(None, head + "y = 3\\n")
    True
    """
    basis = f"path\x00{path}" if path else f"head\x00{text[:HEAD_CHARS]}"
    return hashlib.sha256(basis.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def rewrite_key(request: RewriteRequest) -> str:
    """A rewrite's document: its file's path (the language server's URI's, the command line's)."""
    return document_key(request.path, request.original)


def warm_key(request: WarmRequest) -> str:
    """A warm-up's document: the path of its `file:` URI, as the language server gives a rewrite's
    (`lsp.jobs`), else its text's start."""
    path = unquote(urlparse(request.name).path) if request.name.startswith("file:") else None
    return document_key(path, request.document)


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
        self._offered: OrderedDict[str, WarmRequest] = OrderedDict()  # by document key, newest last
        self._offered_lock = threading.Lock()
        self._keeping: threading.Event | None = None  # set: the keep-warm thread ends

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
        half_way = f"the cluster engine at {self.address} ended the rewrite half-way (its replica stopped?)"
        streaming = False
        try:
            body = {"request": to_wire(request)}
            response = self._send(connection, "POST", "/rewrite", body, stream=True, document=rewrite_key(request))
            streaming = True
            for line in response:
                event = event_from_wire(json_object(line))
                if isinstance(event, Done):
                    return event.outcome
                if isinstance(event, Text):
                    text.append(event.delta)
                emit(event)
            if cancel.is_set():
                return RewriteOutcome.finished("".join(text), "cancelled", Stats.before_start())
            raise EngineUnavailableError(f"{half_way}: nothing was written; ask again")
        except (OSError, http.client.HTTPException, ProtocolError, ValueError, EngineUnavailableError) as error:
            if cancel.is_set():  # we hung up
                return RewriteOutcome.finished("".join(text), "cancelled", Stats.before_start())
            if isinstance(error, EngineUnavailableError):
                raise
            if streaming:  # the text so far goes nowhere: the session writes only a judged whole answer
                raise EngineUnavailableError(f"{half_way} ({error}): nothing was written; ask again") from error
            raise EngineUnavailableError(f"the cluster engine at {self.address}: {error}") from error
        finally:
            stopped.set()
            connection.close()

    def status(self, document: str | None = None) -> dict[str, object]:
        """One replica's state: the one `document` (a `document_key`) is routed to, or any."""
        connection = self._connect()
        try:
            return json_object(self._send(connection, "GET", "/status", None, document=document).read())
        except (OSError, http.client.HTTPException) as error:
            raise EngineUnavailableError(f"the cluster engine at {self.address}: {error}") from error
        finally:
            connection.close()

    def in_turn(self, work: Callable[[], T], emit: Callable[[Event], None], cancel: threading.Event, client: str) -> T:
        return work()  # the replica's model runs there: the work here takes no turn

    def warm(self, request: WarmRequest) -> bool:
        """Offer a document to the replica its rewrites will go to, to prefill while it is idle; False
        where none took it (errors are logged: an offer is a hint)."""
        key = warm_key(request)
        with self._offered_lock:
            self._offered.pop(key, None)
            self._offered[key] = request
            while len(self._offered) > WARM_KEPT:
                self._offered.popitem(last=False)
        try:
            return self.offer(request) is not None
        except SpeceditError as error:
            log.debug("not warmed: %s", error)
            return False

    def offer(self, request: WarmRequest) -> int | None:
        """POST /warm: the pid of the replica that took `request`, or None where it keeps no prompts."""
        connection = self._connect()
        try:
            answer = self._send(connection, "POST", "/warm", {"request": to_wire(request)}, document=warm_key(request))
            reply = json_object(answer.read())
        except (OSError, http.client.HTTPException, ProtocolError) as error:
            raise EngineUnavailableError(f"the cluster engine at {self.address}: {error}") from error
        finally:
            connection.close()
        replica = reply.get("replica")
        return replica if reply.get("accepted") is True and isinstance(replica, int) else None

    def keep_alive(self, wanted: bool) -> None:
        """While `wanted` (an editor has documents open), offer the documents offered last again every
        `KEEP_WARM_SECONDS`: a replica that came since (scaled up, or in place of one that stopped) warms
        those now routed to it, and a replica that has them keeps them among its most recent. The replicas
        themselves live as long as the deployment."""
        if wanted and self._keeping is None:
            self._keeping = threading.Event()
            threading.Thread(
                target=self._keep_warm, args=(self._keeping,), name="specedit-keep-warm", daemon=True
            ).start()
        elif not wanted and self._keeping is not None:
            self._keeping.set()
            self._keeping = None

    def _keep_warm(self, stop: threading.Event) -> None:
        while not stop.wait(KEEP_WARM_SECONDS):
            with self._offered_lock:
                offered = list(self._offered.values())
            for request in reversed(offered):  # the newest first, as the replica warms them
                if stop.is_set():
                    return
                try:
                    self.offer(request)
                except SpeceditError as error:
                    log.debug("not kept warm: %s", error)

    def start(self) -> None:
        pass  # its replicas load their models when the deployment starts

    def close(self) -> None:
        self.keep_alive(False)

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
        document: str | None = None,
    ) -> http.client.HTTPResponse:
        """The answer's head, once it is 200. A `stream` waits for it as long as it takes (Serve may hold
        the request until a replica is free; cancelling hangs up): only connecting has a time limit.
        `document`: the key Serve's router routes it by (`document_key`)."""
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        if self._model:
            headers[MODEL_HEADER] = self._model
        if document:
            headers[DOCUMENT_HEADER] = document
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
    """The error an answer other than 200 says (unauthorized: the engine is unavailable to us). Serve's
    proxy answers its own refusals in plain text (503: no replica, and no room for one), said as it is."""
    try:
        body = response.read(64 * 1024)
    except OSError:
        body = b""
    try:
        detail = json_object(body)
        return error_from(str(detail["error_code"]), str(detail["error_message"]))
    except (ProtocolError, KeyError):
        said = body.decode("utf-8", "replace").strip()
        return EngineUnavailableError(
            f"{address} answered {response.status} {response.reason}" + (f": {said[:500]}" if said else "")
        )


def _hang_up_on(cancel: threading.Event, stopped: threading.Event, connection: http.client.HTTPConnection) -> None:
    """Close the connection when `cancel` is set: the replica sees its client go and stops the engine."""
    while not stopped.wait(0.05):
        if cancel.is_set() and connection.sock is not None:  # (not connected yet: it soon is, or fails)
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
            return
