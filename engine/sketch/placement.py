"""Where one chunk of an edit sketch goes among the original's lines. `merge` places a sketch's chunks in
order with `place_chunks`, each after the one before, each replacing a span of the original, by the rules
its docstring lists (rules 1 and 2 live in `anchors`, 3 and 6 in `edges`). The original's lines are read
once for a merge (`anchors.Original`: where each line is, and running sums over them): each chunk costs
what it holds and what lies near it, not the whole file.
"""

from __future__ import annotations

import difflib
import functools
from collections import Counter
from dataclasses import dataclass

from rapidfuzz.distance import Indel

from specedit.engine.sketch.anchors import (
    REPLACED_PER_LINE,
    REPLACED_SLACK,
    Anchor,
    Original,
    best_chain,
    context_chain,
    find_lines,
)
from specedit.engine.sketch.blocks import comment_above, find_block, indent, lines_above, shown_block
from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline
from specedit.engine.sketch.edges import Side, keeping_unchanged, lost, place_on, says_from
from specedit.engine.sketch.merge_checks import BLOCK_DROPS, counts

# A chunk whose every line the original has more than once is tried at each place of its rarest line, if
# it has at most this many (a block a file repeats: the same lines in two lists, an import block a template
# holds too).
MAX_REPEATS = 8
# Of two places for a chunk after which as many chunks are placed, the one whose merge changes at most
# this share of the characters the other's changes is taken (the chunk is clearly more like what stands
# there); closer, it is a doubt. On the sketch sets and HumanEvalFix's, 0.4 settles 12 of 31 such doubts,
# 10 rightly; wider margins settle more, but a larger share wrongly.
CLEARLY_LESS = 0.4
# A chunk with more anchors than twice this tries alone only this many at either end: each is a placement
# to make and weigh over the whole chunk (a file that repeats itself, sketched whole, has thousands: its
# merge would take minutes). The chunks of docs/sketches.md's sets have 40 at most.
ALONE_AT_EDGES = 32
# A placement that covers a chunk's runs (two equal lines or more in a row) is taken over one that covers
# only its context, unless it loses more than this many of the original's lines and the other loses none:
# then the runs are new code repeating an old near copy far away (guzzle's XML visitor test: a new test
# whose array lines repeat an old test's replaced the 150 lines between). Where both lose lines, the
# covering one is an edit that deleted them (gson's tests rewritten without their try/finally). On
# docs/sketches.md's sets, 2 makes two merges that lost code exact; 0 and 1 break an exact one.
RUN_LOSSES = 2


@dataclass(frozen=True)
class Chunk:
    lines: list[str]  # with their newlines, blank lines at either end left out
    at_start: bool  # no marker before it: it starts the file
    at_end: bool  # no marker after it: it ends the file
    marker_after: str = ""  # the elision marker after it, as written ("" if none)
    marker_before: str = ""  # the one before it

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        """Its lines, stripped (what a placement keeps of the original's lines it replaces)."""
        return frozenset(line.strip() for line in self.lines)


@dataclass(frozen=True)
class Placement:
    start: int  # the chunk replaces the original's lines[start:stop]
    stop: int
    lines: list[str]


@dataclass(frozen=True)
class Placements:
    """How the chunks from one on fare: per chunk its placement, or why it has none or is doubtful; with
    the number of those, to compare one placement's consequences with another's."""

    steps: tuple[tuple[Placement | None, str], ...] = ()  # (placement, "" or why it is doubtful or missing)
    unplaced: int = 0
    changed: int = 0  # characters the placements change

    def after(self, placement: Placement | None, why: str = "", changed: int = 0) -> Placements:
        unplaced = self.unplaced + (placement is None or bool(why))
        return Placements(((placement, why), *self.steps), unplaced, self.changed + changed)


