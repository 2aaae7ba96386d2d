"""The HTTP door: one ASGI application (Starlette) for OpenAI's API and for the cluster's own wire, a thin
host of the engine's session. The daemon serves it beside its socket (`specedit serve --http PORT`, with
uvicorn), and each cluster replica under Ray Serve (`cluster_deploy`), so a team's engine speaks it too.

    GET  /v1/models            the engine's model ("specedit" and its own name) and the apply model
    POST /v1/chat/completions  chat messages, with a `prediction` (Predicted Outputs) for the copy drafter;
                               the apply model ("specedit-apply") merges <code>/<update> (`apply`)
    POST /v1/completions       a raw prompt
    POST /rewrite              a `RewriteRequest`, its events as JSON lines (`backends.cluster` describes it)
    GET  /status               the engine's state

Every route takes the token as a bearer header (what every OpenAI client sends as its API key, compared
in constant time); without it nothing runs. A body is read no further than `MAX_BODY_BYTES` (a 413 the
client can read), and checked (`openai`, `wire`) before anything reaches the engine, off the event loop
where that takes a while (a long body's JSON, an apply request's tags); each text holds at most
`MAX_INPUT_BYTES`. Requests take their turns fairly across clients in the engine (`backends.local.Turns`),
each connection a client of its own, as each of the socket's is; one whose client hangs up is cancelled
within a step. Errors come in OpenAI's shape on `/v1` and on unknown paths, in the cluster's on its own
routes. The server and its budget of connections are `http.server`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specedit.engine.backends.cluster import MAX_BODY_BYTES, MODEL_HEADER, json_object
from specedit.engine.doors.http import openai
from specedit.engine.doors.http.apply import APPLY_MODEL, apply_request, is_apply_model
from specedit.engine.doors.http.openai import OpenAIError, invalid
from specedit.engine.records.errors import (
    ContextLengthError,
    EmptyAnswerError,
    EngineUnavailableError,
    IncompleteOutputError,
    InputError,
    MergeError,
    ModelLoadError,
    SpeceditError,
)
from specedit.engine.records.events import Done, Event, Phase, Text, error_to_wire, event_to_wire
from specedit.engine.records.requests import ChatMessage, CompletionRequest, RewriteOutcome, RewriteRequest
from specedit.engine.records.wire import ProtocolError, from_wire
from specedit.engine.session.session import EventStream, Session
from specedit.engine.session.session import Request as EngineRequest

log = logging.getLogger(__name__)

ENGINE_MODEL = "specedit"  # the engine's own model, whichever it loaded
DISCONNECT_POLL = 0.1  # s between checks that a client still waits for a whole (unstreamed) answer
# A body over the limit is read on (and dropped) up to this many bytes, so that the client, still sending,
# reads the 413 rather than a reset; past it, the connection closes after the answer.
DRAIN_BYTES = 64 * 1024 * 1024


class Door:
    """The application (`app`) on one session, or, on a cluster replica, the session a request's model
    names (`session_for`: the deployment's other models, loaded on demand; `loading` says it loads)."""

    def __init__(
        self,
        session: Session,
        *,
        token: str,
        model: str,
        others: tuple[str, ...] = (),
        session_for: Callable[[str, asyncio.Event], Awaitable[Session]] | None = None,
        status: Callable[[], Mapping[str, object]] | None = None,
        replica: int | None = None,
    ) -> None:
        if not token:
            raise ValueError("the HTTP door needs a token")
        self._session = session
        self._token = token.encode()
        self.model = model  # the engine's own model's name
        self._others = others
        self._session_for = session_for
        self._status = status or (lambda: {})
        self._replica = replica  # a cluster replica's pid, in every answer's stats
        self.running = 0  # requests in the engine now
        self.last_request = time.monotonic()  # when a request with the token came or ended (the idle timeout)
        self._cancelled = 0  # requests the engine stopped because their client went away
        self.routes = [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/rewrite", self.rewrite, methods=["POST"]),
            Route("/status", self.status, methods=["GET"]),
        ]
        self.app = Starlette(routes=self.routes, exception_handlers={404: self._no_route, 405: self._no_route})

    async def handle(self, http: Request) -> Response:
        """One request, for a host that hands over a Starlette request (Ray Serve's replica), routed by the
        end of its path (a deployment's route prefix comes before it)."""
        path = http.url.path.rstrip("/")
        for route in self.routes:
            if path.endswith(route.path) and http.method in (route.methods or ()):
                response: Response = await route.endpoint(http)
                return response
        return _no_such_route(http.method, path, 405 if path.endswith(("/rewrite", "/status")) else 404)

    async def _no_route(self, http: Request, error: Exception) -> Response:
        """Starlette's 404 (no such path) and 405 (not with this method), in the door's error shapes."""
        status = error.status_code if isinstance(error, HTTPException) else 404
        response = _no_such_route(http.method, http.url.path, status)
        if isinstance(error, HTTPException) and error.headers:
            response.headers.update(error.headers)  # 405's `Allow`
        return response

    # -- OpenAI's API

    async def models(self, http: Request) -> Response:
        if not self._authorized(http):
            return _openai_error(_unauthorized())
        return JSONResponse(openai.models([ENGINE_MODEL, self.model, *self._others, APPLY_MODEL]))

    async def chat_completions(self, http: Request) -> Response:
        try:
            self._check_token(http)
            body = openai.chat_completions_body(await _json_body(http))
            asked = body.generation
            if is_apply_model(asked.model):
                # On a thread: the file and sketch are read out of the chat's tags, a while for long ones.
                request: EngineRequest = await asyncio.to_thread(
                    apply_request, body.messages, asked.sampling, asked.max_tokens
                )
                return await self._answer(http, self._session, request, asked, chat=True, whole=True)
            session = await self._session_named(asked.model)
            request = _completion(asked, messages=body.messages, prediction=body.prediction)
            return await self._answer(http, session, request, asked, chat=True, predicted=body.prediction is not None)
        except OpenAIError as error:
            return _openai_error(error)

    async def completions(self, http: Request) -> Response:
        try:
            self._check_token(http)
            body = openai.completions_body(await _json_body(http))
            asked = body.generation
            if is_apply_model(asked.model):
                raise invalid(f"{APPLY_MODEL} answers chat completions", param="model", code="model_not_found")
            session = await self._session_named(asked.model)
            return await self._answer(http, session, _completion(asked, prompt=body.prompt), asked, chat=False)
        except OpenAIError as error:
            return _openai_error(error)

    async def _answer(
        self,
        http: Request,
        session: Session,
        request: EngineRequest,
        asked: openai.Generation,
        *,
        chat: bool,
        predicted: bool = False,
        whole: bool = False,
    ) -> Response:
        """Run `request` for the client: streamed as server-sent events, or whole. `whole`: nothing goes out
        before the answer is judged (the apply model: a file with code missing is never sent)."""
        request_id = openai.new_id("chatcmpl" if chat else "cmpl")
        events = self._start(session, request, _client(http))
        if asked.stream and not whole:
            return StreamingResponse(
                self._events(events, request_id, asked, chat=chat, predicted=predicted), media_type="text/event-stream"
            )
        watch = asyncio.ensure_future(_cancel_when_gone(http, events.cancel))
        try:
            outcome = await _outcome(events)
        except SpeceditError as error:
            return _openai_error(_as_openai(error))
        finally:
            watch.cancel()
        refused = outcome.error()
        if refused is not None and not isinstance(request, CompletionRequest):
            return _openai_error(_as_openai(refused))
        if outcome.status == "cancelled":
            return _openai_error(OpenAIError(499, "the client went away", code="cancelled"))
        usage = openai.usage(outcome, predicted=predicted)
        if asked.stream:  # the apply model, streamed: its whole answer in one piece, once judged
            return StreamingResponse(
                _sse([*_chat_pieces(request_id, asked, outcome.text, outcome, usage)]), media_type="text/event-stream"
            )
        if chat:
            return JSONResponse(openai.chat_completion(request_id, asked.model, outcome.text, outcome, usage))
        finish = openai.finish_reason(outcome)
        return JSONResponse(openai.text_completion(request_id, asked.model, outcome.text, finish, usage))

    async def _events(
        self, events: EventStream, request_id: str, asked: openai.Generation, *, chat: bool, predicted: bool
    ) -> AsyncIterator[str]:
        """The answer as server-sent events, as OpenAI streams it; a client that hangs up (the stream
        closed early) cancels the rewrite within a step."""
        try:
            if chat:
                yield _data(openai.chat_chunk(request_id, asked.model, {"role": "assistant", "content": ""}))
            async for event in events:
                if isinstance(event, Text):
                    piece = (
                        openai.chat_chunk(request_id, asked.model, {"content": event.delta})
                        if chat
                        else openai.text_completion(request_id, asked.model, event.delta, None, None)
                    )
                    yield _data(piece)
                elif isinstance(event, Done):
                    finish = openai.finish_reason(event.outcome)
                    last = (
                        openai.chat_chunk(request_id, asked.model, {}, finish)
                        if chat
                        else openai.text_completion(request_id, asked.model, "", finish, None)
                    )
                    yield _data(last)
                    if asked.include_usage:
                        usage = openai.usage(event.outcome, predicted=predicted)
                        yield _data(openai.chat_chunk(request_id, asked.model, None, usage_=usage))
        except SpeceditError as error:
            yield _data(_as_openai(error).body())
        finally:
            await events.aclose()
        yield "data: [DONE]\n\n"

    async def _session_named(self, model: str) -> Session:
        """The session a request's `model` names: the engine's own (`specedit`, its name), or one of the
        deployment's others; an unknown name is refused (a client never makes the engine load a path)."""
        if model in (ENGINE_MODEL, self.model):
            return self._session
        if model in self._others and self._session_for is not None:
            return await self._session_for(model, asyncio.Event())
        known = ", ".join([ENGINE_MODEL, self.model, *self._others, APPLY_MODEL])
        raise OpenAIError(404, f"no model {model!r} here (it has {known})", code="model_not_found", param="model")

    # -- the cluster's own wire

    async def rewrite(self, http: Request) -> Response:
        if not self._authorized(http):
            return _cluster_error(401, "unauthorized", "a wrong or missing token")
        # Whatever the body is, a refusal is a 4xx in the door's error shape, never Starlette's bare 500:
        # `_json_object` turns every way JSON can be bad into a `ProtocolError`, and `from_wire` checks the
        # shape against `RewriteRequest` (its own validation raises ValueError).
        try:
            # No drain: Serve's proxy, not the client, is on the other end, and answers the client itself.
            body = await _body_within(http, MAX_BODY_BYTES, drain=MAX_BODY_BYTES)
            request = await asyncio.to_thread(_rewrite_request, body)  # a body of up to 4 MB of JSON
            model = self._other_model(http.headers.get(MODEL_HEADER, ""))
        except (ProtocolError, ValueError, TypeError) as error:
            code = error.code if isinstance(error, ProtocolError) else "bad_request"
            return _cluster_error(413 if code == "frame_too_large" else 400, code, str(error))
        return StreamingResponse(self._lines(model, request, _client(http)), media_type="application/x-ndjson")

    async def _lines(self, model: str | None, request: RewriteRequest, client: str) -> AsyncIterator[str]:
        """The rewrite's events as JSON lines (`events.event_to_wire`); when the client goes away (the
        stream is closed early), the engine stops within a step."""
        session = self._session
        if model is not None:
            assert self._session_for is not None
            told = asyncio.Event()
            loading = asyncio.ensure_future(self._session_for(model, told))
            telling = asyncio.ensure_future(told.wait())
            await asyncio.wait({loading, telling}, return_when=asyncio.FIRST_COMPLETED)
            telling.cancel()
            if told.is_set():  # not loaded on this replica yet: it loads now
                yield json.dumps(event_to_wire(Phase("loading"))) + "\n"
            try:
                session = await loading
            except Exception as error:  # a model that does not load: the client is told, the replica carries on
                if not isinstance(error, SpeceditError):
                    log.exception("loading %s failed", model)
                yield json.dumps(error_to_wire(error)) + "\n"
                return
        events = self._start(session, request, client)
        try:
            async for event in events:
                yield json.dumps(event_to_wire(self._stamped(event))) + "\n"
        except Exception as error:  # the client gets it; the door carries on
            if not isinstance(error, SpeceditError):
                log.exception("a rewrite failed")
            yield json.dumps(error_to_wire(error)) + "\n"
        finally:
            await events.aclose()

    def _start(self, session: Session, request: EngineRequest, client: str) -> EventStream:
        """The request's events, counted while the engine runs it (read to the end or not)."""
        events = session.stream(request, client=client)
        self.running += 1

        def ended(done: asyncio.Future[RewriteOutcome | None]) -> None:
            self.running -= 1
            self.last_request = time.monotonic()  # the idle timeout counts from the end of a long one
            self._cancelled += int(getattr(done.result(), "status", "") == "cancelled")

        events.ended.add_done_callback(ended)
        return events

    def _stamped(self, event: Event) -> Event:
        """A `Done` with the door's own figures (a replica's pid) in its stats."""
        if not isinstance(event, Done) or self._replica is None:
            return event
        return Done(
            dataclasses.replace(event.outcome, stats=dataclasses.replace(event.outcome.stats, replica=self._replica))
        )

    def _other_model(self, model: str) -> str | None:
        """The other model a request names; None for the deployment's own (none named, or it)."""
        if not model or model == self.model:
            return None
        if model not in self._others:
            known = ", ".join(repr(name) for name in (self.model, *self._others))
            raise ValueError(f"no model {model!r} on this engine (it has {known})")
        return model

    async def status(self, http: Request) -> Response:
        if not self._authorized(http):
            return _cluster_error(401, "unauthorized", "a wrong or missing token")
        return JSONResponse({**self._status(), "running": self.running, "cancelled": self._cancelled})

    # -- the token

    def authorizes(self, header: bytes) -> bool:
        """Whether an `Authorization` header's value is the token as a bearer (in constant time)."""
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token)

    def _authorized(self, http: Request) -> bool:
        if not self.authorizes(http.headers.get("authorization", "").encode("latin-1")):
            return False
        self.last_request = time.monotonic()  # any request with the token keeps an idle-timed daemon alive
        return True

    def _check_token(self, http: Request) -> None:
        if not self._authorized(http):
            raise _unauthorized()


