"""The model's answers on a set of real edits, to compare prompts: how many match the real edit exactly.

    .venv/bin/python scripts/prompt_answers.py answer --cases ../shared/data/edits/humanevalfix.jsonl \
        --limit 20 --out new.jsonl                    # whole files
    .venv/bin/python scripts/prompt_answers.py answer --cases ../shared/data/edits/git_history.jsonl \
        --regions --max-chars 8000 --limit 10 --out regions.jsonl   # the edited lines only
    .venv/bin/python scripts/prompt_answers.py compare old.jsonl new.jsonl
    .venv/bin/python scripts/prompt_answers.py answer ... --weights float --out float.jsonl  # the weights' cost

`--regions` turns each case whose edit is one hunk into a region rewrite: the hunk's lines with
`REGION_CONTEXT` lines either side; the answer is exact when it is the region as the real edit left it.
Sketch cases (`scripts/sketch_cases.py`) are merged and their answers checked (`engine/sketch/merge_checks.py`):
`summary` counts exact merges, answers the checks catch, and wrong answers the checks let through.
Greedy decoding with the default drafters: the answer is plain decoding's (see docs/exactness.md).
Run it from a checkout of any revision (`PYTHONPATH` pointing at another one) to compare their prompts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import time
from pathlib import Path
from typing import Any

REGION_CONTEXT = 3


def region_case(case: dict[str, Any]) -> dict[str, Any] | None:
    """The case as a region rewrite (before, region, after, expected region), or None when its edit is
    not one hunk."""
    before, after = case["before"].splitlines(keepends=True), case["after"].splitlines(keepends=True)
    changes = [
        op for op in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes() if op[0] != "equal"
    ]
    if not changes:
        return None
    first, last = changes[0], changes[-1]
    start, stop = max(0, first[1] - REGION_CONTEXT), min(len(before), last[2] + REGION_CONTEXT)
    if stop - start > 2 * REGION_CONTEXT + 30:  # several hunks far apart: not one region
        return None
    prefix, suffix = "".join(before[:start]), "".join(before[stop:])
    if not case["after"].startswith(prefix) or not case["after"].endswith(suffix):
        return None
    expected = case["after"][len(prefix) : len(case["after"]) - len(suffix)]
    return {**case, "region": "".join(before[start:stop]), "expected": expected}


def answer(args: argparse.Namespace) -> int:
    from specedit.engine.records.options import EngineOptions
    from specedit.engine.records.requests import RewriteRequest
    from specedit.engine.session.session import local_session

    session = local_session(EngineOptions(model=args.model, threads=args.threads, weights=args.weights))
    written = 0
    with args.cases.open(encoding="utf-8") as cases, args.out.open("w", encoding="utf-8") as out:
        for line in cases:
            case = json.loads(line)
            if len(case["before"]) >= args.max_chars:
                continue
            fields: dict[str, Any] = {"original": case["before"]}
            expected = case["after"]
            if args.regions:
                region = region_case(case)
                if region is None:
                    continue
                fields = {"original": region["region"]}
                expected = region["expected"]
            if "sketch" in case:  # a sketch case (scripts/sketch_cases.py): merged, then checked
                fields["sketch"] = case["sketch"]
            else:
                fields["instruction"] = case["instruction"]
            request = RewriteRequest(language=case["language"], max_new_tokens=args.max_new_tokens, **fields)
            started = time.monotonic()
            outcome = session.run(request)
            record = {
                "id": case["id"],
                "output": outcome.text,
                "exact": outcome.text == expected,
                "whitespace_only": outcome.text != expected and outcome.text.split() == expected.split(),
                "status": outcome.status,
                "merge": outcome.stats.merge,
                "seconds": round(time.monotonic() - started, 2),
            }
            if request.sketch is not None:  # the session judged the answer: `not_a_merge` says why
                record["merge_check"] = "ok" if outcome.status != "not_a_merge" else outcome.problem
            out.write(json.dumps(record) + "\n")
            out.flush()
            written += 1
            print(f"{case['id']}: exact={record['exact']} {record['seconds']} s", file=sys.stderr)
            if written >= args.limit:
                break
    session.close()
    return 0


def compare(args: argparse.Namespace) -> int:
    old = {r["id"]: r for r in map(json.loads, args.old.read_text().splitlines())}
    new = {r["id"]: r for r in map(json.loads, args.new.read_text().splitlines())}
    common = [key for key in old if key in new]
    changed = [key for key in common if old[key]["output"] != new[key]["output"]]
    better = [key for key in changed if new[key]["exact"] and not old[key]["exact"]]
    worse = [key for key in changed if old[key]["exact"] and not new[key]["exact"]]
    print(
        f"{len(common)} cases; exact: {args.old.name} {sum(old[k]['exact'] for k in common)}, "
        f"{args.new.name} {sum(new[k]['exact'] for k in common)}; {len(changed)} answers changed: "
        f"{len(better)} now exact, {len(worse)} no longer exact, {len(changed) - len(better) - len(worse)} "
        f"inexact either way; incomplete (out of budget): {sum(old[k]['status'] != 'complete' for k in common)}, "
        f"{sum(new[k]['status'] != 'complete' for k in common)}"
    )
    for key in changed:
        ratio = difflib.SequenceMatcher(None, old[key]["output"], new[key]["output"]).ratio()
        print(f"  {key}: exact {old[key]['exact']} -> {new[key]['exact']}, similarity {ratio:.2f}")
    return 0


def summary(args: argparse.Namespace) -> int:
    records = [json.loads(line) for line in args.answers.read_text().splitlines()]
    exact = sum(r["exact"] for r in records)
    spaces = sum(r.get("whitespace_only", False) for r in records)
    checked = [r for r in records if "merge_check" in r]
    caught = sum(r["merge_check"] != "ok" for r in checked)
    let_through = sum(r["merge_check"] == "ok" and not r["exact"] and not r["whitespace_only"] for r in checked)
    wrongly_caught = sum(r["merge_check"] != "ok" and r["exact"] for r in checked)
    print(
        f"{len(records)} cases: {exact} exact, {spaces} differ in whitespace only; merge checks: {caught} caught "
        f"({wrongly_caught} of them exact), {let_through} wrong answers let through; "
        f"{sum(r['status'] != 'complete' for r in records)} incomplete; "
        f"median {sorted(r['seconds'] for r in records)[len(records) // 2]} s"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("answer")
    run.add_argument("--cases", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--limit", type=int, default=20)
    run.add_argument("--max-chars", type=int, default=4000)
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--model", help="a model folder or known name (default: the embedded default)")
    run.add_argument("--weights", default="auto", help="the linear layers' weights (as `specedit --weights`)")
    run.add_argument("--regions", action="store_true")
    run.add_argument("--max-new-tokens", type=int, help="output budget per case (default: twice the original)")
    run.set_defaults(handler=answer)
    totals = commands.add_parser("summary")
    totals.add_argument("answers", type=Path)
    totals.set_defaults(handler=summary)
    both = commands.add_parser("compare")
    both.add_argument("old", type=Path)
    both.add_argument("new", type=Path)
    both.set_defaults(handler=compare)
    args = parser.parse_args()
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
