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

from specedit.engine.errors import ModelLoadError, RegionError
from specedit.engine.events import Phase, Step
from specedit.lsp import protocol
from specedit.lsp.code_actions import instruction_comment
from specedit.lsp.command import add_lsp_parser
from specedit.lsp.config import Preset, Settings, section
from specedit.lsp.documents import TextIndex, minimal_change
from specedit.lsp.errors import REQUEST_FAILED, StaleVersionError, error_payload, to_jsonrpc
from specedit.lsp.jobs import LiveStats, overlap
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


@pytest.mark.parametrize("module", ["hunks", "region", "documents", "code_actions"])
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
    from specedit.engine.requests import WarmRequest
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
    from specedit.engine.errors import EngineUnavailableError
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
