"""The bench's summary: each method's speed against plain decoding and the peers, case by case.

Every ratio is pair by pair, a case's two methods measured in one process one after the other, so the
machine's load hits both alike; the summary takes medians and geometric means of those ratios.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from specedit.engine.doors.bench.records import CaseRecord, MethodRecord

PLAIN_METHODS = ("plain", "plain-stock")
Seconds = Literal["wall_seconds", "decode_seconds"]  # the times a ratio compares


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    for index, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(statistics.median(values), 3) if values else None


def minimum(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(min(values), 3) if values else None


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v > 0]
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 3) if values else None


def summarise(
    cases: list[CaseRecord],
    methods: Sequence[str],
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    peak: Mapping[str, Any] | None = None,
) -> dict[str, object]:
    """Each method's speed against plain decoding and the peers, its exactness and its cost per token, and
    what its phases computed a second beside the machine's integer `peak` (`bench.integer_peak_record`)."""

    def ratios(method: str, over: str, key: Seconds) -> list[float]:
        pairs = [c["methods"] for c in cases if method in c["methods"] and over in c["methods"]]
        return [p[over][key] / p[method][key] for p in pairs if p[method][key] > 0]

    def fastest_plain_ratios(method: str, key: Seconds) -> list[float]:
        """Over the faster of `plain` and `plain-stock`, case by case."""
        pairs = [c["methods"] for c in cases if method in c["methods"] and "plain" in c["methods"]]
        return [
            min(p[plain][key] for plain in PLAIN_METHODS if plain in p) / p[method][key]
            for p in pairs
            if p[method][key] > 0
        ]

    others = [m for m in methods if m != "plain"]
    identical_rate: dict[str, float | None] = {}
    cpu_seconds_per_token: dict[str, float | None] = {}
    joules_per_token: dict[str, float] = {}
    tokens_per_second_median: dict[str, float | None] = {}
    summary: dict[str, object] = {
        "cases": len(cases),
        "speedup_vs_plain": {m: median(ratios(m, "plain", "wall_seconds")) for m in others},
        "speedup_vs_plain_geomean": {m: geomean(ratios(m, "plain", "wall_seconds")) for m in others},
        "decode_speedup_vs_plain": {m: median(ratios(m, "plain", "decode_seconds")) for m in others},
        "speedup_vs_fastest_plain": {m: median(fastest_plain_ratios(m, "wall_seconds")) for m in others},
        "decode_speedup_vs_fastest_plain": {m: median(fastest_plain_ratios(m, "decode_seconds")) for m in others},
        "slower_than_plain": {m: sum(r < 1.0 for r in ratios(m, "plain", "wall_seconds")) for m in others},
        "slower_than_fastest_plain": {m: sum(r < 1.0 for r in fastest_plain_ratios(m, "wall_seconds")) for m in others},
        "slowest_vs_plain": {m: minimum(ratios(m, "plain", "wall_seconds")) for m in others},
        "identical_rate": identical_rate,
        "cpu_seconds_per_token": cpu_seconds_per_token,
        "joules_per_token": joules_per_token,
        "tokens_per_second_median": tokens_per_second_median,
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "gops": phase_gops(cases, methods, peak),
        "integer_peak": dict(peak) if peak is not None else None,
    }
    for method in methods:
        runs = [c["methods"][method] for c in cases if method in c["methods"]]
        if not runs:
            continue
        flags = [r["identical_to_plain"] for r in runs if r["identical_to_plain"] is not None]
        identical_rate[method] = round(sum(flags) / len(flags), 4) if flags else None
        tokens = sum(r["generated_tokens"] for r in runs)
        cpu_seconds_per_token[method] = round(sum(r["cpu_seconds"] for r in runs) / tokens, 5) if tokens else None
        joules = [joule for r in runs if (joule := r.get("joules")) is not None]
        if tokens and len(joules) == len(runs):
            joules_per_token[method] = round(sum(joules) / tokens, 5)
        tokens_per_second_median[method] = median(r["tokens_per_second"] for r in runs)
    if "specedit" in methods and "prompt-lookup" in methods:
        summary["speedup_vs_prompt_lookup"] = median(ratios("specedit", "prompt-lookup", "wall_seconds"))
        summary["speedup_vs_prompt_lookup_geomean"] = geomean(ratios("specedit", "prompt-lookup", "wall_seconds"))
    versus_variant = {
        variant: median(ratios("specedit", variant, "wall_seconds"))
        for variant in ("specedit-copy", "specedit-fallback")
        if "specedit" in methods and variant in methods
    }
    if versus_variant:
        summary["speedup_vs_variant"] = versus_variant
    if "specedit" in methods and "llama-cpp" in methods:
        summary["speedup_vs_llama_cpp"] = median(ratios("specedit", "llama-cpp", "wall_seconds"))
    if "specedit" in methods and "llama-server" in methods:
        versus = ratios("specedit", "llama-server", "wall_seconds")
        summary["speedup_vs_llama_server"] = median(versus)
        summary["speedup_vs_llama_server_geomean"] = geomean(versus)
        summary["slower_than_llama_server"] = sum(r < 1.0 for r in versus)
        summary["decode_speedup_vs_llama_server"] = median(ratios("specedit", "llama-server", "decode_seconds"))
        same = [c for c in cases if _same_answer_as_ours(c["methods"].get("llama-server"))]
        summary["llama_server_same_answer"] = len(same)
        summary["speedup_vs_llama_server_same_answer"] = median(
            c["methods"]["llama-server"]["wall_seconds"] / c["methods"]["specedit"]["wall_seconds"] for c in same
        )
        summary["llama_server_best_type"] = dict(
            Counter(c["methods"]["llama-server"]["extra"]["best_of"] for c in cases if "llama-server" in c["methods"])
        )
        # Its speculation may change its answer (its batched arithmetic tips near-ties), and a shorter answer ends
        # sooner: held to the rule specedit keeps, only its ways of decoding that answered as its plain one did.
        versus_exact = [
            exact_wall / c["methods"]["specedit"]["wall_seconds"]
            for c in cases
            if (exact_wall := _llama_server_exact_wall(c["methods"])) is not None
        ]
        summary["speedup_vs_llama_server_exact"] = median(versus_exact)
        summary["speedup_vs_llama_server_exact_geomean"] = geomean(versus_exact)
        summary["slower_than_llama_server_exact"] = sum(r < 1.0 for r in versus_exact)
        summary["slower_than_llama_server_cases"] = {
            c["id"]: round(m["llama-server"]["wall_seconds"] / m["specedit"]["wall_seconds"], 3)
            for c in cases
            if {"specedit", "llama-server"} <= set(m := c["methods"])
            and m["llama-server"]["wall_seconds"] < m["specedit"]["wall_seconds"]
        }
    if "specedit" in methods and "openai-prediction" in methods:
        summary["http_door"] = http_door_overhead(cases)
        if "llama-server" in methods:
            versus = ratios("openai-prediction", "llama-server", "wall_seconds")
            summary["openai_prediction_vs_llama_server"] = median(versus)
            summary["openai_prediction_slower_than_llama_server"] = sum(r < 1.0 for r in versus)
    return summary


