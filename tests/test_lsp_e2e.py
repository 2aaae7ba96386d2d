"""End to end: the real language server over stdio, driven by clients that behave like real editors.

Each client keeps its own copy of the document, applies the server's `workspace/applyEdit` to it and
reports the change back in `didChange`, as an editor does:

- `vscode`: utf-16 positions; reports each change at once; refuses an edit for another version
  (`applied: false`).
- `nvim`: utf-8 positions; batches its change notifications (150 ms debounce, like Neovim); skips an edit
  for another version and still answers `applied: true`.

For every delivery mode the document must end exactly as the in-process `rewrite()` leaves it. The model
is a tiny GPT-2 that memorised a few rewrites (tests/conftest.py); one server per client kind, started once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcContentModified, JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, progress, register_lsp_features

from specedit.engine.records.events import Phase, Step, Text
from specedit.engine.records.requests import RewriteOutcome
from specedit.engine.records.stats import Stats
from specedit.lsp import protocol
from specedit.lsp.params import plain

pytestmark = pytest.mark.asyncio(loop_scope="module")

Kind = Literal["vscode", "nvim"]
CAPABILITIES = {"vscode": "visual-studio-code", "nvim": "neovim@v0.11"}
NVIM_DEBOUNCE = 0.15


# ------------------------------------------------------------------------------ an editor's document


def _line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in re.finditer(r"\r\n|\r|\n", text))]


def _units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def offset_of(text: str, position: types.Position, encoding: str) -> int:
    """The editor's own conversion (independent of the server's): code units of the line's text."""
    starts = _line_starts(text)
    if position.line >= len(starts):
        return len(text)
    start = starts[position.line]
    end = starts[position.line + 1] if position.line + 1 < len(starts) else len(text)
    line = text[start:end].rstrip("\r\n")
    if encoding == "utf-8":
        prefix = line.encode("utf-8")[: position.character].decode("utf-8", errors="ignore")
    elif encoding == "utf-16":
        prefix = line.encode("utf-16-le")[: 2 * position.character].decode("utf-16-le", errors="ignore")
    else:
        prefix = line[: position.character]
    return start + len(prefix)


def position_of(text: str, offset: int, encoding: str) -> types.Position:
    starts = _line_starts(text)
    line = max(i for i, start in enumerate(starts) if start <= offset)
    return types.Position(line=line, character=_units(text[starts[line] : offset], encoding))


@dataclass
class EditorDocument:
    uri: str
    text: str
    version: int = 1
    unsent: list[types.TextDocumentContentChangeEvent] = field(default_factory=list)
    flush_handle: asyncio.TimerHandle | None = None


class EditorClient(LanguageClient):
    """A pytest-lsp client with an editor's document handling (see the module docstring)."""

    kind: Kind = "vscode"
    encoding: str = "utf-16"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.documents: dict[str, EditorDocument] = {}
        self.partials: dict[str, list[dict[str, Any]]] = {}
        self.applied_edits = 0
        self.skipped_edits = 0
        self.typing_before_next_edit: list[tuple[str, int, str]] = []  # (uri, offset, text)
        self.provisional: list[tuple[str, str | None]] = []  # (uri, the text marked pending, or None)
        self.engine: list[dict[str, Any]] = []  # `specedit/engine` notifications, in order

    def open(self, uri: str, text: str) -> EditorDocument:
        document = EditorDocument(uri, text)
        self.documents[uri] = document
        self.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
            )
        )
        return document

    def close(self, uri: str) -> None:
        self.flush(uri)
        del self.documents[uri]
        self.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    def type(self, uri: str, start: int, end: int, text: str) -> None:
        """The user replaces text[start:end]."""
        document = self.documents[uri]
        self._change(document, start, end, text)

    def _change(self, document: EditorDocument, start: int, end: int, text: str, *, flush: bool = True) -> None:
        where = types.Range(
            start=position_of(document.text, start, self.encoding), end=position_of(document.text, end, self.encoding)
        )
        document.text = document.text[:start] + text + document.text[end:]
        document.version += 1 if self.kind == "vscode" else 2  # Neovim's changedtick moves by more
        document.unsent.append(types.TextDocumentContentChangePartial(range=where, text=text))
        if self.kind == "vscode":
            if flush:
                self.flush(document.uri)
        elif document.flush_handle is None:
            loop = asyncio.get_running_loop()
            document.flush_handle = loop.call_later(NVIM_DEBOUNCE, self.flush, document.uri)

    def flush(self, uri: str) -> None:
        document = self.documents.get(uri)
        if document is None or not document.unsent:
            return
        if document.flush_handle is not None:
            document.flush_handle.cancel()
            document.flush_handle = None
        changes, document.unsent = document.unsent, []
        self.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=document.version),
                content_changes=changes,
            )
        )

    def apply_workspace_edit(self, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        while self.typing_before_next_edit:  # the user was quicker than the edit: it arrives stale
            uri, offset, text = self.typing_before_next_edit.pop(0)
            self.type(uri, offset, offset, text)
        for change in params.edit.document_changes or []:
            assert isinstance(change, types.TextDocumentEdit)
            document = self.documents[change.text_document.uri]
            if change.text_document.version != document.version:
                self.skipped_edits += 1
                # VS Code refuses a stale edit; Neovim skips it, and says it applied it.
                return types.ApplyWorkspaceEditResult(applied=self.kind == "nvim")
            edits = sorted(
                (
                    offset_of(document.text, edit.range.start, self.encoding),
                    offset_of(document.text, edit.range.end, self.encoding),
                    edit.new_text,
                )
                for edit in change.edits  # TextEdit or AnnotatedTextEdit (not a subclass of TextEdit)
                if isinstance(edit, (types.TextEdit, types.AnnotatedTextEdit))
            )
            assert edits, "an empty workspace edit"
            self.applied_edits += 1
            if self.kind == "vscode":  # one notification, one version, a change per edit, last first
                version = document.version
                for start, end, new_text in reversed(edits):
                    self._change(document, start, end, new_text, flush=False)
                document.version = version + 1
                self.flush(document.uri)
            else:  # Neovim reports the smallest change it can see (later, with whatever else it has)
                before = document.text
                for start, end, new_text in reversed(edits):
                    document.text = document.text[:start] + new_text + document.text[end:]
                start, end, new_text = _smallest_change(before, document.text)
                document.text = before
                self._change(document, start, end, new_text)
        return types.ApplyWorkspaceEditResult(applied=True)


def _smallest_change(before: str, after: str) -> tuple[int, int, str]:
    prefix = 0
    while prefix < min(len(before), len(after)) and before[prefix] == after[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(before), len(after)) - prefix and before[-1 - suffix] == after[-1 - suffix]:
        suffix += 1
    return prefix, len(before) - suffix, after[prefix : len(after) - suffix]


def client_apply_edit(client: EditorClient, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
    return client.apply_workspace_edit(params)


def client_provisional(client: EditorClient, params: Any) -> None:
    """`specedit/provisional`: the text it marks, in the document at its version; one for an older version
    (the user typed since) marks nothing, as in the editors."""
    value = plain(params)
    document = client.documents.get(value["uri"])
    if document is None or value["range"] is None or value["version"] != document.version or document.unsent:
        client.provisional.append((value["uri"], None))
        return
    where = value["range"]
    start = offset_of(document.text, types.Position(**where["start"]), client.encoding)
    end = offset_of(document.text, types.Position(**where["end"]), client.encoding)
    client.provisional.append((value["uri"], document.text[start:end]))


def client_engine(client: EditorClient, params: Any) -> None:
    client.engine.append(plain(params))


def client_progress(client: EditorClient, params: types.ProgressParams) -> None:
    value = plain(params.value)
    if isinstance(value, dict) and "kind" not in value and str(params.token) in client.partials:
        client.partials[str(params.token)].append(value)
        return
    progress(client, params)  # work-done progress: pytest-lsp records it


def _converter() -> Any:
    """pygls' converter, except that a CodeAction with a command stays a CodeAction: lsprotocol's hook
    takes anything with a "command" key for a Command (a real editor looks at its type: a string)."""
    from pygls.protocol import default_converter

    converter = default_converter()

    def command_or_action(value: Any, _: type) -> Any:
        kind = types.Command if isinstance(value.get("command"), str) else types.CodeAction
        return converter.structure(value, kind)

    converter.register_structure_hook(Union[types.Command, types.CodeAction], command_or_action)  # noqa: UP007
    return converter


def make_client(kind: Kind) -> EditorClient:
    client = EditorClient(converter_factory=_converter)
    client.kind = kind
    register_lsp_features(
        client,
        {
            **DEFAULT_CLIENT_FEATURES,
            types.WORKSPACE_APPLY_EDIT: client_apply_edit,
            types.PROGRESS: client_progress,
            protocol.PROVISIONAL_NOTIFICATION: client_provisional,
            protocol.ENGINE_NOTIFICATION: client_engine,
        },
    )
    return client


async def start_client(kind: Kind, model_dir: Path) -> EditorClient:
    config = ClientServerConfig(
        server_command=[
            sys.executable,
            "-m",
            "specedit.lsp",
            "--engine",
            "inprocess",
            "--model",
            str(model_dir),
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        client_factory=lambda: make_client(kind),
    )
    client = await config.start()
    assert isinstance(client, EditorClient)
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(CAPABILITIES[kind]),
            initialization_options={"specedit": {"delivery": "live"}},
        )
    )
    client.encoding = str(result.capabilities.position_encoding or "utf-16")
    return client


# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def expected(memorising_model_dir: Path) -> Any:
    """What the in-process `rewrite()` makes of a region: the reference every mode must reach."""
    from specedit.engine.loop.generate import Engine
    from specedit.engine.loop.rewrite import rewrite
    from specedit.engine.model.loading import load_model
    from specedit.engine.records.requests import RewriteRequest

    engine = Engine(load_model(str(memorising_model_dir), dtype="float32", device="cpu"))
    cache: dict[tuple[str, str], str] = {}

    def rewritten(original: str, instruction: str) -> str:
        if (original, instruction) not in cache:
            result = rewrite(engine, RewriteRequest(original, instruction, language="python"))
            assert result.complete
            cache[original, instruction] = result.text
        return cache[original, instruction]

    return rewritten


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["vscode", "nvim"])
async def client(request: pytest.FixtureRequest, memorising_model_dir: Path) -> AsyncIterator[EditorClient]:
    client = await start_client(request.param, memorising_model_dir)
    yield client
    await client.shutdown_session()
    await client.stop()


