"""The deterministic merge of an edit sketch: each chunk put in place by lines it shares with the original.

A sketch's *chunks* are its runs of lines between elision markers (`merge_checks.is_elision`). They are
placed in order, each after the one before, each replacing a span of the original:

1. *Anchors*: the chunk's lines that say something (`merge_checks.counts`: a few letters or digits) and
   occur once in the original after the chunk before, grown into runs of equal lines (compared stripped,
   so a re-indented chunk still matches; not over a line the chunk itself has twice, which may be the
   copy that closes new code or the start of new code shaped like the context before it, unless the
   run reaches the chunk's end). `def total(items):` can anchor, `return this;` cannot.
2. *Which anchors*: those that fit together (in order in both, and what lies between two of them in the
   chunk can stand where the original has what lies between them: as many brackets opened and closed, not
   much more code replaced than shown), and, since new code may repeat a unique line of old code, each
   anchor alone too; the two holding the chunk's first and last lines (its context), whatever the
   brackets between them (a template's `{{end}}}`) and over up to a screenful of code deleted there; and
   a chunk that ends the file, at each place where the original has its first lines, replacing not much
   more than it holds (likewise one that starts it). Each choice gives a placement; of those that cover
   the anchors holding the chunk's first and last lines (its context) and, if any can, its runs of two
   lines or more (new code written beside a near copy of old code repeats them), the one that loses the
   fewest of the original's lines (lines that say something and that the chunk lacks) is taken.
3. *Edges*: the chunk's lines before its first anchor start where the original has the most of their
   first lines before the anchor (context it repeats: a `}` and a blank line before a new function), less
   the lines skipping there loses (not one alike to a new line of the chunk: it is changed, as `if (x) {`
   into `if (x) y;`), if the rest fits there; else its last lines may be changes of the lines just
   before the anchor (alike, `EDGE_SCORE`); else they are new, and go in before the anchor if they close
   what they open and do not land inside a deeper block. Likewise after the last anchor. A chunk
   with no marker before it starts the file, one with no marker after it ends it; one that is a changed
   line alone (a new signature) goes where the one line alike to it is.
4. *Repeated blocks*: a chunk none of whose lines the original has once is placed in each stretch around
   a place of its rarest line where it changes something; the place after which the chunks that follow
   can still be placed is taken; if several can, the one whose merge changes clearly fewer characters
   (`CLEARLY_LESS`), else none (`_places`, `_placed`). Failing that, a chunk whose first and last lines
   (its context) the original has several times each goes between each place of its first line and
   the nearest of its last after it.
5. Lines the chunk repeats keep the original's own text (a sketch drops trailing spaces), but for a line
   trimmed beside a line the chunk changes.

A chunk that cannot be placed, a merge that has a block twice in a row where neither the original nor
the sketch has (a deletion the sketch shows like a change), or a merge that `merge_checks` refuses,
leaves the merge *unresolved* (`SketchMerge.unresolved` says why): the model writes the answer then, with
the partial merge as the copy drafter's draft. Measured on sketches of real edits (see docs/benchmarks.md, "Edit
sketches"). Wrong merges seen while tuning: a chunk whose lines are, verbatim, another place of the file
(a Go template holding the same imports) goes there; a new test whose lines (unique ones among them)
repeat an old test's far above chains onto them and replaces what lies between (guzzle's XML visitor
test); a deletion longer than the chunk shows (two `--no-x` options replaced by one `--x`) keeps the
rest.

>>> original = "def f():\\n    return 1\\n\\n\\ndef g():\\n    return 2\\n"
>>> sketch = "# ... existing code ...\\ndef g():\\n    return 3\\n"
>>> merge_sketch(original, sketch).text
'def f():\\n    return 1\\n\\n\\ndef g():\\n    return 3\\n'
"""

from __future__ import annotations

import difflib
import functools
import re
from collections import Counter
from dataclasses import dataclass

from rapidfuzz import fuzz
from rapidfuzz.distance import Indel

from specedit.engine.merge_checks import check_merge, counts, is_elision
from specedit.engine.patches import SketchFormat, apply_patch, detect, parse_patch

# rapidfuzz's ratio (0-100) from which a chunk's line next to an anchor is taken for a change of the
# original's line there (it replaces it) rather than a new one (it goes in beside it). Chosen on the
# continue_lazy fixtures, sketches of git_history edits and hand-written ones (2026-11): `return round(s,
# 2)` for `return s` scores 62, `s += item.price * item.count` for `s += item.price` 70, a changed import
# `from x import A, B` for `from x import A` 78; a new method's first line against the one it would
# replace ~50. 50 and 55 let one wrong merge through on continue_lazy; 60 to 70 merged the same sketches
# of real edits, and only 60 all the hand-written ones.
EDGE_SCORE = 60
# Lines of the original (that say something) a chunk may replace between two anchors, or between its edge
# and an anchor: twice its own there, and some more (a deletion). A coincidental anchor in new code would
# replace far more (68 lines for 18 in a requests test file); a longer deletion is left to the model.
REPLACED_PER_LINE = 2
REPLACED_SLACK = 16
# The same between a chunk's first and last lines when both are once in the original (its context): a
# deletion the sketch shows only by its context's lines (a parser's 50 lines replaced by a signature's)
# goes through up to a screenful; longer, a coincidence of new code's last line is likelier (fmt: 190
# lines lost). Chosen on the sets of every size but heldout5: 40 to 100 merged the same.
CONTEXT_SLACK = 64
# A chunk whose every line the original has more than once is tried at each place of its rarest line, if
# it has at most this many (a block a file repeats: the same lines in two lists, an import block a template
# holds too).
MAX_REPEATS = 8
# Of two places for a chunk after which as many chunks are placed, the one whose merge changes at most
# this share of the characters the other's changes is taken (the chunk is clearly more like what stands
# there); closer, it is a doubt. On the sketch sets of every size (1,119 sketches) and HumanEvalFix's
# (812, Rust's left out): 0.4 settles 12 of 31 such doubts, 10 rightly; 0.5 settles 15, 12 rightly; taking
# the least change whatever the margin settles 23, 15 rightly.
CLEARLY_LESS = 0.4
# Lines that say something, each a change of one of the `EDGE_LINES` lines at a sketch's edge, that a
# sketch without its first or last marker may replace at the file's start or end (`_edge_reading`).
FEW_LINES = 3
EDGE_LINES = 3
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class SketchMerge:
    """The original with every chunk of the sketch that could be placed in place; `unresolved` says, per
    chunk left out or doubtful, why (empty: the merge is the answer)."""

    text: str
    unresolved: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        return not self.unresolved


