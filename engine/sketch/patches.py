"""Edits as models also write them: unified diffs, aider's SEARCH/REPLACE blocks, OpenAI's V4A patches.
Beside a lazy sketch (`merge.py`: the changed parts, `// ... existing code ...` for the rest), a chat model
answers "change this file" with one of these three formats (`parse_patch` describes each), each a list of
*hunks*: the lines the original has there (context and the lines taken out) and the lines that replace
them. This module finds a sketch's format (`detect`), reads its hunks (`parse_patch`) and places them by
their lines (`apply_patch`); a patch that cannot be placed leaves the merge to the model
(`merge.merge_sketch`), whose answer is checked against the patch's lazy sketch (`as_sketch`: each hunk's
new lines, between markers) like any other (`merge_checks`).
"""

from __future__ import annotations

import difflib
import functools
import itertools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from specedit.engine.records.requests import SKETCH_FORMATS as SKETCH_FORMATS
from specedit.engine.records.requests import SketchFormat as SketchFormat
from specedit.engine.sketch.deadline import NO_DEADLINE, Deadline

PatchFormat = Literal["udiff", "search-replace", "v4a"]
WrittenFormat = Literal["lazy", "udiff", "search-replace", "v4a"]  # a sketch's format, as `detect` finds it

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_ANY_HUNK_HEADER = re.compile(r"^@@(?: .*)?$")
_SEARCH = re.compile(r"^<{5,9} ?SEARCH\b")
_DIVIDER = re.compile(r"^={5,9}\s*$")
_REPLACE = re.compile(r"^>{5,9} ?REPLACE\b")
_COMPARISONS: tuple[Callable[[str], str], ...] = (str.rstrip, str.strip)
# How many of a sketch's first lines (not blank) may open a patch: a file's name, a fence, the patch's
# first line.
OPENING = 3
_NEW_FILE = re.compile(r"^\+\+\+ ")
_FILE_HEADERS = re.compile(r"^--- .*\n\+\+\+ ", re.MULTILINE)
_CHANGE = re.compile(r"^[+-](?!\+\+|--)", re.MULTILINE)  # a line taken out or put in, not a file's header
_BEGIN_PATCH = re.compile(r"^[ \t]*\*\*\* Begin Patch[ \t]*$")
_V4A_FILE = re.compile(r"^\*\*\* (Update|Add|Delete) File: (.+?)\s*$")
# The lines of a patch's own syntax: a merge that holds them (and an original that does not) wrote the
# patch into the file instead of applying it.
SYNTAX = re.compile(
    r"^(?:@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@|@@ \.\.\. @@|<{7} SEARCH|>{7} REPLACE|\*\*\* Begin Patch|"
    r"\*\*\* End Patch|\*\*\* Update File: |--- a/|\+\+\+ b/)"
)


@dataclass(frozen=True)
class Hunk:
    old: tuple[str, ...]  # the lines the original has there (context and lines taken out), without newlines
    new: tuple[str, ...]  # the lines that replace them
    context: tuple[int | None, ...] = ()  # per new line, the old line it is (a context line), or None
    line: int | None = None  # where the patch says `old` starts (1-based), if it says
    scope: str | None = None  # a line `old` comes after (V4A's `@@ def f():`), if it names one


@dataclass(frozen=True)
class Patch:
    format: PatchFormat
    files: tuple[tuple[str | None, tuple[Hunk, ...]], ...]  # (path, hunks) per file, in the patch's order


def detect(sketch: str, original: str = "") -> WrittenFormat:
    """The format `sketch` is written in: a patch's syntax where it has some that the original has not
    (editing a diff file is not a diff), or where it opens with it (within its first `OPENING` lines:
    a file name and a fence may come first; SEARCH/REPLACE blocks that edit aider's own parser, whose
    source holds the markers), else a lazy sketch."""
    lines = sketch.splitlines()
    text = "\n".join(lines)  # searched whole, not a line at a time: a sketch may have 100,000s of lines
    own = set(original.splitlines())

    def has(pattern: re.Pattern[str]) -> bool:
        return any(line.group(0) not in own for line in _whole_lines(pattern).finditer(text))

    found = _written_as(text, has)
    if found is None:  # the original's own syntax: a patch only if the sketch opens with it and it applies
        opening = list(itertools.islice((line for line in lines if line.strip()), OPENING))
        found = _written_as(text, lambda pattern: any(pattern.match(line) for line in opening))
        if found is not None and apply_patch(original, parse_patch(sketch, found))[1]:
            found = None
    return found or "lazy"


