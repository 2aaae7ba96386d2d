"""How many replicas and CPUs a team needs: a small discrete-event model of the cluster, fed with measured
costs. Standard library only.

    .venv/bin/python scripts/cluster_sizing.py [--teams 50,500] [--pace 300] [--prefill-ms 4] [--token-ms 25]

Each editor thinks for a random while (exponential, mean `--pace` seconds), asks for a rewrite, waits for
its answer, and thinks again. A rewrite's prompt and answer lengths are drawn around their means
(lognormal). A replica runs one rewrite at a time. It reads the prompt's uncached part at `--prefill-ms`
a token, then writes the answer at `--token-ms` a committed token (speculation included, as measured). The
cached part is the document's file prefix where the request finds its warm replica (routed by document:
`--hit-rate`, else one replica in R), and the system prompt's start always. Waiting requests form one
queue, served first come, first served (routing's spill bound keeps the per-document queues near that).

For each team size it reports the fewest replicas whose p99 wait for a replica stays under `--max-wait`
seconds, their CPUs (`--cpus-per-replica`), the utilisation, the first text's latency (wait, hop, prefill,
one step) p50 and p99, rewrites a minute, and what limits it: the share of replica time spent reading
prompts against writing answers. Every figure is simulated; only the costs are measured. The defaults are
this project's measurements on two AVX2 cores (docs/serving.md); replace them with the load replay's.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

# A rewrite's service: (seconds to its first text once it runs, seconds it holds the replica, seconds of
# those spent reading the prompt).
Service = tuple[float, float, float]


@dataclass(frozen=True)
class Costs:
    """Measured per replica (defaults: the 0.5B model in float32 on two AVX2 cores, docs/serving.md)."""

    prefill_s_per_token: float = 0.004  # 250 prompt tokens a second
    decode_s_per_token: float = 0.025  # 2,400 answer tokens a minute, speculation included
    hop_s: float = 0.073  # Serve's proxy and the HTTP round trip, per request
    cpus_per_replica: float = 2.0


@dataclass(frozen=True)
class Workload:
    pace_s: float = 300.0  # an editor's mean thinking time between two rewrites
    prompt_tokens: float = 1500.0  # mean (a 1,000-2,500-token file)
    answer_tokens: float = 400.0  # mean
    spread: float = 0.5  # the lognormal's sigma, for both lengths
    head_tokens: float = 61.0  # the system prompt's start, cached on every replica
    cached_share: float = 0.95  # of a prompt, on the replica that warmed its document
    hit_rate: float = 0.95  # requests that find their warm replica when routed by document


@dataclass(frozen=True)
class Result:
    replicas: int
    utilisation: float
    wait_mean_s: float
    wait_p99_s: float
    response_mean_s: float  # from arrival to the answer's end
    first_text_p50_s: float
    first_text_p99_s: float
    per_minute: float
    prefill_share: float  # of the replicas' busy time


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A lognormal draw with the given mean."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def rewrite_service(costs: Costs, work: Workload, replicas: int, routed: bool) -> Callable[[random.Random], Service]:
    hit_rate = work.hit_rate if routed else 1 / replicas

    def service(rng: random.Random) -> Service:
        prompt = lognormal(rng, work.prompt_tokens, work.spread)
        cached = work.cached_share * prompt if rng.random() < hit_rate else min(work.head_tokens, prompt)
        reading = (prompt - cached) * costs.prefill_s_per_token
        writing = lognormal(rng, work.answer_tokens, work.spread) * costs.decode_s_per_token
        return costs.hop_s + reading + costs.decode_s_per_token, costs.hop_s + reading + writing, reading

    return service


def simulate(
    replicas: int,
    service: Callable[[random.Random], Service],
    *,
    editors: int = 0,
    pace_s: float = 0.0,
    rate: float = 0.0,
    requests: int = 20_000,
    seed: int = 0,
) -> Result:
    """Serve `requests` rewrites on `replicas`, from `editors` that each think `pace_s` on average between
    their rewrites (a closed loop), or arriving at `rate` a second (an open, Poisson stream). The first
    tenth of them warm the model up and are not counted.

    An M/M/1 queue, for which utilisation is rate / service rate, and the mean response 1 / (mu - lambda):

    >>> exponential = lambda rng: (0.0, rng.expovariate(1.0), 0.0)
    >>> result = simulate(1, exponential, rate=0.5, requests=40_000)
    >>> round(result.utilisation, 1), round(result.response_mean_s)
    (0.5, 2)
    """
    rng = random.Random(seed)
    events: list[tuple[float, int, str, int]] = []  # (time, order, "arrive" editor | "done" request)
    order = 0

    def schedule(at: float, kind: str, value: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, value))

    for editor in range(editors):
        schedule(rng.expovariate(1 / pace_s), "arrive", editor)
    if not editors:
        schedule(rng.expovariate(rate), "arrive", -1)
    free, queue = replicas, deque[int]()
    came: dict[int, float] = {}  # request -> when it arrived
    owner: dict[int, int] = {}  # request -> its editor
    waits: list[float] = []
    firsts: list[float] = []
    responses: list[float] = []
    busy = reading = started_at = end = 0.0
    arrived = done = 0
    counted_from = requests // 10

    def start(now: float, request: int) -> None:
        nonlocal busy, reading
        first, hold, read = service(rng)
        if request >= counted_from:
            waits.append(now - came[request])
            firsts.append(now - came[request] + first)
            busy += hold
            reading += read
        schedule(now + hold, "done", request)

    while events and done < requests:
        now, _, kind, value = heapq.heappop(events)
        if kind == "arrive":
            request, arrived = arrived, arrived + 1
            came[request], owner[request] = now, value
            if request == counted_from:
                started_at = now
            if not editors:
                schedule(now + rng.expovariate(rate), "arrive", -1)
            if free:
                free -= 1
                start(now, request)
            else:
                queue.append(request)
            continue
        request, done = value, done + 1
        if request >= counted_from:
            responses.append(now - came[request])
            end = now
        if editors:
            schedule(now + rng.expovariate(1 / pace_s), "arrive", owner[request])
        del came[request], owner[request]
        if queue:
            start(now, queue.popleft())
        else:
            free += 1
    span = max(end - started_at, 1e-9)
    first_q = statistics.quantiles(firsts, n=100)
    return Result(
        replicas=replicas,
        utilisation=busy / (span * replicas),
        wait_mean_s=statistics.fmean(waits),
        wait_p99_s=statistics.quantiles(waits, n=100)[98],
        response_mean_s=statistics.fmean(responses),
        first_text_p50_s=first_q[49],
        first_text_p99_s=first_q[98],
        per_minute=60 * len(responses) / span,
        prefill_share=reading / busy if busy else 0.0,
    )


def size(team: int, costs: Costs, work: Workload, *, routed: bool, max_wait_s: float, seed: int = 0) -> Result:
    """The fewest replicas whose p99 wait for a replica is at most `max_wait_s`."""
    offered = team / work.pace_s * (work.answer_tokens * costs.decode_s_per_token)  # busy replicas, at least
    replicas = max(1, math.ceil(offered))
    while True:
        service = rewrite_service(costs, work, replicas, routed)
        result = simulate(
            replicas, service, editors=team, pace_s=work.pace_s, requests=max(20_000, 40 * team), seed=seed
        )
        if result.wait_p99_s <= max_wait_s or replicas >= team:
            return result
        replicas += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teams", default="50,500", help="team sizes (default 50,500)")
    parser.add_argument("--pace", type=float, default=Workload.pace_s, help="mean seconds between an editor's rewrites")
    parser.add_argument("--prompt-tokens", type=float, default=Workload.prompt_tokens)
    parser.add_argument("--answer-tokens", type=float, default=Workload.answer_tokens)
    parser.add_argument("--hit-rate", type=float, default=Workload.hit_rate, help="routed requests finding their cache")
    parser.add_argument("--prefill-ms", type=float, default=1000 * Costs.prefill_s_per_token, help="per prompt token")
    parser.add_argument("--token-ms", type=float, default=1000 * Costs.decode_s_per_token, help="per answer token")
    parser.add_argument("--hop-ms", type=float, default=1000 * Costs.hop_s)
    parser.add_argument("--cpus-per-replica", type=float, default=Costs.cpus_per_replica)
    parser.add_argument("--max-wait", type=float, default=2.0, help="p99 seconds a rewrite may wait for a replica")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    costs = Costs(args.prefill_ms / 1000, args.token_ms / 1000, args.hop_ms / 1000, args.cpus_per_replica)
    work = Workload(args.pace, args.prompt_tokens, args.answer_tokens, hit_rate=args.hit_rate)
    rows = []
    for team in (int(count) for count in args.teams.split(",")):
        for routed in (True, False):
            result = size(team, costs, work, routed=routed, max_wait_s=args.max_wait)
            limit = "reading prompts" if result.prefill_share > 0.5 else "writing answers"
            rows.append(
                {
                    "team": team,
                    "routed": routed,
                    "cpus": result.replicas * costs.cpus_per_replica,
                    "limit": limit,
                    **asdict(result),
                }
            )
    if args.json:
        print(json.dumps({"costs": asdict(costs), "workload": asdict(work), "rows": rows}, indent=2))
        return
    print(
        "| editors | routing | replicas | CPUs | utilisation | first text p50 / p99 | rewrites/min | reading | limit |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['team']} | {'document' if row['routed'] else 'default'} | {row['replicas']} | {row['cpus']:g} "
            f"| {row['utilisation']:.0%} | {row['first_text_p50_s']:.2f} / {row['first_text_p99_s']:.2f} s "
            f"| {row['per_minute']:.1f} | {row['prefill_share']:.0%} | {row['limit']} |"
        )


if __name__ == "__main__":
    main()