@dataclass(frozen=True)
class _Chunk:
    lines: list[str]  # with their newlines, blank lines at either end left out
    at_start: bool  # no marker before it: it starts the file
    at_end: bool  # no marker after it: it ends the file


@dataclass(frozen=True)
class _Anchor:
    original: int  # where the run starts in the original (a line index)
    chunk: int  # where it starts in the chunk
    size: int
    said: int  # lines that say something in the run, grown over lines the chunk has twice too


@dataclass(frozen=True)
class _Placement:
    start: int  # the chunk replaces the original's lines[start:stop]
    stop: int
    lines: list[str]


@dataclass(frozen=True)
class _Outcome:
    """How the chunks from one on fare: per chunk its placement, or why it has none or is doubtful; with
    the number of those, to compare one placement's consequences with another's."""

    steps: tuple[tuple[_Placement | None, str], ...] = ()  # (placement, "" or why it is doubtful or missing)
    unplaced: int = 0
    changed: int = 0  # characters the placements change

    def after(self, placement: _Placement | None, why: str = "", changed: int = 0) -> _Outcome:
        unplaced = self.unplaced + (placement is None or bool(why))
        return _Outcome(((placement, why), *self.steps), unplaced, self.changed + changed)


@functools.lru_cache(maxsize=8)
def merge_sketch(original: str, sketch: str, sketch_format: SketchFormat = "auto") -> SketchMerge:
    """`sketch` merged into `original` where its chunks say where they go (see the module docstring); in
    the original's line endings. Kept for the last few requests: the session asks before choosing the
    model, the model's prompt asks again for its draft, and the command line before loading anything.
    A sketch written as a patch (a unified diff, SEARCH/REPLACE blocks, a V4A patch: `patches`, found in
    its text with `auto`) is applied by its hunks' lines instead, and checked the same way.

    A sketch with markers that has none at its start (or end) is read two ways there: as eliding what
    comes before its first chunk (after its last), and as starting (ending) the file there. A chat model
    often leaves out the first and last markers ("here is the updated method:"), and the second reading
    then deletes every line it was not shown; so the first is the merge, and the second only where the
    first cannot place the chunks (the end alone, the start alone, then both; the checks still refuse a
    merge that deletes code the sketch does not show), or where the sketch's edge is a change of the
    file's, or a doubt between them (`_edge_reading`)."""
    crlf = "\r\n" in original
    original = original.replace("\r\n", "\n")
    sketch = sketch.replace("\r\n", "\n")
    written_as = detect(sketch, original) if sketch_format == "auto" else sketch_format
    if written_as != "lazy":
        text, unresolved = apply_patch(original, parse_patch(sketch, written_as))
        if not unresolved and not (check := check_merge(original, sketch, text, written_as)).ok:
            unresolved = (f"the merge fails its checks: {check.describe()}",)
        return SketchMerge(text.replace("\n", "\r\n") if crlf else text, unresolved)
    lines = _lines(original)
    sketch_lines = _lines(sketch)
    chunks = _chunks(sketch_lines)
    said = [line for line in sketch_lines if line.strip()]
    marked = any(is_elision(line) for line in said)
    open_start, open_end = marked and not is_elision(said[0]), marked and not is_elision(said[-1])

    @functools.cache
    def read(edges: tuple[bool, bool]) -> SketchMerge:
        """The merge with the sketch's first chunk starting the file (`edges[0]`), its last ending it."""
        return _reading(original, sketch, lines, sketch_lines, _at_edges(chunks, *edges))

    edges = (False, False)
    if not read(edges).resolved:
        tries = [(False, open_end), (open_start, False), (open_start, open_end)]
        edges = next((tried for tried in tries if any(tried) and read(tried).resolved), edges)
    merge = read(edges)
    for side, other in (("start", (True, edges[1])), ("end", (edges[0], True))):
        if not (open_start if side == "start" else open_end) or other == edges or not merge.resolved:
            continue
        if read(other).resolved and read(other).text != merge.text:
            take, doubt = _edge_reading(side, chunks, original, merge.text, read(other).text)
            if take:
                edges, merge = other, read(other)
            elif doubt:
                merge = SketchMerge(merge.text, (doubt,))
    return SketchMerge(merge.text.replace("\n", "\r\n") if crlf else merge.text, merge.unresolved)