def place_chunks(chunks: list[Chunk], original: Original, deadline: Deadline = NO_DEADLINE) -> Placements:
    """Where each chunk goes, after the one before: where a chunk may go in several places (`_places`), the
    one after which the fewest chunks stay unplaced (a tie is a doubt: which of two equal blocks a sketch
    meant: what each would change did not tell it reliably). Worked out from the last chunk back, for the
    states (chunk, cursor) that the first chunk's choices reach: a stack, not recursion, since a sketch may
    have many chunks. `deadline` is checked before each chunk is placed. A chunk is placed by these rules:

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
       lines or more (new code written beside a near copy of old code repeats them; not where covering them
       loses lines and the context alone loses none: `RUN_LOSSES`; nor where the context's two ends disagree
       and one of them alone places it losing none), the one that loses the fewest of the original's lines
       (lines that say something and that the chunk lacks) is taken.
    3. *Edges*: the chunk's lines before its first anchor start where the original has the most of their
       first lines before the anchor (context it repeats: a `}` and a blank line before a new function), less
       the lines skipping there loses (not one alike to a new line of the chunk: it is changed, as `if (x) {`
       into `if (x) y;`), if the rest fits there; else its last lines may be changes of the lines just
       before the anchor (alike, `edges.EDGE_SCORE`); else they are new, and go in before the anchor if they close
       what they open and do not land inside a deeper block. Likewise after the last anchor. A chunk
       with no marker before it starts the file, one with no marker after it ends it; one that is a changed
       line alone (a new signature) goes where the one line alike to it is.
    4. *Repeated blocks*: a chunk none of whose lines the original has once is placed in each stretch around
       a place of its rarest line where it changes something, losing no more than `RUN_LOSSES` lines (a
       block it would lose more of is another block alike, not the one it changes); the place after which
       the chunks that follow can still be placed is taken; if several can, the one whose merge changes
       clearly fewer characters (`CLEARLY_LESS`), else none (`_places`, `place_chunks`). Failing that, a
       chunk whose first and last lines (its context) the original has several times each goes between each
       place of its first line and the nearest of its last after it; so does a chunk its anchors place losing
       more than `RUN_LOSSES` lines, where they rest on one line of it outside that span (new code repeating
       one old line) and it loses none there (`_within_context`).
    5. *A block whole*: a chunk that is one block (a `def` and its deeper body) goes over the original's
       block of the same first line, if that line is once in the original after the chunk before and the
       anchors leave a doubt or place it losing more lines (its new body repeats a neighbour's lines, and so
       reached over the neighbour: `_whole_block`); a sketch that is one block and nothing else (no markers)
       replaces that block, its last `BLOCK_DROPS` lines too (a line the edit deleted after the last one
       the sketch keeps).
    6. Lines the chunk repeats keep the original's own text (a sketch drops trailing spaces), but for a line
       trimmed beside a line the chunk changes.

    Measured on sketches of real edits (see docs/benchmarks.md, "Edit sketches"). Known wrong merges: a
    chunk whose lines are, verbatim, another place of the file (a Go template holding the same imports) goes
    there; a new test whose generic first lines (`}`) the original has in several places
    starts at the wrong one and replaces what lies between (express); a deletion longer than the chunk shows
    (two `--no-x` options replaced by one `--x`) keeps the rest.
    """
    placements: dict[tuple[int, int], Placements] = {}
    places: dict[tuple[int, int], list[Placement] | str] = {}
    stack = [(0, 0)]
    while stack:
        number, cursor = state = stack[-1]
        if state in placements:  # reached two ways
            stack.pop()
            continue
        if number == len(chunks):
            placements[state] = Placements()
            continue
        chunk = chunks[number]
        if state not in places:
            deadline.check()
            places[state] = _places(original, cursor, chunk)
        found = places[state]
        nexts = [(number + 1, cursor)] if isinstance(found, str) else [(number + 1, place.stop) for place in found]
        if missing := [after for after in nexts if after not in placements]:
            stack += missing
            continue
        stack.pop()
        if isinstance(found, str):
            placements[state] = placements[nexts[0]].after(
                None, f"{found} (the chunk starting {chunk.lines[0].strip()!r})"
            )
            continue
        # Of the places, the one after which the fewest chunks stay unplaced, then the one whose merge
        # changes clearly fewer characters; two alike are a doubt.
        options = sorted(
            ((placements[(number + 1, place.stop)], _changed(original.lines, place), place) for place in found),
            key=lambda option: (option[0].unplaced, option[0].changed + option[1]),
        )
        (following, changed, chosen), *others = options  # `following`: how the chunks after it fare
        tie = bool(others) and others[0][0].unplaced == following.unplaced
        if tie:
            runner_up, runner_up_changed, _ = others[0]
            tie = following.changed + changed > CLEARLY_LESS * (runner_up.changed + runner_up_changed)
        why = f"{chunk.lines[0].strip()!r} could go in more than one place" if tie else ""
        placements[state] = following.after(chosen, why, changed)
    return placements[(0, 0)]


