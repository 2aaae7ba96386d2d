"""Edit-sketch cases made from real edits: what a chat model answers when asked for "just the changes".

    .venv/bin/python scripts/sketch_cases.py --cases ../shared/data/edits/git_history.jsonl \
        --language python --max-chars 6000 --limit 20 --out bench-results/sketch-git-python.jsonl

For each before/after pair, the sketch shows each changed part of the after, the rest elided by the
language's comment (`# ... existing code ...`, `// ... existing code ...`). `--shape` says how much:
`context` (the tidy style: the changed lines and `--context` lines either side, a marker above and below),
or `block` (the whole enclosing function, method or class of each change, as a model shows "the function,
changed"). `--styles` says which markers: `existing` (`... existing code ...` alone), `mixed` (in turn, the
forms chat models also write: a bare `...`, `// rest unchanged`, `# ... (same as before)`), or `models`
(chosen per case from what models write: `// ...`, `/* ... */`, `// (unchanged)`, `# ... rest of the file
unchanged ...`, `// ... keep existing code ...`, `// ... same ...`; and indented like the code beside them,
some cases with the marker at the start or the end left out (`--drop-markers`), trailing spaces stripped,
tabs turned to spaces in some).

`--format` writes the edit as models also write it instead of a sketch: `udiff` (a unified diff; in turn
with exact line numbers, numbers off by some lines and wrong counts, and `@@ ... @@` without numbers; some
without file headers, some with blank context lines unprefixed), `search-replace` (aider's SEARCH/REPLACE
blocks, some with trailing spaces stripped) and `v4a` (OpenAI's `apply_patch`: `*** Begin Patch`,
`*** Update File:`, `@@` with the enclosing function's line, three lines of context).

`--wrap chat` writes each sketch (or patch) as a chat model's whole answer around it, as users copy one:
a sentence before (in most), a fenced block with or without a language (a longer fence where the code
holds fences), in some the file's name in the fence or on the line above, in some two blocks for two
parts with a sentence between, in some a closing sentence. How, by a hash of the case's id; `style`
says it. `engine/sketch/chat_answer.py` takes the sketch back out.

`--split tune|heldout` keeps one half of the cases by a hash of their id (the other half stays unseen
while tuning). Each case keeps `before` and `after` (the merge it should give) and drops the instruction:
`sketch` takes its place, and `style` says how the sketch was written. Cases whose edit changes nothing,
or whose sketch would be most of the file, are left out.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import random
import re
import sys
from pathlib import Path

from specedit.engine.sketch.merge_checks import counts, is_elision

COMMENT = {
    "python": "#",
    "ruby": "#",
    "shell": "#",
    "bash": "#",
    "yaml": "#",
    "php": "//",
    "lua": "--",
    "sql": "--",
    "haskell": "--",
}
EXTENSION = {"python": "py", "javascript": "js", "go": "go", "java": "java", "cpp": "cpp", "swift": "swift"}
MAX_SKETCH_SHARE = 0.6  # a sketch holding more of the file than this is a rewrite, not a sketch

# How chat models write an elision: `{c}` is the language's line comment.
STYLES = ("{c} ... existing code ...", "...", "{c} rest unchanged", "{c} ... (same as before)")
MODEL_STYLES = (
    "{c} ... existing code ...",
    "{c} ...",
    "/* ... */",
    "{c} (unchanged)",
    "{c} ... rest of the file unchanged ...",
    "{c} ... keep existing code ...",
    "{c} ... same ...",
    "{c} ... other methods ...",
    "{c} ... rest of the code remains the same ...",
)
FORMATS = ("lazy", "udiff", "search-replace", "v4a")
# How chat models open, join and close an answer around the code (`--wrap chat`).
OPENINGS = (
    "Here's the updated code:",
    "Sure! Here are the changes to `{path}`:",
    "I've made the change. Here is the relevant part:",
    "To do this, update the code as follows:",
    "Here is the refactor. Only the changed parts are shown:",
    "You can fix this by changing the code like this:",
)
BETWEENS = ("Then, further down in the same file:", "And update this part too:", "Next, change:")
CLOSINGS = (
    "The rest of the file is unchanged.",
    "This keeps the existing behaviour and adds what you asked for.",
    "Let me know if you'd like tests for this as well!",
    "Everything else stays the same.",
)
LABELS = ("{path}:", "**{path}**", "### {path}", "`{path}`", "{path}")
NAMED_FENCES = ('{tag} title="{path}"', "{path}", "{tag}:{path}")
TAGS = {"cpp": ("cpp", "c++"), "javascript": ("javascript", "js"), "markdown": ("markdown", "md")}
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})")

# A line that opens a function, method or class (the block a model shows whole), not a statement's block.
_CONTROL = re.compile(
    r"^(?:if|else|elif|for|foreach|while|do|switch|case|default|try|catch|except|finally|with|return|guard|"
    r"defer|select|unless|until|begin|rescue|ensure|when)\b"
)
_CLOSER = re.compile(r"^(?:[}\])]|end\b)")
_NOTE = re.compile(r"^(?:@|#\[|///?|/\*|\*|#(?!include))")  # decorators and doc comments above a header


def elision(language: str, style: int = 0, styles: tuple[str, ...] = STYLES) -> str:
    marker = styles[style % len(styles)]
    comment = COMMENT.get(language.lower(), "//")
    if marker.startswith("/*") and comment != "//":  # a block comment only where the language has one
        marker = "{c} ..."
    return marker.format(c=comment)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _changed(old: list[str], new: list[str]) -> list[tuple[int, int]]:
    """The changed parts of `new`, [start, stop) each (a deletion: an empty part where it was)."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [(b1, b2) for tag, _, _, b1, b2 in matcher.get_opcodes() if tag != "equal"]