def _client(http: Request) -> str:
    """Who asks, for fair turns: each connection (a peer's address and port) is a client of its own, as
    each of the socket's is; every OpenAI client sends the same key (the token), so the key cannot say."""
    return f"http {http.client.host}:{http.client.port}" if http.client else "http ?"


def _rewrite_request(body: bytes) -> RewriteRequest:
    return from_wire(RewriteRequest, json_object(body).get("request"))


def _no_such_route(method: str, path: str, status: int) -> JSONResponse:
    """An unknown path (404) or method (405): in the cluster's error shape on its routes, else OpenAI's."""
    if path.rstrip("/").endswith(("/rewrite", "/status")):
        return _cluster_error(status, "unknown_type", f"no {method} {path}")
    return _openai_error(OpenAIError(status, f"Invalid URL ({method} {path})", code="unknown_url"))


def _completion(
    asked: openai.Generation,
    *,
    prompt: str | None = None,
    messages: tuple[ChatMessage, ...] = (),
    prediction: str | None = None,
) -> CompletionRequest:
    try:
        return CompletionRequest(
            prompt=prompt,
            messages=messages,
            prediction=prediction,
            sampling=asked.sampling,
            max_new_tokens=asked.max_tokens,
            stop=asked.stop,
        )
    except ValueError as error:  # a text over the limits, a role
        code = "request_too_large" if "larger than" in str(error) else "invalid_value"
        raise invalid(str(error), code=code) from None


