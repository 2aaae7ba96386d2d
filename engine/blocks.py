"""Blocks of code as their indentation shows them: a first line (`def f():`, `func F() {`, `it 'adds' do`),
the lines after it deeper than it, and the closing line at its own indentation where the language has one
(`}`, `end`; the `{` may stand under the first line, as PHP's PSR-2 writes methods). A chat model shows "the
function, changed" as one such block, under its doc comment or annotations if it has them (which then stand
for the original's right above the block: `comment_above`): `placement` puts a chunk that is one over the
original's block of the same first line, and `merge_checks` lets a sketch that is one block and nothing else
delete the last lines of that block, and a chunk that shows one from its first line to its closing one
change all of it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A comment's or an annotation's line: what may stand right above a block's first line, as part of it.
_ABOVE = re.compile(r"^(?:#|//|/\*|\*|@)")


@dataclass(frozen=True)
class Shown:
    """A block that lines show whole."""

    first: str  # its first line, stripped
    closing: str  # its closing line, stripped ("" where it has none: Python)
    brace_below: bool = False  # its `{` on a line of its own under the first (PHP's PSR-2 methods, C#)


def shown_block(lines: list[str]) -> Shown | None:
    """The block `lines` show whole, if they are one (blank lines aside): three lines at least, the first
    with a letter or digit, every other one deeper, but for a closing line at the first one's indentation
    (without words, or `end`), and a `{` under the first line at its indentation where the block closes."""
    said = [line for line in lines if line.strip()]
    if len(said) < 3 or not has_words(said[0]):
        return None
    level = indent(said[0])
    below = said[1].strip() == "{" and indent(said[1]) == level
    closes = indent(said[-1]) == level and _closes(said[-1])
    body = said[1 + below : -1] if closes else said[1:]
    if not body or any(indent(line) <= level for line in body):
        return None
    return Shown(said[0].strip(), said[-1].strip() if closes else "", below)


def lines_above(lines: list[str]) -> int:
    """How many of `lines` come before the first line of a block they show: blank lines, a doc comment's,
    annotations."""
    count = 0
    while count < len(lines) and (not lines[count].strip() or _ABOVE.match(lines[count].strip())):
        count += 1
    return count


def comment_above(lines: list[str], start: int, low: int, like: list[str]) -> int:
    """Where the comment or annotation lines right above the block at `lines[start]` begin (not before `low`),
    those of them begun as one of `like` is (`//`, `#`, `/*` and `*`, `@`: a chunk's own lines above the
    block, which stand for them; not a C file's `#include` above a function shown with a `//` comment)."""
    kinds = {_kind(line) for line in like if line.strip()}
    while start > low and lines[start - 1].strip() and _kind(lines[start - 1]) in kinds:
        start -= 1
    return start


def _kind(line: str) -> str | None:
    """How a comment or annotation line begins (a `/*` comment's lines all one kind), None for another line."""
    found = _ABOVE.match(line.strip())
    return None if found is None else {"/*": "*"}.get(found.group(), found.group())


def block_stop(lines: list[str], start: int, shown: Shown) -> int | None:
    """Where the block of `lines` that starts at `lines[start]` stops, read as `shown` is: past its last line
    deeper than its first (blank lines after it left out), and past its closing line where `shown` has one.
    None where it has not that closing line, or does not close the brackets it opens (a triple-quoted
    string going on at a lower indentation is no end of a method)."""
    depth = indent(lines[start])
    body = start + 1
    if shown.brace_below:
        body = past_deeper(lines, depth, body, len(lines))  # the `{` line, past blank ones
        if body == len(lines) or lines[body].strip() != "{" or indent(lines[body]) != depth:
            return None
        body += 1
    stop = past_deeper(lines, depth, body, len(lines))
    closed = stop < len(lines) and indent(lines[stop]) == depth and _closes(lines[stop])
    if shown.closing:
        if not closed or lines[stop].strip() != shown.closing:
            return None
        stop += 1
    elif closed:  # the original's block closes (`}`, `end`) where the one shown does not: not shown whole
        return None
    else:
        while not lines[stop - 1].strip():
            stop -= 1
    return stop if balance(lines[start:stop]) == 0 else None


def find_block(lines: list[str], shown: Shown, low: int = 0) -> tuple[int, int] | None:
    """Where the original's block of the line that `shown`'s first line is starts and stops (`block_stop`),
    if `lines[low:]` has that line once (compared stripped); else None."""
    starts = [number for number in range(low, len(lines)) if lines[number].strip() == shown.first]
    if len(starts) != 1 or (stop := block_stop(lines, starts[0], shown)) is None:
        return None
    return starts[0], stop


def block_holding(lines: list[str], shown: Shown, held: list[str]) -> tuple[int, int] | None:
    """Of the original's blocks whose first line is `shown`'s (`block_stop`), the one that holds the most of
    the lines `held` (distinct lines, compared stripped), if one holds more than every other; else None. Two `equals`
    methods of two classes, each shown whole: each is the one holding its own class's name."""
    wanted = {line.strip() for line in held if line.strip()}
    blocks = [
        (number, stop)
        for number in range(len(lines))
        if lines[number].strip() == shown.first and (stop := block_stop(lines, number, shown)) is not None
    ]
    ranked = sorted(((len(wanted & {line.strip() for line in lines[a:b]}), (a, b)) for a, b in blocks), reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0]):
        return None
    return ranked[0][1]


def past_deeper(lines: list[str], depth: int, at: int, limit: int) -> int:
    """The first of `lines[at:limit]` that is neither blank nor indented deeper than `depth` (`limit` if
    none is): where a block whose first line is at `depth` goes on to."""
    while at < limit and (not lines[at].strip() or indent(lines[at]) > depth):
        at += 1
    return at


def _closes(line: str) -> bool:
    """Whether `line` may close a block: no words (`}`, `});`), or `end`."""
    return not has_words(line) or line.strip() == "end"


def indent(line: str) -> int:
    """How deep `line` is indented, a tab as 4 spaces."""
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def has_words(line: str) -> bool:
    """Whether a line has a letter or digit: `x = 1` does, `});` does not (too little to anchor, enough
    to tell a changed line or a doubled one)."""
    return any(c.isalnum() for c in line)


def balance(lines: list[str]) -> int:
    """Brackets opened minus brackets closed (strings and comments not told apart: an estimate)."""
    return sum(map(line_balance, lines))


def line_balance(line: str) -> int:
    """Brackets `line` opens minus those it closes."""
    return sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
