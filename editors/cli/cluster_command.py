"""`specedit cluster`: deploy the engine on a Ray cluster (Ray Serve), tell its state, take it down.

Needs the optional extra: `pip install 'specedit[cluster]'`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from specedit.engine.backends.config import read_token
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.options import EngineOptions, add_engine_arguments


def add_cluster_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `cluster` to the `specedit` subcommands."""
    cluster: argparse.ArgumentParser = subparsers.add_parser(
        "cluster",
        help="a team's shared engine on a Ray cluster (Ray Serve): deploy, status, shutdown",
        description="Run the engine as a Ray Serve application on the cluster `ray start` made; editors and "
        "`specedit rewrite --engine http://HOST:PORT --engine-token-file FILE` use it.",
    )
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    deploy = actions.add_parser("deploy", help="deploy (or update) the engine; returns once every replica is loaded")
    deploy.add_argument("--token-file", type=Path, required=True, metavar="FILE", help="its first line is the token")
    deploy.add_argument(
        "--replicas", default="1", metavar="N|MIN:MAX", help="a fixed count, or autoscaling bounds (default 1)"
    )
    deploy.add_argument(
        "--host",
        default="127.0.0.1",
        help="where Serve's HTTP proxy listens (default 127.0.0.1; 0.0.0.0 opens it to the network: put TLS in front)",
    )
    deploy.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (default 8000)")
    deploy.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (and --tls-key)")
    deploy.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    deploy.add_argument("--name", default="specedit", help="the Serve application (default specedit): one per engine")
    deploy.add_argument("--route", default="/", help="its place in the address, e.g. /1.5b (default /)")
    deploy.add_argument(
        "--other-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="another model a request may name (--model on the client), loaded by a replica on first use; repeatable",
    )
    deploy.add_argument(
        "--models-per-replica",
        type=int,
        default=1,
        metavar="N",
        help="how many other models a replica keeps loaded beside --model (default 1; the least recently used goes)",
    )
    deploy.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="N", help="default 1")
    deploy.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="N", help="default 0")
    routing = deploy.add_argument_group("routing and scaling")
    routing.add_argument(
        "--no-document-routing",
        dest="document_routing",
        action="store_false",
        help="route by Serve's default (power of two choices), not each document to the replica holding its prompt",
    )
    routing.add_argument(
        "--spill-at",
        type=int,
        default=2,
        metavar="N",
        help="requests on a document's replica from which the next goes to a less busy one (default 2)",
    )
    routing.add_argument(
        "--place-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a replica may wait for CPUs or GPUs before deploy and requests are told (default 30)",
    )
    routing.add_argument(
        "--target-ongoing",
        type=float,
        default=1.0,
        metavar="N",
        help="with MIN:MAX, the requests per replica the autoscaler aims at (default 1)",
    )
    routing.add_argument(
        "--upscale-delay",
        type=float,
        default=10.0,
        metavar="S",
        help="with MIN:MAX, seconds of load before a replica comes (default 10)",
    )
    routing.add_argument(
        "--downscale-delay",
        type=float,
        default=120.0,
        metavar="S",
        help="with MIN:MAX, seconds of low load before a replica goes (default 120)",
    )
    add_engine_arguments(deploy.add_argument_group("engine"))
    status = actions.add_parser("status", help="the application's and its replicas' state, as JSON")
    shutdown = actions.add_parser("shutdown", help="delete the engine's application from the cluster")
    for action in (deploy, status, shutdown):
        action.add_argument("--address", default="auto", help="the Ray cluster (default: the one on this machine)")
    for action in (status, shutdown):
        action.add_argument("--name", default="specedit", help="the Serve application (default specedit)")
    cluster.set_defaults(cluster_parser=cluster)
    return cluster


def cluster_command(args: argparse.Namespace) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise EngineUnavailableError("Ray is not installed: pip install 'specedit[cluster]'") from None
    from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy

    config = None
    if args.cluster_command == "deploy":
        try:
            low, high = _replicas(args.replicas)
            config = ClusterConfig(
                options=EngineOptions.from_args(args),
                token=read_token(args.token_file),
                min_replicas=low,
                max_replicas=high,
                host=args.host,
                port=args.port,
                cpus_per_replica=args.cpus_per_replica,
                gpus_per_replica=args.gpus_per_replica,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                name=args.name,
                route=args.route,
                models=tuple(args.other_model),
                models_per_replica=args.models_per_replica,
                document_routing=args.document_routing,
                spill_at=args.spill_at,
                place_timeout_s=args.place_timeout,
                target_ongoing_requests=args.target_ongoing,
                upscale_delay_s=args.upscale_delay,
                downscale_delay_s=args.downscale_delay,
            )
        except ValueError as error:
            args.cluster_parser.error(str(error))  # exits 2
    try:
        ray.init(address=args.address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as error:
        raise EngineUnavailableError(f"no Ray cluster at {args.address}: `ray start --head` first ({error})") from None
    if config is not None:
        url = deploy(config)
        print(f"specedit: the engine serves at {url}", file=sys.stderr)
    elif args.cluster_command == "status":
        sys.stdout.write(json.dumps(_status(serve.status(), args.name), indent=2) + "\n")
    else:
        serve.delete(args.name)
        print(f"specedit: deleted the application {args.name!r}", file=sys.stderr)
    return 0


def _replicas(text: str) -> tuple[int, int]:
    """`2` -> (2, 2); `1:4` -> (1, 4)."""
    match = re.fullmatch(r"(\d+)(?::(\d+))?", text)
    if match is None:
        raise ValueError(f"--replicas {text!r}: expected N or MIN:MAX")
    low = int(match.group(1))
    return low, int(match.group(2) or low)


def _status(status: Any, name: str) -> dict[str, Any]:
    app = status.applications.get(name)
    if app is None:
        return {"application": name, "status": "NOT_DEPLOYED"}
    return {
        "application": name,
        "status": str(app.status),
        "deployments": {
            deployment_name: {"status": str(deployment.status), "replicas": dict(deployment.replica_states)}
            for deployment_name, deployment in app.deployments.items()
        },
    }
