"""The language server's boundary pieces: positions, settings, error mapping, the command line."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.exceptions import JsonRpcContentModified, JsonRpcInvalidParams
from pygls.workspace.position_codec import PositionCodec

from specedit.engine.records.errors import ModelLoadError, RegionError
from specedit.engine.records.events import Phase, Step
from specedit.lsp import protocol
from specedit.lsp.code_actions import instruction_comment
from specedit.lsp.command import add_lsp_parser
from specedit.lsp.config import Preset, Settings, section
from specedit.lsp.documents import TextIndex, minimal_change
from specedit.lsp.errors import REQUEST_FAILED, StaleVersionError, error_payload, to_jsonrpc
from specedit.lsp.jobs import overlap
from specedit.lsp.progress import LiveStats
from specedit.lsp.server import overrides_from_args

ENCODINGS = {"utf-8": 1, "utf-16": 2, "utf-32": 4}
PIECES = [*"ab \t", "\n", "\r", "\r\n", "\u00e9", "e\u0301", "🙂", "\x0c", "\u2028"]
texts = st.lists(st.sampled_from(PIECES), max_size=20).map("".join)


def _units(text: str, encoding: str) -> int:
    return len(text.encode(encoding.replace("utf-16", "utf-16-le").replace("utf-32", "utf-32-le"))) // (
        1 if encoding == "utf-8" else ENCODINGS[encoding]
    )


@settings(max_examples=200, deadline=None)
@given(text=texts, data=st.data(), encoding=st.sampled_from(sorted(ENCODINGS)))
def test_positions_round_trip(text: str, data: st.DataObject, encoding: str) -> None:
    """offset -> position -> offset is the identity at every character boundary that does not split a
    CRLF; only \\n, \\r\\n and \\r end lines (not \\x0c or \\u2028, which str.splitlines also splits at)."""
    codec = PositionCodec(encoding)
    index = TextIndex(text)
    offset = data.draw(st.integers(0, len(text)))
    if 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n":
        offset -= 1
    position = index.position_at(offset, codec)
    breaks = [match.end() for match in re.finditer(r"\r\n|\r|\n", text) if match.end() <= offset]
    assert position.line == len(breaks)
    assert position.character == _units(text[(breaks[-1] if breaks else 0) : offset], encoding)
    assert index.offset_at(position, codec) == offset


def test_positions_past_the_end_clamp() -> None:
    codec = PositionCodec(types.PositionEncodingKind.Utf16)
    index = TextIndex("ab\r\ncd")
    assert index.offset_at(types.Position(line=0, character=99), codec) == 2  # the line's end, before \r\n
    assert index.offset_at(types.Position(line=9, character=0), codec) == 6
    assert TextIndex("🙂").offset_at(types.Position(line=0, character=1), codec) == 0  # inside a pair


@given(before=texts, after=texts)
def test_minimal_change_rebuilds_the_text(before: str, after: str) -> None:
    start, end, new_text = minimal_change(before, after)
    assert before[:start] + new_text + before[end:] == after


def test_settings_layers_and_bad_values() -> None:
    base = Settings().merged({"delivery": "final", "model": "m1", "maxNewTokens": 64})
    assert (base.delivery, base.engine_options.model, base.max_new_tokens) == ("final", "m1", 64)
    layered = base.merged({"delivery": "sideways", "presets": {"Shorter": "Make it shorter."}, "model": "m2"})
    assert layered.delivery == "final"  # a bad value is skipped, not fatal
    assert layered.presets == (Preset("Shorter", "Make it shorter."),)
    assert layered.engine_options.model == "m2"
    assert layered.merged({"dtype": "float8"}).engine_options.dtype == "auto"  # EngineOptions refuses it
    assert section({"specedit": {"engine": "inprocess"}}) == {"engine": "inprocess"}
    assert section({"engine": "inprocess"}) == {"engine": "inprocess"}
    assert section(None) == {}
    assert Settings().load_on_start and not Settings().merged({"loadOnStart": False}).load_on_start
    assert Settings().merged({"loadOnStart": "no"}).load_on_start  # not a boolean: skipped


def test_errors_map_in_one_place() -> None:
    assert isinstance(to_jsonrpc(StaleVersionError("old")), JsonRpcContentModified)
    assert isinstance(to_jsonrpc(RegionError("where")), JsonRpcInvalidParams)
    failed = to_jsonrpc(ModelLoadError("no model"))
    assert failed.code == REQUEST_FAILED and failed.data == {"kind": "ModelLoadError", "exitCode": 6}
    assert error_payload(ValueError("boom"))["code"] == -32603


def test_command_line_flags_become_overrides() -> None:
    parser = argparse.ArgumentParser()
    add_lsp_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["lsp", "--engine", "inprocess", "--model", "/m", "--draft", "none"])
    assert overrides_from_args(args) == {"engine": "inprocess", "model": "/m", "draft": "none"}
    assert Settings().merged(overrides_from_args(args)).engine == "inprocess"
    args = parser.parse_args(["lsp", "--draft-layers", "auto", "--p-min", "0.3"])
    settings = Settings().merged(overrides_from_args(args))
    options = settings.engine_options
    assert (options.draft_layers, options.p_min, settings.draft) == ("auto", 0.3, "auto")


def test_fallback_settings_from_the_editor() -> None:
    settings = Settings().merged({"draftModel": "qwen2.5-coder-0.5b-instruct", "pMin": 0.6, "draft": "fallback"})
    options = settings.engine_options
    assert options.draft_model == "qwen2.5-coder-0.5b-instruct" and options.p_min == 0.6
    assert settings.draft == "fallback"
    # Both fallbacks at once, or a threshold out of range, are refused and the earlier value stays.
    assert settings.merged({"draftLayers": "0-3"}).engine_options.draft_layers is None
    assert settings.merged({"pMin": 1.5}).engine_options.p_min == 0.6
    assert Settings().merged({"draftLayers": "0-3"}).engine_options.draft_layers == "0-3"


def test_small_helpers() -> None:
    assert instruction_comment("  -- specedit: use a loop") == "use a loop"
    assert instruction_comment("<!-- specedit: add alt text -->") == "add alt text"
    assert instruction_comment("# not for us") is None
    assert overlap(0, 5, 4, 9) and not overlap(0, 5, 5, 9) and overlap(3, 3, 0, 5)
    assert protocol.NAMES["rewriteMethod"] == "specedit/rewrite"
    assert set(protocol.NAMES["commands"]) == {
        "specedit.rewrite",
        "specedit.accept",
        "specedit.reject",
        "specedit.cancel",
    }


@pytest.mark.parametrize("line", ["# specedit:", "# specedit:   "])
def test_an_empty_instruction_comment_offers_nothing(line: str) -> None:
    assert instruction_comment(line) is None


@pytest.mark.parametrize("module", ["hunks", "region", "documents", "code_actions", "guard", "engine_status"])
def test_docstring_examples(module: str) -> None:
    """The worked examples in the docstrings are true."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"specedit.lsp.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_progress_says_what_happens_before_the_first_step_and_rates_decoding_only() -> None:
    stats = LiveStats(started=time.perf_counter() - 3.2)
    assert stats.to_dict(0, 24)["message"] == "starting · 3 s"
    stats.phase = Phase("loading")
    assert stats.to_dict(0, 24)["message"] == "loading the model · 3 s"
    stats.phase = Phase("queued", 2)
    assert stats.to_dict(0, 24)["message"] == "waiting for 2 other rewrites · 3 s"
    stats.phase = Phase("started")
    assert stats.to_dict(0, 24)["tokens_per_second"] == 0.0  # no step: no rate
    assert stats.to_dict(0, 24)["message"] == "reading the file · 3 s"

    def step(number: int, generated: int) -> Step:
        return Step(number, 100 + generated, 99 + generated, 4, 3, generated, 4 * number, 3 * number, 3.5)

    stats.step(step(1, 40))  # the prefill and the load are behind it: not in the rate
    first = stats.to_dict(2, 24)
    assert first["phase"] == "writing" and first["message"] == "2/24 lines · … tok/s · 75% accepted"
    assert stats.decoding.first is not None
    stats.decoding.first = (time.perf_counter() - 2.0, 40)  # two seconds later, 9 tokens more
    stats.step(step(2, 49))
    later = stats.to_dict(5, 24)
    assert later["tokens_per_second"] == pytest.approx(4.5, abs=0.1)
    assert later["message"] == "5/24 lines · 4.5 tok/s · 75% accepted"


