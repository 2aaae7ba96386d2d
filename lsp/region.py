"""The region being rewritten, followed through a live document: hunks written into it, hunks reverted,
and the user's own typing, as a piece table (each piece is an intact stretch of the original, a hunk's
new text, or foreign text: what the user typed). From it come the document ranges of the next edit,
whether the user touched the part not yet written (a *conflict*), and the edits that restore the original.

The hunks are `hunks.HunkTracker`'s, and the *frontier* and *remainder* are as there. Offsets are Python
`str` indices (code points); positions in the editor's encoding are converted at the LSP boundary
(`documents.py`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from specedit.lsp.hunks import Hunk


class PieceKind(enum.Enum):
    ORIGINAL = "original"  # original[start:end], intact
    HUNK = "hunk"  # a hunk's new text, written by us and untouched since
    PROVISIONAL = "provisional"  # the output not settled yet, written before the frontier, untouched since
    FOREIGN = "foreign"  # anything else: the user's typing, remnants of a hunk the user edited


@dataclass(frozen=True)
class _Piece:
    kind: PieceKind
    start: int = 0  # ORIGINAL: the slice of the original
    end: int = 0
    text: str = ""  # HUNK, PROVISIONAL and FOREIGN: the text
    hunk_id: int = -1

    def __len__(self) -> int:
        return self.end - self.start if self.kind is PieceKind.ORIGINAL else len(self.text)


class HunkState(enum.Enum):
    PENDING = "pending"  # settled, not written: the document still holds its old text
    APPLIED = "applied"  # written: the document holds its new text
    DIRTY = "dirty"  # written, then edited by the user: can no longer be reverted exactly
    REJECTED = "rejected"  # reverted, or dropped unwritten


@dataclass
class RegionTracker:
    """Where the region is in a document that both we and the user edit, as a piece table.

    `start` is the region's document offset. User edits that touch the region split pieces; what they
    cut out of the original is *damage*. A pending hunk can still be written only while its old text is
    intact (inside one ORIGINAL piece); the remainder likewise, or the user has typed into the part not
    yet written: a `conflict`, which is sticky.

    A live rewrite also writes its *provisional* text, the output not settled yet, just before the
    frontier (at most one such piece); the user's typing into it makes it foreign, like a written hunk.

    Boundaries: typing exactly at the region's start is before the region, exactly at its end after it.

    >>> region = RegionTracker("a\\nb\\nc\\n", start=10)
    >>> region.add(Hunk(0, 2, 4, "b\\n", "B\\n"))
    >>> region.pending_range(0)
    (12, 14)
    >>> region.user_edit(0, 0, "xy")          # typing before the region shifts it
    False
    >>> region.pending_range(0)
    (14, 16)
    >>> region.mark_applied(0); region.text()
    'a\\nB\\nc\\n'
    >>> region.user_edit(17, 17, "!")         # typing into the last line, not yet written
    True
    """

    original: str
    start: int
    frontier: int = 0  # see HunkTracker.frontier: the part from here on is not yet written
    conflict: bool = False
    provisional_at: int = 0  # the original's offset the provisional text is written before
    hunks: dict[int, Hunk] = field(default_factory=dict)
    states: dict[int, HunkState] = field(default_factory=dict)
    _pieces: list[_Piece] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.original:
            self._pieces = [_Piece(PieceKind.ORIGINAL, 0, len(self.original))]

    @property
    def end(self) -> int:
        return self.start + sum(len(piece) for piece in self._pieces)

    def text(self) -> str:
        """The region's current text, as the pieces say: equal to the document's slice, always."""
        return "".join(self.original[p.start : p.end] if p.kind is PieceKind.ORIGINAL else p.text for p in self._pieces)

    def add(self, hunk: Hunk) -> None:
        """A hunk settled: pending until written."""
        self.hunks[hunk.id] = hunk
        self.states[hunk.id] = HunkState.PENDING
        if not self._hunk_intact(hunk):
            self.conflict = True

    def ids(self, state: HunkState) -> list[int]:
        return [hunk_id for hunk_id in sorted(self.hunks) if self.states[hunk_id] is state]

    # ---------------------------------------------------------------------------------------- queries

    def pending_range(self, hunk_id: int) -> tuple[int, int] | None:
        """The document range of a pending hunk's old text, or None when the user has touched it."""
        hunk = self.hunks[hunk_id]
        if self.states[hunk_id] is not HunkState.PENDING or not self._hunk_intact(hunk):
            return None
        if not self.original:
            return self.start, self.start
        index = self._original_piece(hunk.start, hunk.end)
        assert index is not None
        piece = self._pieces[index]
        at = self._piece_offset(index) + hunk.start - piece.start
        return at, at + hunk.end - hunk.start

    def applied_range(self, hunk_id: int) -> tuple[int, int] | None:
        """The document range of an applied hunk's new text (None unless it is APPLIED)."""
        if self.states.get(hunk_id) is not HunkState.APPLIED:
            return None
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.HUNK and piece.hunk_id == hunk_id:
                at = self._piece_offset(index)
                return at, at + len(piece)
        raise AssertionError(f"applied hunk {hunk_id} has no piece")

    def provisional_range(self) -> tuple[int, int] | None:
        """The document range of the provisional text (None when there is none)."""
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.PROVISIONAL:
                at = self._piece_offset(index)
                return at, at + len(piece)
        return None

    def provisional_text(self) -> str:
        return next((piece.text for piece in self._pieces if piece.kind is PieceKind.PROVISIONAL), "")

    def offset_of(self, at: int) -> int | None:
        """The document offset of the original's offset `at`, when the original is intact there: where
        provisional text written before `at` goes (after any hunk written up to `at`)."""
        offset = self.start
        for piece in self._pieces:
            if piece.kind is PieceKind.ORIGINAL and piece.start <= at < piece.end:
                return offset + at - piece.start
            offset += len(piece)
        if at == len(self.original) and not any(piece.kind is PieceKind.FOREIGN for piece in self._pieces[-1:]):
            return offset
        return None

    def remainder_intact(self) -> bool:
        """True while the user has not typed into the part of the region not yet written."""
        n = len(self.original)
        if self.frontier >= n:
            return True
        index = self._original_piece(self.frontier, n)
        if index is None:
            return False
        piece = self._pieces[index]
        return not (self.frontier == piece.start and self._is_foreign(index - 1))

    # ---------------------------------------------------------------------------------------- changes

    def mark_applied(self, hunk_id: int) -> None:
        """Our edit writing the hunk came back: its old text in the document is now its new text."""
        hunk = self.hunks[hunk_id]
        assert self.states[hunk_id] is HunkState.PENDING and self._hunk_intact(hunk), "hunk not intact"
        written = _Piece(PieceKind.HUNK, text=hunk.new_text, hunk_id=hunk_id)
        self.states[hunk_id] = HunkState.APPLIED
        if not self.original:
            self._pieces = [written]
        else:
            index = self._original_piece(hunk.start, hunk.end)
            assert index is not None
            piece = self._pieces[index]
            self._pieces[index : index + 1] = [
                _Piece(PieceKind.ORIGINAL, piece.start, hunk.start),
                written,
                _Piece(PieceKind.ORIGINAL, hunk.end, piece.end),
            ]
        self._normalise()

    def mark_reverted(self, hunk_id: int, *, offered: bool = False) -> None:
        """Our edit reverting an applied hunk came back: the original text is back. `offered`: the hunk is
        pending again (it may be written later), else rejected."""
        hunk = self.hunks[hunk_id]
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.HUNK and piece.hunk_id == hunk_id:
                self._pieces[index] = _Piece(PieceKind.ORIGINAL, hunk.start, hunk.end)
                break
        else:
            raise AssertionError(f"reverting hunk {hunk_id}, which has no piece")
        self.states[hunk_id] = HunkState.PENDING if offered else HunkState.REJECTED
        self._normalise()

    def mark_provisional(self, at: int, text: str) -> None:
        """Our edit came back that replaced the provisional text with `text`, written before the original's
        offset `at` (as `offset_of(at)` placed it)."""
        self._pieces = [piece for piece in self._pieces if piece.kind is not PieceKind.PROVISIONAL]
        self._normalise()
        self.provisional_at = at
        if not text:
            return
        written = _Piece(PieceKind.PROVISIONAL, text=text)
        if at == len(self.original):
            self._pieces.append(written)
            return
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.ORIGINAL and piece.start <= at < piece.end:
                self._pieces[index : index + 1] = [
                    _Piece(PieceKind.ORIGINAL, piece.start, at),
                    written,
                    _Piece(PieceKind.ORIGINAL, at, piece.end),
                ]
                self._normalise()
                return
        raise AssertionError(f"provisional text at {at}, where the original is not intact")

    def mark_rejected(self, hunk_id: int) -> None:
        """A pending hunk is dropped without being written."""
        if self.states[hunk_id] is HunkState.PENDING:
            self.states[hunk_id] = HunkState.REJECTED

    def user_edit(self, start: int, end: int, text: str) -> bool:
        """Someone else replaced document[start:end] with `text`. Returns True when this edit started a
        conflict: it touched a pending hunk or the remainder."""
        region_start, region_end = self.start, self.end
        if end <= region_start:  # before the region (typing at its very start included)
            self.start += len(text) - (end - start)
            return False
        if start >= region_end:  # after it (typing at its very end included)
            return False
        cut_start, cut_end = max(start, region_start) - region_start, min(end, region_end) - region_start
        inserted: str | None = text
        if start < region_start:  # begins before the region: the new text lands before it
            self.start = start + len(text)
            inserted = None
        elif end > region_end:  # ends after it: the new text lands after it
            inserted = None
        self._cut(cut_start, cut_end, inserted)
        if self.conflict:
            return False
        touched = not self.remainder_intact() or any(
            not self._hunk_intact(self.hunks[hunk_id]) for hunk_id in self.ids(HunkState.PENDING)
        )
        self.conflict = touched
        return touched

    def our_edit(self, start: int, end: int, text: str) -> None:
        """An edit of ours for another region of the same document: never inside this one."""
        self.user_edit(start, end, text)

    # ---------------------------------------------------------------------------------------- inside

    def _piece_offset(self, index: int) -> int:
        return self.start + sum(len(piece) for piece in self._pieces[:index])

    def _original_piece(self, start: int, end: int) -> int | None:
        """The ORIGINAL piece holding original[start:end] (for start == end: holding that point)."""
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.ORIGINAL and piece.start <= start and end <= piece.end:
                return index
        return None

    def _is_foreign(self, index: int) -> bool:
        return 0 <= index < len(self._pieces) and self._pieces[index].kind is PieceKind.FOREIGN

    def _hunk_intact(self, hunk: Hunk) -> bool:
        if not self.original:  # an empty region: only insertions, at its one point
            return not any(piece.kind is PieceKind.FOREIGN for piece in self._pieces)
        index = self._original_piece(hunk.start, hunk.end)
        if index is None:
            return False
        if hunk.start == hunk.end:  # an insertion: ambiguous next to the user's typing
            piece = self._pieces[index]
            if hunk.start == piece.start and self._is_foreign(index - 1):
                return False
            if hunk.start == piece.end and self._is_foreign(index + 1):
                return False
        return True

    def _split(self, at: int) -> int:
        """Split the pieces at region offset `at`; returns the index of the first piece from `at` on."""
        offset = 0
        for index, piece in enumerate(self._pieces):
            length = len(piece)
            if at == offset:
                return index
            if offset < at < offset + length:
                cut = at - offset
                if piece.kind is PieceKind.ORIGINAL:
                    left = _Piece(PieceKind.ORIGINAL, piece.start, piece.start + cut)
                    right = _Piece(PieceKind.ORIGINAL, piece.start + cut, piece.end)
                else:  # a hunk (or provisional text) split by the user's typing is no longer ours
                    if piece.kind is PieceKind.HUNK:
                        self.states[piece.hunk_id] = HunkState.DIRTY
                    left = _Piece(PieceKind.FOREIGN, text=piece.text[:cut])
                    right = _Piece(PieceKind.FOREIGN, text=piece.text[cut:])
                self._pieces[index : index + 1] = [left, right]
                return index + 1
            offset += length
        return len(self._pieces)

    def _cut(self, cut_start: int, cut_end: int, inserted: str | None) -> None:
        first = self._split(cut_start)
        last = self._split(cut_end) if cut_end > cut_start else first
        for piece in self._pieces[first:last]:
            if piece.kind is PieceKind.HUNK:
                self.states[piece.hunk_id] = HunkState.DIRTY
        self._pieces[first:last] = [_Piece(PieceKind.FOREIGN, text=inserted)] if inserted else []
        self._normalise()

    def _normalise(self) -> None:
        """Drop empty pieces, merge neighbouring foreign text and contiguous stretches of the original.

        An applied hunk that deleted lines is an empty HUNK piece; it stays, so that it can be reverted.
        """
        pieces: list[_Piece] = []
        for piece in self._pieces:
            if len(piece) == 0 and not (
                piece.kind is PieceKind.HUNK and self.states.get(piece.hunk_id) is HunkState.APPLIED
            ):
                continue
            previous = pieces[-1] if pieces else None
            if previous is not None and previous.kind is piece.kind is PieceKind.FOREIGN:
                pieces[-1] = _Piece(PieceKind.FOREIGN, text=previous.text + piece.text)
            elif (
                previous is not None
                and previous.kind is piece.kind is PieceKind.ORIGINAL
                and previous.end == piece.start
            ):
                pieces[-1] = _Piece(PieceKind.ORIGINAL, previous.start, piece.end)
            else:
                pieces.append(piece)
        self._pieces = pieces


def edits_in_order(edits: Sequence[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Sort non-overlapping edits (start, end, text) by position, checking that they do not overlap."""
    ordered = sorted(edits, key=lambda edit: (edit[0], edit[1]))
    for (_, end, _), (start, _, _) in itertools.pairwise(ordered):
        if start < end:
            raise ValueError("edits overlap")
    return ordered


def apply_edits(text: str, edits: Sequence[tuple[int, int, str]]) -> str:
    """Apply non-overlapping edits (start, end, new text), all in `text`'s coordinates.

    >>> apply_edits("hello world", [(0, 5, "goodbye"), (6, 11, "moon")])
    'goodbye moon'
    """
    out: list[str] = []
    position = 0
    for start, end, new_text in edits_in_order(edits):
        out.append(text[position:start])
        out.append(new_text)
        position = end
    out.append(text[position:])
    return "".join(out)
