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
    """
    limit = min(len(before), len(after))
    prefix = 0
    while prefix < limit and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and before[-1 - suffix] == after[-1 - suffix]:
        suffix += 1
    return prefix, len(before) - suffix, after[prefix : len(after) - suffix]