def test_an_offer_to_warm_no_engine_took_is_made_again() -> None:
    """Before the engine answers (it starts with the editor) an offer finds no one: the same text is
    offered again when the engine has started (`touch_all`); once taken, it is not offered again."""
    from specedit.engine.records.requests import WarmRequest
    from specedit.lsp.delivery import DocumentState
    from specedit.lsp.warming import Warmer

    class Engine:
        def __init__(self) -> None:
            self.answers, self.offered = False, []

        def warm(self, request: WarmRequest) -> bool:
            self.offered.append(request.name)
            return self.answers

    engine = Engine()
    uri = "file:///work/a.py"
    documents = {uri: DocumentState(uri, "x = 1\n", 1, "python")}
    warmer = Warmer(documents, lambda: engine, lambda: True, delay=0.01)  # type: ignore[arg-type,return-value]

    def offers_after(touch: Any) -> int:
        before = len(engine.offered)
        touch()
        time.sleep(0.3)
        return len(engine.offered) - before

    assert offers_after(lambda: warmer.touch(uri)) == 1  # no engine yet
    engine.answers = True
    assert offers_after(warmer.touch_all) == 1  # the engine started: offered again, and taken
    assert offers_after(warmer.touch_all) == 0  # the same text, taken already
    assert engine.offered == [uri, uri]