def _with_context(new: list[str], start: int, stop: int, context: int) -> tuple[int, int]:
    """`context` lines either side, widened until that context holds a line that says something
    (`merge_checks.counts`: blank lines and a lone `}` do not say where a deletion next to them was)."""
    new_start, new_stop = start, stop
    start, stop = max(0, start - context), min(len(new), stop + context)
    while start > 0 and not any(counts(line) for line in new[start:new_start]):
        start -= 1
    while stop < len(new) and not any(counts(line) for line in new[new_stop:stop]):
        stop += 1
    return start, stop


def enclosing_block(new: list[str], start: int, stop: int) -> tuple[int, int] | None:
    """The innermost function, method or class around `new[start:stop]`, [start, stop), with the
    decorators and doc comments right above it; None at the top level."""
    said = [line for line in new[start:stop] if line.strip()]
    level = min((_indent(line) for line in said), default=_indent(new[start]) if start < len(new) else 0)
    header = None
    for at in range(min(start, len(new)) - 1, -1, -1):
        line = new[at]
        text = line.strip()
        if not text or _indent(line) >= level:
            continue
        if _CLOSER.match(text) or not any(c.isalpha() for c in text):
            continue
        level = _indent(line)
        if not _CONTROL.match(text) and text.endswith(("{", ":", ")", "=>")):
            header = at
            break
        if level == 0:
            break
    if header is None:
        return None
    first = header
    while first > 0 and new[first - 1].strip() and _indent(new[first - 1]) == level:
        if not _NOTE.match(new[first - 1].strip()):
            break
        first -= 1
    end = header + 1
    while end < len(new) and (not new[end].strip() or _indent(new[end]) > level or new[end].strip() == "{"):
        end += 1
    if end < len(new) and _indent(new[end]) == level and _CLOSER.match(new[end].strip()):
        end += 1
    while end > header + 1 and not new[end - 1].strip():
        end -= 1
    return (first, end) if end >= stop else None


def _parts(before: str, after: str, shape: str, context: int) -> tuple[list[str], list[list[int]]]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    parts: list[list[int]] = []  # [start, stop) in `new`, per part shown
    for start, stop in _changed(old, new):
        block = enclosing_block(new, start, stop) if shape == "block" else None
        start, stop = block or _with_context(new, start, stop, context)
        if parts and start <= parts[-1][1]:
            parts[-1][1] = max(parts[-1][1], stop)
        else:
            parts.append([start, stop])
    return new, parts