_uris = itertools.count()


def new_uri(name: str = "code") -> str:
    return f"file:///work/{name}-{next(_uris)}.py"


async def send_rewrite(client: EditorClient, params: dict[str, Any]) -> dict[str, Any]:
    result = plain(await client.protocol.send_request_async(protocol.REWRITE_METHOD, params))
    assert isinstance(result, dict)
    return result


async def command(client: EditorClient, name: str, *arguments: Any) -> Any:
    return plain(
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=name, arguments=list(arguments))
        )
    )


async def settle(client: EditorClient, uri: str) -> str:
    """The editor's text once its pending change notifications are out."""
    client.flush(uri)
    await asyncio.sleep(0)
    return client.documents[uri].text


# ------------------------------------------------------------------------------------------- cases

ADD = ("def add(a, b):\n    return a + b\n", "Rename add to plus.")
CRLF = ("print('héllo 🙂')\r\nz = 0\r\n", "Set z to 5.")
# Combining accent and emoji before the region, on the region's first line: columns differ per encoding.
PREFIX = "# cafe\u0301 👩‍💻 \U0001d518\nx = 'e\u0301🙂'; "
CASES = {
    "lf": ("", ADD, ""),
    "crlf": ("", CRLF, ""),
    "unicode": (PREFIX, ADD, "# after: 🙂\u0301\n"),
}


def region_range(text: str, prefix: str, original: str, encoding: str) -> dict[str, Any]:
    start, end = position_of(text, len(prefix), encoding), position_of(text, len(prefix) + len(original), encoding)
    return {
        "start": {"line": start.line, "character": start.character},
        "end": {"line": end.line, "character": end.character},
    }


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("delivery", ["live", "final", "preview"])
async def test_every_delivery_ends_as_rewrite_does(
    client: EditorClient, expected: Any, case: str, delivery: str
) -> None:
    prefix, (original, instruction), suffix = CASES[case]
    text = prefix + original + suffix
    uri = new_uri(case)
    document = client.open(uri, text)
    params: dict[str, Any] = {
        "textDocument": {"uri": uri, "version": document.version},
        "instruction": instruction,
        "delivery": delivery,
    }
    if prefix or suffix:
        params["range"] = region_range(text, prefix, original, client.encoding)
    result = await send_rewrite(client, params)
    assert result["status"] == "complete", result
    assert result["stats"]["generated_tokens"] > 0
    want = prefix + expected(original, instruction) + suffix
    if delivery == "preview":
        assert await settle(client, uri) == text  # nothing written until accepted
        accepted = await command(client, protocol.COMMAND_ACCEPT, {"jobId": result["jobId"]})
        assert accepted["skipped"] == []
    assert (await settle(client, uri)).encode() == want.encode()
    if delivery != "preview":  # where the written hunks are now: each holds its new text
        written = result["written"]
        assert written["version"] == client.documents[uri].version and written["hunks"]
        for hunk in written["hunks"]:
            start = offset_of(want, types.Position(**hunk["range"]["start"]), client.encoding)
            end = offset_of(want, types.Position(**hunk["range"]["end"]), client.encoding)
            assert want[start:end] == hunk["newText"]
    # The hunks of the response, applied to the request's text by the editor's own conversion, agree.
    assert _apply_payload(text, result["hunks"], client.encoding) == want
    # Reject restores the document exactly.
    rejected = await command(client, protocol.COMMAND_REJECT, {"jobId": result["jobId"]})
    assert rejected["skipped"] == []
    assert (await settle(client, uri)).encode() == text.encode()
    client.close(uri)