def _written_as(text: str, has: Callable[[re.Pattern[str]], bool]) -> PatchFormat | None:
    """The patch format whose syntax `has` finds (a patch's own markers), with the lines it needs
    anywhere in the sketch's `text` (the markers that close a SEARCH/REPLACE block, a diff's changes)."""
    if has(_BEGIN_PATCH) or has(_V4A_FILE):
        return "v4a"
    if has(_SEARCH) and _whole_lines(_REPLACE).search(text):
        return "search-replace"
    headers = has(_NEW_FILE) and _FILE_HEADERS.search(text)
    if _CHANGE.search(text) and (has(_HUNK_HEADER) or has(_ANY_HUNK_HEADER) or headers):
        return "udiff"
    return None


@functools.cache
def _whole_lines(pattern: re.Pattern[str]) -> re.Pattern[str]:
    """`pattern` (anchored at a line's start) for a whole text: each line it matches, whole."""
    return re.compile(f"(?:{pattern.pattern}).*", re.MULTILINE)


def parse_patch(text: str, format: PatchFormat) -> Patch:
    """The hunks of `text`, a patch in `format`, per file:

    - `udiff`: a unified diff (`--- a/x.py` / `+++ b/x.py`, `@@ -12,7 +12,8 @@`, then ` `, `-` and `+`
      lines). Models get the numbers and counts wrong, write `@@ ... @@`, or leave a blank context line
      without its space: the numbers are only a hint where the lines occur more than once, and a hunk ends
      where its lines do.
    - `search-replace`: aider's blocks (`<<<<<<< SEARCH`, the lines to find, `=======`, their replacement,
      `>>>>>>> REPLACE`), each applied to the file as the blocks before it left it, in any order.
    - `v4a`: OpenAI's `apply_patch` format (`*** Begin Patch`, `*** Update File: x.py`, hunks after `@@` or
      `@@ def f():` naming a line they come after, ` `/`-`/`+` lines, `*** End Patch`).
    """
    lines = [line.rstrip("\r") for line in text.replace("\r\n", "\n").split("\n")]
    if format == "udiff":
        return Patch(format, _parse_udiff(lines))
    if format == "search-replace":
        return Patch(format, _parse_search_replace(lines))
    return Patch(format, _parse_v4a(lines))


def _parse_udiff(lines: list[str]) -> tuple[tuple[str | None, tuple[Hunk, ...]], ...]:
    files: list[tuple[str | None, list[Hunk]]] = []
    hunk: _Lines | None = None  # the hunk being read

    def close() -> None:
        nonlocal hunk
        if hunk is not None and (made := hunk.hunk()):
            if not files:
                files.append((None, []))
            files[-1][1].append(made)
        hunk = None

    for number, line in enumerate(lines):
        following = lines[number + 1] if number + 1 < len(lines) else ""
        if line.startswith("--- ") and following.startswith("+++ "):
            close()
            continue
        if line.startswith("+++ ") and number > 0 and lines[number - 1].startswith("--- "):
            path = line[4:].split("\t")[0].strip()
            files.append((path[2:] if path.startswith(("a/", "b/")) else path, []))
            continue
        if _ANY_HUNK_HEADER.match(line):
            close()
            numbers = _HUNK_HEADER.match(line)
            hunk = _Lines(line=int(numbers.group(1)) if numbers else None)
            continue
        if hunk is None:
            continue
        if line.startswith("\\"):  # "\ No newline at end of file"
            continue
        if not hunk.add(line):  # the diff has ended (a fence, a sentence after it)
            close()
    close()
    return tuple((path, tuple(hunks)) for path, hunks in files if hunks)