def _reading(
    original: str, sketch: str, lines: list[str], sketch_lines: list[str], chunks: list[_Chunk]
) -> SketchMerge:
    """The merge of `chunks` into the original's `lines` (newlines only), checked."""
    keys = [line.strip() for line in lines]  # compared for anchors and likeness
    raw = [line.rstrip() for line in lines]  # compared with their indentation, at a chunk's edges
    merged: list[str] = []
    unresolved: list[str] = []
    cursor = 0  # the original's lines before it are placed (copied or replaced)
    for place, why in _placed(chunks, lines, keys, raw).steps:
        if why:
            unresolved.append(why)
        if place:
            merged += lines[cursor : place.start] + place.lines
            cursor = place.stop
    said = [line for line in sketch_lines if line.strip()]
    open_end = bool(said) and not is_elision(said[-1]) and any(is_elision(line) for line in said)
    if chunks and (chunks[-1].at_end or open_end) and not "".join(lines[cursor:]).strip():
        # The chunk ending the file ends it with the blank lines the sketch ends with, if it shows any (a
        # copied answer loses them), else the original's.
        merged += ["\n"] * (_blank_end(sketch_lines) or _blank_end(lines))
        cursor = len(lines)
    merged += lines[cursor:]
    text = "".join(merged)
    if not original.endswith("\n"):
        text = text.removesuffix("\n")
    if not unresolved and (doubled := _doubled_anew(merged, lines, sketch_lines)):
        unresolved.append(f"the merge has {doubled[0]!r} and the lines after it twice in a row")
    if not unresolved:
        check = check_merge(original, sketch, text, "lazy")
        if not check.ok:
            unresolved.append(f"the merge fails its checks: {check.describe()}")
    return SketchMerge(text, tuple(unresolved))


def _at_edges(chunks: list[_Chunk], starts: bool, ends: bool) -> list[_Chunk]:
    """The chunks with the first one starting the file (`starts`), the last one ending it (`ends`)."""
    if not chunks:
        return chunks
    edged = [*chunks]
    edged[0] = _Chunk(edged[0].lines, starts, edged[0].at_end)
    edged[-1] = _Chunk(edged[-1].lines, edged[-1].at_start, ends)
    return edged


def _edge_reading(side: str, chunks: list[_Chunk], original: str, elided: str, edged: str) -> tuple[bool, str]:
    """Of two readings of a sketch without its first (`side` "start") or last marker that both place it
    (`merge_sketch`), whether the one where the sketch's edge is the file's is taken, and else why they
    leave a doubt, if they do.

    The edged one is taken where what it drops (and the elided one keeps) is one to `FEW_LINES` lines that
    say something, each one a change of a line at that edge of the sketch (`return values` at the file's
    end, where the sketch ends `return [x for x in values if ...]`), and where it keeps every line that
    says something that the other keeps, and more (the other put the chunk in place of a block like it
    earlier in the file); where they differ only in lines that say nothing (brackets, blank lines), the
    one that changes the original less (a class's closing `}` kept after the method a sketch ends with;
    `x = 1` not written twice when the sketch starts with it). Where each keeps lines the other drops and
    the sketch's lines at that edge are the file's lines at its edge (`_same_edge`), the sketch says
    where it is: the edged one. Else, where the sketch's line at that edge is the original's (found
    inside the file), what comes before (after) it is kept: the elided one. Where that line is new code,
    nothing in the sketch says whether it goes beside the lines there or replaces them: a doubt."""
    kept = Counter(line.strip() for line in elided.splitlines() if counts(line))
    kept -= Counter(line.strip() for line in edged.splitlines() if counts(line))
    keys = {line.strip() for line in original.splitlines()}
    said = [line.strip() for chunk in chunks for line in chunk.lines if counts(line)]
    edge = said[:EDGE_LINES] if side == "start" else said[-EDGE_LINES:]
    if sum(kept.values()) <= FEW_LINES and kept and all(any(_changed_into(old, new) for new in edge) for old in kept):
        return True, ""
    lost = Counter(line.strip() for line in edged.splitlines() if counts(line))
    lost -= Counter(line.strip() for line in elided.splitlines() if counts(line))
    if not kept:  # the edged one keeps all the other does: it is taken if it keeps more, else the least change
        return bool(lost) or Indel.distance(original, edged) < Indel.distance(original, elided), ""
    if _beside_changes(kept, said, keys) or (lost and _same_edge(side, chunks, original)):
        return True, ""
    if not said or edge[0 if side == "start" else -1] in keys:
        return False, ""
    new = edge[0 if side == "start" else -1]
    return False, (
        f"the sketch has no marker at its {side}, and {new!r} is new code: whether it goes beside the "
        f"{sum(kept.values())} lines of the original there or replaces them, nothing in it says"
    )


def _beside_changes(kept: Counter[str], said: list[str], keys: set[str]) -> bool:
    """Whether the lines one reading keeps and the other drops (`kept`) are the old lines of the sketch's
    changed lines, each of a different new line of the sketch, or lines the sketch itself holds: that
    reading put the sketch's lines beside those they change (three `HTTPError(..., self.content)` kept
    below their `self.reason` rewrites)."""
    changes = [line for line in said if line not in keys]
    old = [line for line in kept.elements() if line not in said]
    for line in old:
        alike = next((number for number, change in enumerate(changes) if _alike(change, line)), None)
        if alike is None:
            return False
        del changes[alike]
    return bool(old)


def _same_edge(side: str, chunks: list[_Chunk], original: str) -> bool:
    """Whether the sketch's lines at its start (`side`) or end are the original's first (last) lines: as
    many of them as hold two lines that say something, compared stripped, blank lines left out."""
    said = [line.strip() for line in (chunks[0] if side == "start" else chunks[-1]).lines if line.strip()]
    file = [line.strip() for line in original.splitlines() if line.strip()]
    if side == "end":
        said, file = said[::-1], file[::-1]
    same = _common_length(said, file)
    return sum(map(counts, said[:same])) >= 2


def _changed_into(old: str, new: str) -> bool:
    """Whether the original's line `old` may have become the sketch's `new`: alike, or its words all in it."""
    words = set(_WORD.findall(old))
    return old == new or _alike(new, old) or (len(words) >= 2 and words <= set(_WORD.findall(new)))