def _apply_payload(text: str, hunks: list[dict[str, Any]], encoding: str) -> str:
    edits = []
    for hunk in hunks:
        start = types.Position(**hunk["range"]["start"])
        end = types.Position(**hunk["range"]["end"])
        edits.append((offset_of(text, start, encoding), offset_of(text, end, encoding), hunk["newText"]))
    for start, end, new_text in sorted(edits, reverse=True):
        text = text[:start] + new_text + text[end:]
    return text


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_live_rewrite_shows_its_provisional_text_then_replaces_it(
    client: EditorClient, expected: Any, case: str
) -> None:
    """The new first line is written, marked pending, above the old one before its hunk settles; at the
    end nothing provisional is left and the document is the rewrite."""
    prefix, (original, instruction), suffix = CASES[case]
    text = prefix + original + suffix
    uri = new_uri(case)
    document = client.open(uri, text)
    params: dict[str, Any] = {"textDocument": {"uri": uri, "version": document.version}, "instruction": instruction}
    if prefix or suffix:
        params["range"] = region_range(text, prefix, original, client.encoding)
    result = await send_rewrite(client, params)
    assert result["status"] == "complete", result
    want = expected(original, instruction)
    shown = [marked for at, marked in client.provisional if at == uri]
    assert shown and shown[-1] is None, shown
    # What is marked is the output from the first changed line on, so far (the line being written ended).
    first_new_line = next(line for line in want.splitlines(keepends=True) if line not in original)
    written = want[want.index(first_new_line) :]
    pending = [marked for marked in shown if marked]
    assert pending and all(written.startswith(marked.rstrip("\r\n")) for marked in pending), pending
    assert (await settle(client, uri)).encode() == (prefix + want + suffix).encode()
    client.close(uri)


async def test_partial_results_and_progress(client: EditorClient, expected: Any) -> None:
    original, instruction = ADD
    uri = new_uri()
    client.open(uri, original)
    client.partials["partial-1"] = []
    client.progress_reports["work-1"] = []
    result = await send_rewrite(
        client,
        {
            "textDocument": {"uri": uri, "version": 1},
            "instruction": instruction,
            "delivery": "preview",
            "partialResultToken": "partial-1",
            "workDoneToken": "work-1",
        },
    )
    assert result["status"] == "complete" and "hunks" not in result
    partials = client.partials["partial-1"]
    assert partials and all(p["jobId"] == result["jobId"] for p in partials)
    hunks = [hunk for p in partials for hunk in p["hunks"]]
    assert _apply_payload(original, hunks, client.encoding) == expected(original, instruction)
    kinds = [type(value).__name__ for value in client.progress_reports["work-1"]]
    assert kinds[0] == "WorkDoneProgressBegin" and kinds[-1] == "WorkDoneProgressEnd"
    # Each report says where the rewrite is: started (reading the file), then writing lines.
    assert [p["stats"]["phase"] for p in partials][-1] == "writing"
    messages = [value.message for value in client.progress_reports["work-1"][1:-1]]
    pattern = r"(starting|loading the model|reading the file) · \d+ s|\d+/\d+ lines · .*"
    assert messages and all(re.fullmatch(pattern, m) for m in messages), messages
    client.close(uri)


async def test_stale_version_is_content_modified(client: EditorClient) -> None:
    uri = new_uri()
    client.open(uri, ADD[0])
    client.type(uri, 0, 0, "# hi\n")
    await settle(client, uri)
    with pytest.raises(JsonRpcException) as raised:
        await send_rewrite(client, {"textDocument": {"uri": uri, "version": 1}, "instruction": ADD[1]})
    assert raised.value.code == JsonRpcContentModified.CODE  # -32801
    client.close(uri)


async def test_typing_elsewhere_during_a_live_rewrite_is_kept(client: EditorClient, expected: Any) -> None:
    original, instruction = ADD
    uri = new_uri()
    text = "# top\n" + original
    client.open(uri, text)
    params = {
        "textDocument": {"uri": uri, "version": 1},
        "range": region_range(text, "# top\n", original, client.encoding),
        "instruction": instruction,
        "delivery": "live",
    }
    pending = asyncio.ensure_future(send_rewrite(client, params))
    await asyncio.sleep(0.05)
    client.type(uri, 0, 0, "import os  # 🙂\n")  # above the region, while the rewrite runs
    result = await pending
    assert result["status"] == "complete", result
    want = "import os  # 🙂\n# top\n" + expected(original, instruction)
    assert (await settle(client, uri)) == want
    client.close(uri)


@pytest.mark.parametrize("delivery", ["live", "final"])
async def test_line_breaks_only_python_knows_are_not_lines(client: EditorClient, expected: Any, delivery: str) -> None:
    """A form feed (or "\\x0b", U+2028, ...) is a character of its line for an editor (LSP lines end at "\\n",
    "\\r\\n", "\\r") and a line end for `str.splitlines`. pygls' own copy of the document split lines there and
    clamped the positions of later changes to those lines, in the params the server then read: the rewrite
    below, as the editor echoed it (Neovim: its smallest change), came back misplaced or as an error."""
    original, instruction = ADD
    uri = new_uri()
    prefix = "x = 1  # \x0c\n"  # for pygls, two lines: "x = 1  # \x0c" and "\n"; "def add" was in the second
    text = prefix + original
    client.open(uri, text)
    params = {
        "textDocument": {"uri": uri, "version": client.documents[uri].version},
        "range": region_range(text, prefix, original, client.encoding),
        "instruction": instruction,
        "delivery": delivery,
    }
    result = await send_rewrite(client, params)
    assert result["status"] == "complete", result
    assert (await settle(client, uri)) == prefix + expected(original, instruction)
    client.close(uri)


