"""Property tests of settled hunks and of writing them into a document the user is typing in.

The delivery tests simulate the two kinds of editor the server meets, message by message, in an order
Hypothesis chooses: VS Code (reports each change at once, refuses a stale edit with `applied: false`) and
Neovim (batches its change notifications, skips a stale edit yet answers `applied: true`).
"""

from __future__ import annotations

import difflib
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specedit.lsp.delivery import DocumentState, Edit, Intent, IntentResult, PlannedEdit, Rebase, WriteOut
from specedit.lsp.hunks import Hunk, HunkTracker, LineEnds, apply_hunks, line_end, split_lines
from specedit.lsp.region import HunkState, RegionTracker, apply_edits

LINES = [
    "def add(a, b):",
    "    return a + b",
    "}",
    "",
    "    x = 'héllo 🙂'  # emoji",
    "cafe\u0301 = 'combining'",
    "coder = '\U0001f469\u200d\U0001f4bb'  # a ZWJ sequence",
    "print(add(1, 2))",
    "class Point:",
    "        self.x = x",
]
TYPED = ["a", "§", "🙂", "e\u0301", "\n", "\r\n", "xyz", ""]  # what the user types ("§" marks it)

line_endings = st.sampled_from(["\n", "\r\n"])


@st.composite
def documents(draw: st.DrawFn, *, min_lines: int = 0, eol: str | None = None) -> str:
    """Lines of code-ish text, one line ending for the whole text, maybe without a final line end."""
    eol = eol or draw(line_endings)
    lines = draw(st.lists(st.sampled_from(LINES), min_size=min_lines, max_size=12))
    text = "".join(line + eol for line in lines)
    if text and draw(st.booleans()):
        text = text[: -len(eol)]
    return text


