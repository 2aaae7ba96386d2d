"""A team on the cluster, and an open document's first edit beside the daemon: `scripts/cluster_load.py`'s
`--team` and `--side-by-side` modes (this file holds them; run them from there).

    .venv/bin/python scripts/cluster_load.py --team 8 --ramp 60:300:60 --pace 45 --replicas 1:2 [--json F]
    .venv/bin/python scripts/cluster_load.py --side-by-side [--documents 6] [--json F]

`--team N` replays N editors on a Ray cluster on this machine, twice: routed by document
(`cluster_router`), then by Serve's default router, each on a fresh deployment. Editor k joins at k/N of
the ramp up and leaves at k/N of the ramp down. An editor opens a real file of the edit sets (its text,
language and instruction), offers it to warm as the language server does, reads it a while, and asks for
its rewrite: the file's first edit. Then it asks for a second edit of the answer, and opens the next file.
Each wait is random, exponential with mean `--pace` seconds. Figures, per router: the first edit's latency
(to its first streamed text) p50 and p99, rewrites a minute, the prompt tokens the prefix cache gave
(reused over prompt tokens, and the first edits that found most of their prompt cached), and the replica
count every 2 s (`--replicas MIN:MAX` lets Serve's autoscaler move it; it is sampled on for `--cooldown`
seconds after the last editor left, by default the downscale delay and 30 s more).

`--side-by-side` measures what an editor on a warm engine waits for: the first edit of an open 200-line
file (the first 200 lines of real Python files, an edit on the first line), after its warm-up, through
the daemon (`specedit serve`) and through a two-replica cluster, routed by document and not. The rewrite
stops after 8 tokens: its first text comes before. Run nothing else meanwhile.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from bench_cases import read
from cluster_load import ROOT, TOKEN, load_average

from specedit.engine.backends.cluster import ClusterBackend, warm_key
from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.events import Event, Text
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.session.session import Session, remote_session

SECOND_EDIT = "Add the comment line `# Reviewed.` at the very top of the file. Change nothing else."
FIRST_LINE_EDIT = SECOND_EDIT  # the side-by-side's edit: on the first line, so the first text comes at once
SAMPLE_SECONDS = 2.0


def team_files(max_chars: int) -> list[dict[str, str]]:
    """Real files with an instruction: Aider's chat requests and single-file commits, 1,000 characters to
    `max_chars`."""
    cases = read("aider_chat.jsonl") + read("git_history.jsonl")
    return [case for case in cases if 1000 <= len(case["before"]) <= max_chars and case["instruction"].strip()]


def open_documents(count: int, lines: int = 200) -> list[str]:
    """The first `lines` lines of `count` Python files of the commit set, no two alike."""
    documents: dict[str, None] = {}  # (in order, without repeats: a file recurs over its commits)
    for case in read("git_history.jsonl"):
        text = case["before"].splitlines(keepends=True)
        if case["language"] == "python" and len(text) >= lines:
            documents["".join(text[:lines])] = None
    found = list(documents)
    return found[:: max(1, len(found) // count)][:count]


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3)


def first_text(session: Session, request: RewriteRequest) -> dict[str, Any]:
    """Run `request`: seconds to its first streamed text and to its end, and its stats."""
    sent = time.perf_counter()
    first: list[float] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Text) and not first:
            first.append(time.perf_counter() - sent)

    try:
        outcome: RewriteOutcome | None = session.run(request, on_event)
        error = None
    except SpeceditError as failure:
        outcome, error = None, str(failure)
    stats = outcome.stats if outcome is not None else None
    return {
        "first_text_s": round(first[0], 3) if first else None,
        "wall_s": round(time.perf_counter() - sent, 3),
        "status": outcome.status if outcome is not None else None,
        "text": outcome.text if outcome is not None else None,
        "reused_tokens": stats.reused_tokens if stats else 0,
        "prompt_tokens": (stats.reused_tokens + stats.prefill_tokens) if stats else 0,
        "replica": stats.replica if stats else None,
        "error": error,
    }


def wait_warmed(status: Callable[[], dict[str, object]], pid: int | None = None, limit: float = 300.0) -> None:
    """Until the engine (the replica `pid`, where status may come from any) has nothing left to warm,
    twice in a row (between taking a document and prefilling it, one look may miss it)."""
    idle, deadline = 0, time.monotonic() + limit
    while idle < 2 and time.monotonic() < deadline:
        info = status()
        if pid is None or info.get("pid") == pid:
            idle = idle + 1 if info.get("to_warm") == 0 and info.get("warming") is None else 0
        time.sleep(0.1)


# -------------------------------------------------------------------------------------------- the team


class Replay:
    """One replay of the team on one deployment: its records and the replica count over time."""

    def __init__(self, args: Any, address: str, token_file: str, files: list[dict[str, str]]) -> None:
        self.args, self.address, self.token_file = args, address, token_file
        self.files = files
        self.records: list[dict[str, Any]] = []
        self.timeline: list[dict[str, Any]] = []
        self.active = self.in_flight = 0
        self.lock = threading.Lock()
        self.began = time.monotonic()
        self.up, self.hold, self.down = (float(part) for part in args.ramp.split(":"))

    def clock(self) -> float:
        return time.monotonic() - self.began

    def editor(self, number: int) -> None:
        args, team = self.args, self.args.team
        rng = random.Random(args.seed * 1000 + number)
        joins = self.up * number / team
        leaves = self.up + self.hold + self.down * number / team
        backend = ClusterBackend(self.address, token_file=self.token_file)
        session = Session(backend)
        time.sleep(max(0.0, joins - self.clock()))
        with self.lock:
            self.active += 1
        backend.keep_alive(True)  # an editor with documents open
        opened = 0
        while self.clock() < leaves:
            case = self.files[rng.randrange(len(self.files))]
            opened += 1
            uri = f"file:///team/editor{number}/file{opened}.{case['language'] or 'txt'}"
            text = case["before"]
            backend.warm(WarmRequest(text, case["language"], uri))
            for edit, instruction in ((1, case["instruction"]), (2, SECOND_EDIT)):
                time.sleep(min(rng.expovariate(1 / args.pace), max(0.0, leaves - self.clock())))
                if self.clock() >= leaves:
                    break
                request = RewriteRequest(
                    original=text,
                    instruction=instruction,
                    language=case["language"],
                    max_new_tokens=args.max_new_tokens,
                    path=unquote(urlparse(uri).path),
                )
                with self.lock:
                    self.in_flight += 1
                sent = self.clock()
                record = first_text(session, request)
                with self.lock:
                    self.in_flight -= 1
                    self.records.append({"editor": number, "edit": edit, "sent_s": round(sent, 2), **record})
                if record["status"] == "complete" and record["text"]:
                    text = record["text"]
                    backend.warm(WarmRequest(text, case["language"], uri))  # the edit changed it
        backend.keep_alive(False)
        with self.lock:
            self.active -= 1

    def sample(self, stop: threading.Event, name: str) -> None:
        from ray import serve

        while not stop.wait(SAMPLE_SECONDS):
            app = serve.status().applications.get(name)
            engine = app.deployments.get("engine") if app is not None else None
            states = dict(engine.replica_states) if engine is not None else {}
            with self.lock:
                self.timeline.append(
                    {
                        "t_s": round(self.clock(), 1),
                        "replicas": states.get("RUNNING", 0),
                        "starting": states.get("STARTING", 0),
                        "editors": self.active,
                        "in_flight": self.in_flight,
                    }
                )

    def run(self, name: str) -> dict[str, Any]:
        stop = threading.Event()
        sampler = threading.Thread(target=self.sample, args=(stop, name), daemon=True)
        sampler.start()
        editors = [threading.Thread(target=self.editor, args=(n,), daemon=True) for n in range(self.args.team)]
        for thread in editors:
            thread.start()
        for thread in editors:
            thread.join()
        time.sleep(self.args.cooldown)  # the replicas going back down, sampled
        stop.set()
        sampler.join()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        done = [record for record in self.records if record["status"] is not None]
        firsts = [r["first_text_s"] for r in done if r["edit"] == 1 and r["first_text_s"] is not None]
        every = [r["first_text_s"] for r in done if r["first_text_s"] is not None]
        held = [r for r in done if self.up <= r["sent_s"] < self.up + self.hold]
        prompt = sum(r["prompt_tokens"] for r in done)
        first_edits = [r for r in done if r["edit"] == 1 and r["prompt_tokens"]]
        replicas = [point["replicas"] for point in self.timeline] or [0]
        return {
            "rewrites": len(done),
            "errors": len(self.records) - len(done),
            "first_edit_p50_s": percentile(firsts, 0.5),
            "first_edit_p99_s": percentile(firsts, 0.99),
            "any_edit_p50_s": percentile(every, 0.5),
            "any_edit_p99_s": percentile(every, 0.99),
            "rewrites_per_min": round(60 * len(done) / max(self.clock(), 1e-9), 2),
            "rewrites_per_min_held": round(60 * len(held) / self.hold, 2) if self.hold else None,
            "reused_share": round(sum(r["reused_tokens"] for r in done) / prompt, 3) if prompt else None,
            "first_edits_mostly_cached": (
                round(sum(r["reused_tokens"] >= r["prompt_tokens"] / 2 for r in first_edits) / len(first_edits), 3)
                if first_edits
                else None
            ),
            "replicas_min": min(replicas),
            "replicas_max": max(replicas),
            "replicas_mean": round(statistics.fmean(replicas), 2),
            "timeline": self.timeline,
            "records": [{key: value for key, value in r.items() if key != "text"} for r in self.records],
        }


def cluster_options(args: Any, threads: int) -> EngineOptions:
    return EngineOptions(model=args.model, threads=threads)


def team(args: Any, token_file: str) -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy

    low, _, high = args.replicas.partition(":")
    files = team_files(args.max_chars)
    print(f"team of {args.team}, ramp {args.ramp} s, pace {args.pace} s, {len(files)} files", file=sys.stderr)
    reports = []
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        for routing in args.routing.split(","):
            config = ClusterConfig(
                cluster_options(args, args.replica_threads),
                TOKEN,
                min_replicas=int(low),
                max_replicas=int(high or low),
                port=args.port,
                cpus_per_replica=float(args.replica_threads),
                document_routing=routing == "document",
                name=f"team-{routing}",
                target_ongoing_requests=args.target_ongoing,
                upscale_delay_s=args.upscale_delay,
                downscale_delay_s=args.downscale_delay,
            )
            print(f"{routing} routing: load average {load_average()}", file=sys.stderr)
            address = deploy(config)
            report = {
                "routing": routing,
                "replicas": args.replicas,
                **Replay(args, address, token_file, files).run(config.name),
            }
            serve.delete(config.name)
            reports.append(report)
            shown = {key: value for key, value in report.items() if key not in ("timeline", "records")}
            print(f"  {json.dumps(shown)}", file=sys.stderr)
            print("  replicas over time: " + " ".join(str(p["replicas"]) for p in report["timeline"]), file=sys.stderr)
    finally:
        serve.shutdown()
        ray.shutdown()
    return reports


# ------------------------------------------------------------------------------------ side by side


def first_edits(
    name: str, session: Session, documents: list[str], warm: Callable[[WarmRequest], None]
) -> dict[str, Any]:
    """Each document offered to warm (`warm` waits until it is), then its first edit (8 tokens)."""
    results = []
    for number, document in enumerate(documents):
        uri = f"file:///side-by-side/doc{number}.py"
        warm(WarmRequest(document, "python", uri))
        path = unquote(urlparse(uri).path)
        request = RewriteRequest(
            original=document, instruction=FIRST_LINE_EDIT, language="python", path=path, max_new_tokens=8
        )
        results.append(first_text(session, request))  # 8 tokens: to its first text, and the stats
    firsts = [r["first_text_s"] for r in results if r["first_text_s"] is not None]
    for failed in {r["error"] for r in results if r["error"]}:
        print(f"{name}: {failed}", file=sys.stderr)
    report = {
        "engine": name,
        "load_average": load_average(),
        "first_edit_median_s": percentile(firsts, 0.5),
        "first_edit_max_s": max(firsts, default=None),
        "reused_share": round(
            sum(r["reused_tokens"] for r in results) / max(1, sum(r["prompt_tokens"] for r in results)), 3
        ),
        "results": [{key: value for key, value in r.items() if key != "text"} for r in results],
    }
    print(
        f"{name}: first edit median {report['first_edit_median_s']} s, worst {report['first_edit_max_s']} s, "
        f"{report['reused_share']:.0%} of the prompts cached",
        file=sys.stderr,
    )
    return report


def side_by_side(args: Any, token_file: str) -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy

    documents = open_documents(args.documents, args.lines)
    reports = []
    with tempfile.TemporaryDirectory() as folder:
        socket = Path(folder) / "engine.sock"
        command = [str(ROOT / ".venv" / "bin" / "specedit"), "serve", "--socket", str(socket)]
        command += ["--threads", str(args.daemon_threads)] + (["--model", args.model] if args.model else [])
        daemon = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            while not socket.exists():
                time.sleep(0.2)
            session = remote_session(str(socket))
            backend: Any = session.backend

            def warm_daemon(request: WarmRequest) -> None:
                session.warm(request)
                with backend.connect() as client:
                    wait_warmed(client.status)

            first_text(session, RewriteRequest(original="x = 1\n", instruction="Rename x.", max_new_tokens=1))
            reports.append(first_edits(f"daemon, {args.daemon_threads} threads", session, documents, warm_daemon))
        finally:
            daemon.terminate()
            daemon.wait(60)
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        for routing in args.routing.split(","):
            config = ClusterConfig(
                cluster_options(args, args.replica_threads),
                TOKEN,
                min_replicas=2,
                max_replicas=2,
                port=args.port,
                cpus_per_replica=float(args.replica_threads),
                document_routing=routing == "document",
                name=f"side-{routing}",
            )
            cluster = ClusterBackend(deploy(config), token_file=token_file)
            on_cluster = Session(cluster)

            def warm_replica(request: WarmRequest, cluster: ClusterBackend = cluster) -> None:
                pid = cluster.offer(request)
                wait_warmed(lambda: cluster.status(warm_key(request)), pid)

            name = f"cluster, 2 replicas x {args.replica_threads} thread(s), {routing} routing"
            reports.append(first_edits(name, on_cluster, documents, warm_replica))
            serve.delete(config.name)
    finally:
        serve.shutdown()
        ray.shutdown()
    daemon_median = reports[0]["first_edit_median_s"]
    for report in reports[1:]:
        median = report["first_edit_median_s"]
        report["to_daemon"] = round(median / daemon_median, 2) if median and daemon_median else None
        print(f"{report['engine']}: {report['to_daemon']}x the daemon's first edit", file=sys.stderr)
    return reports


def main(args: Any) -> dict[str, Any]:
    """`--team` or `--side-by-side`, as `cluster_load.py` parsed them."""
    with tempfile.NamedTemporaryFile("w", suffix=".token") as token:
        token.write(TOKEN + "\n")
        token.flush()
        os.chmod(token.name, 0o600)
        if args.team:
            return {
                "mode": "team",
                "team": args.team,
                "ramp": args.ramp,
                "pace": args.pace,
                "reports": team(args, token.name),
            }
        return {"mode": "side-by-side", "reports": side_by_side(args, token.name)}
