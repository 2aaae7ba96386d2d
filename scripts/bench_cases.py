#!/usr/bin/env python3
"""Writes a benchmark case set from the shared edits data (nothing is copied into the repo).

    scripts/bench_cases.py > bench-results/wholefile30.jsonl
    scripts/bench_cases.py --mid-size > bench-results/midsize6.jsonl

The default set: every 49th case of humanevalfix.jsonl (20 cases: Python, JS, Java, Go, C++, Rust) and 10
files under 2,000 characters of git_history.jsonl, spread over the file: the model rewrites whole files.

`--mid-size`: 6 files of 4,500-9,000 characters of git_history.jsonl, spread over the file (prompts of
1,300-2,100 tokens, where the prefill is about a third of a rewrite); none is in the default set, and none
was tuned on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EDITS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "edits"


def read(name: str) -> list[dict[str, str]]:
    with (EDITS / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def spread(cases: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """`count` cases taken at even steps over `cases`."""
    return cases[:: max(1, len(cases) // count)][:count]


def whole_files() -> list[dict[str, str]]:
    short = [case for case in read("git_history.jsonl") if len(case["before"]) < 2000]
    return read("humanevalfix.jsonl")[::49][:20] + spread(short, 10)


def mid_size() -> list[dict[str, str]]:
    return spread([case for case in read("git_history.jsonl") if 4500 <= len(case["before"]) <= 9000], 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mid-size", action="store_true", help="6 files of 4,500-9,000 characters")
    args = parser.parse_args()
    for case in mid_size() if args.mid_size else whole_files():
        sys.stdout.write(json.dumps(case) + "\n")


if __name__ == "__main__":
    main()
