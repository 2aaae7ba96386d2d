"""Is an answer to an edit sketch a merge? Checked before anything is written. A chat model's edit sketch
shows the changed parts of a file and stands for the rest with elision comments (`// ... existing code
...`, `# rest unchanged`, a lone `...`); an answer that echoes the sketch, lacks its new lines or drops
code it did not touch is no merge (`check_merge` says which). Lines are compared stripped (the model may
re-indent), and only lines with a few letters or digits count (`}`, `end`, blank lines are too common to
say anything).
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from specedit.engine.records.errors import MergeError
from specedit.engine.sketch.blocks import block_holding, comment_above, find_block, lines_above, omitted, shown_block
from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline
from specedit.engine.sketch.line_index import LineIndex, matching_blocks
from specedit.engine.sketch.patches import SYNTAX, Patch, SketchFormat, as_sketch, detect, parse_patch

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
    r"unchanged|unchanged (?:code|lines)|rest of (?:the )?(?:code|file|class|function|module|methods)|"
    r"^(?:unchanged|omitted|elided|snip|snipped)$"  # `// (unchanged)`, `# [omitted]`
)
MAX_ELISION_WORDS = 8
# A code fence: up to three spaces, three or more backticks or tildes, an info string (a backtick fence's
# holds no backtick: "```x```" is inline code). A chat answer's around its sketch (`chat_answer`).
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*?)[ \t]*$")
# Lines that say something a merge may drop before the first line a chunk spans, or after the last: no
# more than the sketch's new first or last lines replace (a silent deletion beyond it is not a merge).
EDGE_DROPS = 2
# Lines that say something a sketch that is one block whole and nothing else (no markers: "the function,
# changed") may delete from the original's block of its first line past the last line it spans (a line
# the edit deleted at the block's end); more is a block the sketch does not show whole.
BLOCK_DROPS = 3
MIN_ALNUM = 3  # a line counts when it has at least this many letters or digits
FUZZY_SCORE = 50  # rapidfuzz's ratio (0-100) from which a changed line is taken to stand for an original one
# How many lines that count past a chunk's first or last line matched its changed lines there are looked
# for, and either side of where the chunks before it end for a chunk with no line matched (`_span`):
# reading the whole file for each chunk would make the checks of a large sketch quadratic. On
# docs/sketches.md's sets, the farthest past a line matched is 477 lines.
FUZZY_REACH = 512
_SAYS = re.compile(rf"(?:[\W_]*[^\W_]){{{MIN_ALNUM}}}")  # `MIN_ALNUM` letters or digits (`str.isalnum`'s)


@dataclass
class MergeCheck:
    markers: list[str] = field(default_factory=list)  # elision markers left in the answer
    missing: list[str] = field(default_factory=list)  # lines the sketch adds, not in the answer
    dropped: list[str] = field(default_factory=list)  # lines of the original no chunk covers, not in the answer
    prose: list[str] = field(default_factory=list)  # a chat answer's prose or fence lines written (`_written_around`)

    @property
    def ok(self) -> bool:
        return not (self.markers or self.missing or self.dropped or self.prose)

    def raise_if_not_ok(self, name: str) -> None:
        """`MergeError` naming what is wrong, unless the answer is a merge."""
        if not self.ok:
            raise MergeError(f"{name}: the answer is not a merge of the edit sketch: {self.describe()}")

    def describe(self, limit: int = 3) -> str:
        """One line per kind of problem, with the first few lines quoted."""
        parts = []
        for what, lines in (
            ("still holds elision markers or patch syntax", self.markers),
            ("leaves out lines the sketch adds", self.missing),
            ("drops code the sketch did not touch", self.dropped),
            ("writes the chat answer's prose or code fences into the file", self.prose),
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


def is_fence(line: str) -> bool:
    """Whether a line (stripped) is a code fence: ```` ``` ````, ```` ```python ````, `~~~`."""
    found = FENCE.match(line.strip())
    return found is not None and not (found["fence"][0] == "`" and "`" in found["info"])


def check_merge(
    original: str,
    sketch: str,
    answer: str,
    sketch_format: SketchFormat = "auto",
    *,
    left_out: Collection[str] = (),
    patch: Patch | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> MergeCheck:
    """What keeps `answer` from being a merge of `sketch` into `original` (nothing: `.ok`). An answer is
    not a merge when it

    - still holds an elision marker that the original does not have (the sketch was echoed, not merged);
    - lacks a line the sketch adds (a line of the sketch that is neither a marker nor in the original);
    - drops a line of the original that no part of the sketch covers: a chunk of the sketch (its lines between
      two markers) covers the lines of the original from the first one its lines match (exactly, or alike
      enough for rapidfuzz: a changed line) to the last, and may change or delete anything there; outside
      every span the original must survive, at the file's start and end too (a chunk with no marker before
      it does not cover the file's start: chat models leave the first and last markers out). A sketch that
      is one block whole and nothing else ("the method, changed") covers that block of the original, up to
      `BLOCK_DROPS` lines past its own; a chunk that shows a block from its first line to its closing one
      (`func F() {` ... `}`) covers all of that block (its lines between those two), and a chunk that shows a
      block covers nothing outside it. Nor does a chunk cover the original's blocks between two blocks it
      shows one after the other (`blocks.omitted`: a chat model left out the marker between two functions).

    A patch (a unified diff, SEARCH/REPLACE blocks, a V4A patch: `patches`) is checked as the lazy sketches
    it stands for: its hunks' new lines between markers say what the answer must hold, their old lines
    which lines of the original it may change or delete (a `-` line is shown, and so deleted on purpose).
    An answer holding a patch's syntax that the original has not (`@@ -2,7 +2,7 @@`, `<<<<<<< SEARCH`)
    wrote the patch instead of applying it. `left_out`: the lines of a chat answer around its sketch
    (`chat_answer`). `patch`: the sketch's hunks where it was parsed already (`sketch.Sketch`). `deadline`
    is checked before each chunk's work."""
    written_as = detect(sketch, original) if sketch_format == "auto" else sketch_format
    spans = sketch  # what says which lines of the original the edit may change or delete
    if written_as != "lazy":
        patch = parse_patch(sketch, written_as) if patch is None else patch
        sketch, spans = as_sketch(patch, "new"), as_sketch(patch, "old")
    original_lines = _counted(original)
    original_set = set(original_lines)
    answer_lines = _counted(answer)
    answer_set = set(answer_lines)
    deadline.check()
    check = MergeCheck()
    original_all = {line.strip() for line in original.splitlines()}
    check.markers = [
        line.strip()
        for line in answer.splitlines()
        if line.strip() not in original_all and (is_elision(line) or SYNTAX.match(line))
    ]
    check.missing = [
        line
        for line in _counted(sketch)
        if not is_elision(line) and line not in original_set and line not in answer_set
    ]
    deadline.check()
    shown = _shown_blocks(original, sketch, deadline) if written_as == "lazy" else []
    gaps = _omitted(original, sketch, deadline) if written_as == "lazy" else []
    covered, (new_before, new_after) = _covered(
        original_lines, _chunks([line.strip() for line in spans.splitlines()]), shown, gaps, deadline
    )
    if written_as == "lazy" and covered:
        block = _block_shown(original, sketch)
        if len(block - covered) <= BLOCK_DROPS:
            covered |= block
        for limits in shown:  # a block shown to its closing line: all it holds is the sketch's
            if limits is not None and limits[2]:
                covered.update(range(limits[0], limits[1]))
    first, last = min(covered, default=len(original_lines)), max(covered, default=-1)
    starts, ends = _reaches_edges(spans, original)
    if covered and starts:
        covered.update(range(first))
    if covered and ends:
        covered.update(range(last + 1, len(original_lines)))
    # A line the answer lacks anywhere is one a diff to it would delete: no diff needed (difflib's quadratic
    # worst case, a file of repeated lines).
    dropped = [i for i, line in enumerate(original_lines) if line not in answer_set and i not in covered]
    # Past the last line a chunk spans (before the first), as many lines may go as the sketch has new lines
    # past its last line found in the original (before its first), up to `EDGE_DROPS`: they replace the
    # file's last lines there (`return {"hello": "world"}` by `raise HTTPError(404)`), not a function after.
    for edge, new in (([i for i in dropped if i < first], new_before), ([i for i in dropped if i > last], new_after)):
        if len(edge) <= min(new, EDGE_DROPS):
            dropped = [i for i in dropped if i not in edge]
    check.dropped = [original_lines[i] for i in dropped]
    check.prose = _written_around(original, sketch, answer, left_out)
    return check


