"""Writing hunks into a document the user is typing in: one versioned edit in flight, confirmed by its echo.

Pure state, no I/O: the server sends what `DocumentState.plan()` returns as a `workspace/applyEdit`,
feeds every `didChange` to `did_change()` and the client's answer to `on_response()`, and calls `finish()`
once the edit is resolved. Offsets are `str` indices into the mirrored text.

Why echoes: editors disagree about stale edits. An edit carries the document version it was computed
for. VS Code refuses a stale one (`applied: false`); Neovim skips it and still answers `applied: true`.
What both do is apply a versioned edit only to that exact version, so if the edit was applied, the very
first change the client reports after that version *is* the edit (possibly split into several changes,
or followed by the user's typing in the same notification). So the edit counts as applied when, and only
when, the text after some prefix of the first changes after its version equals the text the edit would
give. Otherwise it was not applied, and it is planned again, rebased on the current text. One exception:
Neovim applies an edit's parts bottom up and, when it had sent nothing for a while, reports the first
part at once in a notification of its own and the others a debounce later; a notification that gives
the text of some of the edit's parts is held, unread, as the start of its echo, and read together with
the next one (the edit's parts being the user's typing instead is not worth a thought).

A live job keeps its document in step with the model: every edit it sends writes the hunks settled so far
and replaces the *provisional* text (the output not settled yet, written just before the frontier) with
the current one, so the user watches the new code being written; the lines not yet reached stay as they
are below it. When the job stops writing live, its provisional text is taken out again.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from specedit.lsp.documents import TextIndex
from specedit.lsp.hunks import Hunk, HunkTracker, SettleConfig
from specedit.lsp.protocol import Delivery
from specedit.lsp.region import HunkState, RegionTracker, apply_edits

Edit = tuple[int, int, str]  # (start, end, new text): replace text[start:end]

MAX_ATTEMPTS = 50  # re-plans of one intent (each after the user typed meanwhile) before giving up
# Versions of our own edits a request may be behind: a live rewrite writes many, one per echo (a tiny model
# on specedit's int8 kernels wrote 20 between an editor's sight of version 1 and its request).
OWN_VERSIONS = 64


class IntentResult(enum.Enum):
    DONE = "done"  # written (or nothing left to write)
    REFUSED = "refused"  # the client declined an up-to-date edit
    DROPPED = "dropped"  # no longer wanted: the job stopped writing live


@dataclass
class WriteOut:
    """One rewrite job's hunks on their way into its document: the tracker that settles them, the region
    that follows them through the user's typing, and whether they are written live."""

    id: str
    delivery: Delivery
    region: RegionTracker
    tracker: HunkTracker
    stopped: bool = False  # live writing ended (cancelled, superseded, closed)
    label: str = "specedit"  # what the editor calls its edits (its undo entry, a confirmation)

    @classmethod
    def start(
        cls,
        job_id: str,
        delivery: Delivery,
        original: str,
        start: int,
        config: SettleConfig | None = None,
        *,
        label: str = "specedit",
        newline: str | None = None,
    ) -> WriteOut:
        """`newline`: the document's line end (default: the original's)."""
        tracker = HunkTracker(original, config, newline=newline)
        return cls(job_id, delivery, RegionTracker(original, start), tracker, label=label)

    @property
    def writes_live(self) -> bool:
        return self.delivery == "live" and not self.stopped and not self.region.conflict

    @property
    def provisional(self) -> str:
        """The provisional text the document should hold now ("" unless the job writes live)."""
        return self.tracker.provisional if self.writes_live else ""

    def in_step(self) -> bool:
        """The document holds the provisional text it should (live jobs; the others never write it)."""
        region = self.region
        wanted = self.provisional
        return region.provisional_text() == wanted and (not wanted or region.provisional_at == region.frontier)

    def feed(self, text: str) -> list[Hunk]:
        return self._settled(self.tracker.feed(text))

    def finish(self, final_text: str | None = None) -> list[Hunk]:
        return self._settled(self.tracker.finish(final_text))

    def _settled(self, hunks: list[Hunk]) -> list[Hunk]:
        self.region.frontier = self.tracker.frontier
        for hunk in hunks:
            self.region.add(hunk)
        if not self.region.remainder_intact():
            self.region.conflict = True
        return hunks


@dataclass
class Intent:
    """Something to write for a job: apply hunks, or revert applied ones (None: all that qualify)."""

    write_out: WriteOut
    kind: Literal["apply", "revert"]
    hunk_ids: list[int] | None = None
    live: bool = False  # keep a live job's document in step: its pending hunks and its provisional text
    confirm: bool = False  # ask the user to confirm it, where the client can (a `final` rewrite's edit)
    offer: bool = False  # a revert that leaves its hunks pending, offered to accept (a live job turned preview)
    attempts: int = 0
    result: IntentResult | None = None


