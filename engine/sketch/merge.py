"""The deterministic merge of an edit sketch: each chunk (a run of lines between elision markers,
`merge_checks.is_elision`) put in place by lines it shares with the original, in order, each after the one
before, each replacing a span of the original (`placement` says where, and by which rules). A merge these
rules cannot finish is *unresolved* (`SketchMerge.unresolved` says why): the model writes the answer
then, with the partial merge as the copy drafter's draft. Measured on sketches of real edits (see
docs/benchmarks.md, "Edit sketches").
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from dataclasses import dataclass

from rapidfuzz.distance import Indel

from specedit.engine.sketch.anchors import Original
from specedit.engine.sketch.blocks import indent, omitted, past_deeper
from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline
from specedit.engine.sketch.edges import common_length, is_change_of
from specedit.engine.sketch.merge_checks import check_merge, counts, is_elision
from specedit.engine.sketch.patches import Patch, SketchFormat, apply_patch, detect, parse_patch
from specedit.engine.sketch.placement import Chunk, Placement, place_chunks

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


def merge_sketch(
    original: str,
    sketch: str,
    sketch_format: SketchFormat = "auto",
    *,
    patch: Patch | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> SketchMerge:
    """`sketch` merged into `original` where its chunks say where they go (by `placement.place_chunks`'
    rules); in the original's line endings. A sketch written as a patch (a unified diff, SEARCH/REPLACE
    blocks, a V4A patch: `patches`, found in its text with `auto`) is applied by its hunks' lines instead
    (`patch`, where it was parsed already), and checked the same way. The merge's loops check `deadline`
    between two pieces of work (`deadline.Deadline`). A request's sketch is merged once, by `sketch.Sketch`.

    A chunk that cannot be placed, a merge that has a block twice in a row where neither the original nor
    the sketch has (a deletion the sketch shows like a change), or a merge that `merge_checks` refuses,
    leaves the merge unresolved.

    No chunk deletes code it neither shows nor marks: where it shows two blocks one after the other (two
    functions, no marker between them: chat models leave it out) and the original has blocks between them,
    those stay (`blocks.omitted`), and the checks refuse an answer without them. A deletion there is shown
    by the lines around it (`return 1` then `def b():`), not by two blocks whole.

    A sketch with markers that has none at its start (or end) is read two ways there: as eliding what
    comes before its first chunk (after its last), and as starting (ending) the file there. A chat model
    often leaves out the first and last markers ("here is the updated method:"), and the second reading
    then deletes every line it was not shown; so the first is the merge, and the second only where the
    first cannot place the chunks (the end alone, the start alone, then both; the checks still refuse a
    merge that deletes code the sketch does not show), or where the sketch's edge is a change of the
    file's, or a doubt between them (`_edge_reading`).

    >>> original = "def f():\\n    return 1\\n\\n\\ndef g():\\n    return 2\\n"
    >>> sketch = "# ... existing code ...\\ndef g():\\n    return 3\\n"
    >>> merge_sketch(original, sketch).text
    'def f():\\n    return 1\\n\\n\\ndef g():\\n    return 3\\n'
    """
    crlf = "\r\n" in original
    original = original.replace("\r\n", "\n")
    sketch = sketch.replace("\r\n", "\n")
    written_as = detect(sketch, original) if sketch_format == "auto" else sketch_format
    if written_as != "lazy":
        patch = parse_patch(sketch, written_as) if patch is None else patch
        text, unresolved = apply_patch(original, patch, deadline)
        if not unresolved:
            check = check_merge(original, sketch, text, written_as, patch=patch, deadline=deadline)
            unresolved = () if check.ok else (f"the merge fails its checks: {check.describe()}",)
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
        return _reading(original, sketch, lines, sketch_lines, _at_edges(chunks, *edges), deadline)

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
    original: str, sketch: str, lines: list[str], sketch_lines: list[str], chunks: list[Chunk], deadline: Deadline
) -> SketchMerge:
    """The merge of `chunks` into the original's `lines` (newlines only), checked: with each chunk that
    shows a block whole replacing the rest of the original's block (`_block_end`), unless that merge
    fails where the plain placements pass (the rest was old code the sketch does not touch)."""
    read = Original(lines)
    keys = read.keys
    placed = place_chunks(chunks, read, deadline).steps
    steps = [
        (_keeping_omitted(read, chunk, place, deadline), why)
        for chunk, (place, why) in zip(chunks, placed, strict=True)
    ]
    said = [line for line in sketch_lines if line.strip()]
    open_end = bool(said) and not is_elision(said[-1]) and any(is_elision(line) for line in said)

    def assembled(stops: list[int]) -> SketchMerge:
        """The merge with each placed chunk replacing the original's lines from its start to its stop."""
        merged: list[str] = []
        unresolved: list[str] = []
        cursor = 0  # the original's lines before it are placed (copied or replaced)
        for (place, why), stop in zip(steps, stops, strict=True):
            if why:
                unresolved.append(why)
            if place:
                merged += lines[cursor : place.start] + place.lines
                cursor = stop
        if chunks and (chunks[-1].at_end or open_end) and not "".join(lines[cursor:]).strip():
            # The chunk ending the file ends it with the blank lines the sketch ends with, if it shows any
            # (a copied answer loses them), else the original's.
            merged += ["\n"] * (_blank_end(sketch_lines) or _blank_end(lines))
            cursor = len(lines)
        merged += lines[cursor:]
        text = "".join(merged)
        if not original.endswith("\n"):
            text = text.removesuffix("\n")
        if not unresolved and (doubled := _doubled_anew(merged, lines, sketch_lines, deadline)):
            unresolved.append(f"the merge has {doubled[0]!r} and the lines after it twice in a row")
        if not unresolved:
            check = check_merge(original, sketch, text, "lazy", deadline=deadline)
            if not check.ok:
                unresolved.append(f"the merge fails its checks: {check.describe()}")
        return SketchMerge(text, tuple(unresolved))

    plain = [place.stop if place else 0 for place, _ in steps]
    stops = [*plain]
    known, limit = set(keys), len(lines)  # a stop goes no further than the next chunk's placement
    for number in reversed(range(len(steps))):
        if place := steps[number][0]:
            stops[number] = _block_end(chunks[number], place, lines, known, limit)
            limit = place.start
    merge = assembled(stops)
    if merge.resolved or stops == plain:
        return merge
    return assembled(plain)