@pytest.mark.parametrize("delivery", ["live", "final"])
async def test_a_stale_edit_is_rebased_and_sent_again(client: EditorClient, expected: Any, delivery: str) -> None:
    """The user types above the region just before the edit reaches the editor: VS Code refuses it,
    Neovim skips it (and says it applied it); either way the server notices and sends it again."""
    original, instruction = ADD
    uri = new_uri()
    client.open(uri, original)
    client.typing_before_next_edit = [(uri, 0, "# 🙂 typed\r\n")]
    skipped = client.skipped_edits
    result = await send_rewrite(
        client, {"textDocument": {"uri": uri, "version": 1}, "instruction": instruction, "delivery": delivery}
    )
    assert result["status"] == "complete", result
    assert client.skipped_edits == skipped + 1
    assert (await settle(client, uri)) == "# 🙂 typed\r\n" + expected(original, instruction)
    client.close(uri)


async def test_code_action_from_an_instruction_comment(client: EditorClient, expected: Any) -> None:
    original, instruction = ADD
    uri = new_uri()
    comment = f"# specedit: {instruction}\n"
    client.open(uri, comment + original)
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=types.Position(line=1, character=0), end=types.Position(line=3, character=0)),
            context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.Refactor]),
        )
    )
    assert actions is not None
    titles = [action.title for action in actions if isinstance(action, types.CodeAction)]
    assert titles[0] == f"specedit: Rewrite as the comment says: {instruction}"
    assert "specedit: Add type hints" in titles
    first = actions[0]
    assert isinstance(first, types.CodeAction) and first.command is not None
    assert first.kind == protocol.CODE_ACTION_KIND
    result = await command(client, first.command.command, *(first.command.arguments or []))
    assert result["status"] == "complete"
    assert (await settle(client, uri)) == comment + expected(original, instruction)
    client.close(uri)


@pytest.mark.parametrize("delivery", ["live", "preview", "final"])
async def test_an_echoed_sketch_is_never_left_in_the_document(client: EditorClient, delivery: str) -> None:
    """The model answers the sketch with the sketch itself, elision marker and all: whatever a live rewrite
    wrote is restored, nothing else is written, and no hunk is offered."""
    from conftest import ECHOED_SKETCH

    original, sketch, _ = ECHOED_SKETCH
    uri = new_uri("sketch")
    client.open(uri, original)
    params = {"textDocument": {"uri": uri, "version": 1}, "sketch": sketch, "delivery": delivery}
    result = await send_rewrite(client, params)
    assert result["status"] == "error" and "not a merge of the edit sketch" in result["message"], result
    assert "elision markers" in result["message"] and "drops code" in result["message"]
    assert result.get("hunks", []) == []
    assert (await settle(client, uri)) == original
    client.close(uri)


@pytest.mark.parametrize("delivery", ["live", "preview", "final"])
async def test_a_sketch_its_lines_place_is_merged_without_the_model(client: EditorClient, delivery: str) -> None:
    """The sketch's lines say where it goes: it is merged by them (no token generated), and delivered like
    any answer: hunks to accept or reject."""
    from conftest import LINES_SKETCH

    original, sketch, merged = LINES_SKETCH
    uri = new_uri("lines-sketch")
    client.open(uri, original)
    params = {"textDocument": {"uri": uri, "version": 1}, "sketch": sketch, "delivery": delivery}
    result = await send_rewrite(client, params)
    assert result["status"] == "complete", result
    assert result["stats"]["merge"] == "lines" and result["stats"]["generated_tokens"] == 0
    if delivery == "preview":
        assert await settle(client, uri) == original
        await command(client, protocol.COMMAND_ACCEPT, {"jobId": result["jobId"]})
    assert (await settle(client, uri)) == merged
    await command(client, protocol.COMMAND_REJECT, {"jobId": result["jobId"]})
    assert (await settle(client, uri)) == original
    client.close(uri)


async def test_bad_requests_are_json_rpc_errors(client: EditorClient) -> None:
    from pygls.exceptions import JsonRpcInvalidParams

    with pytest.raises(JsonRpcException, match="not open") as raised:
        await send_rewrite(client, {"textDocument": {"uri": "file:///nowhere.py"}, "instruction": "x"})
    assert raised.value.code == JsonRpcInvalidParams.CODE
    uri = new_uri()
    client.open(uri, "x = 1\n")
    with pytest.raises(JsonRpcException, match="exactly one") as raised:
        await send_rewrite(client, {"textDocument": {"uri": uri}, "instruction": "a", "sketch": "b"})
    assert raised.value.code == JsonRpcInvalidParams.CODE
    client.close(uri)


# ------------------------------------------------------------------------------------ cancellation


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def endless_client(endless_model_dir: Path) -> AsyncIterator[EditorClient]:
    """A server on a random tiny model: it never closes its code block, so a rewrite runs until stopped."""
    client = await start_client("vscode", endless_model_dir)
    yield client
    await client.shutdown_session()
    await client.stop()


ENDLESS = "def add(a, b):\n    return a + b\n" * 3
ENDLESS_BUDGET = 20_000  # tokens: ten seconds or more of the endless model, far more than a test lets it write


async def _start_endless(
    client: EditorClient, uri: str, msg_id: str, delivery: str = "final", version: int | None = None
) -> asyncio.Future[Any]:
    client.partials[msg_id] = []
    params = {
        "textDocument": {"uri": uri, "version": client.documents[uri].version if version is None else version},
        "instruction": "Rename add to plus.",
        "delivery": delivery,
        "maxNewTokens": ENDLESS_BUDGET,
        "partialResultToken": msg_id,
    }
    pending = asyncio.ensure_future(client.protocol.send_request_async(protocol.REWRITE_METHOD, params, msg_id=msg_id))
    pending = asyncio.ensure_future(_plain_later(pending))
    for _ in range(400):  # running: the first stats have come
        if client.partials[msg_id] and client.partials[msg_id][-1]["stats"]["generated_tokens"] > 0:
            break
        await asyncio.sleep(0.025)
    assert not pending.done(), "the endless rewrite ended by itself"
    return pending


async def _plain_later(pending: Any) -> Any:
    return plain(await pending)


@pytest.mark.parametrize("how", ["cancelRequest", "command", "close"])
async def test_cancellation_stops_the_engine_within_a_step(endless_client: EditorClient, how: str) -> None:
    client = endless_client
    uri = new_uri("endless")
    client.open(uri, ENDLESS)
    msg_id = f"cancel-{how}"
    pending = await _start_endless(client, uri, msg_id)
    started = asyncio.get_running_loop().time()
    if how == "cancelRequest":
        client.cancel_request(types.CancelParams(id=msg_id))
    elif how == "command":
        await command(client, protocol.COMMAND_CANCEL, {"uri": uri})
    else:
        client.close(uri)
    result = await asyncio.wait_for(pending, 10)
    assert asyncio.get_running_loop().time() - started < 2.0
    assert result["status"] == "cancelled"
    assert result["stepsAfterCancel"] <= 1
    assert result["stats"]["generated_tokens"] < ENDLESS_BUDGET
    if how != "close":
        assert (await settle(client, uri)) == ENDLESS  # final delivery: nothing written
        client.close(uri)