def _parse_search_replace(lines: list[str]) -> tuple[tuple[str | None, tuple[Hunk, ...]], ...]:
    files: list[tuple[str | None, list[Hunk]]] = []
    path: str | None = None
    part: list[str] | None = None  # the block's lines being read
    search: list[str] = []
    for line in lines:
        if _SEARCH.match(line):
            part, search = [], []
            continue
        if part is None:
            if line.strip() and not line.startswith("```"):
                path = line.strip()  # the line naming the file, before the block
            continue
        if _DIVIDER.match(line) and not search:
            search, part = part, []
            search.append("")  # a marker that the divider was seen (removed below)
            continue
        if _REPLACE.match(line):
            old = tuple(search[:-1]) if search else ()
            if not files or files[-1][0] != path:
                files.append((path, []))
            files[-1][1].append(Hunk(old, tuple(part), _aligned(old, tuple(part))))
            part, search = None, []
            continue
        part.append(line)
    return tuple((name, tuple(hunks)) for name, hunks in files)


def _parse_v4a(lines: list[str]) -> tuple[tuple[str | None, tuple[Hunk, ...]], ...]:
    files: list[tuple[str | None, list[Hunk]]] = []
    hunk = _Lines()
    updating = False

    def close(scope: str | None = None) -> None:
        nonlocal hunk
        if updating and (made := hunk.hunk()):
            files[-1][1].append(made)
        hunk = _Lines(scope=scope)

    for line in lines:
        header = _V4A_FILE.match(line)
        if header:
            close()
            updating = header.group(1) == "Update"
            if updating:
                files.append((header.group(2), []))
            continue
        if line.startswith("***"):  # Begin / End Patch, End of File, Move to
            close()
            continue
        if not updating:
            continue
        if line.startswith("@@"):
            close(line[2:].strip() or None)
        else:
            hunk.add(line)
    close()
    return tuple((path, tuple(hunks)) for path, hunks in files if hunks)


@dataclass
class _Lines:
    """A diff's hunk as it is read: its ` `, `-` and `+` lines."""

    line: int | None = None
    scope: str | None = None
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    context: list[int | None] = field(default_factory=list)

    def add(self, line: str) -> bool:
        """Takes one line of the hunk; False for a line that is none (the hunk has ended)."""
        if line.startswith(" ") or line == "":  # context (a blank one often without its space)
            self.context.append(len(self.old))
            self.old.append(line[1:])
            self.new.append(line[1:])
        elif line.startswith("-"):
            self.old.append(line[1:])
        elif line.startswith("+"):
            self.context.append(None)
            self.new.append(line[1:])
        else:
            return False
        return True

    def hunk(self) -> Hunk | None:
        while self.context and self.context[-1] is not None and not self.old[-1].strip():  # a blank line after it
            self.old.pop(), self.new.pop(), self.context.pop()
        if not (self.old or self.new):
            return None
        return Hunk(tuple(self.old), tuple(self.new), tuple(self.context), self.line, self.scope)


def apply_patch(original: str, patch: Patch, deadline: Deadline = NO_DEADLINE) -> tuple[str, tuple[str, ...]]:
    """`patch` applied to `original` (newlines only): the text, and why a hunk could not be placed (empty:
    every hunk was). A patch of several files is applied as the one file of them whose hunks all place.
    `deadline` is checked before each hunk.

    A hunk is placed where its old lines are, compared without trailing spaces (a chat answer has none),
    else without any indentation (its new lines then take the original's); where they are more than once,
    the diff's line number (shifted as the hunks before it were), or V4A's `@@` line, picks the place; else
    the patch is a doubt.

    >>> apply_patch("a\\nb\\nc\\n", parse_patch("@@ -1,3 +1,3 @@\\n a\\n-b\\n+B\\n c\\n", "udiff"))
    ('a\\nB\\nc\\n', ())
    """
    results = [_apply_file(original, hunks, patch.format, deadline) for _, hunks in patch.files]
    placed = [text for text, why in results if not why]
    if not results:
        return original, ("the patch holds no change",)
    if len(placed) == 1:
        return placed[0], ()
    if len(results) == 1:
        return results[0]
    names = ", ".join(str(path) for path, _ in patch.files)
    return original, (f"the patch edits {len(results)} files ({names}), and {len(placed)} of them fit this one",)


