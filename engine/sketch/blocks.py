"""Blocks of code as their indentation shows them: a first line (`def f():`, `func F() {`, `it 'adds' do`),
the lines after it deeper than it, and the closing line at its own indentation where the language has one
(`}`, `end`; the `{` may stand under the first line, as PHP's PSR-2 writes methods). A chat model shows "the
function, changed" as one such block, under its doc comment or annotations if it has them (which then stand
for the original's right above the block: `comment_above`): `placement` puts a chunk that is one over the
original's block of the same first line, and `merge_checks` lets a sketch that is one block and nothing else
delete the last lines of that block, and a chunk that shows one from its first line to its closing one
change all of it."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from specedit.engine.sketch.line_index import LineIndex

# A comment's or an annotation's line: what may stand right above a block's first line, as part of it.
# A C preprocessor line is code, not a comment: it opens or closes what it stands above. Only the
# directives no Python comment begins with may have spaces after the `#` (`#  ifdef`).
_DIRECTIVE = (
    r"#(?:if|ifdef|ifndef|elif|else|endif|define|undef|include|pragma)\b|#\s+(?:ifdef|ifndef|elif|endif|undef|pragma)\b"
)
_ABOVE = re.compile(rf"^(?!{_DIRECTIVE})(?:#|//|/\*|\*|@)")
# A block whose first line the original has more often than this is not looked for between two blocks a
# sketch shows (`omitted`): which of them it is takes reading each (a test file of `it(...)` blocks).
MAX_ALIKE = 8
# A block's first line that goes on with the statement before it, not a block of its own.
_GOES_ON = re.compile(r"^(?:else|elif|elsif|except|finally|catch|rescue|ensure|when|case)\b")


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


def find_block(lines: list[str], shown: Shown, low: int = 0, starts: list[int] | None = None) -> tuple[int, int] | None:
    """Where the original's block of the line that `shown`'s first line is starts and stops (`block_stop`),
    if `lines[low:]` has that line once (compared stripped); else None. `starts`: where that line is in
    `lines[low:]`, where the caller knows."""
    if starts is None:
        starts = [number for number in range(low, len(lines)) if lines[number].strip() == shown.first]
    if len(starts) != 1 or (stop := block_stop(lines, starts[0], shown)) is None:
        return None
    return starts[0], stop


def block_holding(
    lines: list[str], shown: Shown, held: list[str], starts: list[int] | None = None
) -> tuple[int, int] | None:
    """Of the original's blocks whose first line is `shown`'s (`block_stop`), the one that holds the most of
    the lines `held` (distinct lines, compared stripped), if one holds more than every other; else None. Two `equals`
    methods of two classes, each shown whole: each is the one holding its own class's name. `starts`: where
    the lines that are `shown`'s first are, where the caller knows (a sketch of many blocks asks for each)."""
    wanted = {line.strip() for line in held if line.strip()}
    if starts is None:
        starts = [number for number in range(len(lines)) if lines[number].strip() == shown.first]
    blocks = [(number, stop) for number in starts if (stop := block_stop(lines, number, shown)) is not None]
    ranked = sorted(((len(wanted & {line.strip() for line in lines[a:b]}), (a, b)) for a, b in blocks), reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0][0] == ranked[1][0]):
        return None
    return ranked[0][1]


def omitted(lines: list[str], run: list[str], index: LineIndex | None = None) -> list[tuple[int, int, int]]:
    """The original's lines that a run of a sketch's lines (between two markers) neither shows nor marks:
    those between a block it shows whole and the next block it shows, right after it at its indentation
    (chat models leave out the marker between two functions they show, as they leave out the first and
    last). Each as (where the next block, or the comments above it, begins in `run`; the original's first
    line left out; the line after the last). None where the original's blocks are not found: a block whose
    first line changed, or that is in several places alike, or a next block that is new code.

    `index`: where each of the original's lines is, stripped (`line_index.LineIndex`), where the caller
    has it.

    >>> original = ["def a():", "    return 1", "", "def b():", "    return 2", "", "def c():", "    return 3"]
    >>> omitted(original, ["def a():", "    return 10", "", "def c():", "    return 3"])
    [(3, 3, 6)]
    """
    index = LineIndex([line.strip() for line in lines]) if index is None else index
    found: list[tuple[int, int, int]] = []
    said = [number for number, line in enumerate(run) if line.strip()]
    opened: dict[int, int] = {}  # per indentation, the last line of `run` there that may open a block
    for at, (before, line) in enumerate(zip([None, *said[:-1]], said, strict=True)):
        depth = indent(run[line])
        if before is not None and has_words(run[line]) and depth in opened:
            last = run[before]
            if indent(last) > depth or (indent(last) == depth and _closes(last)):
                found += _between(lines, index, run[opened[depth] : line], run, said[at:])
        if has_words(run[line]) and not _closes(run[line]):
            opened = {level: number for level, number in opened.items() if level < depth}
            opened[depth] = line
    return found