async def test_progress_cancel_button(endless_client: EditorClient) -> None:
    client = endless_client
    uri = new_uri("endless")
    client.open(uri, ENDLESS)
    client.partials["progress"] = []
    client.progress_reports["work"] = []
    params = {
        "textDocument": {"uri": uri, "version": 1},
        "instruction": "Rename add to plus.",
        "delivery": "preview",
        "maxNewTokens": ENDLESS_BUDGET,
        "partialResultToken": "progress",
        "workDoneToken": "work",
    }
    pending = asyncio.ensure_future(send_rewrite(client, params))
    for _ in range(400):
        if any(type(value).__name__ == "WorkDoneProgressReport" for value in client.progress_reports["work"]):
            break
        await asyncio.sleep(0.025)
    begin = client.progress_reports["work"][0]
    assert isinstance(begin, types.WorkDoneProgressBegin) and begin.cancellable
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token="work"))
    result = await asyncio.wait_for(pending, 10)
    assert result["status"] == "cancelled" and result["stepsAfterCancel"] <= 1
    client.close(uri)


async def test_a_newer_overlapping_request_supersedes(endless_client: EditorClient) -> None:
    client = endless_client
    uri = new_uri("endless")
    client.open(uri, ENDLESS)
    older = await _start_endless(client, uri, "older", delivery="live")
    for _ in range(400):  # the live one has written (provisional text) into the document
        if client.documents[uri].version > 1:
            break
        await asyncio.sleep(0.025)
    assert client.documents[uri].version > 1
    # Asked for the version the user saw: only the server's own writing came since, so it still counts.
    newer = await _start_endless(client, uri, "newer", delivery="live", version=1)
    result = await asyncio.wait_for(older, 10)
    assert result["status"] == "superseded" and "written" not in result  # it had settled no hunk
    # The newer one read the document without the older one's provisional text (taken out first).
    assert client.partials["newer"][-1]["stats"]["lines_total"] == ENDLESS.count("\n")
    await command(client, protocol.COMMAND_CANCEL, {})
    assert (await asyncio.wait_for(newer, 10))["status"] == "cancelled"
    # Whatever the live ones wrote, reject restores the document exactly.
    for job in (result["jobId"], client.partials["newer"][-1]["jobId"]):
        await command(client, protocol.COMMAND_REJECT, {"jobId": job})
    assert (await settle(client, uri)) == ENDLESS
    client.close(uri)


@pytest.mark.parametrize("how", ["exit", "end of input"])
async def test_the_server_ends_with_its_client_while_a_live_rewrite_writes(endless_model_dir: Path, how: str) -> None:
    """Neither a live rewrite's pending edits nor its provisional text keep the process alive once the
    editor said exit, or was killed (its end of the channel closed)."""
    client = await start_client("vscode", endless_model_dir)
    uri = new_uri("endless")
    client.open(uri, ENDLESS)
    live = await _start_endless(client, uri, "live", delivery="live")
    server = client._server  # pygls keeps the process it started here
    assert server is not None and server.stdin is not None
    try:
        if how == "exit":
            await client.shutdown_async(None)
            client.exit(None)
        else:
            server.stdin.close()
        assert await asyncio.wait_for(server.wait(), 30) == 0
    finally:
        if server.returncode is None:  # it hung: the test fails, and does not hang with it
            server.kill()
    try:
        result = await live
    except RuntimeError as gone:  # the process ended before its answer went out
        assert "exited" in str(gone)
    else:
        assert result["status"] == "cancelled"
    await client.stop()


# ----------------------------------------------------------------------------------- the daemon


def lsp_with_a_private_daemon(runtime: Path, *flags: str) -> ClientServerConfig:
    """The language server with no --engine (the shared daemon) and `flags`, its runtime folder `runtime`
    (made here, private), so that its daemon is nobody else's."""
    import os

    runtime.mkdir(mode=0o700, exist_ok=True)
    return ClientServerConfig(
        server_command=[sys.executable, "-m", "specedit.lsp", *flags],
        client_factory=lambda: make_client("nvim"),
        server_env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )


def private_socket(runtime: Path) -> Path:
    from specedit.engine.backends.config import SOCKET_NAME

    return runtime / "specedit" / SOCKET_NAME


async def stop_with_its_daemon(client: EditorClient, socket: Path) -> None:
    """The editor goes, and the daemon its server started (which would outlive it until idle)."""
    from specedit.engine.backends.client import EngineClient

    await client.shutdown_session()
    await client.stop()
    if socket.exists():
        with EngineClient.connect(socket) as daemon:
            daemon.stop()


@contextlib.asynccontextmanager
async def editor_with_a_private_daemon(
    model_dir: Path, tmp_path: Path, options: dict[str, Any] | None = None
) -> AsyncIterator[tuple[EditorClient, Path]]:
    """A Neovim-like editor on a language server without --engine, initialized with `options`; the socket
    of the daemon the server starts. Both go at the end."""
    runtime = tmp_path / "run"
    config = lsp_with_a_private_daemon(runtime, "--model", str(model_dir), "--dtype", "float32", "--device", "cpu")
    client = await config.start()
    assert isinstance(client, EditorClient)
    socket = private_socket(runtime)
    try:
        result = await client.initialize_session(
            types.InitializeParams(capabilities=client_capabilities("neovim"), initialization_options=options)
        )
        client.encoding = str(result.capabilities.position_encoding)
        yield client, socket
    finally:
        await stop_with_its_daemon(client, socket)


def daemon_status(socket: Path) -> dict[str, Any]:
    from specedit.engine.backends.client import EngineClient

    with EngineClient.connect(socket) as daemon:
        return daemon.status()


def loaded_and_read(info: dict[str, Any], documents: int) -> bool:
    """Whether a daemon's status says its model is loaded and `documents` prompts are read, nothing left."""
    cached = (info["prefix_cache"] or {}).get("documents", 0)
    return info["state"] == "ready" and not (info["warming"] or info["to_warm"]) and cached >= documents


async def warmed(socket: Path, documents: int) -> None:
    """Until the daemon answers at `socket`, its model loaded, with `documents` prompts read into its cache."""
    from specedit.engine.records.errors import EngineUnavailableError

    deadline, info = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        with contextlib.suppress(EngineUnavailableError):  # (the socket made, not yet listened on)
            info = daemon_status(socket) if socket.exists() else None
        if info is not None and loaded_and_read(info, documents):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the open documents were not read: {info}")