def _placed(chunks: list[_Chunk], lines: list[str], keys: list[str], raw: list[str]) -> _Outcome:
    """Where each chunk goes, after the one before: where a chunk may go in several places (`_places`), the
    one after which the fewest chunks stay unplaced (a tie is a doubt: which of two equal blocks a sketch
    meant: what each would change did not tell it reliably). Worked out from the last chunk back, for the
    states (chunk, cursor) that the first chunk's choices reach: a stack, not recursion, since a sketch may
    have many chunks."""
    outcomes: dict[tuple[int, int], _Outcome] = {}
    places: dict[tuple[int, int], list[_Placement] | str] = {}
    stack = [(0, 0)]
    while stack:
        number, cursor = state = stack[-1]
        if state in outcomes:  # reached two ways
            stack.pop()
            continue
        if number == len(chunks):
            outcomes[state] = _Outcome()
            continue
        chunk = chunks[number]
        if state not in places:
            places[state] = _places(lines, keys, raw, cursor, chunk)
        found = places[state]
        nexts = [(number + 1, cursor)] if isinstance(found, str) else [(number + 1, place.stop) for place in found]
        if missing := [after for after in nexts if after not in outcomes]:
            stack += missing
            continue
        stack.pop()
        if isinstance(found, str):
            outcomes[state] = outcomes[nexts[0]].after(None, f"{found} (the chunk starting {chunk.lines[0].strip()!r})")
            continue
        # Of the places, the one after which the fewest chunks stay unplaced, then the one whose merge
        # changes clearly fewer characters; two alike are a doubt.
        options = sorted(
            ((outcomes[(number + 1, place.stop)], _changed(lines, place), place) for place in found),
            key=lambda option: (option[0].unplaced, option[0].changed + option[1]),
        )
        (following, changed, chosen), *others = options  # `following`: how the chunks after it fare
        tie = bool(others) and others[0][0].unplaced == following.unplaced
        if tie:
            runner_up, runner_up_changed, _ = others[0]
            tie = following.changed + changed > CLEARLY_LESS * (runner_up.changed + runner_up_changed)
        why = f"{chunk.lines[0].strip()!r} could go in more than one place" if tie else ""
        outcomes[state] = following.after(chosen, why, changed)
    return outcomes[(0, 0)]


def _changed(lines: list[str], place: _Placement) -> int:
    """How many characters `place` changes (inserted and deleted)."""
    return Indel.distance("".join(lines[place.start : place.stop]), "".join(place.lines))


def _doubled_anew(merged: list[str], original: list[str], sketch: list[str]) -> tuple[str, ...]:
    """A block the merge has twice in a row where neither the original nor the sketch has it so (a
    placement that put a changed block beside the one it changes, or a deletion shown like a change);
    empty if none."""
    doubled = _doubled(merged)
    if doubled:
        doubled -= _doubled(original) | _doubled(sketch)
    return min(doubled, default=())


def _doubled(lines: list[str], longest: int = 24) -> set[tuple[str, ...]]:
    """The blocks of two lines or more, saying something, that `lines` has twice in a row (compared
    stripped), up to `longest` lines."""
    keys = [line.strip() for line in lines]
    found = set()
    for size in range(2, longest + 1):
        run = 0  # how many lines up to here equal the line `size` after them
        for start in range(len(keys) - size):
            run = run + 1 if keys[start] == keys[start + size] else 0
            block = keys[start - size + 1 : start + 1]
            if run >= size and sum(map(counts, block)) >= 2:
                found.add(tuple(block))
    return found


def _blank_end(lines: list[str]) -> int:
    """How many blank lines `lines` ends with."""
    return next((number for number, line in enumerate(reversed(lines)) if line.strip()), len(lines))


def _lines(text: str) -> list[str]:
    """The lines of `text`, each ending in a newline (the last one too)."""
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]


def _chunks(sketch_lines: list[str]) -> list[_Chunk]:
    runs: list[list[str]] = [[]]
    for line in sketch_lines:
        if is_elision(line):
            runs.append([])
        else:
            runs[-1].append(line)
    chunks = []
    for run in runs:
        while run and not run[0].strip():
            run.pop(0)
        while run and not run[-1].strip():
            run.pop()
        if run:  # a chunk without a marker before (after) it is read both ways: see `merge_sketch`
            chunks.append(_Chunk(run, False, False))
    return chunks


def _places(lines: list[str], keys: list[str], raw: list[str], cursor: int, chunk: _Chunk) -> list[_Placement] | str:
    """Where `chunk` may go after `cursor` (`_place`); or why nowhere.

    A chunk whose lines all occur more than once (a block that a file repeats) is placed in each stretch
    of the original that holds one of the places of its rarest line (up to `MAX_REPEATS`), where it
    changes something (a chunk is in a sketch for a change: one that changes nothing at any of them may
    mean a deletion its lines do not show, as of one of two equal tests): the chunks after it then choose,
    or it stays unresolved (`merge_sketch`). Failing that, it is placed between each pair of places of its
    context lines (`_between_context`) where it does not keep old code it rewrites (`_repeats_old_code`).
    """
    placed = _place(lines, keys, raw, cursor, chunk)
    if not isinstance(placed, str):
        return [placed]
    found = _where(keys, cursor, {line.strip() for line in chunk.lines if counts(line)})
    repeats = min(found.values(), key=len, default=[])
    places = []
    if 1 < len(repeats) <= MAX_REPEATS:  # else it has anchors (and did not fit on them), or too many places
        for number, at in enumerate(repeats):
            low = repeats[number - 1] + 1 if number else cursor
            high = repeats[number + 1] if number + 1 < len(repeats) else len(lines)
            if (chunk.at_start and low > cursor) or (chunk.at_end and high < len(lines)):
                continue
            place = _place(lines[:high], keys[:high], raw[:high], low, chunk)
            if not isinstance(place, str) and place.start <= at < place.stop:
                places.append(place)
    changing = [place for place in places if place.lines != lines[place.start : place.stop]]
    if not changing:
        changing = [
            place
            for place in _between_context(lines, keys, raw, chunk, found)
            if place.lines != lines[place.start : place.stop] and not _repeats_old_code(keys, place)
        ]
    return changing or placed


