"""Routing by document (`cluster_router`) without a cluster: the router Serve's proxy runs, given stand-in
replicas and the queue lengths Serve would tell it, and the keys the client sends (`backends.cluster`).

The real thing, on a local Ray cluster, is in test_cluster.py: a document's rewrites and warm-up land on
one replica there, and a busy one spills.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlparse

import pytest

pytest.importorskip("ray.serve", reason="the cluster extra: pip install -e '.[cluster]'")

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    ReplicaID,
    RequestMetadata,
    StreamingHTTPRequest,
)
from ray.serve.request_router import PendingRequest

from specedit.engine.backends.cluster import (
    DOCUMENT_HEADER,
    HEAD_CHARS,
    document_key,
    rewrite_key,
    warm_key,
)
from specedit.engine.doors.cluster_router import (
    DocumentRouter,
    NoRoomError,
    document_of,
    rendezvous_score,
)
from specedit.engine.records.requests import RewriteRequest, WarmRequest

DEPLOYMENT = DeploymentID(name="engine", app_name="specedit")


@dataclass
class Replica:
    """What the router reads of a `RunningReplica`."""

    replica_id: ReplicaID
    max_ongoing_requests: int = 4
    node_id: str = "node"
    availability_zone: str | None = None
    multiplexed_model_ids: frozenset[str] = frozenset()


def replicas(*names: str) -> list[Any]:
    return [Replica(ReplicaID(name, DEPLOYMENT)) for name in names]


def pending(document: str | None = None, *, session: str = "", model: str = "") -> PendingRequest:
    """A request as Serve's proxy hands it to the router: its pickled `StreamingHTTPRequest`."""
    headers = [(b"authorization", b"Bearer x")]
    if document is not None:
        headers.append((DOCUMENT_HEADER.encode(), document.encode()))
    scope = {"type": "http", "method": "POST", "path": "/rewrite", "headers": headers}
    arg = pickle.dumps(StreamingHTTPRequest(scope, proxy_actor_name="proxy"))
    metadata = RequestMetadata(request_id="r", internal_request_id="r", session_id=session, multiplexed_model_id=model)
    return PendingRequest(args=[arg], kwargs={}, metadata=metadata)


def router(queues: dict[str, int | None], spill_at: int = 2) -> DocumentRouter:
    """A router whose replicas answer `queues` when asked (None: no answer, as a dead one)."""
    made = DocumentRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    made.initialize_state(spill_at=spill_at, place_timeout_s=30.0, cpus_per_replica=1.0, gpus_per_replica=0.0)

    async def probe(asked: list[Any], backoff: int) -> list[tuple[Any, int | None]]:
        return [(replica, queues[replica.replica_id.unique_id]) for replica in asked]

    made._probe_queue_lens = probe  # type: ignore[method-assign]
    return made


def home_of(document: str, names: list[str]) -> str:
    return max(names, key=lambda name: rendezvous_score(document, name))


@pytest.mark.asyncio
async def test_the_router_reads_the_document_from_the_proxys_request() -> None:
    assert document_of(pending("abc123")) == "abc123"
    assert document_of(pending(None, session="chat-7")) == "chat-7"  # Serve's session header, as a fallback
    assert document_of(pending(None)) is None
    foreign = pending(None)
    foreign.args = [b"not a pickle", {"prompt": "x"}]
    assert document_of(foreign) is None and document_of(None) is None


def test_rendezvous_moves_only_the_documents_of_a_replica_that_goes_or_comes() -> None:
    names = ["r1", "r2", "r3", "r4"]
    documents = [f"doc{i}" for i in range(2000)]
    before = {doc: home_of(doc, names) for doc in documents}
    after = {doc: home_of(doc, ["r1", "r2", "r4"]) for doc in documents}
    assert {doc for doc in documents if before[doc] != after[doc]} == {doc for doc in documents if before[doc] == "r3"}
    grown = {doc: home_of(doc, [*names, "r5"]) for doc in documents}
    moved = [doc for doc in documents if grown[doc] != before[doc]]
    assert all(grown[doc] == "r5" for doc in moved) and 0.1 < len(moved) / len(documents) < 0.3
    shares = [list(before.values()).count(name) / len(documents) for name in names]
    assert all(0.2 < share < 0.3 for share in shares)  # spread evenly