def sketch_of(
    before: str,
    after: str,
    language: str,
    context: int,
    style: int = 0,
    *,
    shape: str = "context",
    rng: random.Random | None = None,
    drop_markers: float = 0.0,
) -> tuple[str, str] | None:
    """The sketch of the edit `before` -> `after` (see the module docstring) and how it was written."""
    new, parts = _parts(before, after, shape, context)
    if not parts:
        return None
    notes = [shape]
    styles = MODEL_STYLES if rng is not None else STYLES
    marker = elision(language, rng.randrange(len(styles)) if rng else style, styles)
    notes.append(repr(marker))
    indented = rng is not None and rng.random() < 0.5
    lead, trail = parts[0][0] > 0, parts[-1][1] < len(new)
    if rng is not None and rng.random() < drop_markers:  # a model's "here is the updated method:"
        which = rng.choice(("start", "end", "both"))
        lead, trail = lead and which == "end", trail and which == "start"
        notes.append(f"no marker at the {which}")

    def placed(at: int) -> str:
        """The marker, indented (if it is) like the first code it stands for (a leading one: like the
        part after it)."""
        beside = next((line for line in new[at:] if line.strip()), "")
        return (beside[: _indent(beside)] if indented else "") + marker + "\n"

    pieces = [placed(parts[0][0])] if lead else []
    for number, (start, stop) in enumerate(parts):
        if number > 0:
            pieces.append(placed(parts[number - 1][1]))
        pieces.append("".join(new[start:stop]))
    if trail:
        pieces.append(placed(parts[-1][1]))
    sketch = "".join(pieces)
    if rng is not None:  # a chat answer's code block has no trailing spaces; some turn tabs into spaces
        sketch = "".join(line.rstrip() + "\n" for line in sketch.splitlines())
        if "\t" in sketch and rng.random() < 0.3:
            sketch = "".join(_detabbed(line) for line in sketch.splitlines(keepends=True))
            notes.append("tabs as spaces")
    if len(sketch) > MAX_SKETCH_SHARE * len(after):
        return None
    return sketch, ", ".join(notes)


def _detabbed(line: str) -> str:
    body = line.lstrip("\t")
    return "    " * (len(line) - len(body)) + body


def _groups(before: str, after: str, context: int) -> list[list[tuple[str, int, int, int, int]]]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return list(matcher.get_grouped_opcodes(context))


def _body(line: str) -> str:
    return line.removesuffix("\n").removesuffix("\r")


def udiff_of(before: str, after: str, path: str, rng: random.Random) -> tuple[str, str] | None:
    """A unified diff of the edit, written as models write them (see the module docstring)."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    numbers = rng.choice(("exact", "off", "none"))
    headers = rng.random() < 0.7
    bare_blanks = rng.random() < 0.5
    strip = rng.random() < 0.5
    offset = rng.choice((-1, 1)) * rng.randint(1, 15)
    out = [f"--- a/{path}\n", f"+++ b/{path}\n"] if headers else []
    groups = _groups(before, after, 3)
    if not groups:
        return None
    for group in groups:
        a1, a2, b1, b2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        if numbers == "exact":
            out.append(f"@@ -{a1 + 1},{a2 - a1} +{b1 + 1},{b2 - b1} @@\n")
        elif numbers == "off":
            wrong = rng.randint(-2, 2)
            out.append(f"@@ -{max(1, a1 + 1 + offset)},{a2 - a1 + wrong} +{max(1, b1 + 1 + offset)},{b2 - b1} @@\n")
        else:
            out.append("@@ ... @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [(" " if old[i].strip() or not bare_blanks else "") + _body(old[i]) for i in range(i1, i2)]
                continue
            out += ["-" + _body(old[i]) for i in range(i1, i2)]
            out += ["+" + _body(new[j]) for j in range(j1, j2)]
        out = [line if line.endswith("\n") else line + "\n" for line in out]
    text = "".join(line.rstrip() + "\n" if strip else line for line in out)
    notes = f"udiff, numbers {numbers}" + (", no headers" if not headers else "") + (", stripped" if strip else "")
    return text, notes


def search_replace_of(before: str, after: str, path: str, rng: random.Random) -> tuple[str, str] | None:
    """aider's SEARCH/REPLACE blocks for the edit, one per changed part with 2-3 lines of context."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    strip = rng.random() < 0.5
    groups = _groups(before, after, rng.choice((2, 3)))
    if not groups:
        return None
    fence = "```\n"
    out = []
    for group in groups:
        a1, a2, b1, b2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        search, replace = old[a1:a2], new[b1:b2]
        if strip:
            search = [line.rstrip() + "\n" for line in search]
            replace = [line.rstrip() + "\n" for line in replace]
        out += [f"{path}\n", fence, "<<<<<<< SEARCH\n", *_ended(search), "=======\n", *_ended(replace)]
        out += [">>>>>>> REPLACE\n", fence, "\n"]
    return "".join(out), "search-replace" + (", stripped" if strip else "")