def _between_context(
    lines: list[str], keys: list[str], raw: list[str], chunk: _Chunk, found: dict[str, list[int]]
) -> list[_Placement]:
    """The placements of a chunk by its first and last lines that say something (its context), for when
    the original has each several times: between each place of its first line and the nearest place of
    its last line after it (with no place of the first line between them), where the two are once (gson:
    a new test after asserts two tests share, before a comment three share). Up to `MAX_REPEATS`. `found`:
    where each of the chunk's lines that say something is in the original after the cursor (`_where`)."""
    said = [line.strip() for line in chunk.lines if counts(line)]
    if len(said) < 2 or chunk.at_start or chunk.at_end or said[0] == said[-1]:
        return []
    firsts, lasts = found.get(said[0], []), found.get(said[-1], [])
    places = []
    for number, first in enumerate(firsts):
        last = next((at for at in lasts if at > first), None)
        if last is None:
            break
        if number + 1 < len(firsts) and firsts[number + 1] < last:
            continue
        place = _place(lines[: last + 1], keys[: last + 1], raw[: last + 1], first, chunk)
        if not isinstance(place, str) and place.start <= first and last < place.stop:
            places.append(place)
    return places if len(places) <= MAX_REPEATS else []


def _repeats_old_code(keys: list[str], place: _Placement, run: int = 3) -> bool:
    """Whether the lines `place` adds hold `run` lines in a row, saying something, that the original has
    in a row outside the lines it replaces: a placement between the wrong pair of context lines (a nested
    `try:` and the `except` of the outer one) keeps the old code the chunk rewrites."""
    old = set(keys[place.start : place.stop])
    new = [line.strip() for line in place.lines if counts(line) and line.strip() not in old]
    said = [key if counts(key) else None for key in keys]
    outside = [*said[: place.start], None, *said[place.stop :]]
    runs = {tuple(outside[k : k + run]) for k in range(len(outside) - run + 1) if None not in outside[k : k + run]}
    return any(tuple(new[k : k + run]) in runs for k in range(len(new) - run + 1))


def _place(lines: list[str], keys: list[str], raw: list[str], cursor: int, chunk: _Chunk) -> _Placement | str:
    """Where `chunk` goes: it replaces `lines[start:stop]` with its lines (re-indented like the original's
    where all its anchors are shifted alike); or why that cannot be said.

    The anchors that fit together best are tried, and each anchor alone (a unique line of new code may
    fit with the real ones), and those by the context of a chunk that starts or ends the file
    (`_by_context`); of the placements that hold and cover the anchors they must (`_required`: the
    context, and the runs if any can; two readings of a context that disagrees are a doubt), the one that
    loses the fewest lines of the original (lines that say something, and that the chunk does not have) is
    taken, and of those the one that replaces the fewest.
    """
    chunk_keys = [line.strip() for line in chunk.lines]
    anchors = _anchors(keys, cursor, chunk_keys)
    chains = [_best_chain(keys, chunk_keys, anchors), *([a] for a in anchors)] if anchors else [[]]
    chains += _context_chain(keys, chunk_keys, anchors)
    placements = [_place_on(chain, lines, raw, cursor, chunk) for chain in chains] + _by_context(
        lines, raw, cursor, chunk
    )
    placed = [placement for placement in placements if not isinstance(placement, str)]

    def covers(placement: tuple[int, int, list[str]], required: list[_Anchor]) -> bool:
        return all(placement[0] <= a.original < placement[1] for a in required)

    readings = []  # what each reading of the context holds
    for edges, runs in _required(anchors, chunk_keys, chunk):
        with_edges = [placement for placement in placed if covers(placement, edges)]
        covering = [placement for placement in with_edges if covers(placement, runs)]
        readings.append(covering or (with_edges if edges else []))  # new code may repeat old code
    alternatives = [placements for placements in readings[1:] if placements]
    if not readings[0] and len(alternatives) > 1:
        return f"{chunk.lines[0].strip()!r} could go in more than one place"
    held = readings[0] or (alternatives[0] if alternatives else [])
    if not held:
        reasons = [placement for placement in placements if isinstance(placement, str)]
        return reasons[0] if reasons else "its lines in the original do not fit together"
    kept = set(chunk_keys)

    def lost(placement: tuple[int, int, list[str]]) -> int:
        return sum(counts(key) and key not in kept for key in keys[placement[0] : placement[1]])

    start, stop, new_lines = min(held, key=lambda placement: (lost(placement), placement[1] - placement[0]))
    return _Placement(start, stop, _keeping_unchanged(lines[start:stop], new_lines))


