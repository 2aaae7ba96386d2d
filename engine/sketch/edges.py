"""A chunk's edges and its lines' text, once its anchors say where it goes (`placement.place_chunks`' rules
3 and 6): where its lines before the first anchor and after the last begin and end in the original, which
of them are changes of the original's lines there and which are new; the chunk's lines re-indented like
the original's, and the original's own text kept for the lines it repeats. A chunk's end is placed as its
start is, read backwards (`Side`): from the end of the file, looking no farther than the lines it could
replace (looking at every line after it would make a sketch of thousands of chunks quadratic).
"""

from __future__ import annotations

from collections.abc import Iterator

from rapidfuzz import fuzz, process

from specedit.engine.sketch.anchors import REPLACED_PER_LINE, REPLACED_SLACK, Anchor, Original, Sums, fits_between
from specedit.engine.sketch.blocks import balance, has_words, indent
from specedit.engine.sketch.line_index import opcodes
from specedit.engine.sketch.merge_checks import counts

# rapidfuzz's ratio (0-100) from which a chunk's line next to an anchor is taken for a change of the
# original's line there (it replaces it) rather than a new one (it goes in beside it). A changed line
# scores 62-78 (`return round(s, 2)` for `return s`), a new method's first line against the old one ~50.
# Chosen on continue_lazy, git_history sketches and hand-written ones: only 60 merged all of them.
EDGE_SCORE = 60
# The places an edge's first line has before `start` that are weighed, nearest first (`_edge`): each costs
# the lines between it and `start`. On docs/sketches.md's sets an edge weighs 16 at most.
EDGE_PLACES = 32


def place_on(
    chain: list[Anchor], original: Original, cursor: int, new_lines: list[str], at_start: bool, at_end: bool
) -> tuple[int, int, list[str]] | str:
    """The placement of a chunk's lines (`new_lines`, indented like the original's) on the anchors `chain`
    (`placement._place`): the original's lines `start:stop` it replaces, and its lines; or why it has
    none. `at_start`: no marker before it (it starts the file); `at_end`: none after it."""
    lines, raw = original.lines, original.raw
    new_raw = [line.rstrip() for line in new_lines]
    if chain:
        start, stop = chain[0].original, chain[-1].original + chain[-1].size
        lead, tail = new_raw[: chain[0].chunk], new_raw[chain[-1].chunk + chain[-1].size :]
    elif at_start:  # it begins as the file does, if at all (`x = 1` says too little to anchor)
        same = common_length(new_raw, raw, cursor)
        start, stop, lead, tail = cursor, cursor + same, [], new_raw[same:]
    elif at_end:
        same = common_length(new_raw[::-1], Side(original, backwards=True))
        start, stop, lead, tail = len(lines) - same, len(lines), new_raw[: len(new_raw) - same], []
    else:  # one changed line alone (a new signature): where the one line alike to it is
        said = [line.strip() for line in new_raw if counts(line)]
        alike = _alike(said[0], original, cursor) if len(said) == 1 else []
        if len(alike) != 1:  # (a new function `sub` beside `add` is no change of `add`)
            return "none of its lines is in the original once"
        start = stop = alike[0]
        lead, tail = [], new_raw
    if at_start:
        start = cursor
    else:
        start, unplaced = _edge(lead, Side(original), cursor, start)
        if unplaced and not _insertable(unplaced, original, start, cursor, start):
            return f"{unplaced[0].strip()!r} could go in more than one place"
    if at_end:
        stop = len(lines)
    else:
        # The chunk's end, read backwards, is placed like its start.
        back, unplaced = _edge(tail[::-1], Side(original, backwards=True), 0, len(lines) - stop)
        stop = len(lines) - back
        if unplaced and not _insertable(unplaced[::-1], original, stop, stop, len(lines)):
            return f"{unplaced[0].strip()!r} could go in more than one place"
    return start, stop, new_lines


def _alike(line: str, original: Original, cursor: int) -> list[int]:
    """The original's lines after `cursor` that `line` is a change of (`is_change_of`), in order."""
    if not has_words(line):
        return []
    found = process.extract(line, original.keys[cursor:], scorer=fuzz.ratio, score_cutoff=EDGE_SCORE, limit=None)
    return sorted(cursor + number for key, _, number in found if has_words(key))


class Side:
    """The original's lines (`raw`) read from the start, or from the end (`backwards`: item k is the k-th
    line before the end), with what `fits_between` asks of any stretch of them."""

    def __init__(self, original: Original, backwards: bool = False) -> None:
        self.original, self.backwards, self.size = original, backwards, len(original)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, at: int) -> str:
        return self.original.raw[self.size - 1 - at if self.backwards else at]

    def window(self, start: int, stop: int) -> list[str]:
        """The lines `start:stop`, in this side's order."""
        if not self.backwards:
            return self.original.raw[start:stop]
        return self.original.raw[self.size - stop : self.size - start][::-1]

    def _forwards(self, start: int, stop: int) -> tuple[int, int]:
        return (self.size - stop, self.size - start) if self.backwards else (start, stop)

    def balance(self, start: int, stop: int) -> int:
        return self.original.sums.balance(*self._forwards(start, stop))

    def said(self, start: int, stop: int) -> int:
        return self.original.sums.said(*self._forwards(start, stop))

    def nearest(self, key: str, low: int, start: int) -> Iterator[int]:
        """Where the line `key` (stripped) is among the lines `low:start`, the nearest to `start` first."""
        places = self.original.index.places(key, *self._forwards(low, start))
        if self.backwards:
            return (self.size - 1 - place for place in places)
        return reversed(places)