def _changed(lines: list[str], place: Placement) -> int:
    """How many characters `place` changes (inserted and deleted)."""
    return Indel.distance("".join(lines[place.start : place.stop]), "".join(place.lines))


def _places(original: Original, cursor: int, chunk: Chunk) -> list[Placement] | str:
    """Where `chunk` may go after `cursor` (`_place`, unless its context says otherwise: `_within_context`);
    or why nowhere.

    A chunk whose lines all occur more than once (a block that a file repeats) is placed in each stretch
    of the original that holds one of the places of its rarest line (up to `MAX_REPEATS`), where it
    changes something (a chunk is in a sketch for a change: one that changes nothing at any of them may
    mean a deletion its lines do not show, as of one of two equal tests): the chunks after it then choose,
    or it stays unresolved (`merge_sketch`). Failing that, it is placed between each pair of places of its
    context lines (`_between_context`) where it does not keep old code it rewrites (`_repeats_old_code`).
    """
    lines, keys = original.lines, original.keys
    placed = _place(original, cursor, chunk)
    if not isinstance(placed, str):
        return _within_context(original, cursor, chunk, placed) or [placed]
    found = _found(original, cursor, chunk)
    repeats = min(found.values(), key=len, default=[])
    places = []
    if 1 < len(repeats) <= MAX_REPEATS:  # else it has anchors (and did not fit on them), or too many places
        for number, at in enumerate(repeats):
            low = repeats[number - 1] + 1 if number else cursor
            high = repeats[number + 1] if number + 1 < len(repeats) else len(lines)
            if (chunk.at_start and low > cursor) or (chunk.at_end and high < len(lines)):
                continue
            place = _place(original.before(high), low, chunk)
            if not isinstance(place, str) and place.start <= at < place.stop:
                old = keys[place.start : place.stop]
                if lost(old, [line.strip() for line in place.lines]) <= RUN_LOSSES:
                    places.append(place)
    changing = [place for place in places if place.lines != lines[place.start : place.stop]]
    if not changing:
        changing = [
            place
            for place in _between_context(original, chunk, found)
            if place.lines != lines[place.start : place.stop] and not _repeats_old_code(keys, place)
        ]
    return changing or placed


def _found(original: Original, cursor: int, chunk: Chunk) -> dict[str, list[int]]:
    """Where each of the chunk's lines that say something is in the original after `cursor`."""
    return find_lines(original.keys, cursor, {line.strip() for line in chunk.lines if counts(line)}, original.index)


def _within_context(original: Original, cursor: int, chunk: Chunk, placed: Placement) -> list[Placement]:
    """Where a chunk placed by its anchors losing more than `RUN_LOSSES` of the original's lines goes by its
    context instead: the placements between its first and last lines (`_between_context`) inside that one
    that lose none, where that one rests, outside them, on one line of the chunk at most: new code
    repeating one line of old code (a new test after `assertEquals` lines two tests end with, whose
    `}).create();` the test before has once, replaced that test). Empty where there are none."""
    lines, keys = original.lines, original.keys
    if _lost_lines(keys, chunk, (placed.start, placed.stop, placed.lines)) <= RUN_LOSSES:
        return []
    narrower = []
    chunk_said = {line.strip() for line in chunk.lines if counts(line)}
    for place in _between_context(original, chunk, _found(original, cursor, chunk)):
        said = chunk_said - set(keys[place.start : place.stop])
        outside = keys[placed.start : place.start] + keys[place.stop : placed.stop]
        if (
            placed.start <= place.start
            and place.stop <= placed.stop
            and sum(key in said for key in outside) <= 1
            and place.lines != lines[place.start : place.stop]
            and not _lost_lines(keys, chunk, (place.start, place.stop, place.lines))
        ):
            narrower.append(place)
    return narrower


