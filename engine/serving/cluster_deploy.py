"""The Ray side of a team's shared engine: the Serve replica and `deploy` (`specedit cluster deploy`).

A replica is a session on a `LocalBackend` loaded in its constructor (one rewrite at a time on it, whichever model it
names; the others wait there in turn, told their place on that replica, as in the daemon); Serve spreads
requests over the replicas and scales them between the deployment's bounds, aiming at one running rewrite
per replica (speculation pays at low concurrency). More models a request may name (`models`) are Serve's
multiplexed models: a replica loads one on first use and keeps the `models_per_replica` used last, and
Serve sends a request that names one to a replica that has it loaded, when there is one.
The HTTP endpoints and their wire are described in `cluster` (the client's side). Ray is an optional extra
(`pip install 'specedit[cluster]'`), imported here only inside `deploy` and the replicas.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hmac
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from specedit.engine.errors import SpeceditError
from specedit.engine.events import Done, Phase, error_to_wire, event_to_wire
from specedit.engine.options import EngineOptions
from specedit.engine.requests import RewriteRequest
from specedit.engine.serving.cluster import DEFAULT_PORT, MAX_BODY_BYTES, MODEL_HEADER, error_body, json_object
from specedit.engine.serving.local import LocalBackend
from specedit.engine.session import Session
from specedit.engine.wire import ProtocolError, from_wire

log = logging.getLogger(__name__)

_LOADING: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("specedit_loading", default=None)

APP_NAME = "specedit"
DEPLOYMENT_NAME = "engine"


class EngineReplica:
    """One Serve replica: the engine, loaded in the constructor, behind the endpoints `cluster` describes."""

    def __init__(
        self, options: EngineOptions, token: str, models: tuple[str, ...] = (), models_per_replica: int = 1
    ) -> None:
        if not token:
            raise ValueError("a cluster engine needs a token")
        self._token = token.encode()
        self._options = options
        self._backend = LocalBackend(options)
        self._backend.load()
        self._session = Session(self._backend)
        self._models = models  # the only others a request may name: a client never makes a replica load a path
        self._session_for: Any = None
        if models:
            from ray import serve

            async def load(model: str) -> Session:
                told = _LOADING.get()
                if told is not None:
                    told.set()  # the request that waits for it says so
                backend = self._backend.beside(dataclasses.replace(options, model=model))
                await asyncio.to_thread(backend.load)
                return Session(backend)

            self._session_for = serve.multiplexed(max_num_models_per_replica=models_per_replica)(load)
        self._count_lock = threading.Lock()
        self._running = 0  # rewrites on this replica now
        self._cancelled = 0  # rewrites its engine stopped because their client went away

    async def __call__(self, http: Any) -> Any:  # starlette's Request -> Response
        from starlette.responses import JSONResponse, StreamingResponse

        if not self._authorized(http.headers.get("authorization", "")):
            return JSONResponse(error_body("unauthorized", "a wrong or missing token"), status_code=401)
        path = http.url.path.rstrip("/")
        if http.method == "GET" and path.endswith("/status"):
            with self._count_lock:
                counts = {"running": self._running, "cancelled": self._cancelled}
            models = {"model": self._options.model, "models": list(self._models)}
            return JSONResponse({**models, "pid": os.getpid(), **counts})
        if not (http.method == "POST" and path.endswith("/rewrite")):
            return JSONResponse(error_body("unknown_type", f"no {http.method} {path}"), status_code=404)
        # Whatever the body is, a refusal is a 4xx in the door's error shape, never Starlette's bare 500:
        # `json_object` turns every way JSON can be bad into a `ProtocolError`, and `from_wire` checks the
        # shape against `RewriteRequest` (its own validation raises ValueError).
        try:
            body = await _body_within(http, MAX_BODY_BYTES)
            request = from_wire(RewriteRequest, json_object(body).get("request"))
            model = self._model_named(http.headers.get(MODEL_HEADER, ""))
        except (ProtocolError, ValueError, TypeError) as error:
            code = error.code if isinstance(error, ProtocolError) else "bad_request"
            status = 413 if code == "frame_too_large" else 400
            return JSONResponse(error_body(code, str(error)), status_code=status)
        return StreamingResponse(self._events(model, request), media_type="application/x-ndjson")

    def _model_named(self, model: str) -> str | None:
        """The other model a request names; None for the deployment's own (none named, or it)."""
        if not model or model == self._options.model:
            return None
        if model not in self._models:
            known = ", ".join(repr(name) for name in (self._options.model or "the default", *self._models))
            raise ValueError(f"no model {model!r} on this engine (it has {known})")
        return model

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token)

    def _count(self, *, running: int = 0, cancelled: int = 0) -> None:
        with self._count_lock:
            self._running += running
            self._cancelled += cancelled

    async def _events(self, model: str | None, request: RewriteRequest) -> AsyncIterator[str]:
        """The rewrite's events as lines; when the client goes away (the stream is closed early), the
        engine stops within a step."""
        session = self._session
        if model is not None:
            told = asyncio.Event()
            context = contextvars.copy_context()
            context.run(_LOADING.set, told)
            loading = asyncio.get_running_loop().create_task(self._session_for(model), context=context)
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
        events = session.stream(request)
        self._count(running=1)
        events.ended.add_done_callback(
            lambda ended: self._count(running=-1, cancelled=int(getattr(ended.result(), "status", "") == "cancelled"))
        )
        try:
            async for event in events:
                if isinstance(event, Done):
                    self._count(cancelled=int(event.outcome.status == "cancelled"))
                    outcome = dataclasses.replace(event.outcome, stats={**event.outcome.stats, "replica": os.getpid()})
                    event = Done(outcome)
                yield json.dumps(event_to_wire(event)) + "\n"
        except Exception as error:  # the client gets it; the replica carries on
            if not isinstance(error, SpeceditError):
                log.exception("a rewrite failed")
            yield json.dumps(error_to_wire(error)) + "\n"
        finally:
            await events.aclose()  # the client went away before the end: the engine stops within a step


