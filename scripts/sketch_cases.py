"""Edit-sketch cases made from real edits: what a chat model answers when asked for "just the changes".

    .venv/bin/python scripts/sketch_cases.py --cases ../shared/data/edits/git_history.jsonl \
        --language python --max-chars 6000 --limit 20 --out bench-results/sketch-git-python.jsonl

For each before/after pair, the sketch is the after's changed lines with `--context` lines either side,
the rest elided by the language's comment (`# ... existing code ...`, `// ... existing code ...`). With
`--styles mixed` the elisions take, case by case in turn, the forms chat models also write: a bare `...`,
`// rest unchanged`, `# ... (same as before)`. Each case keeps `before` and `after` (the merge it should
give) and drops the instruction: `sketch` takes its place. Cases whose edit changes nothing, or whose
sketch would be most of the file, are left out.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from specedit.engine.merge_checks import counts

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


# How chat models write an elision: `{c}` is the language's line comment.
STYLES = ("{c} ... existing code ...", "...", "{c} rest unchanged", "{c} ... (same as before)")


def elision(language: str, style: int = 0) -> str:
    return STYLES[style].format(c=COMMENT.get(language.lower(), "//"))


def sketch_of(before: str, after: str, language: str, context: int, style: int = 0) -> str | None:
    """The sketch of the edit `before` -> `after`: each changed part of `after` with `context` lines either
    side, widened until that context holds a line that says something (`merge_checks.counts`: blank lines
    and a lone `}` do not say where a deletion next to them was)."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    parts: list[list[int]] = []  # [start, stop) in `new`, per changed part
    for tag, _, _, new_start, new_stop in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        start, stop = max(0, new_start - context), min(len(new), new_stop + context)
        while start > 0 and not any(counts(line) for line in new[start:new_start]):
            start -= 1
        while stop < len(new) and not any(counts(line) for line in new[new_stop:stop]):
            stop += 1
        if parts and start <= parts[-1][1]:
            parts[-1][1] = max(parts[-1][1], stop)
        else:
            parts.append([start, stop])
    if not parts:
        return None
    marker = elision(language, style) + "\n"
    pieces = [marker] if parts[0][0] > 0 else []
    for number, (start, stop) in enumerate(parts):
        if number > 0:
            pieces.append(marker)
        pieces.append("".join(new[start:stop]))
    if parts[-1][1] < len(new):
        pieces.append(marker)
    sketch = "".join(pieces)
    return sketch if len(sketch) <= MAX_SKETCH_SHARE * len(after) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--language", help="only cases in this language")
    parser.add_argument("--context", type=int, default=2)
    parser.add_argument("--min-chars", type=int, default=0, help="only originals of at least this many characters")
    parser.add_argument("--max-chars", type=int, default=8000, help="only originals shorter than this")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--styles", choices=("existing", "mixed"), default="existing")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N cases that qualify")
    args = parser.parse_args()
    written = skipped = 0
    with args.cases.open(encoding="utf-8") as cases, args.out.open("w", encoding="utf-8") as out:
        for line in cases:
            case = json.loads(line)
            if args.language and case["language"].lower() != args.language.lower():
                continue
            if not args.min_chars <= len(case["before"]) < args.max_chars:
                continue
            style = written % len(STYLES) if args.styles == "mixed" else 0
            sketch = sketch_of(case["before"], case["after"], case["language"], args.context, style)
            if sketch is None:
                continue
            if skipped < args.skip:
                skipped += 1
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