def test_the_engine_is_started_once_a_session_until_it_starts() -> None:
    """Every opened document asks for the engine to start (`loadOnStart`); a session whose engine started
    is not started again (a daemon's start is one connection more a document), one that failed is."""
    from specedit.engine.records.errors import EngineUnavailableError
    from specedit.lsp.server import SpeceditServer

    class Engine:
        def __init__(self) -> None:
            self.starts, self.fails, self.kept = 0, True, []

        def start(self) -> None:
            self.starts += 1
            if self.fails:
                raise EngineUnavailableError("no daemon yet")

        def keep_alive(self, wanted: bool) -> None:
            self.kept.append(wanted)

    server, engine = SpeceditServer(), Engine()
    server._keep_engine(engine, True, True)  # type: ignore[arg-type]
    engine.fails = False
    server._keep_engine(engine, True, True)  # type: ignore[arg-type]
    server._keep_engine(engine, True, True)  # type: ignore[arg-type]
    server._keep_engine(engine, False, False)  # type: ignore[arg-type]
    assert engine.starts == 2 and engine.kept == [True, True, True, False]
    other = Engine()
    other.fails = False
    server._keep_engine(other, True, True)  # type: ignore[arg-type]
    assert other.starts == 1  # a new session (the settings changed) starts its engine


# ------------------------------------------------------------------------------------ the guard


def _hunk(hunk_id: int, old_lines: int, new_text: str) -> Any:
    from specedit.lsp.hunks import Hunk

    return Hunk(hunk_id, 0, 0, "".join(f"    line_{i} = {i}\n" for i in range(old_lines)), new_text)


def _verdict(instruction: str | None, hunks: list[Any], region_lines: int) -> str | None:
    from specedit.lsp.guard import removed_lines, too_destructive

    return too_destructive(instruction, removed_lines(hunks), region_lines)