def _apply_file(
    original: str, hunks: tuple[Hunk, ...], format: PatchFormat, deadline: Deadline
) -> tuple[str, tuple[str, ...]]:
    lines = original.split("\n")
    ends_in_newline = lines[-1] == ""
    if ends_in_newline:
        lines.pop()
    text = _Text(lines)
    cursor, shift = 0, 0  # diffs come in order: each hunk after the one before; the numbers' error so far
    for number, hunk in enumerate(hunks, 1):
        deadline.check()
        if not hunk.old:
            return original, (f"hunk {number} says nothing of where it goes (no lines of the original)",)
        low = 0 if format == "search-replace" else cursor  # aider's blocks each search the whole file
        found = _find(text, hunk, low, cursor, shift, hunks[number - 1 :])
        if isinstance(found, str) and low > 0:  # hunks out of order
            found = _find(text, hunk, 0, cursor, shift, hunks[number - 1 :])
        if isinstance(found, str):
            return original, (f"hunk {number} (starting {_first_said(hunk.old)!r}): {found}",)
        start, new = found
        if hunk.line is not None:
            shift = start + 1 - hunk.line
        text.replace(start, start + len(hunk.old), new)
        cursor = start + len(new)
    return "\n".join(text.lines) + ("\n" if ends_in_newline else ""), ()


class _Text:
    """A file's lines as the hunks so far left them, with each compared as `_find` compares it (without
    trailing spaces, without any indentation) and how often each is there: a hunk is looked for by its
    rarest line, not by comparing it at every place (which makes a diff of thousands of hunks quadratic)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.keys = {compare: [compare(line) for line in lines] for compare in _COMPARISONS}
        self.counts = {compare: Counter(keys) for compare, keys in self.keys.items()}

    def replace(self, start: int, stop: int, new: list[str]) -> None:
        """`lines[start:stop] = new`."""
        for compare, keys in self.keys.items():
            self.counts[compare].subtract(keys[start:stop])
            added = [compare(line) for line in new]
            self.counts[compare].update(added)
            keys[start:stop] = added
        self.lines[start:stop] = new

    def places(self, wanted: list[str], compare: Callable[[str], str], low: int, near: int = 0) -> list[int]:
        """Where the lines `wanted` (compared by `compare`) are, in order, at or after `low`. Looked for from
        `near` on first (hunks come in order): once all the places of their rarest line are seen, there
        are no more, and the rest of the file is not read."""
        keys, counts = self.keys[compare], self.counts[compare]
        rarest = min(range(len(wanted)), key=lambda k: counts[wanted[k]])
        key, size = wanted[rarest], len(wanted)
        left, places = counts[key], []
        start, end = low + rarest, len(keys) - size + 1 + rarest  # where the rarest line may be
        middle = min(max(start, near + rarest), end)
        for at, stop in ((middle, end), (start, middle)):
            while left > 0:
                try:
                    at = keys.index(key, at, stop)
                except ValueError:
                    break
                if keys[at - rarest : at - rarest + size] == wanted:
                    places.append(at - rarest)
                at, left = at + 1, left - 1
        return sorted(places)


def _find(
    text: _Text, hunk: Hunk, low: int, near: int, shift: int, rest: tuple[Hunk, ...]
) -> tuple[int, list[str]] | str:
    """Where `hunk.old` is in `text` at or after `low` (looked for from `near` first: `_Text.places`), and
    the lines that replace it there; or why not.
    `rest` is the patch's hunks from this one on: where as many of them as there are places have the same
    old lines, the patch edits each place, and this hunk takes the first (a rename in each of three doc
    comments, written as three hunks alike)."""
    size = len(hunk.old)
    for compare in _COMPARISONS:  # trailing spaces first, then any indentation
        wanted = [compare(line) for line in hunk.old]
        places = text.places(wanted, compare, low, near)
        if not places:
            continue
        if len(places) > 1:
            places = _narrowed(text, hunk, places, shift)
        if len(places) > 1 and sum([compare(line) for line in other.old] == wanted for other in rest) == len(places):
            places = places[:1]
        if len(places) != 1:
            return f"its lines are in the file {len(places)} times, and nothing in the patch says which"
        start = places[0]
        found, new = text.lines[start : start + size], list(hunk.new)
        if compare is str.strip:
            new = _indented_like(found, hunk.old, new)
        return start, _keeping_context(found, hunk, new)
    return "its lines are not in the file"


def _narrowed(text: _Text, hunk: Hunk, places: list[int], shift: int) -> list[int]:
    """Of several places for a hunk, the one its patch points at: the first after V4A's `@@` line, or the
    nearest to the diff's line number (shifted by how far the hunks before it were off)."""
    if hunk.scope is not None:
        scopes = text.places([hunk.scope.strip()], str.strip, 0)
        after = [place for place in places if any(at < place for at in scopes)]
        if scopes and after:
            nearest = min(after, key=lambda place: place - max(at for at in scopes if at < place))
            return [nearest]
    if hunk.line is not None:
        hinted = hunk.line - 1 + shift
        distances = sorted((abs(place - hinted), place) for place in places)
        if distances[0][0] < distances[1][0]:
            return [distances[0][1]]
    return places


