"""Edit-sketch cases made from real edits: what a chat model answers when asked for "just the changes".

    .venv/bin/python scripts/sketch_cases.py --cases ../shared/data/edits/git_history.jsonl \
        --language python --max-chars 6000 --limit 20 --out bench-results/sketch-git-python.jsonl

For each before/after pair, the sketch is the after's changed lines with `--context` lines either side,
the rest elided by the language's comment (`# ... existing code ...`, `// ... existing code ...`). Each
case keeps `before` and `after` (the merge it should give) and drops the instruction: `sketch` takes its
place. Cases whose edit changes nothing, or whose sketch would be most of the file, are left out.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

COMMENT = {
    "python": "#",
    "ruby": "#",
    "shell": "#",
    "bash": "#",
    "php": "//",
    "lua": "--",
    "sql": "--",
    "haskell": "--",
}
MAX_SKETCH_SHARE = 0.6  # a sketch holding more of the file than this is a rewrite, not a sketch


def elision(language: str) -> str:
    return f"{COMMENT.get(language.lower(), '//')} ... existing code ..."


def sketch_of(before: str, after: str, language: str, context: int) -> str | None:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    groups = list(difflib.SequenceMatcher(None, old, new, autojunk=False).get_grouped_opcodes(context))
    if not groups:
        return None
    marker = elision(language) + "\n"
    parts: list[str] = []
    for number, group in enumerate(groups):
        first, last = group[0], group[-1]
        if number == 0 and first[3] > 0:
            parts.append(marker)
        if number > 0:
            parts.append(marker)
        parts.append("".join(new[first[3] : last[4]]))
        if number == len(groups) - 1 and last[4] < len(new):
            parts.append(marker)
    sketch = "".join(parts)
    return sketch if len(sketch) <= MAX_SKETCH_SHARE * len(after) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--language", help="only cases in this language")
    parser.add_argument("--context", type=int, default=2)
    parser.add_argument("--max-chars", type=int, default=8000)
    parser.add_argument("--limit", type=int, default=20)
    args = parser.parse_args()
    written = 0
    with args.cases.open(encoding="utf-8") as cases, args.out.open("w", encoding="utf-8") as out:
        for line in cases:
            case = json.loads(line)
            if args.language and case["language"].lower() != args.language.lower():
                continue
            if len(case["before"]) >= args.max_chars:
                continue
            sketch = sketch_of(case["before"], case["after"], case["language"], args.context)
            if sketch is None:
                continue
            record = {key: case[key] for key in ("id", "language", "before", "after", "source") if key in case}
            out.write(json.dumps({**record, "sketch": sketch}) + "\n")
            written += 1
            if written >= args.limit:
                break
    print(f"{written} sketch cases in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