def _by_context(lines: list[str], raw: list[str], cursor: int, chunk: _Chunk) -> list[tuple[int, int, list[str]]]:
    """The placements of a chunk that ends the file (no marker after it) at each place where the original
    has its first lines (its context: one at least that says something), replacing all after; of a chunk
    that starts the file, at each place where the original has its last lines, replacing all before. Its
    anchors may be new code repeating old code (a test appended after a near copy of it)."""
    new_raw = [line.rstrip() for line in chunk.lines]
    if chunk.at_start == chunk.at_end:
        return []
    # Only where the first line (the last, backwards) is the same: the original is not copied for every line.
    if chunk.at_end:
        placements = [
            (place, len(lines), chunk.lines)
            for place in range(cursor, len(lines))
            if raw[place] == new_raw[0] and _says(new_raw, raw[place:])
        ]
    else:
        placements = [
            (cursor, place, chunk.lines)
            for place in range(cursor + 1, len(lines) + 1)
            if raw[place - 1] == new_raw[-1] and _says(new_raw[::-1], raw[place - 1 :: -1])
        ]
    # Not over much more code than the chunk holds (new code beside a near copy repeats its first lines).
    return [placement for placement in placements if _replaces_little(raw[placement[0] : placement[1]], new_raw)]


def _says(new: list[str], old: list[str]) -> bool:
    """Whether the first lines `new` and `old` have in common hold one that says something."""
    return any(counts(line) for line in new[: _common_length(new, old)])


Reading = tuple[list["_Anchor"], list["_Anchor"]]  # the context anchors a placement must cover, and the runs


def _required(anchors: list[_Anchor], chunk_keys: list[str], chunk: _Chunk) -> list[Reading]:
    """The anchors a placement must cover: those holding the chunk's first or last line that says something
    (where a sketch repeats its context; not the end a file's start or end fixes); and, if it can, runs of
    two such lines or more in the same order as those (new code may repeat a line of old code, seldom two
    together; a placement that leaves them out, beside the chunk's copy, doubles them; but new code written
    beside a near copy of it does repeat them: a placement that covers the context anchors need not cover
    the runs, when none can). Where the two context anchors disagree (new code at one end repeating old
    code elsewhere), the first reading has neither and every run; then each alone, with the runs in order
    with it, to be taken where the first reading holds nothing and exactly one of them holds something."""
    said = [n for n, key in enumerate(chunk_keys) if counts(key)]
    edges = [
        a
        for a in anchors
        if (a.chunk <= said[0] and not chunk.at_start) or (a.chunk + a.size > said[-1] and not chunk.at_end)
    ]
    long = [a for a in anchors if a.said >= 2]
    if all(_in_order(a, b) for a in edges for b in edges):
        return [(edges, [a for a in long if all(_in_order(a, e) for e in edges)])]
    return [([], long), *(([edge], [a for a in long if _in_order(a, edge)]) for edge in edges)]


def _in_order(a: _Anchor, b: _Anchor) -> bool:
    """Whether two anchors stand in the same order in the chunk and in the original (or are one)."""
    return a == b or (a.chunk < b.chunk) == (a.original < b.original)


def _keeping_unchanged(old: list[str], new: list[str]) -> list[str]:
    """`new`, with the original's own text for the lines it repeats: a sketch writes blank lines without
    their spaces, and a merge changes no line it did not mean to (a line indented anew is changed). But a
    line that the sketch gives without the original's trailing spaces, right beside a line it changes, is
    the sketch's: an edit trims the lines it touches (` * ` in a doc comment it rewrites)."""
    matcher = difflib.SequenceMatcher(
        None, [line.rstrip() for line in old], [line.rstrip() for line in new], autojunk=False
    )
    opcodes = matcher.get_opcodes()
    merged: list[str] = []
    for number, (tag, old_start, old_stop, new_start, new_stop) in enumerate(opcodes):
        if tag != "equal":
            merged += new[new_start:new_stop]
            continue
        kept = old[old_start:old_stop]
        if number > 0 and kept[0].strip():  # the line after a change
            kept[0] = new[new_start]
        if number < len(opcodes) - 1 and kept[-1].strip():  # the line before one
            kept[-1] = new[new_stop - 1]
        merged += kept
    return merged


def _place_on(
    chain: list[_Anchor], lines: list[str], raw: list[str], cursor: int, chunk: _Chunk
) -> tuple[int, int, list[str]] | str:
    """The placement of `chunk` on the anchors `chain` (see `_place`)."""
    new_lines = _reindented(chunk.lines, chain, lines)
    new_raw = [line.rstrip() for line in new_lines]
    if chain:
        start, stop = chain[0].original, chain[-1].original + chain[-1].size
        lead, tail = new_raw[: chain[0].chunk], new_raw[chain[-1].chunk + chain[-1].size :]
    elif chunk.at_start:  # it begins as the file does, if at all (`x = 1` says too little to anchor)
        same = _common_length(new_raw, raw[cursor:])
        start, stop, lead, tail = cursor, cursor + same, [], new_raw[same:]
    elif chunk.at_end:
        same = _common_length(new_raw[::-1], raw[::-1])
        start, stop, lead, tail = len(lines) - same, len(lines), new_raw[: len(new_raw) - same], []
    else:  # one changed line alone (a new signature): where the one line alike to it is
        said = [line.strip() for line in new_raw if counts(line)]
        alike = [index for index in range(cursor, len(lines)) if len(said) == 1 and _alike(said[0], raw[index].strip())]
        if len(alike) != 1:  # (a new function `sub` beside `add` is no change of `add`)
            return "none of its lines is in the original once"
        start = stop = alike[0]
        lead, tail = [], new_raw
    if chunk.at_start:
        start = cursor
    else:
        start, unplaced = _edge(lead, raw, cursor, start)
        if unplaced and not _insertable(unplaced, raw, start, cursor, start):
            return f"{unplaced[0].strip()!r} could go in more than one place"
    if chunk.at_end:
        stop = len(lines)
    else:
        # The chunk's end, read backwards, is placed like its start.
        back, unplaced = _edge(tail[::-1], raw[::-1], 0, len(lines) - stop)
        stop = len(lines) - back
        if unplaced and not _insertable(unplaced[::-1], raw, stop, stop, len(lines)):
            return f"{unplaced[0].strip()!r} could go in more than one place"
    return start, stop, new_lines