async def _outcome(events: EventStream) -> RewriteOutcome:
    async for event in events:
        if isinstance(event, Done):
            return event.outcome
    raise EngineUnavailableError("the engine ended the request without an answer")


async def _cancel_when_gone(http: Request, cancel: threading.Event) -> None:
    """Set `cancel` once the client has hung up (checked every `DISCONNECT_POLL` seconds)."""
    while not await http.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL)
    cancel.set()


def _chat_pieces(
    request_id: str, asked: openai.Generation, text: str, outcome: RewriteOutcome, usage: openai.Usage
) -> list[openai.ChatChunk]:
    """A whole answer as a stream: the role, the text in one piece, the end, and the usage if asked for."""
    pieces = [
        openai.chat_chunk(request_id, asked.model, {"role": "assistant", "content": ""}),
        openai.chat_chunk(request_id, asked.model, {"content": text}),
        openai.chat_chunk(request_id, asked.model, {}, openai.finish_reason(outcome)),
    ]
    if asked.include_usage:
        pieces.append(openai.chat_chunk(request_id, asked.model, None, usage_=usage))
    return pieces


async def _sse(pieces: list[openai.ChatChunk]) -> AsyncIterator[str]:
    for piece in pieces:
        yield _data(piece)
    yield "data: [DONE]\n\n"


