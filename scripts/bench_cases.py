#!/usr/bin/env python3
"""Writes the benchmark's whole-file case set from the shared edits data (nothing is copied into the repo).

    scripts/bench_cases.py > bench-results/wholefile30.jsonl

Every 49th case of humanevalfix.jsonl (20 cases: Python, JS, Java, Go, C++, Rust) and 10 files under
2,000 characters of git_history.jsonl, spread over the file: the model rewrites whole files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EDITS = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "edits"


def read(name: str) -> list[dict[str, str]]:
    with (EDITS / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main() -> None:
    cases = read("humanevalfix.jsonl")[::49][:20]
    short = [case for case in read("git_history.jsonl") if len(case["before"]) < 2000]
    cases += short[:: max(1, len(short) // 10)][:10]
    for case in cases:
        sys.stdout.write(json.dumps(case) + "\n")


if __name__ == "__main__":
    main()