def v4a_of(before: str, after: str, path: str, rng: random.Random) -> tuple[str, str] | None:
    """OpenAI's `apply_patch` V4A patch of the edit: three lines of context, `@@` with the enclosing
    function's or class's line where there is one."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    groups = _groups(before, after, 3)
    if not groups:
        return None
    out = ["*** Begin Patch\n", f"*** Update File: {path}\n"]
    for group in groups:
        b1, b2 = group[0][3], group[-1][4]
        block = enclosing_block(new, b1 + 3 if b2 - b1 > 3 else b1, max(b1 + 1, b2 - 3))
        out.append(f"@@ {new[block[0]].strip()}\n" if block and block[0] < b1 else "@@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + _body(old[i]) + "\n" for i in range(i1, i2)]
                continue
            out += ["-" + _body(old[i]) + "\n" for i in range(i1, i2)]
            out += ["+" + _body(new[j]) + "\n" for j in range(j1, j2)]
    out.append("*** End Patch\n")
    return "".join(out), "v4a"


def _ended(lines: list[str]) -> list[str]:
    return [line if line.endswith("\n") else line + "\n" for line in lines]


def chat_answer_of(sketch: str, case: dict[str, str], format: str, rng: random.Random) -> tuple[str, str]:
    """`sketch` as a chat model's whole answer around it (see the module docstring), and how it was written."""
    path, language = path_of(case), case["language"].lower()
    notes: list[str] = []
    tag = rng.choice(TAGS.get(language, (language,)))
    if format in ("udiff", "v4a"):
        tag = rng.choice(("diff", ""))
    fence = "```"  # in code that holds fences too (a docstring's), as models write it
    held = [len(found.group(1)) for line in sketch.splitlines() if (found := _FENCE_LINE.match(line))]
    if language == "markdown" and held:  # a Markdown text holding fences is fenced longer, as CommonMark asks
        fence = "`" * max(4, *(length + 1 for length in held))
    named = rng.choice(("none", "none", "fence", "above"))
    if named == "fence":
        info = rng.choice(NAMED_FENCES if tag else ("{path}",)).format(tag=tag, path=path)
    else:
        info = rng.choice((tag, tag, ""))
    if format != "search-replace":  # (aider's blocks carry their own fences)
        notes.append(f"fence {fence}{info}" if info else f"fence {fence}, no language")
    pieces = []
    if rng.random() < 0.85:
        pieces += [rng.choice(OPENINGS).format(path=path), ""]
    if named == "above" and format != "search-replace":
        pieces.append(rng.choice(LABELS).format(path=path))
        notes.append("file named above")
    parts = [sketch]
    if format == "lazy" and rng.random() < 0.4:
        parts = _two_parts(sketch, rng.random() < 0.5)
        if len(parts) == 2:
            notes.append("two blocks")
    for number, part in enumerate(parts):
        if number:
            pieces += ["", rng.choice(BETWEENS), ""]
        code = part.removesuffix("\n")  # its blank lines kept: the bare sketch's, line for line
        if format == "search-replace":  # aider's blocks carry their own fences and file names
            pieces.append(code)
            continue
        pieces += [fence + info, code, fence]
    if rng.random() < 0.5:
        pieces += ["", rng.choice(CLOSINGS)]
        notes.append("closing sentence")
    return "\n".join(pieces) + "\n", ", ".join(notes)


