"""specedit's language server: rewrites streamed into the editor as versioned text-document edits.

`SpeceditServer` holds the state: the settings, the documents (its own copies, see `documents.py`), the
session rewrites run on, the jobs (`jobs.Rewrites`), the edit writer (`writer.EditWriter`), the conditions
they wait on (`waiting.Waiting`, woken by every `didChange`), the offers of open documents to the
engine to prefill before a request comes (`warming.Warmer`), and what the editor hears of the engine's
load (`engine_status.EngineStatus`).
The handlers below parse their params once (`params.py`), call into those, and map errors to JSON-RPC
in one place (`_answers_errors`); `build_server` registers them and `run_lsp` serves on stdio, through
a reader that answers malformed messages too (`channel.py`). Logs go to stderr: stdout is the LSP
channel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.workspace.position_codec import PositionCodec

from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.options import EngineOptions
from specedit.engine.session.session import Session
from specedit.engine.store.fetch import ProgressCallback
from specedit.lsp import protocol
from specedit.lsp.channel import stdio
from specedit.lsp.code_actions import code_actions
from specedit.lsp.config import ENGINE_KEYS, Settings, open_session, section, wait_until_loaded
from specedit.lsp.delivery import DocumentState, Edit
from specedit.lsp.documents import TextIndex, minimal_change
from specedit.lsp.engine_status import EngineStatus
from specedit.lsp.errors import to_jsonrpc
from specedit.lsp.jobs import Rewrites
from specedit.lsp.params import JobSelector, RewriteCall
from specedit.lsp.waiting import Waiting
from specedit.lsp.warming import Warmer
from specedit.lsp.writer import EditWriter

log = logging.getLogger("specedit.lsp")

# What pygls' method generators yield: a handler to run, with its positional and keyword arguments.
HandlerCall = tuple[Callable[..., object], tuple[object, ...], None]

VERSION = "0.1.0"


class OwnDocumentsProtocol(LanguageServerProtocol):
    """pygls' protocol without pygls' copies of the text documents: the server keeps its own (`documents`).

    pygls' copy splits lines at every break `str.splitlines` knows ("\\x0b", "\\x0c", "\\u2028", ...), and its
    `didChange` clamps each position to the length of the "line" of that number in its copy, *in the params*,
    before the server's handler sees them: after one form feed in a file, changes on its line and below it
    could come out misplaced, and the echo of the server's own edit taken for the user's typing."""

    def _only_ours(self, method: str, params: object) -> Iterator[HandlerCall]:
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams) -> Iterator[HandlerCall]:
        yield from self._only_ours(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams) -> Iterator[HandlerCall]:
        yield from self._only_ours(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams) -> Iterator[HandlerCall]:
        yield from self._only_ours(types.TEXT_DOCUMENT_DID_CLOSE, params)


class SpeceditServer(LanguageServer):
    def __init__(
        self,
        overrides: Mapping[str, object] | None = None,
        sessions: Callable[[Settings, ProgressCallback], Session] = open_session,
    ) -> None:
        """`overrides`: settings that win over the editor's; `sessions`: where rewrites run for given
        settings (tests give a scripted engine), told how the model's fetch goes."""
        super().__init__(
            "specedit",
            VERSION,
            protocol_cls=OwnDocumentsProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.overrides: Mapping[str, object] = overrides or {}  # the command line: applied last
        self.initialization_settings: Mapping[str, object] = {}
        self.workspace_settings: Mapping[str, object] = {}
        self.settings = Settings().merged(self.overrides)
        self.documents: dict[str, DocumentState] = {}
        self.waiting = Waiting()
        self.writer = EditWriter(self, self.waiting)
        self.engine_status = EngineStatus(self._notify_engine)
        self.rewrites = Rewrites(
            self, self.documents, self.writer, self.waiting, lambda: self.settings, self.session, self.engine_status
        )
        self.warmer = Warmer(self.documents, self.session, lambda: self.settings.warm)
        self._sessions = sessions
        self._session: Session | None = None
        self._session_settings: tuple[str | None, str | None, EngineOptions] | None = None
        self._keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specedit-keep")
        self._started: Session | None = None  # the session whose engine started (on the keeper's thread)
        self._loop: asyncio.AbstractEventLoop | None = None  # the one serving the client, once it opened a document

    def update_settings(self) -> None:
        self.settings = (
            Settings().merged(self.initialization_settings).merged(self.workspace_settings).merged(self.overrides)
        )
        log.info("settings: %s", self.settings)

    def session(self) -> Session:
        """Where rewrites run, for the current settings (a new one when they changed)."""
        settings = self.settings
        key = (settings.engine, settings.engine_token_file, settings.engine_options)
        if self._session is None or key != self._session_settings:
            if self._session is not None:
                self._session.close()
            self._session, self._session_settings = self._sessions(settings, self.engine_status.provisioning), key
        return self._session

    def _notify_engine(self, params: protocol.EngineParams) -> None:
        """`specedit/engine`, from any thread (the engine starts on the keeper's, fetches on its own)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: no one to tell
                loop.call_soon_threadsafe(self.protocol.notify, protocol.ENGINE_NOTIFICATION, params)

    # ------------------------------------------------------------------------------------ documents

    def did_open(self, item: types.TextDocumentItem) -> None:
        if item.uri in self.documents:  # opened again without a close: what we knew of it is void
            self.did_close(item.uri)
        self._loop = asyncio.get_running_loop()
        self.documents[item.uri] = DocumentState(item.uri, item.text, item.version, item.language_id)
        self.warmer.touch(item.uri)
        self.keep_engine(start=True)

    def did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            return
        index = doc.index(doc.client_text)
        changes, index = read_changes(index, params.content_changes, self.workspace.position_codec)
        doc.did_change(params.text_document.version, changes, index.text)
        doc.remember(index)
        self.waiting.notify()
        self.warmer.touch(doc.uri)

    def did_close(self, uri: str) -> None:
        doc = self.documents.pop(uri, None)
        self.warmer.forget(uri)
        self.rewrites.close_document(uri)
        if doc is not None:
            doc.drop_all()
        self.waiting.notify()
        self.keep_engine()

    def close_all(self) -> None:
        """The client is gone (it said exit, or its channel ended): every document closes, so no rewrite
        waits any more for edits no one will apply, and the process can end."""
        for uri in list(self.documents):
            self.did_close(uri)
        self.writer.stop()

    def client_gone(self) -> None:
        """`close_all`, from any thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.close_all)

    def keep_engine(self, *, start: bool = False) -> None:
        """The shared engine stays while documents are open here, not only while a rewrite runs (else the
        next rewrite after a pause waits for the model to load again). With `start` (the editor started, a
        document opened) and the setting `loadOnStart`, the engine starts first: the model loads now, and
        the open documents are read into its cache while the user reads them, so that the first rewrite is
        a warm one, once a session (a daemon's start is a connection more). On a thread, in order: it
        connects, and may wait for the load."""
        session, wanted = self.session(), bool(self.documents)
        self._keeper.submit(self._keep_engine, session, start and self.settings.load_on_start, wanted)

    def _keep_engine(self, session: Session, start: bool, wanted: bool) -> None:
        if start and session is not self._started:
            self.engine_status.loading()
            try:
                session.start()
                wait_until_loaded(session)
            except SpeceditError as error:  # the first rewrite meets it again, and says it (or the next open)
                log.warning("the engine did not start: %s", error)
                self.engine_status.failed(error)
            else:
                self._started = session
                self.engine_status.ready()
                self.warmer.touch_all()  # offers made while it started found no one
        session.keep_alive(wanted)


