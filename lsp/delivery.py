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
give. Otherwise it was not applied, and it is planned again, rebased on the current text.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from specedit.lsp.hunks import Hunk, HunkState, HunkTracker, RegionTracker, SettleConfig, apply_edits

Edit = tuple[int, int, str]  # (start, end, new text): replace text[start:end]
DeliveryMode = Literal["live", "preview", "final"]
DELIVERY_MODES: tuple[DeliveryMode, ...] = ("live", "preview", "final")

MAX_ATTEMPTS = 50  # re-plans of one intent (each after the user typed meanwhile) before giving up


class Outcome(enum.Enum):
    DONE = "done"  # written (or nothing left to write)
    REFUSED = "refused"  # the client declined an up-to-date edit
    DROPPED = "dropped"  # no longer wanted: the job stopped writing live


@dataclass
class Job:
    """One rewrite's hunks on one document."""

    id: str
    delivery: DeliveryMode
    region: RegionTracker
    tracker: HunkTracker
    stopped: bool = False  # live writing ended (cancelled, superseded, closed)
    label: str = "specedit"  # what the editor calls its edits (its undo entry, a confirmation)

    @classmethod
    def start(
        cls,
        job_id: str,
        delivery: DeliveryMode,
        original: str,
        start: int,
        config: SettleConfig | None = None,
        *,
        label: str = "specedit",
    ) -> Job:
        return cls(job_id, delivery, RegionTracker(original, start), HunkTracker(original, config), label=label)

    @property
    def writes_live(self) -> bool:
        return self.delivery == "live" and not self.stopped and not self.region.conflict

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

    job: Job
    kind: Literal["apply", "revert"]
    hunk_ids: list[int] | None = None
    live: bool = False
    confirm: bool = False  # ask the user to confirm it, where the client can (a `final` rewrite's edit)
    attempts: int = 0
    outcome: Outcome | None = None


@dataclass
class PlannedEdit:
    """An edit sent to the client, computed for `version`, waiting for its echo and its answer."""

    id: int
    intent: Intent
    version: int
    edits: list[Edit]  # in the coordinates of the text at `version`, ascending
    hunk_ids: list[int]  # parallel to `edits`
    expected_text: str  # the text once the edit is applied
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
    jobs: list[Job] = field(default_factory=list)
    intents: deque[Intent] = field(default_factory=deque)
    in_flight: PlannedEdit | None = None
    _expired: PlannedEdit | None = None  # given up on after `applied: true`; its echo may still come
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    # ---------------------------------------------------------------------------------------- intents

    def queue(self, intent: Intent) -> None:
        self.intents.append(intent)

    def settled(self, job: Job, hunks: Sequence[Hunk]) -> None:
        """New hunks of a job: queued for writing when the job writes live."""
        if hunks and job.writes_live:
            self.queue(Intent(job, "apply", [hunk.id for hunk in hunks], live=True))

    def pending_intents(self, job: Job) -> bool:
        """True while the job has something queued or in flight."""
        return any(intent.job is job for intent in self.intents) or (
            self.in_flight is not None and self.in_flight.intent.job is job
        )

    def plan(self) -> PlannedEdit | None:
        """The next edit to send, or None (nothing to write, or an edit is already in flight)."""
        if self.in_flight is not None:
            return None
        while self.intents:
            intent = self.intents[0]
            edits, hunk_ids = self._edits_for(intent)
            if not edits:
                self._retire(intent, Outcome.DROPPED if intent.live and not intent.job.writes_live else Outcome.DONE)
                continue
            expected = apply_edits(self.text, edits)
            self.in_flight = PlannedEdit(next(self._ids), intent, self.version, edits, hunk_ids, expected)
            return self.in_flight
        return None

    def _edits_for(self, intent: Intent) -> tuple[list[Edit], list[int]]:
        job, region = intent.job, intent.job.region
        found: list[tuple[Edit, int]] = []
        if intent.kind == "apply":
            if intent.live and not job.writes_live:
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

    def did_change(self, version: int, changes: Sequence[Edit]) -> None:
        """A `didChange`: its changes, each in the coordinates left by the one before."""
        first_user = 0
        candidates = [
            edit
            for edit in (self.in_flight, self._expired)
            if edit is not None and edit.version == self.version and (edit is self._expired or edit.echo is None)
        ]
        if candidates and changes:
            text = self.text
            for count, change in enumerate(changes, start=1):
                text = apply_edits(text, [change])
                echoed = next((edit for edit in candidates if text == edit.expected_text), None)
                if echoed is not None:
                    self.text = text
                    echoed.echo = True
                    self._confirm(echoed)
                    first_user = count
                    break
            if self.in_flight is not None and self.in_flight.echo is None:
                self.in_flight.echo = False  # the client's first change after its version was not it
        self._expired = None
        for start, end, new_text in changes[first_user:]:
            self.text = self.text[:start] + new_text + self.text[end:]
            for job in self.jobs:
                job.region.user_edit(start, end, new_text)
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
            self._expired = edit  # no change seen since: the echo may still be on its way
        if edit.echo:
            # An intent for all pending hunks may have more to do (hunks settled meanwhile): it ends here.
            self._retire(intent, Outcome.DONE)
            return intent
        refused = edit.response is False and edit.echo is None and self.version == edit.version
        intent.attempts += 1
        if refused or intent.attempts >= MAX_ATTEMPTS:
            self._retire(intent, Outcome.REFUSED)
        return intent

    def drop_all(self) -> None:
        """The document is gone: nothing more will be written."""
        for intent in self.intents:
            intent.outcome = Outcome.DROPPED
        self.intents.clear()

    def _retire(self, intent: Intent, outcome: Outcome) -> None:
        if intent in self.intents:
            self.intents.remove(intent)
        intent.outcome = outcome

    def _confirm(self, edit: PlannedEdit) -> None:
        job = edit.intent.job
        for hunk_id in edit.hunk_ids:
            if edit.intent.kind == "apply":
                job.region.mark_applied(hunk_id)
            else:
                job.region.mark_reverted(hunk_id)
        for other in self.jobs:
            if other is not job:
                for start, end, new_text in reversed(edit.edits):
                    other.region.our_edit(start, end, new_text)