def _two_parts(sketch: str, keep_marker: bool) -> list[str]:
    """The sketch as two blocks, split at the marker in its middle (kept at the end of the first, or
    left out: the sentence between the blocks stands for it). One part where it has no marker between
    two chunks."""
    lines = sketch.splitlines(keepends=True)
    said = [number for number, line in enumerate(lines) if line.strip()]
    inner = [n for n in said[1:-1] if is_elision(lines[n])] if len(said) > 2 else []
    if not inner:
        return [sketch]
    at = inner[len(inner) // 2]
    return ["".join(lines[: at + 1] if keep_marker else lines[:at]), "".join(lines[at + 1 :])]


def path_of(case: dict[str, str]) -> str:
    """The file the case edits, as its source names it (`... file src/x.py`), else a name in its language."""
    found = re.search(r"\bfile (\S+)", case.get("source", ""))
    return found.group(1) if found else f"src/main.{EXTENSION.get(case['language'].lower(), 'txt')}"


def in_split(case_id: str, split: str | None) -> bool:
    if split is None:
        return True
    half = hashlib.sha256(case_id.encode()).digest()[0] % 2
    return half == (0 if split == "tune" else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--language", help="only cases in this language")
    parser.add_argument("--context", type=int, default=2)
    parser.add_argument("--min-chars", type=int, default=0, help="only originals of at least this many characters")
    parser.add_argument("--max-chars", type=int, default=8000, help="only originals shorter than this")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--styles", choices=("existing", "mixed", "models"), default="existing")
    parser.add_argument("--shape", choices=("context", "block"), default="context")
    parser.add_argument("--format", choices=FORMATS, default="lazy")
    parser.add_argument(
        "--drop-markers",
        type=float,
        default=1 / 3,
        help="with --styles models: the share of sketches without "
        "the marker at the start, the end or both (default a third)",
    )
    parser.add_argument(
        "--wrap", choices=("none", "chat"), default="none", help="chat: each sketch inside a chat model's whole answer"
    )
    parser.add_argument("--split", choices=("tune", "heldout"), help="only one half of the cases, by their id")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N cases that qualify")
    args = parser.parse_args()
    written = skipped = 0
    with args.cases.open(encoding="utf-8") as cases, args.out.open("w", encoding="utf-8") as out:
        for line in cases:
            case = json.loads(line)
            if args.language and case["language"].lower() != args.language.lower():
                continue
            if not args.min_chars <= len(case["before"]) < args.max_chars or not in_split(case["id"], args.split):
                continue
            rng = random.Random(case["id"])  # the same case is written the same way every time
            if args.format == "lazy":
                style = written % len(STYLES) if args.styles == "mixed" else 0
                made = sketch_of(
                    case["before"],
                    case["after"],
                    case["language"],
                    args.context,
                    style,
                    shape=args.shape,
                    rng=rng if args.styles == "models" else None,
                    drop_markers=args.drop_markers,
                )
            else:
                write = {"udiff": udiff_of, "search-replace": search_replace_of, "v4a": v4a_of}[args.format]
                made = write(case["before"], case["after"], path_of(case), rng)
            if made is None:
                continue
            if skipped < args.skip:
                skipped += 1
                continue
            if args.wrap == "chat":  # its own generator: the sketch is the bare set's, case for case
                answer, how = chat_answer_of(made[0], case, args.format, random.Random(f"chat {case['id']}"))
                made = (answer, f"{made[1]}; chat answer: {how}")
            record = {key: case[key] for key in ("id", "language", "before", "after", "source") if key in case}
            out.write(json.dumps({**record, "sketch": made[0], "style": made[1]}) + "\n")
            written += 1
            if written >= args.limit:
                break
    print(f"{written} sketch cases in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
