"""The Ray side of a team's shared engine: the Serve replica and `deploy` (`specedit cluster deploy`).

A replica is a session on a `LocalBackend` loaded in its constructor (one rewrite at a time on it,
whichever model it names; the others wait there in turn, told their place on that replica, as in the
daemon), behind the HTTP door (`http.door`); Serve spreads requests over the replicas and scales them
between the deployment's bounds, aiming at one running rewrite per replica (speculation pays at low
concurrency). More models a request may name (`models`) are Serve's
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
from dataclasses import dataclass
from typing import TypedDict

from starlette.requests import Request
from starlette.responses import Response

from specedit.engine.backends.cluster import DEFAULT_PORT
from specedit.engine.backends.local import LocalBackend
from specedit.engine.records.options import EngineOptions
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
            Session(backend),
            token=token,
            model=options.model or DEFAULT_MODEL.name,
            others=models,
            session_for=session_for,
            status=lambda: {"model": options.model, "models": list(models), "pid": os.getpid()},
            replica=os.getpid(),
        )

    async def __call__(self, http: Request) -> Response:
        return await self._door.handle(http)


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


class Scaling(TypedDict, total=False):
    """Serve's replicas: a fixed number, or bounds it scales between."""

    num_replicas: int
    autoscaling_config: dict[str, int]


def deploy(config: ClusterConfig) -> str:
    """Deploy (or update) the engine on the Ray cluster this process is connected to; its HTTP address.
    Returns once every replica has loaded its model. The HTTP proxy's place (host, port, TLS) is set by
    the first deployment of a cluster; later ones share it."""
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
