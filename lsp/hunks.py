"""Settled hunks: the growing model output turned into line edits of the original region, as it streams.

Two pure pieces, no LSP in sight:

- `HunkTracker` diffs the original region against the output while it is being written. A *hunk* replaces
  whole lines of the original (`original[start:end]`, offsets into the region) with new lines. A hunk
  *settles* once the output has re-synchronised with a later original line: after that, nothing the model
  writes can change it. Unchanged lines produce no hunk. `finish()` settles the rest with a plain diff.
- `RegionTracker` follows the region through a live document: hunks written into it, hunks reverted, and
  the user's own typing, as a piece table (each piece is an intact stretch of the original, a hunk's new
  text, or foreign text: what the user typed). From it come the document ranges of the next edit, whether
  the user touched the part not yet written (a *conflict*), and the edits that restore the original.

Offsets are Python `str` indices (code points); positions in the editor's encoding are converted at the
LSP boundary (`documents.py`).

Vocabulary: the *frontier* is the offset in the original up to which the output is settled; the
*remainder* is `original[frontier:]`, the part the model has not written yet.
"""

from __future__ import annotations

import bisect
import difflib
import enum
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_LINE_BREAKS = re.compile("\r\n|\r|\n|\u2028|\u2029|\x85")  # all that editors take for line ends
_EDIT_LINE_BREAKS = re.compile("\r\n|\r|\n")  # what editors convert in a text they insert


def line_end(text: str) -> str:
    """A document's line end: its first one ("\\n" if it has none).

    >>> line_end("a\\r\\nb\\n"), line_end("a")
    ('\\r\\n', '\\n')
    """
    found = _EDIT_LINE_BREAKS.search(text)
    return found.group() if found else "\n"


class LineEnds:
    """Output text with the document's line ends, as it streams.

    An editor turns every "\\r\\n", "\\r" and "\\n" of a text it inserts into the document's own line end
    (Neovim's `apply_text_edits`, VS Code's text model): the server writes them so first, or the editor's copy
    would differ from the server's, and its echo of the edit would look like the user's typing. A "\\r" at
    the end of a piece waits for the next one, which may begin with "\\n".

    >>> ends = LineEnds("\\n")
    >>> ends.feed("a\\rb\\r"), ends.feed("\\nc\\r"), ends.flush()
    ('a\\nb', '\\nc', '\\n')
    """

    def __init__(self, newline: str) -> None:
        self.newline = newline
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        self._held = "\r" if text.endswith("\r") else ""
        return self.whole(text[: len(text) - len(self._held)])

    def flush(self) -> str:
        held, self._held = self._held, ""
        return self.whole(held)

    def whole(self, text: str) -> str:
        return _EDIT_LINE_BREAKS.sub(self.newline, text)


@dataclass(frozen=True)
class Hunk:
    """Replace `original[start:end]` (whole lines of the region) with `new_text`.

    `start == end` is a pure insertion before the line at `start`; `new_text == ""` a deletion.
    """

    id: int
    start: int
    end: int
    old_text: str
    new_text: str