def _keeping_omitted(original: Original, chunk: Chunk, place: Placement | None, deadline: Deadline) -> Placement | None:
    """`place` with the original's lines put back that the chunk neither shows nor marks, between two
    blocks it shows one after the other (`blocks.omitted`: a chat model left out the marker between two
    functions), where the placement replaced them."""
    deadline.check()
    if place is None:
        return None
    lines = [*place.lines]  # a line for each of the chunk's lines
    for position, start, stop in reversed(omitted(original.lines, chunk.lines, original.index)):
        if place.start <= start and stop <= place.stop:
            lines[position:position] = original.lines[start:stop]
    return dataclasses.replace(place, lines=lines)


def _block_end(chunk: Chunk, place: Placement, lines: list[str], keys: set[str], limit: int) -> int:
    """Where the placement of a chunk that shows one block whole ends: past the rest of the original's block.

    A chunk that is a block (its first lines at one indentation, `def f():` and its decorators, the rest
    deeper), whose last line that says something is new code (neither the original's nor a change of the
    line it lands on, as `s += item.price * 2` is of `s += item.price`: the block goes on after such a
    line; a call's closing `)` after it says nothing) and whose
    marker after it is no deeper than its first line (it stands for what follows the block, not for
    more of it), replaced the block to its end: the original's lines after the placement that are still
    deeper (a `pass` the new code replaces, the `plt.show()` a rewritten plot drops) go, up to
    `FEW_LINES` that say something (more is a block the chunk did not show whole). A block that ends in
    a line of its own (`}`, `end`) is placed by it. Indentations are the sketch's among its lines, the
    original's among its own (a sketch may write the file's tabs as spaces)."""
    said = [line for line in chunk.lines if line.strip()]
    level = indent(said[0])
    depths = [indent(line) > level for line in said]
    last = next((line.strip() for line in reversed(said) if counts(line)), said[-1].strip())  # not a `)`
    start, stop = place.start, place.stop
    shows_block = (
        chunk.marker_after
        and indent(chunk.marker_after) <= level
        and depths[-1]
        and all(depths[depths.index(True) :])
        and last not in keys
        and start < stop
        and lines[start].strip() == said[0].strip()
        and not is_change_of(last, lines[stop - 1].strip())
    )
    if not shows_block:
        return stop
    end = past_deeper(lines, indent(lines[start]), stop, limit)
    while end > stop and not lines[end - 1].strip():
        end -= 1
    rest = sum(map(counts, lines[stop:end]))
    return end if rest <= FEW_LINES else stop