@st.composite
def rewrites(draw: st.DrawFn, original: str) -> str:
    """A model output: the original with lines deleted, inserted, changed (or, sometimes, anything)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(alphabet=st.sampled_from([*"ab\n\r🙂é", "\u0301"]), max_size=40))
    eol = "\r\n" if "\r\n" in original else "\n"
    lines = split_lines(original)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        op = draw(st.sampled_from(["insert", "delete", "change"]))
        if op == "insert" or not lines:
            lines[at:at] = [draw(st.sampled_from(LINES)) + eol for _ in range(draw(st.integers(1, 3)))]
        elif at < len(lines):
            count = draw(st.integers(1, 3))
            replacement = [] if op == "delete" else [draw(st.sampled_from(LINES)) + "!" + eol]
            lines[at : at + count] = replacement
    return "".join(lines)


def chunked(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# ------------------------------------------------------------------------------------------ hunks


def test_split_lines_keeps_every_character() -> None:
    assert split_lines("a\r\nb\rc\n\nd") == ["a\r\n", "b\rc\n", "\n", "d"]
    assert "".join(split_lines("x\n\n")) == "x\n\n"


def test_unchanged_output_gives_no_hunks() -> None:
    original = "def add(a, b):\r\n    return a + b\r\n"
    tracker = HunkTracker(original)
    assert tracker.feed(original) == []
    assert tracker.finish() == []
    assert tracker.frontier == len(original)


def test_a_lone_brace_does_not_settle_a_hunk() -> None:
    original = "if a:\n    f()\n}\nif b:\n    g()\n}\n"
    tracker = HunkTracker(original)
    assert tracker.feed("if a:\n    f(1)\n}\n") == []  # "}" matches twice and is too weak alone
    assert tracker.feed("if b:\n") == []  # "}" + "if b:": 6 characters, still too weak
    settled = tracker.feed("    g()\n}\n")
    assert [(h.start, h.end, h.new_text) for h in settled] == [(6, 14, "    f(1)\n")]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_settled_hunks_rebuild_the_output(data: st.DataObject) -> None:
    original = data.draw(documents())
    raw = data.draw(rewrites(original))
    tracker = HunkTracker(original)
    output = LineEnds(tracker.newline).whole(raw)  # what the hunks write: the line ends the original's
    hunks: list[Hunk] = []
    for chunk in chunked(data.draw, raw):
        new = tracker.feed(chunk)
        # A settled hunk lies before the frontier; the frontier only moves forward.
        assert all(hunk.end <= tracker.frontier for hunk in new)
        hunks += new
        # What is settled so far already agrees with the output.
        assert output.startswith(apply_hunks(original[: tracker.frontier], hunks))
    hunks += tracker.finish(raw)
    assert apply_hunks(original, hunks) == output
    assert all(hunk.old_text != hunk.new_text for hunk in hunks)
    assert all(a.end < b.start or (a.end == b.start and a.start < a.end) for a, b in itertools.pairwise(hunks))
    assert all(original[h.start : h.end] == h.old_text for h in hunks)


def test_final_text_must_continue_the_stream() -> None:
    tracker = HunkTracker("a\n")
    tracker.feed("b\n")
    with pytest.raises(ValueError):
        tracker.finish("c\n")


# ----------------------------------------------------------------------------------- region tracker


def test_region_tracker_reverts_exactly() -> None:
    original = "one\ntwo\nthree\n"
    region = RegionTracker(original, start=4)
    region.add(Hunk(0, 4, 8, "two\n", ""))  # a deletion: an empty piece that can be reverted
    region.mark_applied(0)
    assert region.text() == "one\nthree\n"
    assert region.applied_range(0) == (8, 8)
    assert region.user_edit(0, 0, "§") is False
    assert region.applied_range(0) == (9, 9)
    region.mark_reverted(0)
    assert region.text() == original


def test_typing_inside_an_applied_hunk_makes_it_dirty_not_revertible() -> None:
    region = RegionTracker("a\nb\n", start=0)
    region.add(Hunk(0, 0, 2, "a\n", "A\n"))
    region.mark_applied(0)
    region.user_edit(1, 1, "§")
    assert region.states[0] is HunkState.DIRTY
    assert region.applied_range(0) is None
    assert region.text() == "A§\nb\n"


# ---------------------------------------------------------------------------------- delivery (sim)


@dataclass
class FakeEditor:
    """An editor's copy of the document, behaving like VS Code or like Neovim."""

    kind: Literal["vscode", "nvim"]
    text: str
    version: int = 1
    unsent: list[Edit] = field(default_factory=list)
    eol: str = ""  # the document's line end, which both editors give every line break of a text they insert

    def __post_init__(self) -> None:
        self.eol = self.eol or line_end(self.text)

    def change(self, edit: Edit, outbox: deque[Any]) -> None:
        start, end, new_text = edit
        self.text = self.text[:start] + new_text + self.text[end:]
        self.version += 1
        if self.kind == "vscode":
            outbox.append(("change", self.version, [edit]))
        else:
            self.unsent.append(edit)

    def apply(self, planned: PlannedEdit, outbox: deque[Any], *, split: bool = False) -> None:
        if planned.version != self.version:  # stale
            outbox.append(("response", planned, self.kind == "nvim"))
            return
        for start, end, _ in planned.edits:
            assert "§" not in self.text[start:end], "the server clobbered the user's typing"
        edits = [(start, end, LineEnds(self.eol).whole(new_text)) for start, end, new_text in planned.edits]
        if self.kind == "vscode":
            # One change per edit, last first, so that each is valid after the one before.
            changes = list(reversed(edits))
            self.text = apply_edits(self.text, edits)
            self.version += 1
            outbox.append(("change", self.version, changes))
        else:
            if split and len(edits) > 1 and not self.unsent:
                # Neovim applies the parts bottom up; after a quiet while, the first goes out at once, alone.
                partial = apply_edits(self.text, edits[-1:])
                self.version += 1
                outbox.append(("change", self.version, [_minimal_change(self.text, partial)]))
                self.text, edits = partial, edits[:-1]
            # Neovim reports the smallest change it can see, later, together with the user's typing.
            after = apply_edits(self.text, edits)
            self.unsent.append(_minimal_change(self.text, after))
            self.text = after
            self.version += 3  # changedtick moves by more than one
        outbox.append(("response", planned, True))

    def flush(self, outbox: deque[Any]) -> None:
        if self.unsent:
            outbox.append(("change", self.version, self.unsent))
            self.unsent = []