@dataclass
class PlannedEdit:
    """An edit sent to the client, computed for `version`, waiting for its echo and its answer."""

    id: int
    intent: Intent
    version: int
    edits: list[Edit]  # in the coordinates of the text at `version`, ascending, none touching another
    hunk_ids: list[int]  # the hunks it writes (or reverts)
    expected_text: str  # the text once the edit is applied
    provisional: tuple[int, str] | None = None  # the provisional text it writes, and the original's offset
    echo: bool | None = None  # True: seen in didChange; False: the client's next change was not it
    response: bool | None = None  # the client's `applied`

    @property
    def resolved(self) -> bool:
        """Known to be applied, or known not to be."""
        return self.echo is not None or self.response is False


@dataclass
class DocumentState:
    """The server's copy of one open document, and the edits it is writing into it."""

    uri: str
    text: str
    version: int
    language_id: str = ""
    write_outs: list[WriteOut] = field(default_factory=list)
    intents: deque[Intent] = field(default_factory=deque)
    in_flight: PlannedEdit | None = None
    closed: bool = False
    # Given up on after `applied: true`, with no change seen since: the echo of any of them may still come
    # (Neovim sends its changes late), even after edits planned again meanwhile.
    _expired: list[PlannedEdit] = field(default_factory=list)
    _held: HeldChange | None = None  # the first part of an edit's echo, Neovim's way, not read yet
    _ours: deque[tuple[int, str, list[Edit]]] = field(default_factory=lambda: deque(maxlen=OWN_VERSIONS))
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _index: TextIndex | None = None  # the line starts of the text last indexed (see `index`)

    def index(self, text: str | None = None) -> TextIndex:
        """The positions of `text` (default: the document's), kept for as long as it is the text indexed
        last: a big document's line starts are found once, then carried through its changes (`remember`)."""
        text = self.text if text is None else text
        if self._index is None or (self._index.text is not text and self._index.text != text):
            self._index = TextIndex(text)
        return self._index

    def remember(self, index: TextIndex) -> None:
        """`index` is of the text as the client has it now (each change applied to the one before)."""
        self._index = index

    # ---------------------------------------------------------------------------------------- intents

    def queue(self, intent: Intent) -> None:
        if self.closed:  # a live job that had written may still ask to bring a closed document in step
            intent.result = IntentResult.DROPPED
            return
        self.intents.append(intent)

    def settled(self, write_out: WriteOut, hunks: Sequence[Hunk]) -> None:
        """New output of a job (and the hunks it settled): a live job's document is brought in step."""
        if write_out.delivery != "live" or (not (hunks and write_out.writes_live) and write_out.in_step()):
            return
        waiting = self.in_flight.intent if self.in_flight is not None else None
        if not any(intent.write_out is write_out and intent.live and intent is not waiting for intent in self.intents):
            self.queue(Intent(write_out, "apply", live=True))  # planned on the job's state when its turn comes

    def pending_intents(self, write_out: WriteOut) -> bool:
        """True while the job has something queued or in flight."""
        return any(intent.write_out is write_out for intent in self.intents) or (
            self.in_flight is not None and self.in_flight.intent.write_out is write_out
        )

    def plan(self) -> PlannedEdit | None:
        """The next edit to send, or None (nothing to write, or an edit is already in flight)."""
        if self.in_flight is not None:
            return None
        while self.intents:
            intent = self.intents[0]
            provisional = None
            if intent.live:
                edits, hunk_ids, provisional = self._live_edits(intent.write_out)
            else:
                edits, hunk_ids = self._edits_for(intent)
            planned = PlannedEdit(next(self._ids), intent, self.version, [], hunk_ids, self.text, provisional)
            planned.edits = [edit for edit in edits if self.text[edit[0] : edit[1]] != edit[2]]
            if not planned.edits:
                if hunk_ids or provisional is not None:  # the document holds it already: nothing to send
                    self._confirm(planned)
                self._retire(
                    intent,
                    IntentResult.DROPPED if intent.live and not intent.write_out.writes_live else IntentResult.DONE,
                )
                continue
            planned.expected_text = apply_edits(self.text, planned.edits)
            self.in_flight = planned
            return planned
        return None

    def _live_edits(self, write_out: WriteOut) -> tuple[list[Edit], list[int], tuple[int, str] | None]:
        """What brings a live job's document in step: its pending hunks, and its provisional text moved to
        the frontier (or taken out, once the job no longer writes live)."""
        region = write_out.region
        edits, hunk_ids = self._edits_for(Intent(write_out, "apply", live=True)) if write_out.writes_live else ([], [])
        if write_out.in_step():
            return edits, hunk_ids, None
        text, at = write_out.provisional, region.frontier
        where = region.offset_of(at) if text else None
        if where is None:
            text = ""
        old = region.provisional_range()
        if old is not None:
            edits.append((old[0], old[1], ""))
        if text:
            assert where is not None
            edits.append((where, where, text))
        if not edits:
            return [], [], None
        return _joined(edits), hunk_ids, (at, text)

    def _edits_for(self, intent: Intent) -> tuple[list[Edit], list[int]]:
        write_out, region = intent.write_out, intent.write_out.region
        found: list[tuple[Edit, int]] = []
        if intent.kind == "apply":
            if intent.live and not write_out.writes_live:
                return [], []
            ids = intent.hunk_ids if intent.hunk_ids is not None else region.ids(HunkState.PENDING)
            for hunk_id in ids:
                if region.states[hunk_id] is not HunkState.PENDING:
                    continue  # written already (a late echo), or rejected
                where = region.pending_range(hunk_id)
                if where is None:
                    if intent.live:  # the user typed into it: live writing stops here
                        region.conflict = True
                        return [], []
                    continue
                found.append(((where[0], where[1], region.hunks[hunk_id].new_text), hunk_id))
        else:
            ids = intent.hunk_ids if intent.hunk_ids is not None else region.ids(HunkState.APPLIED)
            for hunk_id in ids:
                where = region.applied_range(hunk_id)
                if where is not None:
                    found.append(((where[0], where[1], region.hunks[hunk_id].old_text), hunk_id))
        found.sort(key=lambda item: (item[0][0], item[0][1]))
        return [edit for edit, _ in found], [hunk_id for _, hunk_id in found]

    # --------------------------------------------------------------------------------------- the client

    def since(self, version: int) -> Rebase | None:
        """The text at `version` and our edits since, if every change since was one of ours (else None: the
        user changed it). An editor asks for a rewrite of what it shows: while a live rewrite writes into
        the document, that may be a version or two before ours."""
        if version == self.version:
            return Rebase(self.text, [])
        versions = [before for before, _, _ in self._ours]
        if version not in versions:
            return None
        at = versions.index(version)
        return Rebase(self._ours[at][1], [edits for _, _, edits in list(self._ours)[at:]])

    @property
    def client_text(self) -> str:
        """The text as the client has it: the document's, and a held notification's changes (the next
        notification's positions are in it)."""
        return self._held.text if self._held is not None else self.text

    def did_change(self, version: int, changes: Sequence[Edit], text_after: str | None = None) -> None:
        """A `didChange`: its changes, each in the coordinates left by the one before (the first in
        `client_text`'s); `text_after`, if known, the text they make of `client_text`."""
        held, self._held = self._held, None
        if held is not None:
            changes = [*held.changes, *changes]  # one notification, as far as the echo goes
        first_user = 0
        candidates = list(self._expired)
        waiting = self.in_flight
        if waiting is not None and waiting.version == self.version and waiting.echo is None:
            candidates.insert(0, waiting)
        if candidates and changes:
            text = self.text
            for count, change in enumerate(changes, start=1):
                text = apply_edits(text, [change])
                echoed = next((edit for edit in candidates if text == edit.expected_text), None)
                if echoed is not None:
                    self._ours.append((self.version, self.text, echoed.edits))
                    self.text = text
                    echoed.echo = True
                    self._confirm(echoed)
                    first_user = count
                    break
            else:
                if held is None and _started(self.text, text, candidates):
                    self._held = HeldChange(list(changes), text)
                    return  # the rest of the echo is on its way
            if self.in_flight is not None and self.in_flight.echo is None:
                self.in_flight.echo = False  # the client's first change after its version was not it
        self._expired = []
        if first_user < len(changes):
            self._ours.clear()  # the user's: a request made before it is stale
        for start, end, new_text in changes[first_user:]:
            if text_after is None:
                self.text = self.text[:start] + new_text + self.text[end:]
            for write_out in self.write_outs:
                write_out.region.user_edit(start, end, new_text)
        if text_after is not None:  # what the changes make of it, known already: a 5 MB text built once
            self.text = text_after
        self.version = version

    def on_response(self, edit: PlannedEdit, applied: bool) -> None:
        """The client's answer to the applyEdit request."""
        edit.response = applied

    def expire(self, edit: PlannedEdit) -> None:
        """No echo came in time after `applied: true`: assume it was skipped and plan it again. Safe: the
        same edit at the same version is the same edit, and a late echo still matches the new one."""
        if edit.echo is None:
            edit.echo = False

    def finish(self, edit: PlannedEdit) -> Intent:
        """The edit is resolved: close it, and re-queue its intent (rebased) if it was not applied."""
        assert edit is self.in_flight and edit.resolved
        self.in_flight = None
        intent = edit.intent
        if edit.echo is False and edit.response is True and self.version == edit.version:
            self._expired.append(edit)  # no change seen since: the echo may still be on its way
        if edit.echo:
            # An intent for all pending hunks may have more to do (hunks settled meanwhile): it ends here.
            self._retire(intent, IntentResult.DONE)
            if intent.live:  # what is in the document now is not what the job wants (it stopped meanwhile)
                self.settled(intent.write_out, [])
            return intent
        refused = edit.response is False and edit.echo is None and self.version == edit.version
        intent.attempts += 1
        if refused or intent.attempts >= MAX_ATTEMPTS:
            self._retire(intent, IntentResult.REFUSED)
        return intent

    def drop_all(self) -> None:
        """The document is gone: nothing more will be written, nor queued."""
        self.closed = True
        for intent in self.intents:
            intent.result = IntentResult.DROPPED
        self.intents.clear()

    def _retire(self, intent: Intent, result: IntentResult) -> None:
        if intent in self.intents:
            self.intents.remove(intent)
        intent.result = result

    def _confirm(self, edit: PlannedEdit) -> None:
        write_out = edit.intent.write_out
        for hunk_id in edit.hunk_ids:
            if edit.intent.kind == "apply":
                write_out.region.mark_applied(hunk_id)
            else:
                write_out.region.mark_reverted(hunk_id, offered=edit.intent.offer)
        if edit.provisional is not None:
            write_out.region.mark_provisional(*edit.provisional)
        for other in self.write_outs:
            if other is not write_out:
                for start, end, new_text in reversed(edit.edits):
                    other.region.our_edit(start, end, new_text)


