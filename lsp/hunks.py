"""Settled hunks: the growing model output turned into line edits of the original region, as it streams.

`HunkTracker` diffs the original region against the output while it is being written; no LSP in sight. A
*hunk* replaces whole lines of the original (`original[start:end]`, offsets into the region) with new
lines. A hunk *settles* once the output has re-synchronised with a later original line: after that,
nothing the model writes can change it. Unchanged lines produce no hunk. `finish()` settles the rest with
a plain diff. `region.RegionTracker` follows the hunks through the live document.

Offsets are Python `str` indices (code points); positions in the editor's encoding are converted at the
LSP boundary (`documents.py`).

Vocabulary: the *frontier* is the offset in the original up to which the output is settled; the
*remainder* is `original[frontier:]`, the part the model has not written yet.
"""

from __future__ import annotations

import bisect
import difflib
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

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