def _minimal_change(before: str, after: str) -> Edit:
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    opcodes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    start, end = opcodes[0][1], opcodes[-1][2]
    new_start, new_end = opcodes[0][3], opcodes[-1][4]
    return start, end, after[new_start:new_end]


class Simulation:
    def __init__(
        self,
        data: st.DataObject,
        kind: Literal["vscode", "nvim"],
        prefix: str,
        original: str,
        suffix: str,
        mode: Literal["live", "preview", "final"],
        *,
        typing_inside: bool = False,
    ) -> None:
        self.data = data
        self.prefix, self.suffix = prefix, suffix
        self.typing_inside = typing_inside
        self.editor = FakeEditor(kind, prefix + original + suffix)
        self.doc = DocumentState("file:///t.py", prefix + original + suffix, 1)
        self.job = WriteOut.start("r1", mode, original, len(prefix), newline=line_end(prefix + original + suffix))
        self.doc.write_outs.append(self.job)
        self.to_client: deque[PlannedEdit] = deque()
        self.to_server: deque[Any] = deque()
        self.user_edits_left = data.draw(st.integers(0, 8))

    # one step of someone ---------------------------------------------------------------------------
    def step(self, server_work: list[str]) -> bool:
        actions: list[str] = []
        if server_work:
            actions.append("feed")
        if self.doc.in_flight is None and self.doc.intents:
            actions.append("send")
        if self.to_client:
            actions.append("client")
        if self.to_server:
            actions.append("server")
        if self.editor.unsent:
            actions.append("flush")
        if self.user_edits_left:
            actions.append("type")
        edit = self.doc.in_flight
        if edit is not None and edit.response is True and edit.echo is None and not self.to_server:
            actions.append("expire")
        if not actions:
            return False
        action = self.data.draw(st.sampled_from(actions))
        if action == "feed":
            chunk = server_work.pop(0)
            self.doc.settled(self.job, self.job.feed(chunk))
        elif action == "send":
            planned = self.doc.plan()
            if planned is not None:
                self.to_client.append(planned)
        elif action == "client":
            self.editor.apply(self.to_client.popleft(), self.to_server, split=self.data.draw(st.booleans()))
        elif action == "flush":
            self.editor.flush(self.to_server)
        elif action == "type":
            self.user_types()
        elif action == "expire":
            assert edit is not None
            self.doc.expire(edit)
        else:
            message = self.to_server.popleft()
            if message[0] == "change":
                self.doc.did_change(message[1], message[2])
            else:
                self.doc.on_response(message[1], message[2])
        edit = self.doc.in_flight
        if edit is not None and edit.resolved and edit.response is not None:
            event(f"edit resolved: echo={edit.echo} response={edit.response}")
            self.doc.finish(edit)
        if self.job.region.conflict:
            event("conflict")
        return True

    def user_types(self) -> None:
        self.user_edits_left -= 1
        text, draw = self.editor.text, self.data.draw
        typed = draw(st.sampled_from(TYPED))
        region_start, region_end = len(self.prefix), len(text) - len(self.suffix)
        if self.typing_inside:
            start = draw(st.integers(0, len(text)))
            end = draw(st.integers(start, min(len(text), start + 3)))
            self.editor.change((start, end, typed), self.to_server)
            return
        if draw(st.booleans()):  # in the text before the region (at its very start included)
            start = draw(st.integers(0, region_start))
            end = draw(st.integers(start, region_start))
            self.prefix = self.prefix[:start] + typed + self.prefix[end:]
        else:  # after it (at its very end included, unless the region is empty: that is "before")
            low = region_end + (1 if region_start == region_end else 0)
            if low > len(text):
                return
            start = draw(st.integers(low, len(text)))
            end = draw(st.integers(start, len(text)))
            at = start - region_end
            self.suffix = self.suffix[:at] + typed + self.suffix[end - region_end :]
        self.editor.change((start, end, typed), self.to_server)

    def run(self, work: list[str]) -> None:
        for _ in range(5000):
            if not self.step(work):
                break
            if self.typing_inside:
                continue
            # Invariant: the pieces describe the server's copy exactly.
            region = self.job.region
            assert self.doc.text[region.start : region.end] == region.text()
        else:
            raise AssertionError("the simulation did not settle")
        assert self.doc.in_flight is None and not self.doc.intents
        assert self.doc.text == self.editor.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    kind=st.sampled_from(["vscode", "nvim"]),
    mode=st.sampled_from(["live", "preview", "final"]),
)
def test_user_edits_plus_hunks_and_reject_restores(data: st.DataObject, kind: Any, mode: Any) -> None:
    eol = data.draw(line_endings)
    prefix, original, suffix = (data.draw(documents(eol=eol)) for _ in range(3))
    output = data.draw(rewrites(original))
    sim = Simulation(data, kind, prefix, original, suffix, mode)
    sim.run(chunked(data.draw, output))
    job, doc = sim.job, sim.doc
    if mode != "live":
        assert sim.editor.text == sim.prefix + original + sim.suffix  # nothing written yet
    doc.settled(job, job.finish(output))
    if mode != "live":
        doc.queue(Intent(job, "apply"))  # the end of `final`, or `specedit.accept` after a preview
    sim.run([])
    assert not job.region.conflict
    assert sim.editor.text == sim.prefix + LineEnds(sim.editor.eol).whole(output) + sim.suffix
    # Reject: the region exactly as it was, the user's typing kept.
    doc.queue(Intent(job, "revert"))
    sim.run([])
    assert sim.editor.text == sim.prefix + original + sim.suffix


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(["vscode", "nvim"]), mode=st.sampled_from(["live", "final"]))
def test_typing_anywhere_is_never_clobbered(data: st.DataObject, kind: Any, mode: Any) -> None:
    """The user types anywhere, the region included: what they type survives (FakeEditor checks every
    edit), the copies agree, and the pieces still describe the region."""
    eol = data.draw(line_endings)
    prefix, suffix = data.draw(documents(eol=eol)), data.draw(documents(eol=eol))
    original = data.draw(documents(min_lines=1, eol=eol))
    output = data.draw(rewrites(original))
    sim = Simulation(data, kind, prefix, original, suffix, mode, typing_inside=True)
    sim.run(chunked(data.draw, output))
    sim.doc.settled(sim.job, sim.job.finish(output))
    if mode == "final":
        sim.doc.queue(Intent(sim.job, "apply"))
    sim.run([])
    region = sim.job.region
    assert sim.doc.text[region.start : region.end] == region.text()
    sim.doc.queue(Intent(sim.job, "revert"))
    sim.run([])
    assert sim.doc.text[region.start : region.end] == region.text()


