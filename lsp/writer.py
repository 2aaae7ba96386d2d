"""The edit writer: each document's edits go out as versioned `workspace/applyEdit`s, one in flight, each
confirmed by its echo in `didChange` before the next is planned (the state machine is `delivery.py`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer

from specedit.lsp import protocol
from specedit.lsp.delivery import DocumentState, IntentResult, PlannedEdit
from specedit.lsp.waiting import Waiting

log = logging.getLogger("specedit.lsp")

ECHO_TIMEOUT = 2.0  # s to wait for an applied edit to come back in didChange (Neovim debounces 150 ms)
APPLY_TIMEOUT = 300.0  # s to wait for workspace/applyEdit's answer (VS Code may ask the user first)


class EditWriter:
    def __init__(self, lsp: LanguageServer, waiting: Waiting) -> None:
        self._lsp = lsp
        self._waiting = waiting
        self._pumps: dict[str, asyncio.Task[None]] = {}

    def kick(self, doc: DocumentState) -> None:
        """Make sure the document's writer runs if it has something to write."""
        pump = self._pumps.get(doc.uri)
        if doc.intents and (pump is None or pump.done()):
            self._pumps[doc.uri] = asyncio.ensure_future(self._pump(doc))

    def stop(self) -> None:
        """The client is gone: no edit in flight will be answered, nothing more is written."""
        for pump in self._pumps.values():
            pump.cancel()
        self._pumps.clear()

    async def _pump(self, doc: DocumentState) -> None:
        try:
            await self._write(doc)
        finally:
            self._waiting.notify()  # planning alone may have settled intents (nothing left to write)

    async def _write(self, doc: DocumentState) -> None:
        while (edit := doc.plan()) is not None:
            try:
                async with asyncio.timeout(APPLY_TIMEOUT):  # not wait_for: on 3.11 it can swallow a cancel
                    answer = await self._lsp.workspace_apply_edit_async(self._params(doc, edit))
                applied = bool(answer.applied)
                if not applied:
                    log.info("edit %d not applied: %s", edit.id, answer.failure_reason or "stale")
            except (JsonRpcException, asyncio.TimeoutError) as error:
                log.warning("workspace/applyEdit failed: %s", error)
                applied = False
            doc.on_response(edit, applied)
            if not await self._waiting.until(_resolved(edit), ECHO_TIMEOUT):
                log.info("edit %d: no echo within %.1f s; planning it again", edit.id, ECHO_TIMEOUT)
                doc.expire(edit)
            intent = doc.finish(edit)
            if intent.result is IntentResult.REFUSED:
                log.warning("%s: the editor refused an edit", intent.write_out.id)
            if edit.echo and edit.provisional is not None:
                self._provisional(doc, edit)
            self._waiting.notify()

    def _provisional(self, doc: DocumentState, edit: PlannedEdit) -> None:
        """Tell the client where the provisional text now is, for it to mark as pending."""
        where = edit.intent.write_out.region.provisional_range()
        codec = self._lsp.workspace.position_codec
        params: protocol.ProvisionalParams = {
            "uri": doc.uri,
            "version": doc.version,
            "jobId": edit.intent.write_out.id,
            "range": None if where is None else doc.index().range_payload(where[0], where[1], codec),
        }
        self._lsp.protocol.notify(protocol.PROVISIONAL_NOTIFICATION, params)

    def _params(self, doc: DocumentState, edit: PlannedEdit) -> types.ApplyWorkspaceEditParams:
        index, codec = doc.index(), self._lsp.workspace.position_codec
        confirm = edit.intent.confirm and _supports_annotations(self._lsp.client_capabilities)
        edits: list[types.TextEdit | types.AnnotatedTextEdit] = []
        for start, end, new_text in edit.edits:
            where = index.range_at(start, end, codec)
            if confirm:
                edits.append(types.AnnotatedTextEdit(range=where, new_text=new_text, annotation_id="specedit"))
            else:
                edits.append(types.TextEdit(range=where, new_text=new_text))
        label = edit.intent.write_out.label
        workspace_edit = types.WorkspaceEdit(
            document_changes=[
                types.TextDocumentEdit(
                    text_document=types.OptionalVersionedTextDocumentIdentifier(uri=doc.uri, version=edit.version),
                    edits=edits,
                )
            ],
            change_annotations=(
                {"specedit": types.ChangeAnnotation(label=label, needs_confirmation=True)} if confirm else None
            ),
        )
        return types.ApplyWorkspaceEditParams(edit=workspace_edit, label=label)


def _resolved(edit: PlannedEdit) -> Callable[[], bool]:
    return lambda: edit.resolved


def _supports_annotations(capabilities: types.ClientCapabilities) -> bool:
    workspace = capabilities.workspace
    return bool(workspace and workspace.workspace_edit and workspace.workspace_edit.change_annotation_support)