def _edge(edge: list[str], side: Side, low: int, start: int) -> tuple[int, list[str]]:
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
        stripped = [line.strip() for line in edge]
        new = Sums(stripped)
        # The lines skipped between a place and `start` fit only where they say little more than the edge
        # does (`fits_between`): past the first place where they say more, none fits.
        most = REPLACED_PER_LINE * new.said(0, len(edge)) + REPLACED_SLACK
        places = []  # (lines it repeats, place), nearest first
        weighed = 0
        for place in side.nearest(stripped[0], low, start):
            if side.said(min(place + len(edge), start), start) > most or weighed == EDGE_PLACES:
                break
            if side[place] != edge[0]:
                continue
            weighed += 1
            size = 1
            while size < len(edge) and place + size < start and side[place + size] == edge[size]:
                size += 1
            if fits_between(new, size, len(edge), side, place + size, start):
                dropped = lost([line.strip() for line in side.window(place + size, start)], stripped[size:])
                places.append((size - dropped, size, place))
        if places:  # the most repeated less lost, then the most repeated, then the nearest
            return max(places, key=lambda found: found[:2])[2], []
    # Changed lines: alike pairs from `start` back, over equal lines between them (blank lines, `}`).
    unplaced, placed_start = len(edge), start
    walked, at = unplaced, start
    while walked and at > low:
        new_line, old_line = edge[walked - 1].strip(), side[at - 1].strip()
        if new_line != old_line and not is_change_of(new_line, old_line):
            break
        walked, at = walked - 1, at - 1
        if is_change_of(new_line, old_line):
            unplaced, placed_start = walked, at
    return placed_start, edge[:unplaced]


def lost(old: list[str], new: list[str]) -> int:
    """How many of the lines `old` that say something `new` replaces without keeping them: neither among
    its lines nor changed into one (alike to one of its lines the original lacks there, each of those a
    change of one line at most)."""
    old_lines, new_lines = set(old), set(new)
    changes = [line for line in new if line not in old_lines]
    dropped = 0
    for line in old:
        if not counts(line) or line in new_lines:
            continue
        alike = next((number for number, change in enumerate(changes) if is_change_of(change, line)), None)
        if alike is None:
            dropped += 1
        else:
            del changes[alike]
    return dropped


def _insertable(new: list[str], original: Original, at: int, low: int, high: int) -> bool:
    """Whether lines that nothing places can go in before the original's line `at` as new code: none of them
    (but bare brackets) is a line of the original between `low` and `high` (that would be context the chunk
    repeats, not found where it fits), they close what they open, and the line after them is not deeper
    inside a block than their first line."""
    if any(has_words(line) and original.count(line.strip(), low, high) for line in new) or balance(new) != 0:
        return False
    raw = original.raw
    while at < len(raw) and not raw[at].strip():
        at += 1
    after = raw[at] if at < len(raw) else ""
    first = next(line for line in new if line.strip())
    return indent(first) >= indent(after)


def is_change_of(new: str, old: str) -> bool:
    """Whether a chunk's line is a change of the original's `old` (it replaces it), not a new one."""
    return has_words(new) and has_words(old) and fuzz.ratio(new, old) >= EDGE_SCORE


def common_length(a: list[str], b: list[str] | Side, start: int = 0) -> int:
    """How many of the first lines of `a` and of `b` from `start` on are equal."""
    same = 0
    while same < min(len(a), len(b) - start) and a[same] == b[start + same]:
        same += 1
    return same


def says_from(new: list[str], old: list[str] | Side, start: int = 0) -> bool:
    """Whether the first lines `new` and `old` (from `start` on) have in common hold one that says something."""
    return any(counts(line) for line in new[: common_length(new, old, start)])


def keeping_unchanged(old: list[str], new: list[str]) -> list[str]:
    """`new`, with the original's own text for the lines it repeats: a sketch writes blank lines without
    their spaces, and a merge changes no line it did not mean to (a line indented anew is changed). But a
    line that the sketch gives without the original's trailing spaces, right beside a line it changes, is
    the sketch's: an edit trims the lines it touches (` * ` in a doc comment it rewrites)."""
    changes = opcodes([line.rstrip() for line in old], [line.rstrip() for line in new])
    merged: list[str] = []
    for number, (tag, old_start, old_stop, new_start, new_stop) in enumerate(changes):
        if tag != "equal":
            merged += new[new_start:new_stop]
            continue
        kept = old[old_start:old_stop]
        if number > 0 and kept[0].strip():  # the line after a change
            kept[0] = new[new_start]
        if number < len(changes) - 1 and kept[-1].strip():  # the line before one
            kept[-1] = new[new_stop - 1]
        merged += kept
    return merged
