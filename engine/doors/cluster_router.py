"""Routing by document on Ray Serve: a request router that sends a document's requests, rewrites and
warm-ups alike, to the replica that holds its prompt in its prefix cache.

The client names the document in a header (`DOCUMENT_HEADER`: a hash of its path, or of the file's first
lines; `backends.cluster` says which). The router sends a document to the replica that served it last. A
document it has not seen goes where rendezvous hashing over the live replicas puts it: every proxy
agrees, and a replica that comes or goes moves only its own share. When that replica has `spill_at`
requests or more, or is gone, the request spills to the least loaded one, which becomes the document's.
Requests without the header keep Serve's default, power of two choices, as do those naming another model
(Serve's multiplexing: the replica with that model loaded matters more than a prompt).

Serve's HTTP proxy hands the router each request as its pickled `StreamingHTTPRequest`, whose ASGI scope
holds the headers; the body is never read here. A request that finds no replica waits while replicas start.
One that has waited `place_timeout_s` while the cluster has no room for a replica is refused (503) with the
reason, instead of waiting for good. Ray is pinned (2.60.0): where this module reaches past Serve's public
router API, a comment says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
from collections import OrderedDict
from typing import Any, cast

import ray
from ray.serve._private.common import DeploymentID
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from specedit.engine.backends.cluster import DOCUMENT_HEADER

MAX_DOCUMENTS = 65_536  # documents whose replica is remembered; the least recently routed go first
_HEADER = DOCUMENT_HEADER.encode("latin-1")


def document_of(pending: PendingRequest | None) -> str | None:
    """The document a request names: its `DOCUMENT_HEADER`, else Serve's session header (`x-session-id`,
    which OpenAI clients can send too); None for neither."""
    if pending is None:
        return None
    for arg in pending.args:
        if isinstance(arg, bytes):  # the proxy's request, as it pickled it (a few hundred bytes: no body)
            try:
                arg = pickle.loads(arg)
            except Exception:  # not the proxy's: another caller's bytes
                continue
        scope = getattr(arg, "asgi_scope", None)
        if isinstance(scope, dict):
            for name, value in scope.get("headers", ()):
                if name.lower() == _HEADER and value:
                    return bytes(value).decode("latin-1")
    session = pending.metadata.session_id
    return session or None


def rendezvous_score(document: str, replica: str) -> int:
    """Highest random weight (rendezvous) hashing: a document goes to the replica that scores highest.
    Removing a replica moves only the documents it held; each proxy computes the same.

    >>> replicas = ["r1", "r2", "r3"]
    >>> home = max(replicas, key=lambda r: rendezvous_score("app.py", r))
    >>> other = next(r for r in replicas if r != home)  # another replica goes: app.py stays
    >>> max([r for r in replicas if r != other], key=lambda r: rendezvous_score("app.py", r)) == home
    True
    """
    digest = hashlib.blake2b(f"{document}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class NoRoomError(DeploymentUnavailableError):
    """No replica runs, and the cluster has no room to place one: Serve's proxy answers 503 with this
    message (`DeploymentUnavailableError`'s status)."""

    def __init__(self, deployment_id: DeploymentID, reason: str) -> None:
        super().__init__(deployment_id)
        Exception.__init__(self, deployment_id, reason)  # its arguments, should it be pickled
        self._reason = reason

    @property
    def message(self) -> str:
        return self._reason

    def __str__(self) -> str:
        return self._reason


class DocumentRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Serve's request router for the engine's deployment (see the module docstring). No `FIFOMixin`: a
    replica chosen for a request goes to that request, not to the oldest one waiting."""

    def initialize_state(self, **kwargs: Any) -> None:
        """Serve calls it with `RequestRouterConfig.request_router_kwargs`, which `cluster_deploy.deploy`
        gives: `spill_at`, `place_timeout_s`, `cpus_per_replica`, `gpus_per_replica`."""
        self._spill_at = int(kwargs["spill_at"])
        self._place_timeout_s = float(kwargs["place_timeout_s"])
        self._demand = (float(kwargs["cpus_per_replica"]), float(kwargs["gpus_per_replica"]))
        self._homes: OrderedDict[str, ReplicaID] = OrderedDict()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        document = document_of(pending_request)
        if document is None or pending_request is None or pending_request.metadata.multiplexed_model_id:
            default = PowerOfTwoChoicesRequestRouter.choose_replicas  # its mixins are this class's too
            ranks: list[list[RunningReplica]] = await default(cast(Any, self), candidate_replicas, pending_request)
            return ranks
        if not candidate_replicas:
            return []
        pending_request.routing_context.should_backoff = True  # every replica is a candidate at once
        return [[await self._replica_for(document, candidate_replicas)]]

    async def _replica_for(self, document: str, replicas: list[RunningReplica]) -> RunningReplica:
        """The document's replica: the one that served it last, else its rendezvous choice; or, where that
        one is busy past the bound or does not answer, the least loaded other one that is less busy."""
        by_id = {replica.replica_id: replica for replica in replicas}
        served = self._homes.get(document)
        home = by_id.get(served) if served is not None else None
        if home is None:
            home = max(replicas, key=lambda replica: rendezvous_score(document, replica.replica_id.unique_id))
        queue = (await self._queue_lengths([home]))[home.replica_id]
        if queue is not None and queue < self._spill_at:
            return home
        others = [replica for replica in replicas if replica.replica_id != home.replica_id]
        lengths = await self._queue_lengths(others)
        known = [(length, replica) for replica in others if (length := lengths[replica.replica_id]) is not None]
        if known:
            length, least = min(known, key=lambda pair: pair[0])
            if queue is None or length < queue:
                return least
        return home

    async def _queue_lengths(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int | None]:
        """Each replica's requests, from Serve's cache where it is fresh, else asked (None: no answer)."""
        lengths: dict[ReplicaID, int | None] = {}
        asked = []
        for replica in replicas:
            cached = self.replica_queue_len_cache.get(replica.replica_id)
            if cached is None:
                asked.append(replica)
            lengths[replica.replica_id] = cached
        if asked:  # Serve's own probe (private): it drops a replica whose actor died
            for replica, length in await self._probe_queue_lens(asked, 0):
                lengths[replica.replica_id] = length
        return lengths

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """A replica took the request: the document's replica from now on."""
        document = document_of(pending_request)
        if document is None or pending_request.metadata.multiplexed_model_id:
            return
        self._homes[document] = replica_id
        self._homes.move_to_end(document)
        while len(self._homes) > MAX_DOCUMENTS:
            self._homes.popitem(last=False)

    async def _choose_replica_for_request(
        self, pending_request: PendingRequest, *, is_retry: bool = False
    ) -> RunningReplica:
        """Serve's wait for a replica (private), which never ends while none runs: a request that finds
        none is refused once the cluster has had no room for one during `place_timeout_s`."""
        watch = None
        if not self.curr_replicas:
            watch = asyncio.get_running_loop().create_task(self._refuse_without_room(pending_request))
        try:
            replica: RunningReplica = await super()._choose_replica_for_request(pending_request, is_retry=is_retry)
            return replica
        finally:
            if watch is not None:
                watch.cancel()

    async def _refuse_without_room(self, pending_request: PendingRequest) -> None:
        while True:
            await asyncio.sleep(self._place_timeout_s)
            if self.curr_replicas or pending_request.future.done():
                return
            deployment: DeploymentID = self._deployment_id  # (private: the deployment's name)
            states = await asyncio.to_thread(replica_states, deployment.app_name, deployment.name)
            reason = None if "ALIVE" in states else no_room(deployment.app_name, *self._demand, states)
            if reason is not None and not pending_request.future.done():
                pending_request.future.set_exception(NoRoomError(deployment, reason))
                self._remove_pending_request_from_indices(pending_request)  # (private: as Serve's cancel does)
                return


def replica_states(app: str, deployment: str) -> list[str]:
    """The states of the deployment's replica actors in Ray's actor table: PENDING_CREATION for one that
    waits for room (or for its process), ALIVE for one placed (loading its model or serving), DEAD. The
    table (`ray._private.state`) is the one place that tells a replica waiting for room from one loading."""
    from ray._private import state

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    actors = state.actors().values()
    return [str(info.get("State")) for info in actors if str(info.get("Name", "")).startswith(prefix)]


def no_room(app: str, cpus: float, gpus: float, states: list[str]) -> str | None:
    """Why the cluster cannot place a replica of `app` now, or None where it can: one of its replicas waits
    (`replica_states`), and fewer CPUs or GPUs are free than a replica asks for."""
    if "PENDING_CREATION" not in states:
        return None
    free: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
    total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    if free.get("CPU", 0.0) >= cpus and free.get("GPU", 0.0) >= gpus:
        return None
    asks = f"{cpus:g} CPUs" + (f" and {gpus:g} GPUs" if gpus else "")
    has = f"{free.get('CPU', 0.0):g} CPUs free of {total.get('CPU', 0.0):g}"
    if gpus:
        has += f", {free.get('GPU', 0.0):g} GPUs free of {total.get('GPU', 0.0):g}"
    return (
        f"the cluster has no room for a replica of {app!r}: each asks for {asks}, and it has {has} "
        "(free some, add a node, or deploy with fewer CPUs per replica)"
    )