@pytest.mark.asyncio
async def test_a_document_stays_on_its_replica_until_it_is_busy_then_spills_to_the_least_loaded() -> None:
    names = ["a", "b", "c"]
    home = home_of("doc", names)
    others = sorted(name for name in names if name != home)
    queues: dict[str, int | None] = {home: 0, others[0]: 1, others[1]: 0}
    chosen = (await router(queues).choose_replicas(replicas(*names), pending("doc")))[0][0]
    assert chosen.replica_id.unique_id == home
    queues[home] = 1  # one running: the next waits there, where its prompt is
    assert (await router(queues).choose_replicas(replicas(*names), pending("doc")))[0][0].replica_id.unique_id == home
    queues[home] = 2  # one running, one waiting: the next goes to the least loaded other
    spilled = (await router(queues).choose_replicas(replicas(*names), pending("doc")))[0][0]
    assert spilled.replica_id.unique_id == others[1]
    queues.update({others[0]: 2, others[1]: 3})  # every other is as busy or busier: it stays
    stays = (await router(queues).choose_replicas(replicas(*names), pending("doc")))[0][0]
    assert stays.replica_id.unique_id == home
    queues[home] = None  # its replica does not answer (died): the least loaded other
    gone = (await router(queues).choose_replicas(replicas(*names), pending("doc")))[0][0]
    assert gone.replica_id.unique_id == others[0]


@pytest.mark.asyncio
async def test_a_document_goes_where_it_was_served_last_and_a_replica_that_went_moves_it() -> None:
    names = ["a", "b", "c"]
    routing = router(dict.fromkeys(names, 0))
    served = next(name for name in names if name != home_of("doc", names))
    request = pending("doc")
    routing.on_request_routed(request, ReplicaID(served, DEPLOYMENT), None)  # it spilled there once
    chosen = (await routing.choose_replicas(replicas(*names), pending("doc")))[0][0]
    assert chosen.replica_id.unique_id == served
    left = [name for name in names if name != served]  # that replica went: rendezvous among the rest
    chosen = (await routing.choose_replicas(replicas(*left), pending("doc")))[0][0]
    assert chosen.replica_id.unique_id == home_of("doc", left)


@pytest.mark.asyncio
async def test_requests_without_a_document_or_naming_a_model_keep_serves_default() -> None:
    names = ["a", "b", "c"]
    routing = router(dict.fromkeys(names, 0))
    routing.update_replicas(replicas(*names))
    ranks = await routing.choose_replicas(replicas(*names), pending(None))
    assert len(ranks) == 1 and len(ranks[0]) == 2  # power of two choices: two at random
    routing.on_request_routed(pending(None), ReplicaID("a", DEPLOYMENT), None)
    routing.on_request_routed(pending("doc", model="other"), ReplicaID("a", DEPLOYMENT), None)
    assert not routing._homes  # neither is remembered


def test_the_client_keys_a_document_by_its_path_or_its_start() -> None:
    uri = "file:///home/me/my%20project/caf%C3%A9.py"
    path = unquote(urlparse(uri).path)  # what the language server gives a rewrite (`lsp.jobs`)
    warmed = WarmRequest("x = 1\n", "python", uri)
    rewritten = RewriteRequest(original="x = 2\n", instruction="Rename.", path=path)
    assert rewrite_key(rewritten) == warm_key(warmed) == document_key(path, "")
    assert len(warm_key(warmed)) == 16 and quote(path) not in warm_key(warmed)  # a hash: no path on the wire
    untitled = WarmRequest("y = 1\n" * 1000, "python", "untitled:Untitled-1")
    whole = RewriteRequest(original=untitled.document[:HEAD_CHARS] + "z = 3\n", instruction="Rename.")
    assert warm_key(untitled) == rewrite_key(whole)  # no path: the start of the text it shares
    assert rewrite_key(RewriteRequest(original="other\n", instruction="Rename.")) != rewrite_key(whole)


def test_no_room_is_serves_unavailable_error_with_the_reason() -> None:
    from ray.serve._private.http_util import get_http_response_status

    error = NoRoomError(DEPLOYMENT, "the cluster has no room")
    status = get_http_response_status(error, None, "r")
    assert (status.code, status.message) == (503, "the cluster has no room")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.message == "the cluster has no room"


def test_the_docstrings_examples_hold() -> None:
    import doctest

    from specedit.engine.backends import cluster
    from specedit.engine.doors import cluster_router

    assert doctest.testmod(cluster).failed == 0 and doctest.testmod(cluster_router).failed == 0