def test_the_guard_catches_the_issues_destructive_answers() -> None:
    """Issue 67's cases: a rename answered with a 4-line stub of a 49-line function, "Add type hints"
    answered with one import line."""
    stub = "def add_message(self, msg):\n    pass\n\n\n"
    assert _verdict("Rename append_msg to add_message.", [_hunk(0, 49, stub)], 49) == "it removes 45 of 49 lines"
    assert _verdict("Add type hints", [_hunk(0, 30, "from typing import *\n")], 30) == "it removes 29 of 30 lines"


def test_the_guard_lets_ordinary_rewrites_through() -> None:
    from specedit.lsp.guard import MIN_LINES

    loop_to_comprehension = [_hunk(0, 4, "    squares = [x * x for x in xs]\n")]  # 3 of a 10-line function
    assert _verdict("Use a list comprehension.", loop_to_comprehension, 10) is None
    every_line_rewritten = [_hunk(0, 20, "".join(f"    renamed_{i} = {i}\n" for i in range(20)))]
    assert _verdict("Rename the variables.", every_line_rewritten, 20) is None
    emptied = [_hunk(0, 20, "")]
    for asked in ("Remove this function.", "Delete the dead code", "Simplify it", "make it shorter", "Clean up"):
        assert _verdict(asked, emptied, 20) is None, asked
    assert _verdict("Rename x.", [_hunk(0, MIN_LINES - 1, "")], MIN_LINES - 1) is None  # a few lines
    assert _verdict(None, emptied, 20) is None  # a sketch: its merge is checked elsewhere
    # Just over half of the region is too much; half is not.
    assert _verdict("Rename x.", [_hunk(0, 10, "")], 20) is None
    assert _verdict("Rename x.", [_hunk(0, 11, "")], 20) == "it removes 11 of 20 lines"


def test_the_guard_counts_net_removals_over_all_hunks() -> None:
    from specedit.lsp.guard import removed_lines

    assert removed_lines([_hunk(0, 6, "a\n"), _hunk(1, 0, "b\nc\n"), _hunk(2, 3, "d\ne\nf\n")]) == 3


# ------------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "where",
    [
        {"start": {"line": -1, "character": 0}, "end": {"line": 0, "character": 0}},
        {"start": {"line": 0, "character": -3}, "end": {"line": 0, "character": 0}},
        {"start": {"line": 0, "character": 0}, "end": {"line": "1", "character": 0}},
        {"start": {"line": 0, "character": 0}, "end": {"line": True, "character": 0}},
        {"start": {"line": 0, "character": 0}, "end": {"line": 2**31, "character": 0}},
    ],
)
def test_a_bad_position_is_invalid_params(where: dict[str, Any]) -> None:
    from specedit.lsp.errors import InvalidRequestError
    from specedit.lsp.params import RewriteCall

    params = {"textDocument": {"uri": "file:///a.py"}, "instruction": "x", "range": where}
    with pytest.raises(InvalidRequestError, match="range") as raised:
        RewriteCall.parse(params)
    assert to_jsonrpc(raised.value).code == JsonRpcInvalidParams.CODE


class _Sent:
    """A server whose answers are kept, not written."""

    def __init__(self) -> None:
        from specedit.lsp.server import build_server

        self.server = build_server()
        self.answers: list[dict[str, Any]] = []
        converter = self.server.protocol._converter
        self.server.protocol._send_data = lambda data: self.answers.append(converter.unstructure(data))  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (b'{"jsonrpc":"2.0","id":4,"method":"specedit/rewrite","params":{"instruction":"caf\xe9"}}', (4, -32700)),
        (b'{"jsonrpc":"2.0","id":5,"method":', (None, -32700)),
        (b"[1, 2]", (None, -32600)),
        (b'{"id":6,"method":"shutdown"}', (6, -32600)),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"textDocument/codeAction","params":{"textDocument":{"uri":"file:///a"},'
            b'"range":{"start":{"line":-1,"character":0},"end":{"line":0,"character":0}},"context":{"diagnostics":[]}}}',
            (7, JsonRpcInvalidParams.CODE),
        ),
    ],
)
def test_a_malformed_message_is_answered(body: bytes, answer: tuple[Any, int]) -> None:
    """pygls drops what it cannot read, and the request is never answered: the channel answers it."""
    from specedit.lsp.channel import read_message

    sent = _Sent()
    assert read_message(sent.server.protocol, body) is None
    [response] = sent.answers
    assert (response.get("id"), response["error"]["code"]) == answer, response