async def rewrite_final(client: EditorClient, uri: str, instruction: str) -> dict[str, Any]:
    answer = await send_rewrite(
        client, {"textDocument": {"uri": uri, "version": 1}, "instruction": instruction, "delivery": "final"}
    )
    assert answer["status"] == "complete", answer
    return answer


async def test_the_default_engine_is_a_shared_daemon_started_with_the_editor(
    memorising_model_dir: Path, tmp_path: Path, expected: Any
) -> None:
    """Without --engine the server starts the engine daemon (in a private runtime folder here) when the
    editor starts: before any rewrite is asked, the model is loaded and the open document read, so that
    the first rewrite reads only its request; the result is the same as in process. A document opened
    later is offered to the loaded engine, which reads it while idle, the same way."""
    async with editor_with_a_private_daemon(memorising_model_dir, tmp_path) as (client, socket):
        for documents, (name, (original, instruction)) in enumerate((("daemon", CRLF), ("warmed", ADD)), 1):
            uri = new_uri(name)
            client.open(uri, original)
            await warmed(socket, documents)  # no rewrite asked for it yet
            answer = await rewrite_final(client, uri, instruction)
            assert answer["stats"]["reused_tokens"] > answer["stats"]["prefill_tokens"]
            assert (await settle(client, uri)) == expected(original, instruction)


async def test_load_on_start_false_leaves_the_engine_to_the_first_rewrite(
    memorising_model_dir: Path, tmp_path: Path, expected: Any
) -> None:
    """`loadOnStart: false` (memory kept until it is needed): opening a document starts nothing; the first
    rewrite starts the daemon and gets the same answer."""
    from specedit.lsp.warming import WARM_DELAY

    async with editor_with_a_private_daemon(memorising_model_dir, tmp_path, {"loadOnStart": False}) as (
        client,
        socket,
    ):
        original, instruction = ADD
        uri = new_uri("on-demand")
        client.open(uri, original)
        await asyncio.sleep(WARM_DELAY + 2.0)  # an offer to warm comes and finds no engine
        assert not socket.exists()
        await rewrite_final(client, uri, instruction)
        assert (await settle(client, uri)) == expected(original, instruction)
        assert daemon_status(socket)["state"] == "ready"


# ------------------------------------------------------------------------------ a scripted engine
# The guard and a cancel that offers what was written need answers no tiny model writes on demand (a
# rename answered with a stub). Here the real server runs over stdio with a scripted engine: each
# instruction's answer is given, and streamed a line at a time.

SCRIPT_LINE_SECONDS = 0.02  # between two lines of an answer: the editor sees them come one by one
PAUSE = "\x00pause\n"  # a line of an answer that is not written: the engine waits, so edits can land
ENDLESS_AFTER = "\x00endless"  # an answer ending so keeps stepping, writing nothing, until cancelled
LOAD_SECONDS = 0.5  # the scripted model's load


