"""Where each line of a long text is, so that work on a short text against it (a sketch's chunk, a patch's
hunk) costs what the short one holds, not what the long one does: rescanning the file for every chunk
would make a sketch of thousands of chunks on a file of tens of thousands of lines take minutes.
`LineIndex` finds a line's places by bisection, and `matching_blocks` gives difflib's own matching blocks
of a chunk within the file from those places alone.

>>> index = LineIndex(["a", "b", "c", "a", "b"])
>>> index.places("a", 1), index.count("b", 0, 4)
([3], 1)
>>> matching_blocks(index, ["x", "a", "b"], 2)
[(3, 1, 2)]
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence

# A chunk's line found at most this many times in the searched stretch seeds the search for the longest
# match: the runs through it are followed one by one. Runs of lines found more often are looked at only
# where they could be the longest (a stretch of such lines as long as the best seeded run).
RARE = 8


class LineIndex:
    """The places of each line of `lines` (in order), and how many a stretch holds."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = lines
        self._places: dict[str, list[int]] = {}
        for number, line in enumerate(lines):
            self._places.setdefault(line, []).append(number)

    def places(self, line: str, low: int = 0, high: int | None = None) -> list[int]:
        """Where `line` is among `lines[low:high]`, in order (indices into `lines`)."""
        found = self._places.get(line)
        if not found:
            return []
        start = bisect.bisect_left(found, low) if low else 0
        stop = len(found) if high is None or high >= len(self.lines) else bisect.bisect_left(found, high)
        return found[start:stop]

    def first(self, line: str, low: int = 0) -> int | None:
        """Where `line` is first among `lines[low:]`, if it is."""
        found = self._places.get(line)
        start = bisect.bisect_left(found, low) if found else 0
        return found[start] if found and start < len(found) else None

    def count(self, line: str, low: int = 0, high: int | None = None) -> int:
        """How many of `lines[low:high]` are `line`."""
        found = self._places.get(line)
        if not found:
            return 0
        start = bisect.bisect_left(found, low) if low else 0
        stop = len(found) if high is None or high >= len(self.lines) else bisect.bisect_left(found, high)
        return stop - start


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's `SequenceMatcher(None, a, b, autojunk=False).get_opcodes()`, from `matching_blocks`: a
    chunk of thousands of lines made of a few lines repeated (a file sketched whole) took difflib seconds."""
    joined: list[tuple[int, int, int]] = []
    for i, j, k in [*matching_blocks(LineIndex(a), b), (len(a), len(b), 0)]:
        if joined and joined[-1][0] + joined[-1][2] == i and joined[-1][1] + joined[-1][2] == j:
            joined[-1] = (joined[-1][0], joined[-1][1], joined[-1][2] + k)
        else:
            joined.append((i, j, k))
    answer = []
    i = j = 0
    for ai, bj, size in joined:
        tag = "replace" if i < ai and j < bj else "delete" if i < ai else "insert" if j < bj else ""
        if tag:
            answer.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            answer.append(("equal", ai, i, bj, j))
    return answer


def matching_blocks(
    index: LineIndex, b: Sequence[str], low: int = 0, isjunk: Callable[[str], bool] | None = None
) -> list[tuple[int, int, int]]:
    """difflib's `SequenceMatcher(isjunk, index.lines[low:], b, autojunk=False).get_matching_blocks()`, the
    same blocks (before it joins adjacent ones, and without its final empty one), with their places in
    `index.lines` (not `low` less): found from the places of `b`'s lines, not by reading every line."""
    matcher = _Matcher(index, b, isjunk, low)
    blocks = []
    queue = [(low, len(index.lines), 0, len(b))]
    while queue:  # difflib's own order of ranges
        alo, ahi, blo, bhi = queue.pop()
        i, j, k = found = matcher.longest(alo, ahi, blo, bhi)
        if k:
            blocks.append(found)
            if alo < i and blo < j:
                queue.append((alo, i, blo, j))
            if i + k < ahi and j + k < bhi:
                queue.append((i + k, ahi, j + k, bhi))
    blocks.sort()
    return blocks