def split_lines(text: str) -> list[str]:
    """Split after every "\\n", keeping line ends; a last line without one is a line too.

    >>> split_lines("a\\r\\nb\\nc")
    ['a\\r\\n', 'b\\n', 'c']
    >>> split_lines("")
    []
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def apply_hunks(original: str, hunks: Iterable[Hunk]) -> str:
    """The original with the (disjoint) hunks applied.

    >>> apply_hunks("a\\nb\\nc\\n", [Hunk(0, 2, 4, "b\\n", "B\\nBB\\n")])
    'a\\nB\\nBB\\nc\\n'
    """
    out: list[str] = []
    position = 0
    for hunk in sorted(hunks, key=lambda h: (h.start, h.end)):
        assert hunk.start >= position, "hunks overlap"
        out.append(original[position : hunk.start])
        out.append(hunk.new_text)
        position = hunk.end
    out.append(original[position:])
    return "".join(out)


@dataclass(frozen=True)
class SettleConfig:
    """When a re-synchronisation is trusted.

    The output is back in step with the original once `confirm_lines` consecutive output lines equal
    consecutive original lines and hold at least `confirm_chars` non-blank characters: one `}` or an empty
    line matches too many places to settle anything by itself. Reaching the end of the original with a
    weaker match does not count (the model may still be writing inserted code); `finish()` diffs the rest.
    """

    confirm_lines: int = 2
    confirm_chars: int = 10
    max_candidates: int = 64  # original lines tried per output line (the nearest first)

    def __post_init__(self) -> None:
        if self.confirm_lines < 1 or self.confirm_chars < 0 or self.max_candidates < 1:
            raise ValueError("confirm_lines and max_candidates must be >= 1, confirm_chars >= 0")


class _Run(enum.Enum):
    CONFIRMED = "confirmed"
    PENDING = "pending"  # matching so far, but the output ends before the match is confirmed
    MISMATCH = "mismatch"


class HunkTracker:
    """Streams the output of a rewrite into settled hunks against the original region.

    A monotone line matcher, like the copy drafter: the output either continues the original line for
    line (nothing to do), or it has left it, and then the next hunk ends where the output comes back to
    a later original line: the nearest place in the output, then the nearest place in the original.

    >>> tracker = HunkTracker("def add(a, b):\\n    return a + b\\n\\nprint(add(1, 2))\\n")
    >>> tracker.feed("def plus(a, b):\\n")                   # left the original
    []
    >>> tracker.feed("    return a + b\\n")                  # back in step? one line: not confirmed yet
    []
    >>> [(h.start, h.end, h.new_text) for h in tracker.feed("\\n")]
    [(0, 15, 'def plus(a, b):\\n')]
    >>> tracker.frontier                                     # the next line is not written yet
    33
    >>> tracker.feed("print(plus(1, 2))\\n")                 # a changed last line: settles at the end
    []
    >>> [(h.start, h.end, h.new_text) for h in tracker.finish()]
    [(33, 50, 'print(plus(1, 2))\\n')]
    """

    def __init__(self, original: str, config: SettleConfig | None = None, *, newline: str | None = None) -> None:
        """`newline`: the document's line end, which the output's are turned into (default: the original's)."""
        self.original = original
        self.config = config or SettleConfig()
        self.newline = newline or line_end(original)
        self._ends = LineEnds(self.newline)
        self.hunks: list[Hunk] = []
        self.finished = False
        self._old = split_lines(original)
        self._old_starts = [0]
        for line in self._old:
            self._old_starts.append(self._old_starts[-1] + len(line))
        self._where: dict[str, list[int]] = {}
        for index, line in enumerate(self._old):
            self._where.setdefault(line, []).append(index)
        self._new: list[str] = []  # complete output lines
        self._partial = ""  # the output after its last "\n"
        self._parts: list[str] = []
        self._i = 0  # first original line not settled
        self._j = 0  # first output line not settled
        self._scan = 0  # output lines from _j whose every candidate mismatched (a settled verdict)

    @property
    def output(self) -> str:
        """Everything fed so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def frontier(self) -> int:
        """The offset in the original up to which the output is settled."""
        return self._old_starts[self._i]

    @property
    def provisional(self) -> str:
        """The output not settled yet, as whole lines (the line being written ends with a newline too), or
        "" while the output is in step with the original (nothing written past the frontier, or only the
        beginning of the frontier's own line). What an editor shows, marked pending, before the frontier.

        >>> tracker = HunkTracker("a = 1\\nb = 2\\n")
        >>> tracker.feed("a = 1\\nb"); tracker.provisional
        []
        ''
        >>> tracker.feed("bb = 2\\nc"); tracker.provisional
        []
        'bbb = 2\\nc\\n'
        """
        if self.finished:
            return ""
        written = self._new[self._j :]
        if not written and self._i < len(self._old) and self._old[self._i].startswith(self._partial):
            return ""
        text = "".join(written) + (self._partial + "\n" if self._partial else "")
        # Shown only: the unusual line breaks too become the document's (some editors take them for one).
        return _LINE_BREAKS.sub(self.newline, text)

    @property
    def lines_done(self) -> int:
        return self._i

    @property
    def lines_total(self) -> int:
        return len(self._old)

    def feed(self, text: str) -> list[Hunk]:
        """Add output text (its line ends become the document's); returns the hunks that settled because of it."""
        if self.finished:
            raise RuntimeError("feed() after finish()")
        text = self._ends.feed(text)
        if not text:
            return []
        self._parts.append(text)
        self._add_text(text)
        return self._settle()

    def finish(self, final_text: str | None = None) -> list[Hunk]:
        """The output is complete (`final_text`, when given, must continue what was fed, line ends aside):
        settle the rest.

        Do not call this for an incomplete output (cancelled, out of budget): its unsettled part is not
        the whole remainder, and a diff would delete the lines the model never reached.
        """
        if self.finished:
            return []
        if final_text is None:
            rest = self._ends.flush()
        else:
            final_text, produced = self._ends.whole(final_text), self.output
            if not final_text.startswith(produced):
                raise ValueError("the final text does not continue the streamed text")
            rest = final_text[len(produced) :]
        if rest:
            self._parts.append(rest)
            self._add_text(rest)
        settled = self._settle()
        if self._partial:
            self._new.append(self._partial)
            self._partial = ""
        old_rest, new_rest = self._old[self._i :], self._new[self._j :]
        matcher = difflib.SequenceMatcher(None, old_rest, new_rest, autojunk=False)
        for tag, a0, a1, b0, b1 in matcher.get_opcodes():
            if tag != "equal":
                settled.append(self._emit(self._i + a0, self._i + a1, self._j + b0, self._j + b1))
        self._i, self._j = len(self._old), len(self._new)
        self.finished = True
        return settled

    # ------------------------------------------------------------------------------------------ inside

    def _add_text(self, text: str) -> None:
        pieces = (self._partial + text).split("\n")
        self._new.extend(piece + "\n" for piece in pieces[:-1])
        self._partial = pieces[-1]

    def _settle(self) -> list[Hunk]:
        settled: list[Hunk] = []
        while self._j < len(self._new):
            # 1. The output continues the original: an unchanged line, settled at once.
            if self._i < len(self._old) and self._new[self._j] == self._old[self._i]:
                self._i += 1
                self._j += 1
                self._scan = 0
                continue
            # 2. It has left the original: settle a hunk once it has come back, confirmed.
            found = self._resync()
            if found is None:
                break
            old_end, new_end = found
            settled.append(self._emit(self._i, old_end, self._j, new_end))
            self._i, self._j, self._scan = old_end, new_end, 0
        return settled

    def _resync(self) -> tuple[int, int] | None:
        """The nearest confirmed (original line, output line) where the output is back in step."""
        for j in range(self._j + self._scan, len(self._new)):
            candidates = self._where.get(self._new[j], [])
            first = bisect.bisect_left(candidates, self._i)
            for old_index in candidates[first : first + self.config.max_candidates]:
                verdict = self._run(old_index, j)
                if verdict is _Run.CONFIRMED:
                    return old_index, j
                if verdict is _Run.PENDING:
                    self._scan = j - self._j
                    return None
            self._scan = j + 1 - self._j  # every candidate for this line mismatched: final
        return None

    def _run(self, old_index: int, new_index: int) -> _Run:
        k = chars = 0
        while True:
            if k >= self.config.confirm_lines and chars >= self.config.confirm_chars:
                return _Run.CONFIRMED
            if old_index + k >= len(self._old):
                return _Run.MISMATCH  # too weak a match at the very end: leave it to finish()
            if new_index + k >= len(self._new):
                return _Run.PENDING
            if self._new[new_index + k] != self._old[old_index + k]:
                return _Run.MISMATCH
            chars += len(self._old[old_index + k].strip())
            k += 1

    def _emit(self, old_start: int, old_end: int, new_start: int, new_end: int) -> Hunk:
        start, end = self._old_starts[old_start], self._old_starts[old_end]
        hunk = Hunk(len(self.hunks), start, end, self.original[start:end], "".join(self._new[new_start:new_end]))
        self.hunks.append(hunk)
        return hunk


# ------------------------------------------------------------------------------------ region tracker


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

    def mark_reverted(self, hunk_id: int) -> None:
        """Our edit reverting an applied hunk came back: the original text is back."""
        hunk = self.hunks[hunk_id]
        for index, piece in enumerate(self._pieces):
            if piece.kind is PieceKind.HUNK and piece.hunk_id == hunk_id:
                self._pieces[index] = _Piece(PieceKind.ORIGINAL, hunk.start, hunk.end)
                break
        else:
            raise AssertionError(f"reverting hunk {hunk_id}, which has no piece")
        self.states[hunk_id] = HunkState.REJECTED
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