def _written_around(original: str, sketch: str, answer: str, left_out: Collection[str]) -> list[str]:
    """The answer's lines that neither the original nor the sketch has and that are a code fence, or a line
    of the chat answer around the sketch (`left_out`: its prose, file names and fences) that says something:
    written into the file, they are no merge, as an elision marker left in it is not."""
    own = {line.strip() for text in (original, sketch) for line in text.splitlines()}
    around = {line.strip() for line in left_out if counts(line) or is_fence(line)}
    return [
        line.strip()
        for line in answer.splitlines()
        if line.strip() not in own and (line.strip() in around or is_fence(line))
    ]


def _block_shown(original: str, sketch: str) -> set[int]:
    """The original's lines that count (indices among them) in the block that a sketch without markers
    shows whole (`blocks.shown_block`): the block of the one line of the original equal to its first. Empty
    if it shows no block whole."""
    sketch_lines = sketch.splitlines()
    if any(is_elision(line) for line in sketch_lines) or (shown := shown_block(sketch_lines)) is None:
        return set()
    lines = original.splitlines()
    if (block := find_block(lines, shown)) is None:
        return set()
    return _counted_in(_counted_numbers(lines), block)


def _shown_blocks(original: str, sketch: str, deadline: Deadline) -> list[tuple[int, int, bool] | None]:
    """Per chunk of the sketch (`_runs`, as `_chunks` reads them), the original's lines that count (indices
    among them, from and to) of the block the chunk shows whole (`blocks.shown_block`, below a doc comment or
    annotations if any; of the original's blocks of its first line, the one holding the most of its lines),
    and whether it shows it to its closing line (`}`, `end`); None where it shows no block whole. A chunk
    that shows a block changes nothing outside it (its lines alike to lines past the block, a loop like the
    next method's, do not stretch its span there), and one shown to its closing line says what the whole
    block holds (`_covered`)."""
    lines = original.splitlines()
    counted = _counted_numbers(lines)
    firsts = LineIndex([line.strip() for line in lines])  # where each block's first line is
    found: list[tuple[int, int, bool] | None] = []
    for run in map(list, _runs(sketch.splitlines())):
        deadline.check()
        above = lines_above(run)  # a doc comment or annotations above the block's first line
        body = run[above:]
        shown = shown_block(body)
        block = block_holding(lines, shown, body, firsts.places(shown.first)) if shown is not None else None
        if block is not None:  # the chunk's own lines above it stand for the original's there
            block = (comment_above(lines, block[0], 0, run[:above]), block[1])
        indices = sorted(_counted_in(counted, block)) if shown is not None and block is not None else []
        found.append((indices[0], indices[-1] + 1, bool(shown.closing)) if shown is not None and indices else None)
    return found