def test_refused_edit_is_not_retried() -> None:
    doc = DocumentState("file:///t.py", "a\nb\n", 1)
    job = WriteOut.start("r1", "final", "a\nb\n", 0)
    doc.write_outs.append(job)
    doc.settled(job, job.finish("a\nB\n"))
    intent = Intent(job, "apply")
    doc.queue(intent)
    planned = doc.plan()
    assert planned is not None and planned.edits == [(2, 4, "B\n")]
    doc.on_response(planned, False)  # the user said no in VS Code's refactor preview
    doc.finish(planned)
    assert intent.result is IntentResult.REFUSED and doc.plan() is None


# ------------------------------------------------------------------------------ provisional text (live)

HEAD = "# head\n"
BEFORE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


def _live(original: str = BEFORE) -> tuple[DocumentState, WriteOut]:
    doc = DocumentState("file:///t.py", HEAD + original + "# tail\n", 1)
    job = WriteOut.start("r1", "live", original, len(HEAD))
    doc.write_outs.append(job)
    return doc, job


def _write_all(doc: DocumentState, *, typed: Edit | None = None) -> None:
    """VS Code: every planned edit applied and echoed at once (after the user's `typed`, when given)."""
    while (planned := doc.plan()) is not None:
        if typed is not None:
            doc.did_change(doc.version + 1, [typed])
            typed = None
            doc.on_response(planned, False)
        else:
            doc.did_change(doc.version + 1, list(reversed(planned.edits)))
            doc.on_response(planned, True)
        doc.finish(planned)