def read_changes(
    index: TextIndex, content_changes: Sequence[types.TextDocumentContentChangeEvent], codec: PositionCodec
) -> tuple[list[Edit], TextIndex]:
    """A `didChange`'s changes as offsets (each in the text the one before left), and the index of the
    text after them all. A whole-text change becomes the smallest edit that makes it (for the echo of our
    own edits, and the regions); its text is taken as it came, not built again."""
    changes: list[Edit] = []
    for change in content_changes:
        if isinstance(change, types.TextDocumentContentChangePartial):
            start, end = index.offset_at(change.range.start, codec), index.offset_at(change.range.end, codec)
            edit = (min(start, end), max(start, end), change.text)
            index = index.edited(*edit)
        else:
            edit = minimal_change(index.text, change.text)
            index = index.edited(*edit, text=change.text)
        changes.append(edit)
    return changes, index


# --------------------------------------------------------------------------------------- handlers

Handler = TypeVar("Handler", bound=Callable[..., object])


def _answers_errors(handler: Handler) -> Handler:
    """The one place where a `SpeceditError` a handler raises becomes the JSON-RPC error the client gets."""
    if inspect.iscoroutinefunction(handler):

        @functools.wraps(handler)
        async def answer_async(*args: object) -> object:
            try:
                return await handler(*args)
            except SpeceditError as error:
                raise to_jsonrpc(error) from error

        return answer_async  # type: ignore[return-value]

    @functools.wraps(handler)
    def answer(*args: object) -> object:
        try:
            return handler(*args)
        except SpeceditError as error:
            raise to_jsonrpc(error) from error

    return answer  # type: ignore[return-value]


def on_initialize(ls: SpeceditServer, params: types.InitializeParams) -> None:
    ls.initialization_settings = section(params.initialization_options)
    ls.update_settings()


async def on_initialized(ls: SpeceditServer, params: types.InitializedParams) -> None:
    ls._loop = asyncio.get_running_loop()
    await fetch_configuration(ls)
    ls.keep_engine(start=True)  # with the editor: loaded by the time the user asks


async def on_did_change_configuration(ls: SpeceditServer, params: types.DidChangeConfigurationParams) -> None:
    values = params.settings.get(protocol.CONFIGURATION_SECTION) if isinstance(params.settings, Mapping) else None
    if isinstance(values, Mapping):
        ls.workspace_settings = values
        ls.update_settings()
    else:
        await fetch_configuration(ls)