async def _body_within(http: Any, limit: int) -> bytes:
    """The request's body, read no further than `limit` bytes (`ProtocolError("frame_too_large")` past it):
    a client that declares or sends more costs the replica no more memory than the limit."""
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ProtocolError("frame_too_large", f"a request of {int(declared)} bytes (at most {limit})")
    body = bytearray()
    async for chunk in http.stream():
        body += chunk
        if len(body) > limit:
            raise ProtocolError("frame_too_large", f"a request of more than {limit} bytes")
    return bytes(body)


@dataclass(frozen=True)
class ClusterConfig:
    """A deployment: the engine each replica loads, how many replicas, where Serve's HTTP proxy listens."""

    options: EngineOptions
    token: str
    min_replicas: int = 1
    max_replicas: int = 1
    host: str = "127.0.0.1"  # Serve's proxy; 0.0.0.0 opens it to the network (on purpose only)
    port: int = DEFAULT_PORT
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    tls_cert: str | None = None  # both: Serve's proxy speaks HTTPS (the token then never crosses in clear)
    tls_key: str | None = None
    name: str = APP_NAME  # the Serve application: several engines (models) may share one cluster
    route: str = "/"  # where its address ends: https://HOST:PORT/ROUTE
    models: tuple[str, ...] = ()  # others a request may name (Serve's model multiplexing), loaded on demand
    models_per_replica: int = 1  # of those, how many a replica keeps loaded (the least recently used goes)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"replicas {self.min_replicas}:{self.max_replicas}: need 1 <= min <= max")
        if not self.token:
            raise ValueError("a cluster engine needs a token")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and its key")
        if not self.route.startswith("/"):
            raise ValueError(f"the route {self.route!r} must start with /")
        if self.models_per_replica < 1:
            raise ValueError(f"models per replica {self.models_per_replica}: need at least 1")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}{self.route.rstrip('/')}"


def deploy(config: ClusterConfig) -> str:
    """Deploy (or update) the engine on the Ray cluster this process is connected to; its HTTP address.
    Returns once every replica has loaded its model. The HTTP proxy's place (host, port, TLS) is set by
    the first deployment of a cluster; later ones share it."""
    from ray import serve

    http: dict[str, Any] = {"host": config.host, "port": config.port}
    if config.tls_cert is not None:
        http.update(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
    serve.start(http_options=http)
    scaling: dict[str, Any]
    if config.min_replicas == config.max_replicas:
        scaling = {"num_replicas": config.min_replicas}
    else:
        scaling = {
            "autoscaling_config": {
                "min_replicas": config.min_replicas,
                "max_replicas": config.max_replicas,
                "target_ongoing_requests": 1,
            }
        }
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME,
        ray_actor_options={"num_cpus": config.cpus_per_replica, "num_gpus": config.gpus_per_replica},
        max_ongoing_requests=4,  # one runs; the others wait on the replica, told they are queued
        **scaling,
    )(EngineReplica)
    application = deployment.bind(config.options, config.token, config.models, config.models_per_replica)
    serve.run(application, name=config.name, route_prefix=config.route)
    return config.url