def _data(piece: Mapping[str, object]) -> str:
    return f"data: {json.dumps(piece, ensure_ascii=False)}\n\n"


def _as_openai(error: SpeceditError) -> OpenAIError:
    """The engine's errors in OpenAI's shape: the client's request (400), an answer not to send (422), the
    engine (503, 500)."""
    if isinstance(error, ContextLengthError):
        return OpenAIError(400, str(error), code="context_length_exceeded")
    if isinstance(error, InputError):
        return OpenAIError(400, str(error), code="invalid_value")
    if isinstance(error, (MergeError, EmptyAnswerError, IncompleteOutputError)):
        code = {MergeError: "not_a_merge", EmptyAnswerError: "empty_answer"}.get(type(error), "incomplete_output")
        return OpenAIError(422, str(error), code=code)
    if isinstance(error, (ModelLoadError, EngineUnavailableError)):
        return OpenAIError(503, str(error), code="engine_unavailable", kind="server_error")
    return OpenAIError(500, str(error), code="engine_error", kind="server_error")


def _unauthorized() -> OpenAIError:
    return OpenAIError(401, "a wrong or missing API key (the engine's token)", code="invalid_api_key")


def _openai_error(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=_closing(error.status))


def _cluster_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error_code": code, "error_message": message}, status_code=status, headers=_closing(status))