def test_an_unreadable_notification_is_dropped_and_an_unreadable_response_resolves_its_waiter() -> None:
    import concurrent.futures

    from specedit.lsp.channel import read_message

    sent = _Sent()
    protocol = sent.server.protocol
    body = b'{"jsonrpc":"2.0","method":"textDocument/didChange","params":{"textDocument":{"uri":"file:///a"}}}'
    assert read_message(protocol, body) is None and sent.answers == []
    waiter: concurrent.futures.Future[Any] = concurrent.futures.Future()
    protocol._request_futures["edit-1"] = waiter
    protocol._result_types["edit-1"] = types.ApplyWorkspaceEditResponse
    assert read_message(protocol, b'{"jsonrpc":"2.0","id":"edit-1","result":{}}') is None
    assert waiter.done() and waiter.exception() is not None


def test_a_whole_text_change_of_a_big_document_costs_about_what_reading_it_does() -> None:
    """A client that syncs whole documents sends 5 MB for each change; reading that message is a cost the
    server cannot avoid. Finding the change in it costs no more than a few times that."""
    import json

    from specedit.lsp.delivery import DocumentState
    from specedit.lsp.server import read_changes

    line = "    value = compute(alpha, beta) + 42  # 🙂 non-BMP\n"
    text = line * (5_000_000 // len(line))
    new = text[: len(text) // 2] + "x = 1\n" + text[len(text) // 2 :]
    body = json.dumps({"contentChanges": [{"text": new}]})
    codec = PositionCodec(types.PositionEncodingKind.Utf16)

    def change() -> None:
        doc = DocumentState("file:///big.py", text, 1, "python")
        edits, index = read_changes(doc.index(), [types.TextDocumentContentChangeWholeDocument(text=new)], codec)
        doc.did_change(2, edits, index.text)
        assert edits == [(len(text) // 2, len(text) // 2, "x = 1\n")] and doc.text == new

    def best(work: Any) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return min(times)

    reading, changing = best(lambda: json.loads(body)), best(change)
    assert changing < 5 * reading, (changing, reading)


def test_a_changed_text_keeps_its_line_starts() -> None:
    from specedit.lsp.documents import TextIndex

    @settings(max_examples=300, deadline=None)
    @given(text=texts, data=st.data())
    def check(text: str, data: st.DataObject) -> None:
        index = TextIndex(text)
        assert index.line_count > 0  # found, so that the next ones are carried over
        for _ in range(data.draw(st.integers(1, 3))):
            start = data.draw(st.integers(0, len(index.text)))
            end = data.draw(st.integers(start, len(index.text)))
            index = index.edited(start, end, data.draw(texts))
            assert index._starts == TextIndex(index.text)._starts

    check()


# ------------------------------------------------------------------------------------ the engine


def test_the_engine_status_says_what_the_load_is_at_and_is_not_chatty() -> None:
    from specedit.lsp.engine_status import EngineStatus, provisioning_message

    sent: list[protocol.EngineParams] = []
    status = EngineStatus(sent.append)
    status.loading()
    status.loading()  # the same again: nothing new to say
    for done in range(0, 491_400_064, 10_000_000):  # a fetch reports every chunk
        status.provisioning("assemble", done, 491_400_064)
    status.ready()
    assert sent[0] == {"state": "loading", "message": "loading the model"}
    assert sent[1] == {"state": "loading", "message": "fetching the model 0/491 MB"}
    assert 2 <= len(sent) < 10 and sent[-1] == {"state": "ready", "message": "ready"}
    assert status.message == "ready"
    assert provisioning_message("wait-lock", 0, None).startswith("waiting for another process")
    assert provisioning_message("convert", 0, 1) == "converting the model (once)"