class ScriptedBackend:
    """A `session.Backend` that answers each instruction with the text the test gave for it, a `Step`
    after each line; the first rewrite (or `start`) waits for its load, saying `Phase("loading")`."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self._load_lock = threading.Lock()
        self.loaded = False

    def _load(self, emit: Any) -> None:
        if not self.loaded:
            emit(Phase("loading"))
        with self._load_lock:
            if not self.loaded:
                time.sleep(LOAD_SECONDS)
                self.loaded = True

    def run(self, request: Any, emit: Any, cancel: threading.Event, client: str, sketch: Any = None) -> RewriteOutcome:
        self._load(emit)
        emit(Phase("started"))
        answer = self.answers[request.instruction]
        endless = answer.endswith(ENDLESS_AFTER)
        text = answer.removesuffix(ENDLESS_AFTER)
        written: list[str] = []
        steps = 0

        def step() -> None:
            nonlocal steps
            steps += 1
            generated = len("".join(written))
            emit(Step(steps, 100 + generated, 99 + generated, 4, 3, generated, 4 * steps, 3 * steps, 0.01 * steps))

        for line in text.splitlines(keepends=True):
            if cancel.is_set():
                break
            if line == PAUSE:
                time.sleep(0.6)  # more than an echo takes (Neovim's debounce is 150 ms)
                continue
            written.append(line)
            emit(Text(line))
            step()
            time.sleep(SCRIPT_LINE_SECONDS)
        while endless and not cancel.is_set():
            step()
            time.sleep(0.01)
        stats = Stats(generated_tokens=len("".join(written)), target_forwards=steps)
        if cancel.is_set():
            return RewriteOutcome("".join(written), "cancelled", "cancelled", stats)
        return RewriteOutcome.finished("".join(written), "stop", stats)

    def in_turn(self, work: Any, emit: Any, cancel: threading.Event, client: str) -> Any:
        return work()

    def warm(self, request: Any) -> bool:
        return False

    def keep_alive(self, wanted: bool) -> None:
        pass

    def start(self) -> None:
        self._load(lambda event: None)

    def close(self) -> None:
        pass


def serve_scripted(answers: dict[str, str]) -> None:
    """The language server on stdio, its rewrites answered by a `ScriptedBackend` (run in a subprocess)."""
    import logging

    from specedit.engine.session.session import Session
    from specedit.lsp.channel import stdio
    from specedit.lsp.server import build_server

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="specedit-lsp: %(levelname)s: %(message)s")
    backend = ScriptedBackend(answers)
    server = build_server({"engine": "inprocess"}, lambda settings, progress: Session(backend))
    stdio(server, server.client_gone)


GUARDED = (
    "import os\n"
    "import re  # patterns\n"
    "import sys  # argv\n"
    "\n"
    "def append_msg(history, msg):\n"
    + "".join(f"    step_{i} = history.get({i}, 0) + len(msg)\n" for i in range(16))
    + "    return history\n"
    "\n"
    "def other(x):\n"
    "    return x * 2  # unchanged\n"
)  # 25 lines
STUB = "def add_message(history, msg):\n    pass\n"
OTHER = "\ndef other(x):\n    return x * 2  # unchanged\n"
IMPORTS = "import re  # patterns\nimport sys  # argv\n\n"
ANSWERS = {
    # A rename answered with a stub; `other` kept: its hunk settles while the answer is still being written.
    "Rename append_msg to add_message.": "import os\n" + IMPORTS + STUB + OTHER,
    # The same, `other` dropped too: the hunk settles only at the end.
    "Rename append_msg to add_message, please.": "import os\n" + IMPORTS + STUB,
    # A first hunk written live, then the stub: what was written is taken out again.
    "Use json, and rename append_msg to add_message.": "import json\n" + IMPORTS + PAUSE + STUB + OTHER,
    # The same stub, asked for.
    "Remove the body of append_msg.": "import os\n" + IMPORTS + STUB + OTHER,
    # A hunk, then no end: cancelled by the user.
    "Use json.": "import json\n" + IMPORTS + ENDLESS_AFTER,
}


def scripted_config(kind: Kind) -> ClientServerConfig:
    tests = str(Path(__file__).parent)
    script = (
        f"import json, sys; sys.path.insert(0, {tests!r}); "
        "import test_lsp_e2e; test_lsp_e2e.serve_scripted(json.loads(sys.argv[1]))"
    )
    return ClientServerConfig(
        server_command=[sys.executable, "-c", script, json.dumps(ANSWERS)],
        client_factory=lambda: make_client(kind),
    )


async def start_scripted(kind: Kind, options: dict[str, Any] | None = None) -> EditorClient:
    client = await scripted_config(kind).start()
    assert isinstance(client, EditorClient)
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(CAPABILITIES[kind]),
            initialization_options={"specedit": {"delivery": "live", **(options or {})}},
        )
    )
    client.encoding = str(result.capabilities.position_encoding or "utf-16")
    return client


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["vscode", "nvim"])
async def scripted(request: pytest.FixtureRequest) -> AsyncIterator[EditorClient]:
    client = await start_scripted(request.param)
    yield client
    await client.shutdown_session()
    await client.stop()


def _text_at(text: str, where: dict[str, Any], encoding: str) -> str:
    start = offset_of(text, types.Position(**where["start"]), encoding)
    end = offset_of(text, types.Position(**where["end"]), encoding)
    return text[start:end]


async def _live_rewrite(client: EditorClient, instruction: str, token: str) -> tuple[str, dict[str, Any]]:
    uri = new_uri("guarded")
    client.open(uri, GUARDED)
    client.partials[token] = []
    params = {
        "textDocument": {"uri": uri, "version": 1},
        "instruction": instruction,
        "delivery": "live",
        "partialResultToken": token,
    }
    return uri, await send_rewrite(client, params)


@pytest.mark.parametrize("when", ["mid-stream", "at the end"])
async def test_a_live_rewrite_that_removes_most_of_its_region_becomes_a_preview(
    scripted: EditorClient, when: str
) -> None:
    """A rename answered with a stub is not written: the result offers its hunks, each with its old text
    where it is now, and says what it removes; accept writes them, reject restores."""
    client = scripted
    instruction = {
        "mid-stream": "Rename append_msg to add_message.",
        "at the end": "Rename append_msg to add_message, please.",
    }[when]
    answer = ANSWERS[instruction]
    uri, result = await _live_rewrite(client, instruction, f"guard-{when}-{client.kind}")
    assert result["status"] == "complete" and result["delivery"] == "preview", result
    removed = GUARDED.count("\n") - answer.count("\n")
    assert result["message"] == f"shown as a preview: it removes {removed} of 25 lines"
    assert "written" not in result
    assert await settle(client, uri) == GUARDED  # its provisional text taken out, nothing else written
    offered = result["offered"]
    assert offered["version"] == client.documents[uri].version and offered["hunks"]
    for hunk in offered["hunks"]:
        assert _text_at(GUARDED, hunk["range"], client.encoding) == hunk["oldText"]
    partials = client.partials[f"guard-{when}-{client.kind}"]
    turned = next(i for i, partial in enumerate(partials) if partial["delivery"] == "preview")
    assert all(partial["delivery"] == "live" for partial in partials[:turned])
    if when == "mid-stream":  # seen as a preview before the answer's last line was
        assert partials[turned]["stats"]["lines_done"] < partials[turned]["stats"]["lines_total"]
    hunks = [hunk for partial in partials for hunk in partial["hunks"]]
    assert all(_text_at(GUARDED, hunk["range"], client.encoding) == hunk["oldText"] for hunk in hunks)
    assert _apply_payload(GUARDED, hunks, client.encoding) == answer

    accepted = await command(client, protocol.COMMAND_ACCEPT, {"jobId": result["jobId"]})
    assert accepted["skipped"] == [] and accepted["applied"]
    assert await settle(client, uri) == answer
    await command(client, protocol.COMMAND_REJECT, {"jobId": result["jobId"]})
    assert await settle(client, uri) == GUARDED
    client.close(uri)


async def test_what_a_live_rewrite_wrote_before_the_guard_is_taken_out_and_offered(scripted: EditorClient) -> None:
    """A first hunk is written live (the partial results say where: `written`), then the stub settles: the
    first hunk is taken out again, and both are offered."""
    client = scripted
    instruction = "Use json, and rename append_msg to add_message."
    uri, result = await _live_rewrite(client, instruction, f"guard-written-{client.kind}")
    partials = client.partials[f"guard-written-{client.kind}"]
    written = [partial["written"] for partial in partials if partial.get("written", {}).get("hunks")]
    assert written and written[0]["hunks"][0]["newText"] == "import json\n"
    assert written[0]["hunks"][0]["oldText"] == "import os\n"
    assert result["delivery"] == "preview" and "it removes" in result["message"], result
    assert await settle(client, uri) == GUARDED
    first, _ = result["offered"]["hunks"]
    assert first["oldText"] == "import os\n"
    await command(client, protocol.COMMAND_ACCEPT, {"jobId": result["jobId"], "hunks": [0]})  # the import only
    assert await settle(client, uri) == GUARDED.replace("import os\n", "import json\n")
    await command(client, protocol.COMMAND_REJECT, {"jobId": result["jobId"]})
    assert await settle(client, uri) == GUARDED
    client.close(uri)


async def test_a_removal_that_was_asked_for_is_written_live(scripted: EditorClient) -> None:
    client = scripted
    instruction = "Remove the body of append_msg."
    uri, result = await _live_rewrite(client, instruction, f"asked-{client.kind}")
    assert result["status"] == "complete" and result["delivery"] == "live" and "offered" not in result
    assert await settle(client, uri) == ANSWERS[instruction]
    assert all(partial["delivery"] == "live" for partial in client.partials[f"asked-{client.kind}"])
    client.close(uri)


@pytest.mark.parametrize("how", ["cancelRequest", "command", "progress"])
async def test_a_cancelled_live_rewrite_restores_and_offers_what_it_wrote(scripted: EditorClient, how: str) -> None:
    """Cancel takes out what a live rewrite wrote; its settled hunks stay offered: accept keeps them."""
    client = scripted
    uri = new_uri("cancelled")
    client.open(uri, GUARDED)
    token = msg_id = f"cancel-offer-{how}-{client.kind}"
    client.partials[token] = []
    client.progress_reports[token] = []
    params = {
        "textDocument": {"uri": uri, "version": 1},
        "instruction": "Use json.",
        "partialResultToken": token,
        "workDoneToken": token,
    }
    pending = asyncio.ensure_future(
        _plain_later(client.protocol.send_request_async(protocol.REWRITE_METHOD, params, msg_id=msg_id))
    )
    for _ in range(400):  # the hunk is written, the rewrite still runs
        if any(partial.get("written", {}).get("hunks") for partial in client.partials[token]):
            break
        await asyncio.sleep(0.025)
    assert (await settle(client, uri)).startswith("import json\n") and not pending.done()
    if how == "cancelRequest":
        client.cancel_request(types.CancelParams(id=msg_id))
    elif how == "command":
        await command(client, protocol.COMMAND_CANCEL, {"uri": uri})
    else:
        client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    result = await asyncio.wait_for(pending, 10)
    assert result["status"] == "cancelled" and result["delivery"] == "preview", result
    assert result["message"] == "cancelled: 1 hunk shown as a preview"
    assert await settle(client, uri) == GUARDED
    [hunk] = result["offered"]["hunks"]
    assert (hunk["oldText"], hunk["newText"]) == ("import os\n", "import json\n")
    assert _text_at(GUARDED, hunk["range"], client.encoding) == "import os\n"
    await command(client, protocol.COMMAND_ACCEPT, {"jobId": result["jobId"]})
    assert await settle(client, uri) == GUARDED.replace("import os\n", "import json\n")
    await command(client, protocol.COMMAND_REJECT, {"jobId": result["jobId"]})
    assert await settle(client, uri) == GUARDED
    client.close(uri)


async def test_a_generic_client_gets_the_same_through_commands(scripted: EditorClient) -> None:
    """No plugin: `specedit.rewrite` through executeCommand, its progress created by the server and
    cancelled with its button. The client cannot show a preview: it is asked to keep what was offered."""
    client = scripted
    asked: list[types.ShowMessageRequestParams] = []

    def keep(params: types.ShowMessageRequestParams) -> types.MessageActionItem:
        asked.append(params)
        return types.MessageActionItem(title="Keep")

    client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)(keep)
    uri = new_uri("generic")
    client.open(uri, GUARDED)
    arguments = {"textDocument": {"uri": uri, "version": 1}, "instruction": "Use json.", "delivery": "live"}
    pending = asyncio.ensure_future(command(client, protocol.COMMAND_REWRITE, arguments))
    kept = GUARDED.replace("import os\n", "import json\n")
    for _ in range(400):
        if client.documents[uri].text == kept:  # the hunk written
            break
        await asyncio.sleep(0.025)
    [token] = [token for token in client.progress_reports if str(token).startswith("specedit-")]
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    result = await asyncio.wait_for(pending, 10)
    assert result["status"] == "cancelled" and result["delivery"] == "preview", result
    assert [hunk["oldText"] for hunk in result["offered"]["hunks"]] == ["import os\n"]  # restored, offered
    end = client.progress_reports[token][-1]
    assert isinstance(end, types.WorkDoneProgressEnd) and end.message == "cancelled: 1 hunk shown as a preview"
    for _ in range(400):  # restored, asked, kept
        if asked and await settle(client, uri) == kept:
            break
        await asyncio.sleep(0.025)
    assert [params.message for params in asked] == ["specedit: cancelled: 1 hunk shown as a preview. Keep it?"]
    assert await settle(client, uri) == kept
    client.close(uri)


async def test_the_editor_hears_the_engine_load(scripted: EditorClient) -> None:
    """Started with the editor (`loadOnStart`): `specedit/engine` says loading from the start, then ready."""
    client = scripted
    for _ in range(200):
        if client.engine and client.engine[-1]["state"] == "ready":
            break
        await asyncio.sleep(0.025)
    assert [notice["state"] for notice in client.engine][:2] == ["loading", "ready"], client.engine
    assert client.engine[0]["message"] == "loading the model"


async def test_a_rewrite_that_waits_for_the_load_says_so() -> None:
    """`loadOnStart: false`: the first rewrite loads the model; its progress and `specedit/engine` say so."""
    client = await start_scripted("vscode", {"loadOnStart": False})
    try:
        uri = new_uri("loading")
        client.open(uri, GUARDED)
        client.progress_reports["load"] = []
        params = {
            "textDocument": {"uri": uri, "version": 1},
            "instruction": "Remove the body of append_msg.",
            "delivery": "final",
            "workDoneToken": "load",
        }
        assert (await send_rewrite(client, params))["status"] == "complete"
        messages = [getattr(value, "message", None) or "" for value in client.progress_reports["load"]]
        assert any(message.startswith("loading the model · ") for message in messages), messages
        assert [notice["state"] for notice in client.engine] == ["loading", "ready"], client.engine
    finally:
        await client.shutdown_session()
        await client.stop()


# ----------------------------------------------------------------------------- malformed requests


async def _raw_request(client: EditorClient, msg_id: str, body: bytes) -> Any:
    """Send `body` as it is (the client's own encoder would never write it); the server's answer."""
    import concurrent.futures

    waiter: concurrent.futures.Future[Any] = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = waiter
    server = client._server
    assert server is not None and server.stdin is not None
    server.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return await asyncio.wait_for(asyncio.wrap_future(waiter), 10)


async def test_malformed_requests_are_answered_with_their_json_rpc_errors(scripted: EditorClient) -> None:
    from pygls.exceptions import JsonRpcInvalidParams

    client = scripted
    uri = new_uri("malformed")
    client.open(uri, GUARDED)
    negative = {"start": {"line": -1, "character": 0}, "end": {"line": 0, "character": 0}}
    with pytest.raises(JsonRpcException, match=r"range\.start\.line") as raised:
        await send_rewrite(client, {"textDocument": {"uri": uri}, "instruction": "Use json.", "range": negative})
    assert raised.value.code == JsonRpcInvalidParams.CODE  # not -32603, an internal error
    action = {"textDocument": {"uri": uri}, "range": negative, "context": {"diagnostics": []}}
    message = {"jsonrpc": "2.0", "id": "bad-action", "method": "textDocument/codeAction", "params": action}
    with pytest.raises(JsonRpcException, match=r"Position\.line") as raised:  # pygls dropped it: no answer
        await _raw_request(client, "bad-action", json.dumps(message).encode())
    assert raised.value.code == JsonRpcInvalidParams.CODE
    body = b'{"jsonrpc":"2.0","id":"bad-utf8","method":"specedit/rewrite","params":{"instruction":"caf\xe9"}}'
    with pytest.raises(JsonRpcException, match="not valid UTF-8") as raised:
        await _raw_request(client, "bad-utf8", body)
    assert raised.value.code == -32700
    # The server reads on.
    answer = await send_rewrite(
        client, {"textDocument": {"uri": uri, "version": 1}, "instruction": "Remove the body of append_msg."}
    )
    assert answer["status"] == "complete"
    client.close(uri)