def test_a_live_job_shows_what_it_writes_before_the_lines_it_has_not_reached() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(w, h):\n    return w * h  # the"))
    _write_all(doc)
    # The changed line, provisional, above the old one, which stays until the hunk settles.
    assert doc.text == HEAD + "def area(w, h):\n    return w * h  # the\n    return w * h\n\n\ndef perimeter" + (
        "(w, h):\n    return 2 * (w + h)\n# tail\n"
    )
    start, end = job.region.provisional_range() or (0, 0)
    assert doc.text[start:end] == "    return w * h  # the\n"
    doc.settled(job, job.feed(" area\n\n\ndef perimeter(w, h):\n    return 2"))
    _write_all(doc)
    # Settled: the hunk written; the line being written begins like the old one: nothing provisional.
    assert doc.text == HEAD + "def area(w, h):\n    return w * h  # the area\n\n\ndef perimeter(w, h):\n" + (
        "    return 2 * (w + h)\n# tail\n"
    )
    assert job.region.provisional_range() is None
    doc.settled(job, job.feed(" * w + 2"))
    _write_all(doc)
    assert doc.text.endswith("def perimeter(w, h):\n    return 2 * w + 2\n    return 2 * (w + h)\n# tail\n")
    after = BEFORE.replace("w * h\n", "w * h  # the area\n").replace("2 * (w + h)", "2 * w + 2 * h")
    doc.settled(job, job.finish(after))
    _write_all(doc)
    assert doc.text == HEAD + after + "# tail\n"
    assert job.region.provisional_range() is None and not doc.intents


def test_the_beginning_of_an_unchanged_line_is_not_shown_twice() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(w, h):\n    return w"))
    assert job.tracker.provisional == "" and not doc.intents


def test_a_stopped_live_job_takes_its_provisional_text_out() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n    return width"))
    _write_all(doc)
    assert "def area(width, height):\n    return width\ndef area(w, h):" in doc.text
    job.stopped = True  # cancelled
    doc.settled(job, [])
    _write_all(doc)
    assert doc.text == HEAD + BEFORE + "# tail\n"


def test_typing_into_provisional_text_stops_the_job_and_keeps_the_typing() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    _write_all(doc)
    at = doc.text.index("width") + len("width")
    doc.did_change(doc.version + 1, [(at, at, "§")])
    assert job.region.conflict and not job.writes_live
    doc.settled(job, job.feed("    return width * height\n"))
    _write_all(doc)
    assert "def area(width§, height):\n" in doc.text  # ours no longer: left as the user made it
    assert doc.text[job.region.start : job.region.end] == job.region.text()


def test_provisional_text_is_rebased_over_the_users_typing_elsewhere() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    _write_all(doc, typed=(0, 0, "§§\n"))  # the first edit is stale: planned again
    assert doc.text.startswith("§§\n# head\ndef area(width, height):\ndef area(w, h):\n")
    job.stopped = True
    doc.settled(job, [])
    _write_all(doc)
    assert doc.text == "§§\n" + HEAD + BEFORE + "# tail\n"


def test_a_job_that_stops_while_its_provisional_text_is_on_its_way_takes_it_out() -> None:
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    planned = doc.plan()
    assert planned is not None
    job.stopped = True  # cancelled before the edit came back: the document does not hold it yet
    doc.settled(job, [])
    doc.did_change(doc.version + 1, list(reversed(planned.edits)))
    doc.on_response(planned, True)
    doc.finish(planned)
    assert "width" in doc.text and doc.pending_intents(job)
    _write_all(doc)
    assert doc.text == HEAD + BEFORE + "# tail\n"


def test_a_late_echo_is_recognised_after_edits_planned_again_meanwhile() -> None:
    """Neovim sends its changes late: the server gave up waiting for an edit's echo, planned the job's
    newer state, gave up on that too; the first edit's echo, arriving then, is still the server's own
    (else its provisional text would be left in the document as if the user had typed it)."""
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    first = doc.plan()
    assert first is not None
    doc.on_response(first, True)  # applied in the editor; its echo not sent yet
    doc.expire(first)
    doc.finish(first)
    doc.settled(job, job.feed("    return width * height\n"))
    again = doc.plan()
    assert again is not None and again.version == first.version
    doc.on_response(again, True)  # stale there: Neovim answers `applied` and does nothing
    doc.expire(again)
    doc.finish(again)
    end = len(first.expected_text)  # the user typed at the end of the file; Neovim sends both at once
    doc.did_change(doc.version + 3, [*reversed(first.edits), (end, end, "§")])
    assert doc.text == first.expected_text + "§"
    assert not job.region.conflict and doc.text[job.region.start : job.region.end] == job.region.text()
    after = BEFORE.replace("(w, h):\n    return w * h", "(width, height):\n    return width * height")
    doc.settled(job, job.finish(after))
    _write_all(doc)
    assert doc.text == HEAD + after + "# tail\n§"


