"""Load on a shared engine: the local daemon beside the Ray Serve cluster, with the real default model.

    .venv/bin/python scripts/cluster_load.py [--clients 1,2,4,8] [--json bench-results/cluster-load-avx2.json]

Three engines, one after the other, on this machine: the daemon (`specedit serve`, 2 threads), then the
cluster (`ray.init`, `deploy` as `specedit cluster deploy` does it, plain HTTP on 127.0.0.1) with one
replica of 2 threads, then with two replicas of one thread each. Each is given the same rewrites at 1, 2, 4
and 8 concurrent clients (whole-file rewrites of the 20 short HumanEvalFix functions of
`wholefile30.jsonl`, answers of a few hundred tokens), through the sessions the command line and the
editors use (a session on a daemon's or a cluster's backend). Each level has cases of its own (4, 4, 4, 8: a prompt seen
before would be prefilled from the engine's prompt cache), the same ones on every engine. For each level:
rewrites and generated tokens per minute (over the level's wall time), and the first streamed text's
latency (from sending the request to the first piece of the answer on the client: what an editor can show
first), median and worst. Clients at a level start together; a level with fewer clients than 4 sends 4
rewrites in all (each client one after the other).

The HTTP hop: the round trip of a rewrite of one token on a two-line function (its prompt's prefill and
one forward), through the daemon's socket and through Serve's proxy, median of 30: the one-replica
cluster's minus the daemon's (same threads) is what the hop costs.

Every answer is checked against the daemon's for the same case (greedy: they must be equal). Run nothing
else meanwhile; the load average is printed before each engine.

    .venv/bin/python scripts/cluster_load.py --team 8 [--ramp 60:300:60] [--pace 45] [--replicas 1:2]
    .venv/bin/python scripts/cluster_load.py --side-by-side [--documents 6]

replay a team of editors (warm-ups, first and second edits, ramped up and down), routed by document and
by Serve's default router, and measure an open 200-line file's first edit on the daemon and on a
two-replica cluster side by side: `cluster_team.py` describes both. `--model DIR` runs any of the modes
on another model (the tiny test model, to check the script end to end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cases import read  # noqa: E402

from specedit.engine.records.events import Event, Text  # noqa: E402
from specedit.engine.records.options import EngineOptions  # noqa: E402
from specedit.engine.records.requests import RewriteRequest  # noqa: E402
from specedit.engine.session.session import Session, remote_session  # noqa: E402

TOKEN = "load-run-token-0123456789abcdef"
MODEL: str | None = None  # --model: None is the default model
ONE_TOKEN = RewriteRequest(original="def add(a, b):\n    return a + b\n", instruction="Rename add.", max_new_tokens=1)


def cases() -> list[RewriteRequest]:
    """The HumanEvalFix cases of the benchmark's whole-file set (`bench_cases.py`)."""
    chosen = read("humanevalfix.jsonl")[::49][:20]
    return [
        RewriteRequest(original=row["before"], instruction=row["instruction"], language=row["language"])
        for row in chosen
    ]


def cpu_class() -> str:
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    return "AVX2" if "avx2" in flags else platform.machine()


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def timed(session: Session, request: RewriteRequest) -> dict[str, Any]:
    sent = time.perf_counter()
    first: list[float] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Text) and not first:
            first.append(time.perf_counter() - sent)

    outcome = session.run(request, on_event)
    return {
        "wall": time.perf_counter() - sent,
        "first_text": first[0] if first else None,
        "status": outcome.status,
        "text": outcome.text,
        "tokens": outcome.stats.get("generated_tokens"),
    }


def level(session: Session, requests: list[RewriteRequest], clients: int) -> dict[str, Any]:
    """`clients` clients at once, sharing `requests`, each sending its share one after another."""
    shares = [requests[client::clients] for client in range(clients)]
    results: list[list[dict[str, Any]]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients)

    def client(number: int) -> None:
        start.wait()
        for request in shares[number]:
            results[number].append({"case": request.instruction, **timed(session, request)})

    began = time.perf_counter()
    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    done = [result for share in results for result in share]
    firsts = [result["first_text"] for result in done if result["first_text"] is not None]
    tokens = sum(result["tokens"] or 0 for result in done)
    return {
        "clients": clients,
        "rewrites": len(done),
        "wall_s": round(wall, 2),
        "rewrites_per_min": round(60 * len(done) / wall, 2),
        "tokens_per_min": round(60 * tokens / wall),
        "first_text_median_s": round(statistics.median(firsts), 2),
        "first_text_max_s": round(max(firsts), 2),
        "results": done,
    }


def hop(session: Session) -> float:
    """The median round trip of a one-token rewrite, ms."""
    times = []
    for _ in range(30):
        sent = time.perf_counter()
        session.run(ONE_TOKEN)
        times.append(time.perf_counter() - sent)
    return round(1000 * statistics.median(times), 2)


def run_engine(name: str, session: Session, requests: list[RewriteRequest], levels: list[int]) -> dict[str, Any]:
    print(f"{name}: load average {load_average()}", file=sys.stderr)
    timed(session, ONE_TOKEN)  # the first rewrite pays for warming up; not counted
    report: dict[str, Any] = {"engine": name, "load_average": load_average(), "hop_ms": hop(session), "levels": []}
    print(f"  a one-token rewrite's round trip: {report['hop_ms']} ms", file=sys.stderr)
    start = 0
    for clients in levels:
        count = max(clients, 4)
        result = level(session, requests[start : start + count], clients)
        start += count
        report["levels"].append(result)
        print(
            f"  {clients} clients: {result['rewrites']} rewrites in {result['wall_s']} s = "
            f"{result['rewrites_per_min']}/min, {result['tokens_per_min']} tokens/min; "
            f"first text median {result['first_text_median_s']} s, "
            f"worst {result['first_text_max_s']} s",
            file=sys.stderr,
        )
    return report