def _between(
    lines: list[str], index: LineIndex, block: list[str], run: list[str], rest: list[int]
) -> list[tuple[int, int, int]]:
    """For `omitted`: the original's lines between the block `block` shows whole and the block that the
    run's next lines show (`rest`: their positions in `run`, the first at the block's indentation)."""
    said = [line for line in block if line.strip()]
    shown = shown_block(block)
    if shown is None and len(said) == 2 and has_words(said[0]) and indent(said[1]) > indent(said[0]):
        shown = Shown(said[0].strip(), "")  # a block of two lines is whole too (`shown_block` asks three)
    if shown is None or not 0 < index.count(shown.first) <= MAX_ALIKE:
        return []
    if (place := block_holding(lines, shown, block, index.places(shown.first))) is None:
        return []
    depth, start = indent(lines[place[0]]), place[1]
    while start < len(lines) and not lines[start].strip():
        start += 1
    above = lines_above([run[number] for number in rest])  # the next block's comments and annotations
    following = rest[above:]
    if len(following) < 2 or indent(run[following[1]]) <= indent(run[following[0]]):
        return []  # no block: a statement after a block may follow a deletion the sketch shows
    level = indent(run[following[0]])
    next_block = following[:1] + list(itertools.takewhile(lambda number: indent(run[number]) > level, following[1:]))
    # The first of the next block's lines (its first line, then the deeper ones) that the original has
    # once from there on, and the first line of the original's block that holds it.
    keys = [run[number].strip() for number in next_block]
    at = next((index.first(key, start) for key in keys if index.count(key, start) == 1), None)
    if at is None:
        return []
    while at > start and not (has_words(lines[at]) and indent(lines[at]) <= depth):
        at -= 1
    if indent(lines[at]) != depth or not has_words(lines[at]):
        return []
    # Less the comments above it that the sketch shows (a blank line may stand between them and it).
    shown_above = [run[number].strip() for number in rest[:above]]
    stop = at
    while shown_above and stop > start:
        if lines[stop - 1].strip() == shown_above[-1]:
            shown_above.pop()
        elif lines[stop - 1].strip():
            break
        stop -= 1
    stop = comment_above(lines, stop, start, [run[number] for number in rest[:above]])
    return [(rest[0], start, stop)] if _whole_blocks(lines[start:stop], depth) else []


def _whole_blocks(lines: list[str], depth: int) -> bool:
    """Whether `lines` are blocks whole at `depth` and nothing else (comments and blank lines aside): each
    a first line there (not one that goes on with the statement before it: `else:`, `except`) with deeper
    lines after it, and a closing line there if it has one. Statements between two blocks shown are a
    deletion the sketch shows by the lines around it, as a block's `else:` is part of that block."""
    said = [line for line in lines if line.strip() and not _ABOVE.match(line.strip())]
    opens = 0
    for number, line in enumerate(said):
        if indent(line) > depth:
            continue
        if indent(line) < depth:
            return False
        if _closes(line) and number > 0:
            continue
        deeper = number + 1 < len(said) and indent(said[number + 1]) > depth
        if not has_words(line) or _GOES_ON.match(line.strip()) or not deeper:
            return False
        opens += 1
    return opens > 0


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
    opened = line.count("(") + line.count("[") + line.count("{")  # (not a generator: asked of every line)
    return opened - line.count(")") - line.count("]") - line.count("}")