def _between_context(original: Original, chunk: Chunk, found: dict[str, list[int]]) -> list[Placement]:
    """The placements of a chunk by its first and last lines that say something (its context), for when
    the original has each several times: between each place of its first line and the nearest place of
    its last line after it (with no place of the first line between them), where the two are once (gson:
    a new test after asserts two tests share, before a comment three share). Up to `MAX_REPEATS`. `found`:
    where each of the chunk's lines that say something is in the original after the cursor (`find_lines`)."""
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
        place = _place(original.before(last + 1), first, chunk)
        if not isinstance(place, str) and place.start <= first and last < place.stop:
            places.append(place)
    return places if len(places) <= MAX_REPEATS else []


def _repeats_old_code(keys: list[str], place: Placement, run: int = 3) -> bool:
    """Whether the lines `place` adds hold `run` lines in a row, saying something, that the original has
    in a row outside the lines it replaces: a placement between the wrong pair of context lines (a nested
    `try:` and the `except` of the outer one) keeps the old code the chunk rewrites."""
    old = set(keys[place.start : place.stop])
    new = [line.strip() for line in place.lines if counts(line) and line.strip() not in old]
    said = [key if counts(key) else None for key in keys]
    outside = [*said[: place.start], None, *said[place.stop :]]
    runs = {tuple(outside[k : k + run]) for k in range(len(outside) - run + 1) if None not in outside[k : k + run]}
    return any(tuple(new[k : k + run]) in runs for k in range(len(new) - run + 1))


def _place(original: Original, cursor: int, chunk: Chunk) -> Placement | str:
    """Where `chunk` goes: it replaces `lines[start:stop]` with its lines (re-indented like the original's
    where all its anchors are shifted alike); or why that cannot be said. By its anchors
    (`_place_by_anchors`), unless it is one block whole (`_whole_block`) and its anchors leave a doubt or
    place it losing more of the original's lines (lines that say something that the chunk lacks)."""
    lines, keys = original.lines, original.keys
    placed = _place_by_anchors(original, cursor, chunk)
    block = _whole_block(original, cursor, chunk)
    alone = not chunk.marker_before and not chunk.marker_after  # the sketch is this block, and no more
    if block is not None:
        start, stop, new_lines, first = block
        lost = _lost_lines(keys, chunk, (first, stop, new_lines))  # a comment above: the chunk shows its own
        bound = None
        if not isinstance(placed, str):
            bound = _lost_lines(keys, chunk, placed) + (BLOCK_DROPS + 1 if alone else 0)
        # A comment above the block that the chunk rewrites (the anchors would keep the old one too) tips a tie.
        said_above = [line.strip() for line in chunk.lines[: lines_above(chunk.lines)] if line.strip()]
        rewritten = said_above != [key for key in keys[start:first] if key]
        if bound is None or lost < bound or (rewritten and lost == bound):
            placed = start, stop, new_lines
    if isinstance(placed, str):
        return placed
    start, stop, new_lines = placed
    return Placement(start, stop, keeping_unchanged(lines[start:stop], new_lines))


def _lost_lines(keys: list[str], chunk: Chunk, placement: tuple[int, int, list[str]]) -> int:
    """How many of the original's lines that say something a placement replaces that the chunk lacks."""
    return sum(counts(key) and key not in chunk.keys for key in keys[placement[0] : placement[1]])