def _where(keys: list[str], cursor: int, wanted: set[str]) -> dict[str, list[int]]:
    """Where each of the `wanted` lines is in the original after `cursor` (line indices, in order)."""
    places: dict[str, list[int]] = {}
    for index in range(cursor, len(keys)):
        if keys[index] in wanted:
            places.setdefault(keys[index], []).append(index)
    return places


def _anchors(keys: list[str], cursor: int, chunk_keys: list[str]) -> list[_Anchor]:
    """The chunk's anchors: its lines that say something and occur once in the original after `cursor`,
    grown into runs of equal lines, in the chunk's order."""
    places = _where(keys, cursor, {key for key in chunk_keys if counts(key)})
    # A line the chunk has twice (`done();` closing the new test and the old one after it) says nothing of
    # which of its places the original's line is: a run does not grow over it.
    twice = {key for key, number in Counter(chunk_keys).items() if number > 1 and counts(key)}
    anchors: list[_Anchor] = []
    for position, key in enumerate(chunk_keys):
        found = places.get(key, [])
        if not counts(key) or len(found) != 1:
            continue
        a, b = position, found[0]
        if anchors and anchors[-1].original - anchors[-1].chunk == b - a and a < anchors[-1].chunk + anchors[-1].size:
            continue  # inside the run before
        while a > 0 and b > cursor and chunk_keys[a - 1] == keys[b - 1] and chunk_keys[a - 1] not in twice:
            a, b = a - 1, b - 1
        end = position + 1
        while end < len(chunk_keys) and b + end - a < len(keys) and chunk_keys[end] == keys[b + end - a]:
            end += 1
        reach = end  # as far as the lines agree: a run of two lines or more, if they say something
        if end < len(chunk_keys):  # nor on over one, short of the chunk's end (its context): new code may
            end = next((k for k in range(position + 1, end) if chunk_keys[k] in twice), end)  # start there
        # A run ends in lines that say something: whether a `}` or a blank line next to it is the
        # original's or new code's is for the edges to find out (`_edge`).
        while not counts(chunk_keys[a]):
            a, b = a + 1, b + 1
        while not counts(chunk_keys[end - 1]):
            end -= 1
        anchors.append(_Anchor(b, a, end - a, sum(map(counts, chunk_keys[a:reach]))))
    return anchors


def _best_chain(keys: list[str], chunk_keys: list[str], anchors: list[_Anchor]) -> list[_Anchor]:
    """The anchors that fit together: in order in both, with what lies between two of them in the chunk
    fitting where the original has what lies between them (`_fits`), saying the most lines, and rather
    ones at the chunk's edges (where a sketch repeats its context). A line of new code that happens to be
    unique in the original (`s = requests.session()`) is left out this way."""
    said = [n for n, key in enumerate(chunk_keys) if counts(key)]

    def worth(anchor: _Anchor) -> float:
        lines = chunk_keys[anchor.chunk : anchor.chunk + anchor.size]
        edges = (anchor.chunk <= said[0]) + (anchor.chunk + anchor.size > said[-1])
        return float(sum(map(counts, lines)) + 0.5 * edges)

    best: list[tuple[float, list[_Anchor]]] = []
    for anchor in anchors:
        options = [
            (score, chain)
            for score, chain in best
            if chain[-1].original + chain[-1].size <= anchor.original
            and chain[-1].chunk + chain[-1].size <= anchor.chunk
            and _fits(
                chunk_keys[chain[-1].chunk + chain[-1].size : anchor.chunk],
                keys[chain[-1].original + chain[-1].size : anchor.original],
            )
        ]
        score, chain = max(options, key=lambda option: option[0], default=(0.0, []))
        best.append((score + worth(anchor), [*chain, anchor]))
    return max(best, key=lambda option: option[0])[1]


def _context_chain(keys: list[str], chunk_keys: list[str], anchors: list[_Anchor]) -> list[list[_Anchor]]:
    """The anchors holding the chunk's first and last lines that say something (the context a sketch
    repeats around a change), when they stand in order and what lies between them is not much more code
    than the chunk shows (`CONTEXT_SLACK`): whatever its brackets (a template or a string may open more
    than it closes)."""
    said = [n for n, key in enumerate(chunk_keys) if counts(key)]
    if len(anchors) < 2 or anchors[0].chunk > said[0] or anchors[-1].chunk + anchors[-1].size <= said[-1]:
        return []
    first, last = anchors[0], anchors[-1]
    if not first.original + first.size <= last.original:
        return []
    new = chunk_keys[first.chunk + first.size : last.chunk]
    old = keys[first.original + first.size : last.original]
    return [[first, last]] if _replaces_little(old, new, CONTEXT_SLACK) else []


def _edge(edge: list[str], raw: list[str], low: int, start: int) -> tuple[int, list[str]]:
    """Where the chunk's lines before its first anchor (`edge`) begin in the original, and those of them
    that are new, to go in right before `start`.

    The edge may begin with lines of the original (context the chunk repeats: a closing `}` and a blank
    line before a new function): of the places before `start` where the chunk's lines after them fit where
    the original has its lines up to `start`, the one where the most of them are, less the lines it loses
    (lines that say something, that the chunk lacks), then the most of them, then the nearest.
    Else its last lines may be changes of the original's lines just before `start` (alike). Lines compared
    with their indentation. Used backwards for the chunk's end.
    """
    if edge:
        places = []  # (lines it repeats, place), nearest first
        for place in range(start - 1, low - 1, -1):
            if raw[place] != edge[0]:
                continue
            size = 1
            while size < len(edge) and place + size < start and raw[place + size] == edge[size]:
                size += 1
            rest, skipped = [line.strip() for line in edge[size:]], [line.strip() for line in raw[place + size : start]]
            if _fits(rest, skipped):
                lost = _lost(skipped, rest)
                places.append((size - lost, size, place))
        if places:  # the most repeated less lost, then the most repeated, then the nearest
            return max(places, key=lambda found: found[:2])[2], []
    # Changed lines: alike pairs from `start` back, over equal lines between them (blank lines, `}`).
    unplaced, placed_start = len(edge), start
    walked, at = unplaced, start
    while walked and at > low:
        new, old = edge[walked - 1].strip(), raw[at - 1].strip()
        if new != old and not _alike(new, old):
            break
        walked, at = walked - 1, at - 1
        if _alike(new, old):
            unplaced, placed_start = walked, at
    return placed_start, edge[:unplaced]


