"""A chunk's anchors: its lines that say something and that the original has once after the chunk before,
grown into runs of equal lines, and the chains of them that fit together (`placement`'s rules 1 and 2).
`placement` places the chunk on them.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from dataclasses import dataclass

from specedit.engine.blocks import line_balance
from specedit.engine.merge_checks import counts

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


def find_lines(keys: list[str], cursor: int, wanted: set[str]) -> dict[str, list[int]]:
    """Where each of the `wanted` lines is in the original after `cursor` (line indices, in order)."""
    places: dict[str, list[int]] = {}
    for index in range(cursor, len(keys)):
        if keys[index] in wanted:
            places.setdefault(keys[index], []).append(index)
    return places


def find_anchors(keys: list[str], cursor: int, chunk_keys: list[str]) -> list[Anchor]:
    """The chunk's anchors: its lines that say something and occur once in the original after `cursor`,
    grown into runs of equal lines, in the chunk's order."""
    places = find_lines(keys, cursor, {key for key in chunk_keys if counts(key)})
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
        # original's or new code's is for the edges to find out (`placement._edge`).
        while not counts(chunk_keys[a]):
            a, b = a + 1, b + 1
        while not counts(chunk_keys[end - 1]):
            end -= 1
        anchors.append(Anchor(b, a, end - a, said_before[reach] - said_before[a]))
    return anchors


def best_chain(keys: list[str], chunk_keys: list[str], anchors: list[Anchor]) -> list[Anchor]:
    """The anchors that fit together: in order in both, with what lies between two of them in the chunk
    fitting where the original has what lies between them (`fits_between`), saying the most lines, and rather
    ones at the chunk's edges (where a sketch repeats its context). A line of new code that happens to be
    unique in the original (`s = requests.session()`) is left out this way.

    Each anchor extends the best-scored chain before it that it fits after (the first in anchor order
    among equals); the chains are tried best first, and fitting is counted from running sums: a chunk of
    a few thousand one-line anchors (a file that repeats itself, sketched whole) takes milliseconds, not
    minutes."""
    said = [n for n, key in enumerate(chunk_keys) if counts(key)]
    new, old = Sums(chunk_keys), Sums(keys)

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


def fits_between(new: Sums, new_start: int, new_stop: int, old: Sums, old_start: int, old_stop: int) -> bool:
    """Whether the chunk's lines `new_start:new_stop` can stand where the original has `old_start:old_stop`:
    they open and close as many brackets, and do not replace much more code than they hold (a unique line
    of new code must not pull the chunk over a screenful of the original's: `replaces_little`)."""
    return (
        new.balance(new_start, new_stop) == old.balance(old_start, old_stop)
        and old.said(old_start, old_stop) <= REPLACED_PER_LINE * new.said(new_start, new_stop) + REPLACED_SLACK
    )


def context_chain(keys: list[str], chunk_keys: list[str], anchors: list[Anchor]) -> list[list[Anchor]]:
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
    return [[first, last]] if replaces_little(old, new, CONTEXT_SLACK) else []


def fits(new: list[str], old: list[str]) -> bool:
    """Whether the chunk's lines `new` can stand where the original has `old` (`fits_between` on them whole)."""
    return fits_between(Sums(new), 0, len(new), Sums(old), 0, len(old))


def replaces_little(old: list[str], new: list[str], slack: int = REPLACED_SLACK) -> bool:
    """Whether lines `new` in place of `old` replace not much more code than they hold (`REPLACED_PER_LINE`)."""
    said_new, said_old = sum(map(counts, new)), sum(map(counts, old))
    return bool(said_old <= REPLACED_PER_LINE * said_new + slack)