class _Matcher:
    """difflib's `find_longest_match` (autojunk off) of `b` within ranges of `index.lines`."""

    def __init__(self, index: LineIndex, b: Sequence[str], isjunk: Callable[[str], bool] | None, low: int) -> None:
        self.a, self.b, self.index = index.lines, b, index
        junk = {line for line in set(b) if isjunk(line)} if isjunk is not None else set()
        self.junk = [line in junk for line in b]
        # Where no line of `b` but junk is in `a` more than once (junk as `merge_checks` has it: a line not
        # once in the file), the place of each: a run is then a row of them, read in `b`'s order.
        self.pairs: list[tuple[int, int]] | None = None
        lines = {line for line, is_junk in zip(b, self.junk, strict=True) if not is_junk}
        if all(index.count(line, low) <= 1 for line in lines):
            found = {line: index.first(line, low) for line in lines}
            self.pairs = [(j, i) for j, line in enumerate(b) if (i := found.get(line)) is not None]
            self.pair_js = [j for j, _ in self.pairs]

    def longest(self, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
        """The longest run of equal lines without junk in `a[alo:ahi]` and `b[blo:bhi]`, the one that
        starts first in `a`, then in `b`; grown over equal junk lines at both ends (difflib's rule).

        Runs through a rare line (`RARE`) are followed from its places; where a stretch of lines found more
        often is as long as the best of them, every place of those lines is read, as difflib does."""
        if self.pairs is not None:
            return self._grown(alo, ahi, blo, bhi, *self._longest_row(alo, ahi, blo, bhi))
        a, b, junk = self.a, self.b, self.junk
        found = [0 if junk[j] else self.index.count(b[j], alo, ahi) for j in range(blo, bhi)]
        longest_common = stretch = 0  # the longest stretch of `b` whose lines are all found, not rarely
        for times in found:
            stretch = stretch + 1 if times > RARE else 0
            longest_common = max(longest_common, stretch)
        best = (alo, blo, 0)
        followed: dict[int, tuple[int, int]] = {}  # per diagonal, the last run followed on it (from, to in `a`)
        for j in range(blo, bhi):
            if not 0 < found[j - blo] <= RARE:
                continue
            for i in self.index.places(b[j], alo, ahi):
                run = followed.get(i - j)
                if run is not None and run[0] <= i < run[1]:
                    continue  # (seeds come in `b`'s order: a diagonal's runs in order too)
                start_i, start_j = i, j
                while start_i > alo and start_j > blo and not junk[start_j - 1] and a[start_i - 1] == b[start_j - 1]:
                    start_i, start_j = start_i - 1, start_j - 1
                size = j - start_j + 1
                while start_i + size < ahi and start_j + size < bhi and not junk[start_j + size]:
                    if a[start_i + size] != b[start_j + size]:
                        break
                    size += 1
                followed[i - j] = (start_i, start_i + size)
                if (size, -start_i, -start_j) > (best[2], -best[0], -best[1]):
                    best = (start_i, start_j, size)
        if best[2] <= longest_common:
            best = self._read_all(alo, ahi, blo, bhi, found)
        return self._grown(alo, ahi, blo, bhi, *best)

    def _longest_row(self, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
        """`longest` where each line of `b` (but junk) is in `a` once at most (`pairs`)."""
        best, size, before = (alo, blo, 0), 0, (-2, -2)
        assert self.pairs is not None
        for k in range(bisect.bisect_left(self.pair_js, blo), bisect.bisect_left(self.pair_js, bhi)):
            j, i = self.pairs[k]
            if not alo <= i < ahi:
                continue
            size = size + 1 if before == (j - 1, i - 1) else 1
            before = (j, i)
            if (size, -(i - size + 1), -(j - size + 1)) > (best[2], -best[0], -best[1]):
                best = (i - size + 1, j - size + 1, size)
        return best

    def _read_all(self, alo: int, ahi: int, blo: int, bhi: int, found: list[int]) -> tuple[int, int, int]:
        """difflib's search itself, over the places of `b`'s lines only (a line of `a` that `b` lacks ends
        every run), stopping once a run is as long as any could be."""
        a, b = self.a, self.b
        b2j: dict[str, list[int]] = {}
        possible = stretch = 0  # the longest stretch of `b` whose lines are all found
        for j in range(blo, bhi):
            stretch = stretch + 1 if found[j - blo] else 0
            possible = max(possible, stretch)
            if found[j - blo]:
                b2j.setdefault(b[j], []).append(j)
        # In order, as they are read: the search often stops at the first places.
        places = heapq.merge(*(self.index.places(line, alo, ahi) for line in b2j))
        besti, bestj, bestsize = alo, blo, 0
        j2len: dict[int, int] = {}
        before = alo - 2
        for i in places:
            if i != before + 1:
                j2len = {}
            new_j2len = {}
            for j in b2j[a[i]]:
                k = new_j2len[j] = j2len.get(j - 1, 0) + 1
                if k > bestsize:
                    besti, bestj, bestsize = i - k + 1, j - k + 1, k
            j2len, before = new_j2len, i
            if bestsize == possible:
                break
        return besti, bestj, bestsize

    def _grown(self, alo: int, ahi: int, blo: int, bhi: int, i: int, j: int, k: int) -> tuple[int, int, int]:
        """The match grown as difflib grows it: over equal lines that are not junk, then over junk ones."""
        a, b, junk = self.a, self.b, self.junk
        for is_junk in (False, True):
            while i > alo and j > blo and junk[j - 1] == is_junk and a[i - 1] == b[j - 1]:
                i, j, k = i - 1, j - 1, k + 1
            while i + k < ahi and j + k < bhi and junk[j + k] == is_junk and a[i + k] == b[j + k]:
                k += 1
        return i, j, k
