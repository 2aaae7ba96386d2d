"""Positions in the editor's encoding (utf-8, utf-16 or utf-32 code units) to `str` offsets and back.

All text work happens on Python `str`; conversion happens here, at the LSP boundary, with pygls' unit
counters for the negotiated encoding. Lines end at "\\n", "\\r\\n" or "\\r", as the LSP says (not at the
other breaks `str.splitlines` knows, such as "\\x0c" or "\\u2028", which is why the server keeps its own
copy of each document rather than pygls' one).
"""

from __future__ import annotations

import bisect
import re
from functools import cached_property

from lsprotocol import types
from pygls.workspace.position_codec import PositionCodec

from specedit.lsp import protocol

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class TextIndex:
    """Line starts of one text, for converting positions.

    >>> index = TextIndex("a🙂b\\r\\ncd")
    >>> codec = PositionCodec(types.PositionEncodingKind.Utf16)
    >>> index.offset_at(types.Position(line=0, character=3), codec)   # after the emoji: 3 utf-16 units
    2
    >>> position = index.position_at(5, codec); (position.line, position.character)
    (1, 0)
    """

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def _starts(self) -> list[int]:
        return [0, *(match.end() for match in _LINE_BREAK.finditer(self.text))]

    def edited(self, start: int, end: int, new_text: str, *, text: str | None = None) -> TextIndex:
        """The index of the text with `text[start:end]` replaced by `new_text` (that text: `text`, where the
        caller has it already). Line starts already found are carried over: only those near the change are
        found again, the later ones shifted, so a small change in a 5 MB document does not scan it whole.

        >>> index = TextIndex("a\\rb\\nc"); index.line_count
        3
        >>> edited = index.edited(2, 3, "\\n"); (edited.text, edited.line_count)   # "\\r\\n": one break
        ('a\\r\\n\\nc', 3)
        """
        if text is None:
            text = self.text[:start] + new_text + self.text[end:]
        index = TextIndex(text)
        if "_starts" not in self.__dict__:
            return index  # never needed here: found when needed there
        starts, shift = self._starts, len(new_text) - (end - start)
        # A break may end just before the change ("\r" + an inserted "\n") or just after it: the old starts
        # from start - 1 to end + 1 are found again, in the new text.
        head = starts[: bisect.bisect_right(starts, max(start - 1, 0))]
        limit = start + len(new_text) + 1
        found = [
            match.end()
            for match in _LINE_BREAK.finditer(text, max(start - 1, 0), min(len(text), limit + 1))
            if match.end() <= limit
        ]
        tail = starts[bisect.bisect_right(starts, end + 1) :]
        index.__dict__["_starts"] = [*head, *found, *map(shift.__add__, tail)]
        return index

    @property
    def line_count(self) -> int:
        return len(self._starts)

    def _line_bounds(self, line: int) -> tuple[int, int]:
        """Start and end (before the line break) of a line."""
        start = self._starts[line]
        if line + 1 < len(self._starts):
            end = self._starts[line + 1]
            end -= 2 if self.text.startswith("\r\n", end - 2) else 1
        else:
            end = len(self.text)
        return start, end

    def offset_at(self, position: types.Position, codec: PositionCodec) -> int:
        """The offset of a position; past the end of a line is its end, past the last line the text's end.
        A position inside a character (half a surrogate pair, inside a utf-8 sequence) is that character's
        start."""
        if position.line >= len(self._starts):
            return len(self.text)
        start, end = self._line_bounds(position.line)
        units = 0
        for offset in range(start, end):
            units += codec.impl.code_units_for_char(self.text[offset])
            if units > position.character:
                return offset
        return end

    def position_at(self, offset: int, codec: PositionCodec) -> types.Position:
        """The position of an offset (which must not split a "\\r\\n")."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._starts, offset) - 1
        start = self._starts[line]
        return types.Position(line=line, character=codec.client_num_units(self.text[start:offset]))

    def range_at(self, start: int, end: int, codec: PositionCodec) -> types.Range:
        return types.Range(start=self.position_at(start, codec), end=self.position_at(end, codec))

    def range_payload(self, start: int, end: int, codec: PositionCodec) -> protocol.Range:
        """`range_at`, as our extensions' payloads carry it."""
        where = self.range_at(start, end, codec)
        return {
            "start": {"line": where.start.line, "character": where.start.character},
            "end": {"line": where.end.line, "character": where.end.character},
        }


def minimal_change(before: str, after: str) -> tuple[int, int, str]:
    """A whole-text change as the smallest single edit (start, end, new text): clients that sync whole
    documents would otherwise look like they rewrote every line.

    >>> minimal_change("hello world", "hello, world")
    (5, 5, ',')
    >>> minimal_change("aaa", "aa")
    (2, 3, '')
    """
    limit = min(len(before), len(after))
    prefix = _common_length(before, after, limit, from_end=False)
    suffix = _common_length(before, after, limit - prefix, from_end=True)
    return prefix, len(before) - suffix, after[prefix : len(after) - suffix]


def _common_length(a: str, b: str, limit: int, *, from_end: bool) -> int:
    """How many characters `a` and `b` share at their start (or end), at most `limit`. Slices are compared
    in doubling chunks (C speed, a few times the shared length in all), and the chunk that differs is halved
    down to the character: a 5 MB document's change costs milliseconds, not a Python loop over it.

    >>> _common_length("abcdef", "abcxef", 6, from_end=False), _common_length("abcdef", "abcxef", 6, from_end=True)
    (3, 2)
    """

    def same(start: int, end: int) -> bool:  # the characters start..end (counted from the chosen side)
        if from_end:
            return a[len(a) - end : len(a) - start] == b[len(b) - end : len(b) - start]
        return a[start:end] == b[start:end]

    done, chunk = 0, 64
    while done < limit:
        size = min(chunk, limit - done)
        if not same(done, done + size):
            while size > 1:  # the first difference is in done..done+size
                half = size // 2
                if same(done, done + half):
                    done += half
                    size -= half
                else:
                    size = half
            return done
        done += size
        chunk *= 2
    return done
