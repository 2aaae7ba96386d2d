"""The Ray side of a team's shared engine: the Serve replica and `deploy` (`specedit cluster deploy`).

A replica is a session on a `LocalBackend` loaded in its constructor (one rewrite at a time on it,
whichever model it names; the others wait there in turn, told their place on that replica, as in the
daemon), behind the HTTP door (`http.door`), plus the editors' warm-ups (POST /warm). Serve's router sends
a document's requests to the replica that holds its prompt (`cluster_router`, unless `document_routing`
is off) and scales the replicas between the deployment's bounds, aiming at one running rewrite per
replica (speculation pays at low concurrency). `deploy` says so when the cluster has no room for a
replica, rather than waiting for good. More models a request may name (`models`) are Serve's
multiplexed models: a replica loads one on first use and keeps the `models_per_replica` used last, and
Serve sends a request that names one to a replica that has it loaded, when there is one.
The HTTP endpoints and their wire are described in `cluster` (the client's side). Ray is an optional extra
(`pip install 'specedit[cluster]'`), imported here only inside `deploy` and the replicas.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, TypedDict

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specedit.engine.backends.cluster import DEFAULT_PORT, MAX_BODY_BYTES, error_body, json_object
from specedit.engine.backends.local import LocalBackend
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import WarmRequest
from specedit.engine.records.wire import ProtocolError, from_wire
from specedit.engine.session.session import Session
from specedit.engine.store.store import DEFAULT_MODEL

log = logging.getLogger(__name__)

_LOADING: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("specedit_loading", default=None)

APP_NAME = "specedit"
DEPLOYMENT_NAME = "engine"


class EngineReplica:
    """One Serve replica: the engine, loaded in the constructor, behind the HTTP door (`http.door`: the
    cluster's own wire, which `cluster` describes, and OpenAI's API)."""

    def __init__(
        self, options: EngineOptions, token: str, models: tuple[str, ...] = (), models_per_replica: int = 1
    ) -> None:
        from specedit.engine.doors.http.door import Door

        backend = LocalBackend(options)
        backend.load()
        self._session = Session(backend)
        session_for = None
        if models:  # the only others a request may name: a client never makes a replica load a path
            from ray import serve

            async def load(model: str) -> Session:
                told = _LOADING.get()
                if told is not None:
                    told.set()  # the request that waits for it says so
                other = backend.beside(dataclasses.replace(options, model=model))
                await asyncio.to_thread(other.load)
                return Session(other)

            loader = serve.multiplexed(max_num_models_per_replica=models_per_replica)(load)

            async def session_for(model: str, told: asyncio.Event) -> Session:
                context = contextvars.copy_context()
                context.run(_LOADING.set, told)
                session: Session = await asyncio.get_running_loop().create_task(loader(model), context=context)
                return session

        self._door = Door(
            self._session,
            token=token,
            model=options.model or DEFAULT_MODEL.name,
            others=models,
            session_for=session_for,
            status=lambda: {
                "model": options.model,
                "models": list(models),
                "pid": os.getpid(),
                "warming": backend.warming,
                "to_warm": backend.to_warm(),
            },
            replica=os.getpid(),
        )

    async def __call__(self, http: Request) -> Response:
        if http.method == "POST" and http.url.path.rstrip("/").endswith("/warm"):
            return await self.warm(http)
        return await self._door.handle(http)

    async def warm(self, http: Request) -> Response:
        """POST /warm: a document an editor has open, prefilled here while no rewrite runs or waits (the
        router sent it where its rewrites go). Answers at once whether it was taken, and by which pid."""
        if not self._door.authorizes(http.headers.get("authorization", "").encode("latin-1")):
            return JSONResponse(error_body("unauthorized", "a wrong or missing token"), status_code=401)
        try:
            body = await _body_within(http, MAX_BODY_BYTES)
            request = await asyncio.to_thread(_warm_request, body)  # up to 4 MB of JSON
        except (ProtocolError, ValueError, TypeError) as error:
            code = error.code if isinstance(error, ProtocolError) else "bad_request"
            status = 413 if code == "frame_too_large" else 400
            return JSONResponse(error_body(code, str(error)), status_code=status)
        return JSONResponse({"accepted": self._session.warm(request), "replica": os.getpid()})


def _warm_request(body: bytes) -> WarmRequest:
    return from_wire(WarmRequest, json_object(body).get("request"))


async def _body_within(http: Request, limit: int) -> bytes:
    """The body, or `ProtocolError("frame_too_large")` once it (or its declared length) passes `limit`."""
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ProtocolError("frame_too_large", f"a request of {int(declared)} bytes (at most {limit})")
    body = bytearray()
    async for chunk in http.stream():
        body += chunk
        if len(body) > limit:
            raise ProtocolError("frame_too_large", f"a request of more than {limit} bytes (at most {limit})")
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
    # A document's requests go to the replica that holds its prompt (`cluster_router`); off: Serve's
    # default router (power of two choices), as for the load replay's comparison.
    document_routing: bool = True
    spill_at: int = 2  # requests on a document's replica (one running, one waiting) from which the next spills
    # How long a replica may wait for room (CPUs, GPUs) before `deploy` and a request that finds no
    # replica are told so.
    place_timeout_s: float = 30.0
    # Serve's autoscaler, for MIN:MAX: ongoing requests a replica aims at (one running: speculation pays
    # at low concurrency), and how long the load must stay over or under it before a replica comes or goes.
    target_ongoing_requests: float = 1.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 120.0

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
        if self.spill_at < 1:
            raise ValueError(f"spill at {self.spill_at}: need at least 1")
        if self.place_timeout_s <= 0 or self.target_ongoing_requests <= 0:
            raise ValueError("the place timeout and the target of ongoing requests must be positive")
        if self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("scaling delays cannot be negative")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}{self.route.rstrip('/')}"


class Scaling(TypedDict, total=False):
    """Serve's replicas: a fixed number, or bounds it scales between."""

    num_replicas: int
    autoscaling_config: dict[str, float]