def _place_by_anchors(original: Original, cursor: int, chunk: Chunk) -> tuple[int, int, list[str]] | str:
    """Where `chunk` goes by its anchors (see `_place`).

    The anchors that fit together best are tried, and each anchor alone (a unique line of new code may
    fit with the real ones), and those by the context of a chunk that starts or ends the file
    (`_by_context`); of the placements that hold and cover the anchors they must (`_required`: the
    context, and the runs if any can; two readings of a context that disagrees are a doubt), the one that
    loses the fewest lines of the original (`_lost_lines`) is taken, and of those the one that replaces
    the fewest.
    """
    keys = original.keys
    chunk_keys = [line.strip() for line in chunk.lines]
    anchors = original.anchors(cursor, chunk_keys)
    # Each anchor alone too, those nearest the chunk's edges where it has many (its context is there).
    alone = anchors if len(anchors) <= 2 * ALONE_AT_EDGES else anchors[:ALONE_AT_EDGES] + anchors[-ALONE_AT_EDGES:]
    chains = [best_chain(keys, chunk_keys, anchors, original.sums), *([a] for a in alone)] if anchors else [[]]
    chains += context_chain(keys, chunk_keys, anchors, original.sums)
    placements = [
        place_on(chain, original, cursor, _reindented(chunk.lines, chain, original.lines), chunk.at_start, chunk.at_end)
        for chain in chains
    ] + _by_context(original, cursor, chunk)
    placed = [placement for placement in placements if not isinstance(placement, str)]

    def covers(placement: tuple[int, int, list[str]], required: list[Anchor]) -> bool:
        return all(placement[0] <= a.original < placement[1] for a in required)

    def lost(placement: tuple[int, int, list[str]]) -> int:
        return _lost_lines(keys, chunk, placement)

    readings = []  # what each reading of the context holds
    for edges, runs in _required(anchors, chunk_keys, chunk):
        with_edges = [placement for placement in placed if covers(placement, edges)]
        covering = [placement for placement in with_edges if covers(placement, runs)]
        if covering and edges and min(map(lost, with_edges)) == 0 and min(map(lost, covering)) > RUN_LOSSES:
            covering = []  # the runs are new code repeating old code far from where the context puts it
        readings.append(covering or (with_edges if edges else []))  # new code may repeat old code
    alternatives = [placements for placements in readings[1:] if placements]
    if alternatives and readings[0] and min(map(lost, readings[0])) > RUN_LOSSES:
        # The context disagrees, and the runs alone put the chunk where it loses lines: new code repeating
        # old code (a second loop like the first, with the lines before it rewritten like the old ones).
        # Where one end of the context places it losing none, the runs do not decide: that end does.
        lossless = [placements for placements in alternatives if min(map(lost, placements)) == 0]
        if lossless:
            readings[0], alternatives = [], lossless
    if not readings[0] and len(alternatives) > 1:
        return f"{chunk.lines[0].strip()!r} could go in more than one place"
    held = readings[0] or (alternatives[0] if alternatives else [])
    if not held:
        reasons = [placement for placement in placements if isinstance(placement, str)]
        return reasons[0] if reasons else "its lines in the original do not fit together"
    return min(held, key=lambda placement: (lost(placement), placement[1] - placement[0]))


def _whole_block(original: Original, cursor: int, chunk: Chunk) -> tuple[int, int, list[str], int] | None:
    """The placement of a chunk that is one block whole (`blocks.shown_block`; no marker after it deeper
    than its first line) over the original's block of the same first line (`blocks.block_stop`), where the
    original has that line once after `cursor`, and the block's first line. A model shows "the function,
    changed" so, its doc comment or annotations above it standing for the original's there
    (`blocks.comment_above`); where its new body repeats a neighbour's lines (two tests alike), the anchors
    alone would stretch it over the neighbour. None if it is not."""
    above = lines_above(chunk.lines)  # a doc comment or annotations above the block's first line
    shown = shown_block(chunk.lines[above:])
    if chunk.at_start or chunk.at_end or shown is None or not counts(shown.first):
        return None
    if chunk.marker_after and indent(chunk.marker_after) > indent(chunk.lines[above]):
        return None
    lines, keys = original.lines, original.keys
    if (block := find_block(lines, shown, cursor, original.places(shown.first, cursor))) is None:
        return None
    # Its own lines above the block stand for the original's there.
    start, stop = comment_above(lines, block[0], cursor, chunk.lines[:above]), block[1]
    # Its lines equal to the block's, as anchors: indented as they are (tabs where the file has them).
    same = difflib.SequenceMatcher(None, keys[start:stop], [line.strip() for line in chunk.lines], autojunk=False)
    anchors = [Anchor(start + run.a, run.b, run.size, 0) for run in same.get_matching_blocks() if run.size]
    return start, stop, _reindented(chunk.lines, anchors, lines), block[0]