async def fetch_configuration(ls: SpeceditServer) -> None:
    workspace = ls.client_capabilities.workspace
    if not (workspace and workspace.configuration):
        return
    try:
        values = await ls.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section=protocol.CONFIGURATION_SECTION)])
        )
    except Exception as error:  # a client may not answer: the settings stay as they are
        log.info("workspace/configuration failed: %s", error)
        return
    ls.workspace_settings = section(values[0] if values else None)
    ls.update_settings()


def on_did_open(ls: SpeceditServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.did_open(params.text_document)


def on_did_change(ls: SpeceditServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.did_change(params)


def on_did_close(ls: SpeceditServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.did_close(params.text_document.uri)


def on_shutdown(ls: SpeceditServer, params: None) -> None:
    ls.rewrites.stop_all()
    ls.waiting.notify()


def on_exit(ls: SpeceditServer, params: None) -> None:
    ls.close_all()


def on_progress_cancel(ls: SpeceditServer, params: types.WorkDoneProgressCancelParams) -> None:
    ls.rewrites.cancel_progress(params.token)


def on_code_action(ls: SpeceditServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    doc = ls.documents.get(params.text_document.uri)
    if doc is None:
        return []
    return code_actions(doc, params, ls.settings.presets, ls.workspace.position_codec)


@_answers_errors
async def on_rewrite(ls: SpeceditServer, params: object) -> protocol.RewriteResult:
    job = await ls.rewrites.start(RewriteCall.parse(params))
    try:
        return await ls.rewrites.run(job)
    finally:
        ls.keep_engine()  # the rewrite may have started the engine


@_answers_errors
async def command_rewrite(ls: SpeceditServer, *arguments: object) -> protocol.RewriteResult:
    # pygls does not pass $/cancelRequest for a command on to its handler: watch the request's future.
    future = ls.protocol._request_futures.get(ls.protocol.msg_id) if ls.protocol.msg_id is not None else None
    job = await ls.rewrites.start(RewriteCall.parse(arguments[0] if arguments else {}))
    if future is not None:
        future.add_done_callback(lambda done: job.stop("cancelled", offer=True) if done.cancelled() else None)
    try:
        return await ls.rewrites.run(job, server_progress=True)
    finally:
        ls.keep_engine()


@_answers_errors
async def command_accept(ls: SpeceditServer, *arguments: object) -> protocol.EditResult:
    return await ls.rewrites.accept(JobSelector.parse(arguments))


@_answers_errors
async def command_reject(ls: SpeceditServer, *arguments: object) -> protocol.EditResult:
    return await ls.rewrites.reject(JobSelector.parse(arguments))


@_answers_errors
def command_cancel(ls: SpeceditServer, *arguments: object) -> dict[str, list[str]]:
    return ls.rewrites.cancel(JobSelector.parse(arguments))


def build_server(
    overrides: Mapping[str, object] | None = None,
    sessions: Callable[[Settings, ProgressCallback], Session] = open_session,
) -> SpeceditServer:
    """A server with every handler registered (for the arguments, see `SpeceditServer`)."""
    server = SpeceditServer(overrides, sessions)
    server.feature(types.INITIALIZE)(on_initialize)
    server.feature(types.INITIALIZED)(on_initialized)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_did_close)
    server.feature(types.SHUTDOWN)(on_shutdown)
    server.feature(types.EXIT)(on_exit)
    server.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)(on_progress_cancel)
    server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]),
    )(on_code_action)
    server.feature(protocol.REWRITE_METHOD)(on_rewrite)
    server.command(protocol.COMMAND_REWRITE)(command_rewrite)
    server.command(protocol.COMMAND_ACCEPT)(command_accept)
    server.command(protocol.COMMAND_REJECT)(command_reject)
    server.command(protocol.COMMAND_CANCEL)(command_cancel)
    return server


def overrides_from_args(args: argparse.Namespace) -> dict[str, object]:
    """Command-line flags as settings (only those given), by the editors' names."""
    names = {
        "engine": "engine",
        "engineTokenFile": "engine_token_file",
        "draft": "draft",
        **ENGINE_KEYS,  # the engine flags' dests are the EngineOptions fields
    }
    return {key: getattr(args, attr) for key, attr in names.items() if getattr(args, attr, None) is not None}


def run_lsp(args: argparse.Namespace) -> int:
    """`specedit lsp`: serve on stdio until the client says exit."""
    verbose = getattr(args, "verbose", 0) or 0
    logging.basicConfig(
        level=logging.WARNING - 10 * verbose, stream=sys.stderr, format="specedit-lsp: %(levelname)s: %(message)s"
    )
    logging.getLogger("pygls").setLevel(logging.WARNING if verbose < 3 else logging.DEBUG)
    server = build_server(overrides_from_args(args))
    stdio(server, server.client_gone)
    return 0
