#!/usr/bin/env python3
"""The copy drafter's first draft length, side by side: whole-file rewrites in one process, each case
run with every length in turn and back (A B C, C B A), no kept prompts (every run prefills its whole
prompt); the time to the first text and the whole rewrite, against the first length given (medians of
per-case ratios), and a check that every length writes the same text.

    .venv/bin/python scripts/first_draft.py --cases bench-results/wholefile30.jsonl --first 10 --limit 10 \\
        --lengths 64,16 [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from pathlib import Path

from specedit.drafters.copy_drafter import CopyDrafterConfig
from specedit.engine.backends.local import open_engine
from specedit.engine.loop import drafting
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--first", type=int, default=0, help="the first case to run (0-based)")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--lengths", default="64,16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    lengths = [int(length) for length in args.lengths.split(",")]
    lines = args.cases.read_text(encoding="utf-8").splitlines()[args.first : args.first + args.limit]
    engine = open_engine(EngineOptions(threads=args.threads))
    engine.prefix_cache = None  # every run prefills its whole prompt
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    runs: dict[int, list[tuple[float, float]]] = {length: [] for length in lengths}
    for line in lines:
        case = json.loads(line)
        request = RewriteRequest(case["before"], case["instruction"], language=case.get("language", ""))
        texts = set()
        for length in [*lengths, *reversed(lengths)]:
            drafting.CopyDrafterConfig = functools.partial(CopyDrafterConfig, initial_draft=length)  # type: ignore[misc]
            result = rewrite(engine, request)
            stats = result.generation.stats
            runs[length].append((stats.first_text_seconds or stats.wall_seconds, stats.wall_seconds))
            texts.add(result.text)
        assert len(texts) == 1, f"{case['id']}: the first draft's length changed the answer"
        print(case["id"], {length: round(sum(run[1] for run in runs[length][-2:]), 2) for length in lengths})
    base = lengths[0]
    for length in lengths[1:]:
        first = [b[0] / a[0] for a, b in zip(runs[base], runs[length], strict=True)]
        whole = [b[1] / a[1] for a, b in zip(runs[base], runs[length], strict=True)]
        print(
            f"{length} against {base}: first text {statistics.median(first):.3f}x, "
            f"whole rewrite {statistics.median(whole):.4f}x (geomean {statistics.geometric_mean(whole):.4f})"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