@dataclass(frozen=True)
class HeldChange:
    """A notification held as the start of an edit's echo: its changes, and the text after them."""

    changes: list[Edit]
    text: str


def _started(before: str, after: str, candidates: Sequence[PlannedEdit]) -> bool:
    """Some edit's last parts (Neovim applies them bottom up) turn `before` into `after`."""
    return any(
        apply_edits(before, edit.edits[first:]) == after for edit in candidates for first in range(1, len(edit.edits))
    )


Span = tuple[int, int, int]  # (start, end, length): text[start:end] replaced with `length` characters


@dataclass(frozen=True)
class Rebase:
    """The text at an older version of a document, and our edits since (each list one version's)."""

    text: str
    edits: list[list[Edit]]

    def range(self, start: int, end: int) -> tuple[int, int]:
        """Where `text[start:end]` is now. What our edits inserted at its edges stays outside it; what they
        wrote over its text is inside it."""
        for edits in self.edits:
            spans = [(old_start, old_end, len(new_text)) for old_start, old_end, new_text in edits]
            start, end = _moved(start, spans, at_start=True), _moved(end, spans, at_start=False)
        return start, max(start, end)

    def back(self, start: int, end: int) -> tuple[int, int]:
        """Where a range of the current text was in `text`; what our edits wrote in it is inside it."""
        for edits in reversed(self.edits):
            spans, shift = [], 0
            for old_start, old_end, new_text in edits:
                spans.append((old_start + shift, old_start + shift + len(new_text), old_end - old_start))
                shift += len(new_text) - (old_end - old_start)
            start, end = _moved(start, spans, at_start=True), _moved(end, spans, at_start=False)
        return start, max(start, end)


def _moved(offset: int, spans: list[Span], *, at_start: bool) -> int:
    """Where an offset is once `spans` (ascending, none touching) are replaced. An insertion at the offset
    goes before a range's start and after its end; an offset inside replaced text goes to the replacement's
    start (a range's start) or end (a range's end)."""
    shift = 0
    for start, end, length in spans:
        if offset < start or (offset == start and (start < end or not at_start)):
            break
        if offset >= end:
            shift += length - (end - start)
            continue
        return start + shift + (0 if at_start else length)
    return offset + shift


def _joined(edits: list[Edit]) -> list[Edit]:
    """Edits in order, those that touch joined into one (a hunk written where provisional text was, the
    provisional text written right after a hunk): one edit per place, whatever order the client applies
    them in. At one point, the edits keep the order they came in."""
    ordered = sorted(enumerate(edits), key=lambda item: (item[1][0], item[1][1], item[0]))
    joined: list[Edit] = []
    for _, (start, end, text) in ordered:
        if joined and start <= joined[-1][1]:
            previous = joined[-1]
            assert start == previous[1], "edits overlap"
            joined[-1] = (previous[0], end, previous[2] + text)
        else:
            joined.append((start, end, text))
    return joined