def _at_edges(chunks: list[Chunk], starts: bool, ends: bool) -> list[Chunk]:
    """The chunks with the first one starting the file (`starts`), the last one ending it (`ends`)."""
    if not chunks:
        return chunks
    edged = [*chunks]
    edged[0] = dataclasses.replace(edged[0], at_start=starts)
    edged[-1] = dataclasses.replace(edged[-1], at_end=ends)
    return edged


def _edge_reading(side: str, chunks: list[Chunk], original: str, elided: str, edged: str) -> tuple[bool, str]:
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
        alike = next((number for number, change in enumerate(changes) if is_change_of(change, line)), None)
        if alike is None:
            return False
        del changes[alike]
    return bool(old)


def _same_edge(side: str, chunks: list[Chunk], original: str) -> bool:
    """Whether the sketch's lines at its start (`side`) or end are the original's first (last) lines: as
    many of them as hold two lines that say something, compared stripped, blank lines left out."""
    said = [line.strip() for line in (chunks[0] if side == "start" else chunks[-1]).lines if line.strip()]
    file = [line.strip() for line in original.splitlines() if line.strip()]
    if side == "end":
        said, file = said[::-1], file[::-1]
    same = common_length(said, file)
    return sum(map(counts, said[:same])) >= 2


def _changed_into(old: str, new: str) -> bool:
    """Whether the original's line `old` may have become the sketch's `new`: alike, or its words all in it."""
    words = set(_WORD.findall(old))
    return old == new or is_change_of(new, old) or (len(words) >= 2 and words <= set(_WORD.findall(new)))


def _doubled_anew(merged: list[str], original: list[str], sketch: list[str], deadline: Deadline) -> tuple[str, ...]:
    """A block the merge has twice in a row where neither the original nor the sketch has it so (a
    placement that put a changed block beside the one it changes, or a deletion shown like a change);
    empty if none."""
    doubled = _doubled(merged, deadline)
    if doubled:
        doubled -= _doubled(original, deadline) | _doubled(sketch, deadline)
    return min(doubled, default=())


def _doubled(lines: list[str], deadline: Deadline, longest: int = 24) -> set[tuple[str, ...]]:
    """The blocks of two lines or more, saying something, that `lines` has twice in a row (compared
    stripped), up to `longest` lines."""
    keys = [line.strip() for line in lines]
    said = [0]  # said[k]: how many of the first k lines say something (a block's count in O(1))
    for key in keys:
        said.append(said[-1] + counts(key))
    found = set()
    for size in range(2, longest + 1):
        deadline.check()
        run = 0  # how many lines up to here equal the line `size` after them
        for start in range(len(keys) - size):
            run = run + 1 if keys[start] == keys[start + size] else 0
            if run >= size and said[start + 1] - said[start - size + 1] >= 2:
                found.add(tuple(keys[start - size + 1 : start + 1]))
    return found


def _blank_end(lines: list[str]) -> int:
    """How many blank lines `lines` ends with."""
    return next((number for number, line in enumerate(reversed(lines)) if line.strip()), len(lines))


def _lines(text: str) -> list[str]:
    """The lines of `text`, each ending in a newline (the last one too)."""
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]


def _chunks(sketch_lines: list[str]) -> list[Chunk]:
    runs: list[list[str]] = [[]]
    markers = []  # markers[k]: the marker after runs[k]
    for line in sketch_lines:
        if is_elision(line):
            markers.append(line)
            runs.append([])
        else:
            runs[-1].append(line)
    chunks = []
    for run, before, after in zip(runs, ["", *markers], [*markers, ""], strict=True):
        while run and not run[0].strip():
            run.pop(0)
        while run and not run[-1].strip():
            run.pop()
        if run:  # a chunk without a marker before (after) it is read both ways: see `merge_sketch`
            chunks.append(Chunk(run, False, False, after, before))
    return chunks