def _by_context(original: Original, cursor: int, chunk: Chunk) -> list[tuple[int, int, list[str]]]:
    """The placements of a chunk that ends the file (no marker after it) at each place where the original
    has its first lines (its context: one at least that says something), replacing all after; of a chunk
    that starts the file, at each place where the original has its last lines, replacing all before. Its
    anchors may be new code repeating old code (a test appended after a near copy of it)."""
    new_raw = [line.rstrip() for line in chunk.lines]
    if chunk.at_start == chunk.at_end:
        return []
    raw, size = original.raw, len(original)
    # Only where the first line (the last, backwards) is the same.
    if chunk.at_end:
        placements = [
            (place, size, chunk.lines)
            for place in original.places(new_raw[0].strip(), cursor)
            if raw[place] == new_raw[0] and says_from(new_raw, raw, place)
        ]
    else:
        backwards = Side(original, backwards=True)
        placements = [
            (cursor, place + 1, chunk.lines)
            for place in original.places(new_raw[-1].strip(), cursor)
            if raw[place] == new_raw[-1] and says_from(new_raw[::-1], backwards, size - 1 - place)
        ]
    # Not over much more code than the chunk holds (new code beside a near copy repeats its first lines).
    most = REPLACED_PER_LINE * sum(map(counts, new_raw)) + REPLACED_SLACK
    return [placement for placement in placements if original.sums.said(placement[0], placement[1]) <= most]


Reading = tuple[list["Anchor"], list["Anchor"]]  # the context anchors a placement must cover, and the runs


def _required(anchors: list[Anchor], chunk_keys: list[str], chunk: Chunk) -> list[Reading]:
    """The anchors a placement must cover: those holding the chunk's first or last line that says something
    (where a sketch repeats its context; not the end a file's start or end fixes); and, if it can, runs of
    two such lines or more in the same order as those (new code may repeat a line of old code, seldom two
    together; a placement that leaves them out, beside the chunk's copy, doubles them; but new code written
    beside a near copy of it does repeat them: a placement that covers the context anchors need not cover
    the runs, when none can). Where the two context anchors disagree (new code at one end repeating old
    code elsewhere), the first reading has neither and every run; then each alone, with the runs in order
    with it, to be taken where the first reading holds nothing and exactly one of them holds something
    (or loses nothing, where the first reading loses lines: `_place`)."""
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


def _in_order(a: Anchor, b: Anchor) -> bool:
    """Whether two anchors stand in the same order in the chunk and in the original (or are one)."""
    return a == b or (a.chunk < b.chunk) == (a.original < b.original)


def _reindented(chunk_lines: list[str], anchors: list[Anchor], lines: list[str]) -> list[str]:
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


def _retabbed(chunk_lines: list[str], anchors: list[Anchor], lines: list[str]) -> list[str]:
    """The chunk's lines with their leading spaces as tabs, `width` spaces a tab, where every anchored line
    of the original is indented with tabs and the chunk's with spaces, a multiple of `width`: the spaces a
    tab most of them take (a chat answer's code block turns a Go file's tabs into spaces; a line the edit
    moved out of a block it left has a tab fewer); else as they are."""
    widths: Counter[int] = Counter()
    indents = []
    for anchor in anchors:
        for k in range(anchor.size):
            new, old = chunk_lines[anchor.chunk + k], lines[anchor.original + k]
            new_indent, old_indent = new[: len(new) - len(new.lstrip())], old[: len(old) - len(old.lstrip())]
            if not counts(new) or not old_indent:
                continue
            if old_indent.strip("\t") or new_indent.strip(" "):
                return chunk_lines
            indents.append(len(new_indent))
            if len(new_indent) % len(old_indent) == 0:
                widths[len(new_indent) // len(old_indent)] += 1
    if not widths or (width := widths.most_common(1)[0][0]) < 2 or any(spaces % width for spaces in indents):
        return chunk_lines
    retabbed = []
    for line in chunk_lines:
        spaces = len(line) - len(line.lstrip(" "))
        retabbed.append("\t" * (spaces // width) + " " * (spaces % width) + line[spaces:] if line.strip() else line)
    return retabbed