def _omitted(original: str, sketch: str, deadline: Deadline) -> list[list[tuple[int, int]]]:
    """Per chunk of the sketch (`_runs`, as `_chunks` reads them), the original's lines that count (indices
    among them, from and to) that it neither shows nor marks between two blocks it shows one after the
    other (`blocks.omitted`: the marker between two functions left out). A merge keeps them."""
    lines = original.splitlines()
    counted = _counted_numbers(lines)
    stripped = LineIndex([line.strip() for line in lines])
    found = []
    for run in _runs(sketch.splitlines()):
        deadline.check()
        found.append(
            [
                (bisect.bisect_left(counted, start), bisect.bisect_left(counted, stop))
                for _, start, stop in omitted(lines, run, stripped)
            ]
        )
    return found


def _counted_in(counted: list[int], block: tuple[int, int]) -> set[int]:
    """The indices among the original's lines that count (`counted`: their line numbers) of those in the
    lines `block` spans."""
    return set(range(bisect.bisect_left(counted, block[0]), bisect.bisect_left(counted, block[1])))


def _counted_numbers(lines: list[str]) -> list[int]:
    """The numbers of the lines that count."""
    return [number for number, line in enumerate(lines) if counts(line)]


def _reaches_edges(sketch: str, original: str) -> tuple[bool, bool]:
    """Whether the sketch, with no marker before its first line (after its last), starts (ends) with the
    original's own first (last) lines, two at least, compared with their indentation: a chunk that ends
    `      }` / `    }` / `  }` / `}` as the file does says it reaches the file's end (and spans what it
    deletes there, between its last line that says something and those brackets). A method's `  end`
    beside a class's `end` is not the same line."""
    said = [line.rstrip() for line in sketch.splitlines() if line.strip()]
    file = [line.rstrip() for line in original.splitlines() if line.strip()]

    def reaches(sketch_edge: list[str], file_edge: list[str]) -> bool:
        same = 0
        while same < min(len(sketch_edge), len(file_edge)) and sketch_edge[same] == file_edge[same]:
            same += 1
        return bool(sketch_edge) and not is_elision(sketch_edge[0]) and same >= 2

    return reaches(said, file), reaches(said[::-1], file[::-1])