def _closing(status: int) -> dict[str, str] | None:
    """A 413's connection closes after it: what is left of an outsized body is not read on."""
    return {"Connection": "close"} if status == 413 else None


async def _json_body(http: Request) -> dict[str, object]:
    """The request's JSON object, read no further than `MAX_BODY_BYTES` (`OpenAIError` for anything else)."""
    try:
        return await asyncio.to_thread(json_object, await _body_within(http, MAX_BODY_BYTES))
    except ProtocolError as error:
        if error.code == "frame_too_large":
            raise OpenAIError(413, str(error), code="request_too_large") from None
        raise invalid(str(error), code="invalid_json") from None


async def _body_within(http: Request, limit: int, *, drain: int = DRAIN_BYTES) -> bytes:
    """The request's body, read no further than `limit` bytes (`ProtocolError("frame_too_large")` past it):
    a client that declares or sends more costs the engine no more memory than the limit. The rest is read
    and dropped, up to `drain` bytes: a client still sending its body (one that asked to close the
    connection after the answer, as `urllib` does) reads the 413 rather than a reset. A client that waits
    to be asked for its body (`Expect: 100-continue`) is refused before it sends any."""
    declared = http.headers.get("content-length", "")
    waits = "100-continue" in http.headers.get("expect", "").lower()
    if declared.isdigit() and int(declared) > (limit if waits else drain):
        raise ProtocolError("frame_too_large", f"a request of {int(declared)} bytes (at most {limit})")
    body = bytearray()
    read = 0
    async for chunk in http.stream():
        read += len(chunk)
        if read <= limit:
            body += chunk
        elif read > drain:
            break
        else:
            body.clear()
    if read > limit:
        size = f"of {int(declared)} bytes" if declared.isdigit() else f"of more than {limit} bytes"
        raise ProtocolError("frame_too_large", f"a request {size} (at most {limit})")
    return bytes(body)