def test_an_echo_neovim_sends_in_two_notifications_is_the_servers_own() -> None:
    """Seen in Neovim 0.11 (a live rewrite, nobody typing): an edit in two parts (a settled hunk, the
    provisional text further down) is applied bottom up; the lower part's change goes out at once, alone,
    the upper one's a debounce later. Both together are the echo: nothing the user typed, no conflict, no
    provisional text left behind."""
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    _write_all(doc)
    doc.settled(job, job.feed("    return width * height\n\n\ndef perimeter(w, h):\n    return 2 * w"))
    planned = doc.plan()
    assert planned is not None and len(planned.edits) == 2
    upper, lower = planned.edits
    doc.on_response(planned, True)
    before = doc.text
    doc.did_change(doc.version + 1, [lower])
    assert planned.echo is None and doc.text == before  # the start of its echo, held: the rest is on its way
    assert doc.client_text == apply_edits(before, [lower])  # where the next notification's positions are
    doc.did_change(doc.version + 1, [upper])
    assert planned.echo is True and doc.text == planned.expected_text
    doc.finish(planned)
    assert not job.region.conflict and doc.text[job.region.start : job.region.end] == job.region.text()
    after = BEFORE.replace("(w, h):\n    return w * h", "(width, height):\n    return width * height")
    after = after.replace("2 * (w + h)", "2 * width + 2 * height")
    doc.settled(job, job.finish(after))
    _write_all(doc)
    assert doc.text == HEAD + after + "# tail\n"


def test_a_lone_part_of_an_edit_followed_by_something_else_is_the_users() -> None:
    """The first part's change, then a change that is not the rest (even after the edit expired): both are
    the user's; the document's copy and the job's map of it stay exact."""
    for expired in (False, True):
        doc, job = _live()
        doc.settled(job, job.feed("def area(width, height):\n"))
        _write_all(doc)
        doc.settled(job, job.feed("    return width * height\n\n\ndef perimeter(w, h):\n    return 2 * w"))
        planned = doc.plan()
        assert planned is not None
        doc.on_response(planned, True)
        lower, before = planned.edits[1], doc.text
        doc.did_change(doc.version + 1, [lower])
        if expired:
            doc.expire(planned)
        doc.did_change(doc.version + 1, [(0, 0, "§")])
        assert planned.echo is False
        assert doc.text == "§" + apply_edits(before, [lower])
        doc.finish(planned)
        assert doc.text[job.region.start : job.region.end] == job.region.text()
        _write_all(doc)
        assert doc.text[job.region.start : job.region.end] == job.region.text()


def test_a_closed_document_gets_nothing_more_to_write() -> None:
    """The editor closed it (or is gone) while a live job's edit was in flight: its echo arriving then
    must not bring the job's document in step again (an edit sent to no one, waited on for minutes)."""
    doc, job = _live()
    doc.settled(job, job.feed("def area(width, height):\n"))
    planned = doc.plan()
    assert planned is not None
    doc.drop_all()
    doc.did_change(doc.version + 1, list(reversed(planned.edits)))
    doc.on_response(planned, True)
    doc.finish(planned)
    doc.settled(job, job.feed("    return width * height\n"))
    assert not doc.intents and doc.plan() is None