def _counted(text: str) -> list[str]:
    """The lines that count, stripped."""
    return [line.strip() for line in text.splitlines() if counts(line)]


@functools.lru_cache(maxsize=1 << 16)
def counts(line: str) -> bool:
    """Whether a line says enough to be compared: `MIN_ALNUM` letters or digits. Kept for the lines seen
    last: a merge asks it of each line several times, and code repeats its lines."""
    return _SAYS.match(line) is not None


def _runs(sketch_lines: list[str]) -> list[list[str]]:
    """The sketch's runs of lines between elision markers, as written, those holding a line that counts."""
    runs: list[list[str]] = [[]]
    for line in sketch_lines:
        if is_elision(line):
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if any(map(counts, run))]


def _chunks(sketch_lines: list[str]) -> list[list[str]]:
    """The sketch's runs of lines between elision markers (lines that count only)."""
    return [[line for line in run if counts(line)] for run in _runs(sketch_lines)]


def _covered(
    original_lines: list[str],
    chunks: list[list[str]],
    blocks: list[tuple[int, int, bool] | None] | None = None,
    omitted: list[list[tuple[int, int]]] | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> tuple[set[int], tuple[int, int]]:
    """Indices of the original's lines that some chunk spans: from the first line of the original that one
    of the chunk's lines matches (in order, exactly; else the most alike, at least `FUZZY_SCORE`, between
    the places of its matched neighbours) to the last (a chunk with no line in the original spans
    nothing). A chunk without a marker before (after) it spans no more than that: a chat model leaves the
    first and last markers out, and a merge that deletes the file's start (end) it was not shown is not a
    merge. Each chunk is matched in the whole original and, where the chunks before it were found, after
    them (a line its neighbours share, `Use: "test",`, must not pull it back to an earlier place); it spans
    both; within the block it shows whole, where `blocks` (`_shown_blocks`) has one for it. With them, how
    many lines of the first chunk come before its first line found, and of the last after its last (the
    fewest of its matches). A chunk spans none of the lines `omitted` has for it (`_omitted`)."""
    index = LineIndex(original_lines)
    stretches = []  # (from, to) of the lines covered, joined at the end: a span may be most of the file
    new_before, new_after = 0, 0
    after = 0  # past the last line the chunk before matched
    for number, chunk in enumerate(chunks):
        deadline.check()
        lows = (0, after) if after else (0,)
        spans = [_span(index, chunk, low, unique, after) for low in lows for unique in (False, True)]
        found = [span for span in spans if span is not None]
        limits = blocks[number] if blocks else None
        low, high = (0, len(original_lines)) if limits is None else limits[:2]
        holes = omitted[number] if omitted else []
        for span in found:
            stretches += _without((max(span[0], low), min(span[1] + 1, high)), holes)
        if found and number == 0:
            new_before = min(span[2] for span in found)
        if found and number == len(chunks) - 1:
            new_after = min(span[3] for span in found)
        ordered = [span[1] for span in spans[-2:] if span is not None]  # found after the chunk before
        if ordered:
            after = min(ordered) + 1
    covered: set[int] = set()
    reached = 0  # the stretches, in order, cover the lines before it
    for start, stop in sorted(stretches):
        covered.update(range(max(start, reached), stop))
        reached = max(reached, stop)
    return covered, (new_before, new_after)


def _without(stretch: tuple[int, int], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the stretch `stretch` (from, to) outside the stretches `holes`."""
    parts = []
    start, stop = stretch
    for hole_start, hole_stop in sorted(holes):
        if hole_stop <= start or hole_start >= stop:
            continue
        if hole_start > start:
            parts.append((start, hole_start))
        start = max(start, hole_stop)
    return [*parts, (start, stop)] if start < stop else parts


def _span(
    index: LineIndex, chunk: list[str], low: int, unique: bool, after: int = 0
) -> tuple[int, int, int, int] | None:
    """The first and last lines of the original's lines (`index.lines`) from `low` on that `chunk`'s lines
    match (see `_covered`), and how many of the chunk's lines come before the first of its lines matched
    and after the last; with `unique`, only lines the original has once start a match (`return ret;` must
    not pull it elsewhere). Matched as difflib matches them (`line_index.matching_blocks`); a chunk with no
    line matched is looked for around `after`, where the chunks before it end."""
    size = len(index.lines) - low
    junk = (lambda line: index.count(line, low) != 1) if unique else None
    matched = {j + k: i - low + k for i, j, run in matching_blocks(index, chunk, low, junk) for k in range(run)}
    anchors = dict(matched)  # position in the chunk: line of the original after `low`
    # A changed line stands where the most alike line is, between its neighbours' places (up to
    # `FUZZY_REACH` lines from the one neighbour of a line outside them). Those between the first and last
    # lines matched stand between them, and so change nothing of the span: only the lines outside them are
    # looked for.
    first, last = (min(matched), max(matched)) if matched else (len(chunk), -1)
    for position in [*range(min(first, len(chunk))), *range(max(last + 1, first), len(chunk))]:
        if not matched:  # around where the chunks before it end
            start, stop = max(0, after - low - FUZZY_REACH), min(size, max(0, after - low) + FUZZY_REACH)
        elif position < first:
            start, stop = max(0, matched[first] - FUZZY_REACH), matched[first]
        else:
            start, stop = matched[last] + 1, min(size, matched[last] + 1 + FUZZY_REACH)
        lines = index.lines[low + start : low + stop]
        found = process.extractOne(chunk[position], lines, scorer=fuzz.ratio, score_cutoff=FUZZY_SCORE)
        if found is not None:
            anchors[position] = start + found[2]
    if not anchors:
        return None
    first, last = min(anchors.values()), max(anchors.values())
    return low + first, low + last, min(anchors), len(chunk) - 1 - max(anchors)
