"""A chunk's anchors: its lines that say something and that the original has once after the chunk before,
grown into runs of equal lines, and the chains of them that fit together (`placement.place_chunks`' rules
1 and 2). `placement` places the chunk on them. The original's lines are read once for a merge
(`Original`): where each is, and running sums over them, so that each chunk costs what it holds.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from specedit.engine.sketch.blocks import line_balance
from specedit.engine.sketch.line_index import LineIndex
from specedit.engine.sketch.merge_checks import counts

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


@dataclass(frozen=True)
class Anchor:
    original: int  # where the run starts in the original (a line index)
    chunk: int  # where it starts in the chunk
    size: int
    said: int  # lines that say something in the run, grown over lines the chunk has twice too


class Original:
    """The original's lines as placement reads them: as they are (`lines`, with their newlines), stripped
    (`keys`: compared for anchors and likeness), without trailing spaces (`raw`: compared with their
    indentation, at a chunk's edges); with where each key is (`index`) and running sums over the keys
    (`sums`). Made once for a merge: a chunk that read the whole file for them made a sketch of thousands
    of chunks quadratic. `before(high)` is the lines before `high` alone, sharing the index and sums."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.keys = [line.strip() for line in lines]
        self.raw = [line.rstrip() for line in lines]
        self.index = LineIndex(self.keys)
        self.sums = Sums(self.keys)

    def __len__(self) -> int:
        return len(self.lines)

    def before(self, high: int) -> Original:
        """The lines before `high`."""
        part = Original.__new__(Original)
        part.lines, part.keys, part.raw = self.lines[:high], self.keys[:high], self.raw[:high]
        part.index, part.sums = self.index, self.sums
        return part

    def places(self, key: str, low: int = 0) -> list[int]:
        """Where the line `key` (stripped) is at or after `low`, in order."""
        return self.index.places(key, low, len(self.lines))

    def anchors(self, cursor: int, chunk_keys: list[str]) -> list[Anchor]:
        """`find_anchors` in these lines."""
        return find_anchors(self.keys, cursor, chunk_keys, self.index)

    def count(self, key: str, low: int, high: int) -> int:
        """How many of the lines `low:high` are `key` (stripped)."""
        return self.index.count(key, low, min(high, len(self.lines)))


def find_lines(keys: list[str], cursor: int, wanted: set[str], index: LineIndex | None = None) -> dict[str, list[int]]:
    """Where each of the `wanted` lines is among the original's `keys` after `cursor` (line indices, in
    order), the line found first first. `index`: where each key is (of these keys, or of more after them:
    `Original.before`), where the caller has it."""
    index = LineIndex(keys) if index is None else index
    places = {key: found for key in wanted if (found := index.places(key, cursor, len(keys)))}
    return dict(sorted(places.items(), key=lambda item: item[1][0]))


def find_anchors(keys: list[str], cursor: int, chunk_keys: list[str], index: LineIndex | None = None) -> list[Anchor]:
    """The chunk's anchors: its lines that say something and occur once in the original after `cursor`
    (`keys`: its lines, stripped; `index`: where each is, as `find_lines` takes it), grown into runs of
    equal lines, in the chunk's order."""
    places = find_lines(keys, cursor, {key for key in chunk_keys if counts(key)}, index)
    # A line the chunk has twice (`done();` closing the new test and the old one after it) says nothing of
    # which of its places the original's line is: a run does not grow over it.
    twice = {key for key, number in Counter(chunk_keys).items() if number > 1 and counts(key)}
    # Counted once for the chunk, not per anchor (a chunk of thousands of one-line anchors, a file that
    # repeats itself sketched whole, made this quadratic): lines that say something before each position,
    # the next line the chunk has twice from each position, and how far each diagonal agrees.
    said_before = [0, *itertools.accumulate(map(counts, chunk_keys))]
    next_twice = [len(chunk_keys)] * (len(chunk_keys) + 1)
    for k in range(len(chunk_keys) - 1, -1, -1):
        next_twice[k] = k if chunk_keys[k] in twice else next_twice[k + 1]
    agreeing: dict[int, tuple[int, int]] = {}  # original - chunk: (from, to) chunk positions that agree
    anchors: list[Anchor] = []
    for position, key in enumerate(chunk_keys):
        found = places.get(key, [])
        if not counts(key) or len(found) != 1:
            continue
        a, b = position, found[0]
        if anchors and anchors[-1].original - anchors[-1].chunk == b - a and a < anchors[-1].chunk + anchors[-1].size:
            continue  # inside the run before
        while a > 0 and b > cursor and chunk_keys[a - 1] == keys[b - 1] and chunk_keys[a - 1] not in twice:
            a, b = a - 1, b - 1
        known = agreeing.get(b - a)
        if known is not None and known[0] <= position < known[1]:
            end = known[1]
        else:
            end = position + 1
            while end < len(chunk_keys) and b + end - a < len(keys) and chunk_keys[end] == keys[b + end - a]:
                end += 1
            agreeing[b - a] = (position, end)
        reach = end  # as far as the lines agree: a run of two lines or more, if they say something
        if end < len(chunk_keys):  # nor on over one, short of the chunk's end (its context): new code may
            end = min(next_twice[position + 1], end)  # start there
        # A run ends in lines that say something: whether a `}` or a blank line next to it is the
        # original's or new code's is for the edges to find out (`edges._edge`).
        while not counts(chunk_keys[a]):
            a, b = a + 1, b + 1
        while not counts(chunk_keys[end - 1]):
            end -= 1
        anchors.append(Anchor(b, a, end - a, said_before[reach] - said_before[a]))
    return anchors


def best_chain(keys: list[str], chunk_keys: list[str], anchors: list[Anchor], sums: Sums | None = None) -> list[Anchor]:
    """The anchors that fit together: in order in both, with what lies between two of them in the chunk
    fitting where the original has what lies between them (`fits_between`), saying the most lines, and rather
    ones at the chunk's edges (where a sketch repeats its context). A line of new code that happens to be
    unique in the original (`s = requests.session()`) is left out this way.

    Each anchor extends the best-scored chain before it that it fits after (the first in anchor order
    among equals); the chains are tried best first, and fitting is counted from running sums: a chunk of
    a few thousand one-line anchors (a file that repeats itself, sketched whole) takes milliseconds, not
    minutes."""
    said = [n for n, key in enumerate(chunk_keys) if counts(key)]
    new, old = Sums(chunk_keys), Sums(keys) if sums is None else sums  # (`sums`: the caller's, over `keys`)

    def worth(anchor: Anchor) -> float:
        lines = chunk_keys[anchor.chunk : anchor.chunk + anchor.size]
        edges = (anchor.chunk <= said[0]) + (anchor.chunk + anchor.size > said[-1])
        return float(sum(map(counts, lines)) + 0.5 * edges)

    chains: list[tuple[float, int, list[Anchor]]] = []  # (-score, anchor number, chain), best first
    for number, anchor in enumerate(anchors):
        chain: list[Anchor] = []
        score = 0.0
        for minus_score, _, before in chains:
            last = before[-1]
            new_start, old_start = last.chunk + last.size, last.original + last.size
            if (
                old_start <= anchor.original
                and new_start <= anchor.chunk
                and fits_between(new, new_start, anchor.chunk, old, old_start, anchor.original)
            ):
                chain, score = before, -minus_score
                break
        bisect.insort(chains, (-(score + worth(anchor)), number, [*chain, anchor]), key=lambda c: c[:2])
    return chains[0][2]


class Sums:
    """Running sums over lines, for `fits_between` on any stretch of them at once: brackets opened less
    closed (`balance`), lines that say something (`counts`)."""

    def __init__(self, lines: list[str]) -> None:
        self._balance, self._said = [0], [0]
        for line in lines:
            self._balance.append(self._balance[-1] + line_balance(line))
            self._said.append(self._said[-1] + counts(line))

    def balance(self, start: int, stop: int) -> int:
        return self._balance[stop] - self._balance[start]

    def said(self, start: int, stop: int) -> int:
        return self._said[stop] - self._said[start]


class Stretches(Protocol):
    """What `fits_between` asks of lines: brackets opened less closed and lines that say something, in any
    stretch of them (`Sums`)."""

    def balance(self, start: int, stop: int) -> int: ...

    def said(self, start: int, stop: int) -> int: ...


def fits_between(new: Stretches, new_start: int, new_stop: int, old: Stretches, old_start: int, old_stop: int) -> bool:
    """Whether the chunk's lines `new_start:new_stop` can stand where the original has `old_start:old_stop`:
    they open and close as many brackets, and do not replace much more code than they hold (a unique line
    of new code must not pull the chunk over a screenful of the original's: `replaces_little`)."""
    return (
        new.balance(new_start, new_stop) == old.balance(old_start, old_stop)
        and old.said(old_start, old_stop) <= REPLACED_PER_LINE * new.said(new_start, new_stop) + REPLACED_SLACK
    )


def context_chain(keys: list[str], chunk_keys: list[str], anchors: list[Anchor], sums: Sums) -> list[list[Anchor]]:
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
    said_old = sums.said(first.original + first.size, last.original)
    return [[first, last]] if said_old <= REPLACED_PER_LINE * sum(map(counts, new)) + CONTEXT_SLACK else []


def fits(new: list[str], old: list[str]) -> bool:
    """Whether the chunk's lines `new` can stand where the original has `old` (`fits_between` on them whole)."""
    return fits_between(Sums(new), 0, len(new), Sums(old), 0, len(old))


def replaces_little(old: list[str], new: list[str], slack: int = REPLACED_SLACK) -> bool:
    """Whether lines `new` in place of `old` replace not much more code than they hold (`REPLACED_PER_LINE`)."""
    said_new, said_old = sum(map(counts, new)), sum(map(counts, old))
    return bool(said_old <= REPLACED_PER_LINE * said_new + slack)