def _indented_like(found: list[str], old: tuple[str, ...], new: list[str]) -> list[str]:
    """`new`, indented by what the file's lines add to (or take from) the hunk's old lines, where that is
    the same for every line that says something (a hunk written without its class's indentation)."""
    shifts = {
        (len(have) - len(have.lstrip())) - (len(had) - len(had.lstrip()))
        for have, had in zip(found, old, strict=True)
        if have.strip()
    }
    if len(shifts) != 1 or not (shift := shifts.pop()):
        return new
    if shift > 0:
        unit = next((have[:shift] for have in found if have.strip() and len(have) - len(have.lstrip()) >= shift), "")
        return [unit + line if line.strip() else line for line in new]
    return [line[-shift:] if line[:-shift].strip() == "" else line.lstrip() for line in new]


def _keeping_context(found: list[str], hunk: Hunk, new: list[str]) -> list[str]:
    """`new` with the file's own text for the hunk's context lines (a patch drops trailing spaces; the
    lines it adds or changes are its own)."""
    return [found[at] if at is not None else line for line, at in zip(new, hunk.context, strict=True)]


def _aligned(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[int | None, ...]:
    """Per line of `new`, the line of `old` it is unchanged, or None: aligned without trailing spaces (a
    block whose search the file has with them), and equal as written (a change of its spaces is one)."""
    matcher = difflib.SequenceMatcher(
        None, [line.rstrip() for line in old], [line.rstrip() for line in new], autojunk=False
    )
    context: list[int | None] = [None] * len(new)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            if old[block.a + k] == new[block.b + k]:
                context[block.b + k] = block.a + k
    return tuple(context)


def _first_said(lines: tuple[str, ...]) -> str:
    return next((line.strip() for line in lines if line.strip()), "")


def as_sketch(patch: Patch, side: Literal["old", "new"]) -> str:
    """The lazy sketch one side of a patch stands for: each hunk's `new` (or `old`) lines, a marker between
    them and around them (what `merge_checks` checks a model's answer against). Of several files, those
    of the first."""
    hunks = patch.files[0][1] if patch.files else ()
    parts = ["...\n"]
    for hunk in hunks:
        parts += [line + "\n" for line in (hunk.new if side == "new" else hunk.old)]
        parts.append("...\n")
    return "".join(parts)
