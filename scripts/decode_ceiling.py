#!/usr/bin/env python3
"""How near speculative decoding comes to the ceiling that the machine's forward cost curve allows at the
tokens per forward it measured: the loop's own cost (drafting, verifying, streaming) against the forwards'.

    .venv/bin/python scripts/forward_cost.py ... > curve.txt
    .venv/bin/specedit bench --cases ... --methods plain,specedit --json bench.json
    .venv/bin/python scripts/decode_ceiling.py curve.txt bench.json

A forward of k rows costs about a + b*k (least squares over the curve's checked kernels, every context):
F forwards over R rows in all cost F*a + b*R, so the ceiling of a case, end to end, is plain decoding's
wall time over the prompt's prefill (plain's) plus those forwards. Run both under the same conditions
(threads, weights, steering variables).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def cost_line(curve: Path) -> tuple[float, float]:
    """(a, b) of the least-squares line through `forward_cost.py`'s rows (context, tokens, checked s, ...)."""
    points = []
    for line in curve.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
            points.append((int(fields[1]), float(fields[2])))
    if len(points) < 2:
        raise SystemExit(f"{curve}: no forward costs in it (forward_cost.py's table)")
    mean_k = statistics.fmean(k for k, _ in points)
    mean_cost = statistics.fmean(cost for _, cost in points)
    slope = sum((k - mean_k) * (cost - mean_cost) for k, cost in points) / sum((k - mean_k) ** 2 for k, _ in points)
    return mean_cost - slope * mean_k, slope


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", type=Path, help="scripts/forward_cost.py's output")
    parser.add_argument("bench", type=Path, help="specedit bench --json, with plain and specedit")
    args = parser.parse_args()
    fixed, per_row = cost_line(args.curve)
    print(f"forward cost ~ {fixed * 1000:.1f} ms + {per_row * 1000:.2f} ms a row")
    shares = []
    for case in json.loads(args.bench.read_text())["cases"]:
        plain, spec = case["methods"]["plain"], case["methods"]["specedit"]
        forwards, rows = spec["target_forwards"], spec["drafted_tokens"] + spec["target_forwards"]
        ideal = plain["prefill_seconds"] + forwards * fixed + rows * per_row
        measured, ceiling = plain["wall_seconds"] / spec["wall_seconds"], plain["wall_seconds"] / ideal
        shares.append(measured / ceiling)
        accepted = spec["accepted_tokens"] / forwards
        print(
            f"{case['id']:32s} {forwards:3d} forwards, {rows / forwards:5.1f} rows and {accepted:5.1f} accepted a"
            f" forward: {measured:5.2f}x, ceiling {ceiling:5.2f}x = {measured / ceiling:4.0%}"
        )
    print(f"of the ceiling: median {statistics.median(shares):.0%}, lowest {min(shares):.0%} ({len(shares)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