def deploy(config: ClusterConfig) -> str:
    """Deploy (or update) the engine on the Ray cluster this process is connected to; its HTTP address.
    Returns once every replica has loaded its model; `EngineUnavailableError` when the deployment failed,
    or when a replica has waited `place_timeout_s` for room the cluster does not have (the application
    stays, and comes up once there is room). The HTTP proxy's place (host, port, TLS) is set by the first
    deployment of a cluster; later ones share it."""
    from ray import serve

    http: dict[str, object] = {"host": config.host, "port": config.port}
    if config.tls_cert is not None:
        http.update(ssl_certfile=config.tls_cert, ssl_keyfile=config.tls_key)
    serve.start(http_options=http)
    scaling: Scaling
    if config.min_replicas == config.max_replicas:
        scaling = {"num_replicas": config.min_replicas}
    else:
        scaling = {
            "autoscaling_config": {
                "min_replicas": config.min_replicas,
                "max_replicas": config.max_replicas,
                "target_ongoing_requests": config.target_ongoing_requests,
                "upscale_delay_s": config.upscale_delay_s,
                "downscale_delay_s": config.downscale_delay_s,
            }
        }
    routing: dict[str, Any] = {}
    if config.document_routing:
        from ray.serve.config import RequestRouterConfig

        from specedit.engine.doors.cluster_router import DocumentRouter

        kwargs = {
            "spill_at": config.spill_at,
            "place_timeout_s": config.place_timeout_s,
            "cpus_per_replica": config.cpus_per_replica,
            "gpus_per_replica": config.gpus_per_replica,
        }
        routing["request_router_config"] = RequestRouterConfig(
            request_router_class=DocumentRouter,  # type: ignore[arg-type]  # (its `**kwargs` are the fields)
            request_router_kwargs=kwargs,
        )
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME,
        ray_actor_options={"num_cpus": config.cpus_per_replica, "num_gpus": config.gpus_per_replica},
        max_ongoing_requests=4,  # one runs; the others wait on the replica, told they are queued
        **scaling,
        **routing,
    )(EngineReplica)
    application = deployment.bind(config.options, config.token, config.models, config.models_per_replica)
    target = serve.RunTarget(application, name=config.name, route_prefix=config.route)
    serve.run_many([target], wait_for_applications_running=False)
    _wait_until_running(config)
    return config.url


def _wait_until_running(config: ClusterConfig) -> None:
    """Serve's own wait, which never ends while a replica has no room: this one says so after
    `place_timeout_s` (and then every few seconds it is asked, while the cluster's resources change)."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    from specedit.engine.doors.cluster_router import no_room, replica_states

    started = time.monotonic()
    checked = started
    while True:
        app = serve.status().applications.get(config.name)
        if app is None:  # (deleted meanwhile, by another client)
            raise EngineUnavailableError(f"the application {config.name!r} is gone from the cluster")
        if app.status == ApplicationStatus.RUNNING:
            return
        if app.status in (ApplicationStatus.DEPLOY_FAILED, ApplicationStatus.UNHEALTHY):
            said = app.message or "; ".join(d.message for d in app.deployments.values() if d.message)
            raise EngineUnavailableError(f"the application {config.name!r} did not deploy: {said}")
        now = time.monotonic()
        if now - started >= config.place_timeout_s and now - checked >= min(config.place_timeout_s, 5.0):
            checked = now
            states = replica_states(config.name, DEPLOYMENT_NAME)
            reason = no_room(config.name, config.cpus_per_replica, config.gpus_per_replica, states)
            if reason is not None:
                running = states.count("ALIVE")
                serving = f"it serves with {running} replica(s) meanwhile" if running else "nothing serves it"
                raise EngineUnavailableError(
                    f"{reason}. The application waits for room ({serving}); "
                    f"`specedit cluster shutdown --name {config.name}` takes it down"
                )
        time.sleep(0.25)
