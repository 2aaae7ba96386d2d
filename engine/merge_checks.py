"""Is an answer to an edit sketch a merge? Checked before anything is written.

A chat model's edit sketch shows the changed parts of a file and stands for the rest with elision comments
(`// ... existing code ...`, `# rest unchanged`, a lone `...`). An answer is not a merge when it

- still holds an elision marker that the original does not have (the sketch was echoed, not merged);
- lacks a line the sketch adds (a line of the sketch that is neither a marker nor in the original);
- drops a line of the original that no part of the sketch covers: a chunk of the sketch (its lines between
  two markers) covers the lines of the original from the first one its lines match (exactly, or alike
  enough for rapidfuzz: a changed line) to the last, and may change or delete anything there; a chunk
  before the first marker covers from the file's start, one after the last to its end (a sketch without
  markers, the whole file or a part, covers what its lines span); outside every span the original must
  survive.

Lines are compared stripped (the model may re-indent), and only lines with a few letters or digits count
(`}`, `end`, blank lines are too common to say anything).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from specedit.engine.errors import MergeError

# A comment line that stands for code left out, or a line that is only an ellipsis: "// ... existing code
# ...", "# ... (same as before)", "/* rest of the file unchanged */", "-- ...". Not a comment that merely
# holds an ellipsis ("* @param {...number} args") or says "unchanged" in passing ("# keep it unchanged").
_COMMENT_START = re.compile(r"^(?:#+|//+|--|/\*+|\*|<!--|;+|%|\{/\*)")
_COMMENT_END = re.compile(r"(?:\*+/\}?|-->)$")
_ELLIPSIS = re.compile(r"\.\.\.|…")
_ELIDES = re.compile(  # what an elision says, with an ellipsis beside it
    r"\b(?:existing|unchanged|same|before|rest|remaining|other|previous|original|omitted|elided|etc)\b"
)
_ELIDES_ALONE = re.compile(  # what says it without one
    r"existing code|same as before|(?:code|file|rest|everything else|remainder) (?:is |stays |remains )?"
    r"unchanged|unchanged (?:code|lines)|rest of (?:the )?(?:code|file|class|function|module|methods)"
)
MAX_ELISION_WORDS = 8
MIN_ALNUM = 3  # a line counts when it has at least this many letters or digits
FUZZY_SCORE = 50  # rapidfuzz's ratio (0-100) from which a changed line is taken to stand for an original one


@dataclass
class MergeCheck:
    markers: list[str] = field(default_factory=list)  # elision markers left in the answer
    missing: list[str] = field(default_factory=list)  # lines the sketch adds, not in the answer
    dropped: list[str] = field(default_factory=list)  # lines of the original no chunk covers, not in the answer

    @property
    def ok(self) -> bool:
        return not (self.markers or self.missing or self.dropped)

    def raise_if_not_ok(self, name: str) -> None:
        """`MergeError` naming what is wrong, unless the answer is a merge."""
        if not self.ok:
            raise MergeError(f"{name}: the answer is not a merge of the edit sketch: {self.describe()}")

    def describe(self, limit: int = 3) -> str:
        """One line per kind of problem, with the first few lines quoted."""
        parts = []
        for what, lines in (
            ("still holds elision markers", self.markers),
            ("leaves out lines the sketch adds", self.missing),
            ("drops code the sketch did not touch", self.dropped),
        ):
            if lines:
                quoted = "; ".join(repr(line) for line in lines[:limit])
                more = f" and {len(lines) - limit} more" if len(lines) > limit else ""
                parts.append(f"it {what} ({len(lines)}: {quoted}{more})")
        return ", ".join(parts)


def is_elision(line: str) -> bool:
    text = line.strip()
    if text in ("...", "…"):
        return True
    start = _COMMENT_START.match(text)
    if start is None:
        return False
    body = _COMMENT_END.sub("", text[start.end() :]).strip()
    words = _ELLIPSIS.sub(" ", body).strip(" \t()[]:,;-").lower()
    if len(words.split()) > MAX_ELISION_WORDS:
        return False
    if _ELLIPSIS.search(body):
        return not words or bool(_ELIDES.search(words))
    return bool(_ELIDES_ALONE.search(words))


def check_merge(original: str, sketch: str, answer: str) -> MergeCheck:
    """What keeps `answer` from being a merge of `sketch` into `original` (nothing: `.ok`)."""
    original_lines = _counted(original)
    original_set = set(original_lines)
    answer_lines = _counted(answer)
    answer_set = set(answer_lines)
    check = MergeCheck()
    original_all = {line.strip() for line in original.splitlines()}
    check.markers = [
        line.strip() for line in answer.splitlines() if is_elision(line) and line.strip() not in original_all
    ]
    sketch_lines = [line.strip() for line in sketch.splitlines()]
    check.missing = [
        line
        for line in _counted(sketch)
        if not is_elision(line) and line not in original_set and line not in answer_set
    ]
    covered = _covered(original_lines, _chunks(sketch_lines))
    matcher = difflib.SequenceMatcher(None, original_lines, answer_lines, autojunk=False)
    for tag, start, stop, _, _ in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            check.dropped += [
                original_lines[i]
                for i in range(start, stop)
                if i not in covered and original_lines[i] not in answer_set
            ]
    return check


def _counted(text: str) -> list[str]:
    """The lines that count, stripped."""
    return [line.strip() for line in text.splitlines() if counts(line)]


def counts(line: str) -> bool:
    """Whether a line says enough to be compared: `MIN_ALNUM` letters or digits."""
    return sum(c.isalnum() for c in line) >= MIN_ALNUM


def _chunks(sketch_lines: list[str]) -> list[tuple[list[str], bool, bool]]:
    """The sketch's runs of lines between elision markers (lines that count only), each with whether it
    starts the file (no marker before it) and ends it (none after)."""
    runs: list[list[str]] = [[]]
    for line in sketch_lines:
        if is_elision(line):
            runs.append([])
        elif counts(line):
            runs[-1].append(line)
    last = len(runs) - 1
    if last == 0:  # no marker: the whole file, or a part of it with the rest implied (a method alone)
        return [(runs[0], False, False)] if runs[0] else []
    return [(run, number == 0, number == last) for number, run in enumerate(runs) if run]


def _covered(original_lines: list[str], chunks: list[tuple[list[str], bool, bool]]) -> set[int]:
    """Indices of the original's lines that some chunk spans: from the first line of the original that one
    of the chunk's lines matches (in order, exactly; else the most alike, at least `FUZZY_SCORE`, between
    the places of its matched neighbours) to the last; a chunk that starts the sketch spans from the
    original's start, one that ends it to the original's end (a chunk with no line in the original spans
    nothing). Each chunk is matched in the whole original
    and, where the chunks before it were found, after them (a line its neighbours share, `Use: "test",`,
    must not pull it back to an earlier place); it spans both."""
    covered: set[int] = set()
    after = 0  # past the last line the chunk before matched
    for chunk, at_start, at_end in chunks:
        lows = (0, after) if after else (0,)
        spans = [_span(original_lines, chunk, low, unique) for low in lows for unique in (False, True)]
        for span in spans:
            if span is not None:
                first = 0 if at_start else span[0]
                last = len(original_lines) - 1 if at_end else span[1]
                covered.update(range(first, last + 1))
        ordered = [span[1] for span in spans[-2:] if span is not None]  # found after the chunk before
        if ordered:
            after = min(ordered) + 1
    return covered


def _span(original_lines: list[str], chunk: list[str], low: int, unique: bool) -> tuple[int, int] | None:
    """The first and last lines of `original_lines[low:]` that `chunk`'s lines match (see `_covered`); with
    `unique`, only lines the original has once start a match (`return ret;` must not pull it elsewhere)."""
    rest = original_lines[low:]
    seen = Counter(rest)
    junk = (lambda line: seen[line] != 1) if unique else None
    matcher = difflib.SequenceMatcher(junk, rest, chunk, autojunk=False)
    matched = {block.b + k: block.a + k for block in matcher.get_matching_blocks() for k in range(block.size)}
    anchors = list(matched.values())
    for position, line in enumerate(chunk):
        if position in matched:
            continue
        # A changed line stands where the most alike line is, between its neighbours' places.
        start = max((matched[p] for p in matched if p < position), default=-1) + 1
        stop = min((matched[p] for p in matched if p > position), default=len(rest))
        found = process.extractOne(line, rest[start:stop], scorer=fuzz.ratio, score_cutoff=FUZZY_SCORE)
        if found is not None:
            anchors.append(start + found[2])
    return (low + min(anchors), low + max(anchors)) if anchors else None