def _lost(old: list[str], new: list[str]) -> int:
    """How many of the lines `old` that say something `new` replaces without keeping them: neither among
    its lines nor changed into one (alike to one of its lines the original lacks there, each of those a
    change of one line at most)."""
    changes = [line for line in new if line not in old]
    lost = 0
    for line in old:
        if not counts(line) or line in new:
            continue
        alike = next((number for number, change in enumerate(changes) if _alike(change, line)), None)
        if alike is None:
            lost += 1
        else:
            del changes[alike]
    return lost


def _insertable(new: list[str], raw: list[str], at: int, low: int, high: int) -> bool:
    """Whether lines that nothing places can go in before `raw[at]` as new code: none of them (but bare
    brackets) is a line of the original between `low` and `high` (that would be context the chunk
    repeats, not found where it fits), they close what they open, and the line after them is not deeper
    inside a block than their first line."""
    nearby = {line.strip() for line in raw[low:high]}
    if any(_has_words(line) and line.strip() in nearby for line in new) or _balance(new) != 0:
        return False
    after = next((line for line in raw[at:] if line.strip()), "")
    first = next(line for line in new if line.strip())
    return _indent(first) >= _indent(after)


def _fits(new: list[str], old: list[str]) -> bool:
    """Whether the chunk's lines `new` can stand where the original has `old`: they open and close as many
    brackets, and do not replace much more code than they hold (a unique line of new code must not pull
    the chunk over a screenful of the original's)."""
    return _balance(new) == _balance(old) and _replaces_little(old, new)


def _replaces_little(old: list[str], new: list[str], slack: int = REPLACED_SLACK) -> bool:
    """Whether lines `new` in place of `old` replace not much more code than they hold (`REPLACED_PER_LINE`)."""
    said_new, said_old = sum(map(counts, new)), sum(map(counts, old))
    return bool(said_old <= REPLACED_PER_LINE * said_new + slack)


def _balance(lines: list[str]) -> int:
    """Brackets opened minus brackets closed (strings and comments not told apart: an estimate)."""
    text = "".join(lines)
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def _alike(new: str, old: str) -> bool:
    """Whether a chunk's line is a change of the original's `old` (it replaces it), not a new one."""
    return _has_words(new) and _has_words(old) and fuzz.ratio(new, old) >= EDGE_SCORE


def _has_words(line: str) -> bool:
    """Whether a line has a letter or digit: `x = 1` does, `});` does not (too little to anchor, enough
    to tell a changed line or a doubled one)."""
    return any(c.isalnum() for c in line)


def _common_length(a: list[str], b: list[str]) -> int:
    """How many of the first lines of `a` and `b` are equal."""
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    return same


def _reindented(chunk_lines: list[str], anchors: list[_Anchor], lines: list[str]) -> list[str]:
    """The chunk's lines, with the indentation its anchors lack in front of each, when every anchored line
    that says something lacks the same (a method shown without its class's indentation); indented with
    tabs where the original's anchored lines are and the chunk's have spaces for them (`_retabbed`)."""
    chunk_lines = _retabbed(chunk_lines, anchors, lines)
    shifts = set()
    for anchor in anchors:
        for k in range(anchor.size):
            new, old = chunk_lines[anchor.chunk + k], lines[anchor.original + k]
            if counts(new):
                new_indent = new[: len(new) - len(new.lstrip())]
                old_indent = old[: len(old) - len(old.lstrip())]
                shifts.add(old_indent[: len(old_indent) - len(new_indent)] if old_indent.endswith(new_indent) else None)
    if len(shifts) != 1 or not (shift := shifts.pop()):
        return chunk_lines
    return [shift + line if line.strip() else line for line in chunk_lines]


def _retabbed(chunk_lines: list[str], anchors: list[_Anchor], lines: list[str]) -> list[str]:
    """The chunk's lines with their leading spaces as tabs, `width` spaces a tab, where every anchored line
    of the original is indented with tabs and the chunk's with `width` spaces for each (a chat answer's
    code block turns a Go file's tabs into spaces); else as they are."""
    widths = set()
    for anchor in anchors:
        for k in range(anchor.size):
            new, old = chunk_lines[anchor.chunk + k], lines[anchor.original + k]
            new_indent, old_indent = new[: len(new) - len(new.lstrip())], old[: len(old) - len(old.lstrip())]
            if not counts(new) or not old_indent:
                continue
            if old_indent.strip("\t") or new_indent.strip(" ") or len(new_indent) % len(old_indent):
                return chunk_lines
            widths.add(len(new_indent) // len(old_indent))
    if len(widths) != 1 or (width := widths.pop()) < 2:
        return chunk_lines
    retabbed = []
    for line in chunk_lines:
        spaces = len(line) - len(line.lstrip(" "))
        retabbed.append("\t" * (spaces // width) + " " * (spaces % width) + line[spaces:] if line.strip() else line)
    return retabbed