def test_a_live_edit_has_the_line_ends_the_editor_gives_it() -> None:
    """A model that writes a lone "\\r" (or "\\r\\n") in a "\\n" document: Neovim and VS Code insert it as
    "\\n"; were the server to send "\\r", the echo would differ from its edit and look like the user's
    typing, and a cancelled rewrite would leave its provisional text in the buffer."""
    doc, job = _live()
    editor = FakeEditor("nvim", doc.text)

    def write_all() -> None:
        while (planned := doc.plan()) is not None:
            outbox: deque[Any] = deque()
            editor.apply(planned, outbox)
            editor.flush(outbox)
            for message in reversed(outbox):  # the echo, then the answer
                if message[0] == "change":
                    doc.did_change(message[1], message[2])
                else:
                    doc.on_response(message[1], message[2])
            assert planned.echo, "the echo was taken for the user's typing"
            doc.finish(planned)
        assert doc.text == editor.text

    doc.settled(job, job.feed("def area(w, h):\r\n    return w * h  # the\rarea\n\n\ndef perimeter(w, h):\n"))
    doc.settled(job, job.feed("    return 3\r"))  # the "\\r" waits: the next piece may begin with "\\n"
    write_all()
    written = "def area(w, h):\n    return w * h  # the\narea\n\n\ndef perimeter(w, h):\n    return 3\n"
    assert doc.text == HEAD + written + "    return 2 * (w + h)\n# tail\n"
    job.stopped = True  # cancelled: the provisional line goes, the settled hunk stays
    doc.settled(job, [])
    write_all()
    assert doc.text == HEAD + written.removesuffix("    return 3\n") + "    return 2 * (w + h)\n# tail\n"


def test_provisional_text_has_the_documents_line_ends() -> None:
    """Editors convert other line ends in what they are given (VS Code does): the edit would then no longer
    be what the server sees echoed."""
    tracker = HunkTracker("a = 1\r\nb = 2\r\n")
    tracker.feed("x\ry\nz\u2028w")
    assert tracker.provisional == "x\r\ny\r\nz\r\nw\r\n"


# ----------------------------------------------------------- a request made before the server's own edits


def test_a_request_behind_only_the_servers_own_edits_is_carried_over() -> None:
    """An editor asks for a rewrite of what it shows; a live rewrite may have written into it meanwhile."""
    doc, job = _live()
    asked = doc.version
    perimeter = doc.text.index("def perimeter")
    doc.settled(job, job.feed("def area(width, height):\n    return width"))
    _write_all(doc)  # provisional text, above the lines the job has not reached
    assert doc.version > asked
    rebase = doc.since(asked)
    assert rebase is not None and rebase.text == HEAD + BEFORE + "# tail\n"
    # The request's range (the old text's "def perimeter..." to the end) is that text still.
    start, end = rebase.range(perimeter, len(rebase.text))
    assert doc.text[start:end] == rebase.text[perimeter:]
    # A range from the top: what the server inserted inside it is inside it.
    start, end = rebase.range(0, perimeter)
    assert (start, doc.text[end:]) == (0, rebase.text[perimeter:])
    # Back to the request's text: the provisional lines the server wrote in the range are inside it.
    assert rebase.back(start, end) == (0, perimeter)
    assert rebase.back(end, len(doc.text)) == (perimeter, len(rebase.text))
    doc.did_change(doc.version + 1, [(0, 0, "§")])  # the user's own change: older requests are stale now
    assert doc.since(asked) is None and doc.since(doc.version - 1) is None
    assert doc.since(doc.version) == type(rebase)(doc.text, [])


@given(
    text=st.text(alphabet="ab\n", max_size=30),
    cuts=st.lists(st.integers(0, 30), min_size=2, max_size=2),
    inserts=st.lists(st.tuples(st.integers(0, 30), st.text(alphabet="xy\n", min_size=1, max_size=4)), max_size=4),
)
def test_server_insertions_outside_a_range_leave_its_text(
    text: str, cuts: list[int], inserts: list[tuple[int, str]]
) -> None:
    """The range's text is where `Rebase.range` says, whatever the server inserted around it (at its edges
    included); what it inserted inside stays inside; `back` returns it to where it was."""
    start, end = sorted(min(cut, len(text)) for cut in cuts)
    edits = sorted({min(at, len(text)): (min(at, len(text)), min(at, len(text)), new) for at, new in inserts}.values())
    after = apply_edits(text, edits)
    moved_start, moved_end = Rebase(text, [edits]).range(start, end)
    inside = [(at - start, at - start, new) for at, _, new in edits if start < at < end]
    assert after[moved_start:moved_end] == apply_edits(text[start:end], inside)
    assert Rebase(text, [edits]).back(moved_start, moved_end) == (start, end)  # the way back, for the hunks