def daemon_run(requests: list[RewriteRequest], levels: list[int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        socket = Path(folder) / "engine.sock"
        command = [str(ROOT / ".venv" / "bin" / "specedit"), "serve", "--socket", str(socket), "--threads", "2"]
        command += ["--model", MODEL] if MODEL else []
        daemon = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            while not socket.exists():
                time.sleep(0.2)
            return run_engine("daemon, 2 threads", remote_session(str(socket)), requests, levels)
        finally:
            daemon.terminate()
            daemon.wait(60)


def cluster_runs(requests: list[RewriteRequest], levels: list[int], port: int) -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy

    reports = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".token") as token:
            token.write(TOKEN + "\n")
            token.flush()
            os.chmod(token.name, 0o600)
            for replicas, threads in ((1, 2), (2, 1)):
                options = EngineOptions(model=MODEL, threads=threads)
                config = ClusterConfig(
                    options,
                    TOKEN,
                    min_replicas=replicas,
                    max_replicas=replicas,
                    port=port,
                    cpus_per_replica=float(threads),
                )
                address = deploy(config)
                name = f"cluster, {replicas} replica(s) x {threads} thread(s)"
                reports.append(run_engine(name, remote_session(address, token_file=token.name), requests, levels))
                serve.delete(config.name)
    finally:
        serve.shutdown()
        ray.shutdown()
    return reports


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--engines", default="daemon,cluster")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", help="the engine's model (default: the default model)")
    team = parser.add_argument_group("--team and --side-by-side (cluster_team.py)")
    team.add_argument("--team", type=int, default=0, metavar="N", help="replay N editors")
    team.add_argument("--ramp", default="60:300:60", metavar="UP:HOLD:DOWN", help="seconds (default 60:300:60)")
    team.add_argument("--pace", type=float, default=45.0, metavar="S", help="mean seconds between requests (45)")
    team.add_argument("--replicas", default="2", metavar="N|MIN:MAX", help="the team's replicas (default 2)")
    team.add_argument("--routing", default="document,default", help="the routers to compare, in order")
    team.add_argument("--target-ongoing", type=float, default=1.0, help="the autoscaler's target (1)")
    team.add_argument("--upscale-delay", type=float, default=10.0, help="the autoscaler's, seconds (10)")
    team.add_argument("--downscale-delay", type=float, default=120.0, help="the autoscaler's, seconds (120)")
    team.add_argument("--cooldown", type=float, help="seconds sampled after the team left (downscale delay + 30)")
    team.add_argument("--max-chars", type=int, default=4000, help="the largest file an editor opens (4,000)")
    team.add_argument("--max-new-tokens", type=int, help="each rewrite's budget (default: the engine's)")
    team.add_argument("--seed", type=int, default=0)
    team.add_argument("--side-by-side", action="store_true", help="a 200-line file's first edit, daemon vs cluster")
    team.add_argument("--documents", type=int, default=6, help="open files for --side-by-side (6)")
    team.add_argument("--lines", type=int, default=200, help="their lines (200; fewer for a small model)")
    team.add_argument("--daemon-threads", type=int, default=2)
    team.add_argument("--replica-threads", type=int, default=1, help="threads (and CPUs) per replica (1)")
    team.add_argument("--ray-cpus", type=int, default=os.cpu_count(), help="CPUs Ray may hand out")
    args = parser.parse_args()
    MODEL = args.model
    if args.cooldown is None:
        args.cooldown = args.downscale_delay + 30 if ":" in args.replicas else 0.0
    if args.team or args.side_by_side:
        import cluster_team

        print(f"CPU class {cpu_class()}, {os.cpu_count()} cores", file=sys.stderr)
        result = {"cpu": cpu_class(), **cluster_team.main(args)}
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return
    levels = [int(count) for count in args.clients.split(",")]
    requests = cases()
    print(f"CPU class {cpu_class()}, {os.cpu_count()} cores; {len(requests)} cases", file=sys.stderr)
    reports = []
    if "daemon" in args.engines:
        reports.append(daemon_run(requests, levels))
    if "cluster" in args.engines:
        reports += cluster_runs(requests, levels, args.port)
    if "daemon" in args.engines:  # greedy: every engine's answer to a case is the daemon's
        reference = {result["case"]: result["text"] for lvl in reports[0]["levels"] for result in lvl["results"]}
        for report in reports:
            results = [result for lvl in report["levels"] for result in lvl["results"]]
            report["same_as_daemon"] = sum(reference.get(r["case"]) == r["text"] for r in results)
            report["answers"] = len(results)
            print(
                f"{report['engine']}: {report['same_as_daemon']}/{report['answers']} answers are the daemon's",
                file=sys.stderr,
            )
    if args.json:
        for report in reports:
            for lvl in report["levels"]:
                for result in lvl["results"]:
                    result.pop("text")
        args.json.write_text(json.dumps({"cpu": cpu_class(), "reports": reports}, indent=2) + "\n")


if __name__ == "__main__":
    main()