def phase_gops(
    cases: list[CaseRecord], methods: Sequence[str], peak: Mapping[str, Any] | None
) -> dict[str, dict[str, float | None]]:
    """Per method that reports them (ours), the median GOP/s of its prefill and of its decoding, and each as a
    share of its ceiling in `peak` (`prefill_ceiling_gops`, `decode_ceiling_gops`)."""
    figures: dict[str, dict[str, float | None]] = {}
    for method in methods:
        runs = [c["methods"][method] for c in cases if method in c["methods"]]
        phases: dict[str, float | None] = {}
        rates = {
            "prefill": [rate for run in runs if (rate := run.get("prefill_gops")) is not None],
            "decode": [rate for run in runs if (rate := run.get("decode_gops")) is not None],
        }
        for phase in ("prefill", "decode"):
            phases[phase] = median(rates[phase])
            ceiling = peak.get(f"{phase}_ceiling_gops") if peak is not None else None
            phases[f"{phase}_share"] = round(phases[phase] / ceiling, 3) if phases[phase] and ceiling else None
        if phases["prefill"] is not None or phases["decode"] is not None:
            figures[method] = phases
    return figures


def gops_line(summary: Mapping[str, Any]) -> str | None:
    """The printed summary's line of each phase's GOP/s and its share of the integer peak; None without."""
    figures: dict[str, dict[str, float | None]] = summary.get("gops") or {}
    if not figures:
        return None

    def shown(rate: float | None, part: float | None) -> str:
        return "-" if rate is None else f"{rate:.0f}" + (f" ({part:.0%})" if part is not None else "")

    peak = summary.get("integer_peak")
    beside = f"of the integer peak, {peak['gops']:.0f} GOPS" if peak else "no integer peak measured"
    return f"GOPS, prefill / decoding (median; share {beside}): " + ", ".join(
        f"{method} {shown(f['prefill'], f['prefill_share'])} / {shown(f['decode'], f['decode_share'])}"
        for method, f in figures.items()
    )


def _same_answer_as_ours(run: MethodRecord | None) -> bool:
    return run is not None and bool(run.get("extra", {}).get("same_answer_as_ours"))


def _llama_server_exact_wall(runs: dict[str, MethodRecord]) -> float | None:
    """The fastest of llama-server's ways of decoding a case that answered as its own plain decoding did,
    its plain decoding included; None without them or without specedit's run."""
    walls = [
        run["wall_seconds"]
        for name, run in runs.items()
        if name.startswith("llama-server-") and run.get("identical_to_plain")
    ]
    ours = runs.get("specedit")
    return min(walls) if walls and ours is not None and ours.get("wall_seconds") else None


def http_door_overhead(cases: list[CaseRecord]) -> dict[str, float | int | None]:
    """What the HTTP door (`openai-prediction`) costs beside `specedit` on the same cases: the median ratio
    of their times, the time it adds per request and per token, and the prediction tokens it reports."""
    pairs = [(c["methods"]["openai-prediction"], c["methods"]["specedit"]) for c in cases if {
        "openai-prediction", "specedit"} <= set(c["methods"])]  # fmt: skip
    added = [door["wall_seconds"] - ours["wall_seconds"] for door, ours in pairs]
    tokens = [max(1, ours["generated_tokens"]) for _, ours in pairs]
    return {
        "wall_ratio_median": median(door["wall_seconds"] / ours["wall_seconds"] for door, ours in pairs),
        "added_seconds_median": median(added),
        "added_ms_per_token_median": median(1000 * a / t for a, t in zip(added, tokens, strict=True)),
        "accepted_prediction_tokens": sum(door["extra"]["accepted_prediction_tokens"] or 0 for door, _ in pairs),
        "rejected_prediction_tokens": sum(door["extra"]["rejected_prediction_tokens"] or 0 for door, _ in pairs),
    }
