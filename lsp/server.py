"""specedit's language server: rewrites streamed into the editor as versioned text-document edits.

One `SpeceditServer` holds all state: the documents (its own copies, see `documents.py`), the rewrite jobs,
and the engine backend. Each rewrite runs in a worker thread; its text comes back to the event loop, where
`hunks.HunkTracker` turns it into settled hunks and `delivery.DocumentState` writes them (live), reports
them (preview, as partial results), or writes them all at the end (final).

Handlers are plain functions of the server, registered in `build_server`; `run_lsp` starts it on stdio.
Logs go to stderr: stdout is the LSP channel.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer

from specedit.engine.errors import EngineUnavailableError, ModelLoadError, SpeceditError
from specedit.engine.prompts import language_for_path
from specedit.engine.requests import RewriteRequest
from specedit.lsp import protocol
from specedit.lsp.backend import BackendResult, RewriteBackend, StepReport, make_backend
from specedit.lsp.config import Settings, section
from specedit.lsp.delivery import DocumentState, Intent, Job, Outcome, PlannedEdit
from specedit.lsp.documents import TextIndex, minimal_change
from specedit.lsp.errors import InvalidRequestError, StaleVersionError, error_payload, to_jsonrpc
from specedit.lsp.hunks import HunkState

log = logging.getLogger("specedit.lsp")

VERSION = "0.1.0"
ECHO_TIMEOUT = 2.0  # s to wait for an applied edit to come back in didChange (Neovim debounces 150 ms)
APPLY_TIMEOUT = 300.0  # s to wait for workspace/applyEdit's answer (VS Code may ask the user first)
REPORT_INTERVAL = 0.1  # s between progress reports
RETAINED_JOBS = 16  # finished jobs kept per document for accept / reject


# ------------------------------------------------------------------------------------------- a job


@dataclass
class LiveStats:
    """Stats of a running rewrite, from the engine's per-step reports."""

    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0

    def update(self, info: StepReport) -> None:
        self.steps = info.step
        self.drafted += info.drafted
        self.accepted += info.accepted
        self.generated = info.generated_tokens

    def to_dict(self, lines_done: int, lines_total: int) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started
        return {
            "generated_tokens": self.generated,
            "tokens_per_second": round(self.generated / elapsed, 2) if elapsed > 0 else 0.0,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "target_forwards": self.steps,
            "lines_done": lines_done,
            "lines_total": lines_total,
        }


@dataclass(eq=False)
class RewriteJob:
    """A rewrite request's life: the engine run, its hunks, and how they reach the document."""

    id: str
    uri: str
    core: Job
    request: RewriteRequest
    request_index: TextIndex  # the document at the request's version: hunks are reported in it
    request_start: int
    partial_token: int | str | None = None
    progress_token: int | str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    stop_reason: protocol.Status | None = None  # cancelled or superseded
    running: bool = True
    stats: LiveStats = field(default_factory=LiveStats)
    steps_after_cancel: int = 0
    reported: int = 0  # hunks sent as partial results so far
    last_report: float = 0.0
    final_intent: Intent | None = None

    def stop(self, reason: protocol.Status) -> None:
        """Ask the engine to stop (it checks before every step) and stop writing live."""
        if self.running and self.stop_reason is None:
            log.info("%s: %s", self.id, reason)
            self.stop_reason = reason
            self.cancel.set()
        self.core.stopped = True

    def live_stats(self) -> dict[str, Any]:
        return self.stats.to_dict(self.core.tracker.lines_done, self.core.tracker.lines_total)


# ----------------------------------------------------------------------------------------- the server


class SpeceditServer(LanguageServer):
    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        super().__init__("specedit", VERSION, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.overrides: Mapping[str, Any] = overrides or {}  # the command line: applied last
        self.initialization_settings: Mapping[str, Any] = {}
        self.workspace_settings: Mapping[str, Any] = {}
        self.settings = Settings().merged(self.overrides)
        self.documents: dict[str, DocumentState] = {}
        self.jobs: dict[str, RewriteJob] = {}
        self._job_numbers = itertools.count(1)
        self._backend: RewriteBackend | None = None
        self._backend_settings: tuple[Any, ...] | None = None
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._pulse: asyncio.Event | None = None
        self._engine_error_shown = False

    # ----------------------------------------------------------------------------------- settings

    def update_settings(self) -> None:
        self.settings = (
            Settings().merged(self.initialization_settings).merged(self.workspace_settings).merged(self.overrides)
        )
        log.info("settings: %s", self.settings)

    def backend(self) -> RewriteBackend:
        key = (self.settings.engine, self.settings.model, self.settings.dtype, self.settings.device)
        if self._backend is None or key != self._backend_settings:
            if self._backend is not None:
                self._backend.close()
            self._backend, self._backend_settings = make_backend(self.settings), key
        return self._backend

    # ------------------------------------------------------------------------------------- waiting

    def notify_waiters(self) -> None:
        """Something changed (a didChange, an edit resolved): wake everyone waiting for a condition."""
        pulse, self._pulse = self._pulse, None
        if pulse is not None:
            pulse.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until `predicate()` holds (checked on every pulse); False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not predicate():
            if self._pulse is None:
                self._pulse = asyncio.Event()
            pulse = self._pulse
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(pulse.wait(), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True

    # ------------------------------------------------------------------------------------ documents

    def did_change(self, params: types.DidChangeTextDocumentParams) -> None:
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            return
        codec = self.workspace.position_codec
        text, changes = doc.text, []
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                index = TextIndex(text)
                start, end = index.offset_at(change.range.start, codec), index.offset_at(change.range.end, codec)
                edit = (min(start, end), max(start, end), change.text)
            else:
                edit = minimal_change(text, change.text)
            changes.append(edit)
            text = text[: edit[0]] + edit[2] + text[edit[1] :]
        doc.did_change(params.text_document.version, changes)
        self.notify_waiters()

    def did_close(self, uri: str) -> None:
        doc = self.documents.pop(uri, None)
        for job in [job for job in self.jobs.values() if job.uri == uri]:
            job.stop("cancelled")
            if not job.running:
                del self.jobs[job.id]
        if doc is not None:
            doc.drop_all()
        self.notify_waiters()

    def shutdown_jobs(self) -> None:
        for job in self.jobs.values():
            job.stop("cancelled")
        self.notify_waiters()

    # ------------------------------------------------------------------------------------- rewrite

    async def rewrite(self, params: Mapping[str, Any], *, server_progress: bool = False) -> protocol.RewriteResult:
        """`specedit/rewrite` and the `specedit.rewrite` command. Errors before the job starts raise."""
        job = self.start_job(params)
        return await self.run_job(job, server_progress=server_progress)

    def start_job(self, params: Mapping[str, Any]) -> RewriteJob:
        if not isinstance(params, Mapping):
            raise InvalidRequestError("the parameters must be an object")
        document = params.get("textDocument")
        if not isinstance(document, Mapping) or not isinstance(document.get("uri"), str):
            raise InvalidRequestError("textDocument.uri is required")
        uri = cast(str, document["uri"])
        doc = self.documents.get(uri)
        if doc is None:
            raise InvalidRequestError(f"{uri} is not open")
        version = document.get("version")
        if version is not None and version != doc.version:
            raise StaleVersionError(f"{uri} is at version {doc.version}, not {version}")
        delivery = params.get("delivery") or self.settings.delivery
        if delivery not in protocol.DELIVERIES:
            raise InvalidRequestError(f"delivery must be one of {', '.join(protocol.DELIVERIES)}")
        instruction, sketch = params.get("instruction"), params.get("sketch")
        if (instruction is None) == (sketch is None) or not isinstance(instruction or sketch, str):
            raise InvalidRequestError("give exactly one of instruction and sketch, as a string")
        max_new_tokens = params.get("maxNewTokens", self.settings.max_new_tokens)
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            raise InvalidRequestError("maxNewTokens must be a positive integer")

        index = TextIndex(doc.text)
        start, end = 0, len(doc.text)
        if params.get("range") is not None:
            start, end = self._offsets(index, params["range"])
        try:
            request = RewriteRequest(
                original=doc.text[start:end],
                instruction=instruction,
                sketch=sketch,
                language=language_for_path(unquote(urlparse(uri).path)),
                draft=self.settings.draft,
                max_new_tokens=max_new_tokens,
            )
        except ValueError as error:
            raise InvalidRequestError(str(error)) from None

        job_id = f"r{next(self._job_numbers)}"
        self._supersede(doc, start, end)
        core = Job.start(job_id, delivery, request.original, start)
        doc.jobs.append(core)
        job = RewriteJob(
            job_id,
            uri,
            core,
            request,
            index,
            start,
            partial_token=params.get("partialResultToken"),
            progress_token=params.get("workDoneToken"),
        )
        self.jobs[job_id] = job
        log.info("%s: %s %s [%d:%d] (%s)", job_id, delivery, uri, start, end, (instruction or "sketch")[:60])
        return job

    def _offsets(self, index: TextIndex, value: Any) -> tuple[int, int]:
        try:
            where = types.Range(
                start=types.Position(line=value["start"]["line"], character=value["start"]["character"]),
                end=types.Position(line=value["end"]["line"], character=value["end"]["character"]),
            )
        except (KeyError, TypeError):
            raise InvalidRequestError("range must be {start: {line, character}, end: {line, character}}") from None
        codec = self.workspace.position_codec
        start, end = index.offset_at(where.start, codec), index.offset_at(where.end, codec)
        if end < start:
            raise InvalidRequestError("the range ends before it starts")
        return start, end

    def _supersede(self, doc: DocumentState, start: int, end: int) -> None:
        """A newer request on an overlapping range: the running job ends `superseded`; a finished one is
        forgotten (its hunks can no longer be accepted or rejected), as are all but the latest finished
        ones (RETAINED_JOBS per document)."""
        finished = [job for job in self.jobs.values() if job.uri == doc.uri and not job.running]
        for other in [job for job in self.jobs.values() if job.uri == doc.uri]:
            region = other.core.region
            if other.running and _overlap(region.start, region.end, start, end):
                other.stop("superseded")
            elif not other.running and (
                _overlap(region.start, region.end, start, end) or finished.index(other) < len(finished) - RETAINED_JOBS
            ):
                del self.jobs[other.id]
                if other.core in doc.jobs:
                    doc.jobs.remove(other.core)

    async def run_job(self, job: RewriteJob, *, server_progress: bool = False) -> protocol.RewriteResult:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))

        def on_step(info: StepReport) -> None:
            if job.cancel.is_set():
                job.steps_after_cancel += 1  # the engine checks before every step: at most one
            put("step", info)

        def work(backend: RewriteBackend) -> None:
            try:
                put(
                    "done",
                    backend.run(
                        job.request, on_text=lambda text: put("text", text), on_step=on_step, cancel=job.cancel
                    ),
                )
            except BaseException as error:  # reported to the client; the server carries on
                put("error", error)

        try:
            backend = self.backend()
        except SpeceditError as error:
            job.running = False
            return self._error_result(job, error)
        threading.Thread(target=work, args=(backend,), name=f"specedit-{job.id}", daemon=True).start()
        await self._begin_progress(job, server_progress)

        outcome: tuple[str, Any] | None = None
        while outcome is None:
            try:
                kind, value = await events.get()
            except asyncio.CancelledError:  # $/cancelRequest (or shutdown): end the job, still answer
                _uncancel()
                job.stop("cancelled")
                continue
            if kind == "text":
                self._on_text(job, value)
            elif kind == "step":
                self._on_step(job, value)
            else:
                outcome = (kind, value)
        job.running = False
        while True:
            try:
                result = await self._conclude(job, outcome)
                break
            except asyncio.CancelledError:
                _uncancel()
                job.stop("cancelled")
        self._end_progress(job, result)
        log.info("%s: %s %s", job.id, result["status"], result.get("message", ""))
        return result

    def _on_text(self, job: RewriteJob, text: str) -> None:
        doc = self.documents.get(job.uri)
        hunks = job.core.feed(text)
        if doc is not None:
            doc.settled(job.core, hunks)
            self.kick(doc)
        if hunks:
            self._report(job, force=True)

    def _on_step(self, job: RewriteJob, info: StepReport) -> None:
        job.stats.update(info)
        self._report(job)

    async def _conclude(self, job: RewriteJob, outcome: tuple[str, Any]) -> protocol.RewriteResult:
        kind, value = outcome
        if kind == "error":
            return self._error_result(job, value)
        backend_result = cast(BackendResult, value)
        doc = self.documents.get(job.uri)
        status: protocol.Status
        message = ""
        if backend_result.status == "complete" and job.stop_reason is None:
            try:
                hunks = job.core.finish(backend_result.text)
            except ValueError as error:  # the stream and the final text disagree: a bug, never written
                return self._error_result(job, error)
            if doc is not None:
                doc.settled(job.core, hunks)
                if job.core.delivery == "final" and not job.core.region.conflict:
                    job.final_intent = Intent(job.core, "apply")
                    doc.queue(job.final_intent)
                self.kick(doc)
            self._report(job, force=True)
            status = "complete"
        elif backend_result.status == "incomplete":
            status, message = "error", "the model used its whole token budget without finishing the code"
        else:
            status = job.stop_reason or "cancelled"

        if doc is not None:
            await self.wait_until(lambda: not doc.pending_intents(job.core) or job.uri not in self.documents)
        if status == "complete" and job.core.region.conflict:
            status, message = "conflict", "the document was edited where the rewrite had not written yet"
        if job.final_intent is not None and job.final_intent.outcome is Outcome.REFUSED:
            status, message = "error", "the editor did not apply the edit"
        result: protocol.RewriteResult = {"jobId": job.id, "status": status, "stats": backend_result.stats}
        if message:
            result["message"] = message
        if job.partial_token is None:
            result["hunks"] = [self._hunk_payload(job, hunk_id) for hunk_id in sorted(job.core.region.hunks)]
        if job.stop_reason is not None:
            result["stepsAfterCancel"] = job.steps_after_cancel
        if job.uri not in self.documents:
            self.jobs.pop(job.id, None)
        return result

    def _error_result(self, job: RewriteJob, error: BaseException) -> protocol.RewriteResult:
        if isinstance(error, (EngineUnavailableError, ModelLoadError)) and not self._engine_error_shown:
            self._engine_error_shown = True  # once, not on every request
            self.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Error, message=f"specedit: {error}")
            )
        if not isinstance(error, SpeceditError):
            log.error("%s failed", job.id, exc_info=error)
        payload = error_payload(error)
        return {"jobId": job.id, "status": "error", "stats": {}, "message": payload["message"], "error": payload}

    # ------------------------------------------------------------------------------------ reporting

    def _hunk_payload(self, job: RewriteJob, hunk_id: int) -> protocol.HunkPayload:
        hunk = job.core.region.hunks[hunk_id]
        where = job.request_index.range_at(
            job.request_start + hunk.start, job.request_start + hunk.end, self.workspace.position_codec
        )
        return {
            "id": hunk.id,
            "range": {
                "start": {"line": where.start.line, "character": where.start.character},
                "end": {"line": where.end.line, "character": where.end.character},
            },
            "newText": hunk.new_text,
        }

    def _report(self, job: RewriteJob, *, force: bool = False) -> None:
        """Partial results (new hunks, stats) and work-done progress, at most every REPORT_INTERVAL."""
        now = time.perf_counter()
        if not force and now - job.last_report < REPORT_INTERVAL:
            return
        job.last_report = now
        stats = job.live_stats()
        if job.partial_token is not None:
            hunk_ids = sorted(job.core.region.hunks)[job.reported :]
            job.reported += len(hunk_ids)
            partial: protocol.RewritePartialResult = {
                "jobId": job.id,
                "hunks": [self._hunk_payload(job, hunk_id) for hunk_id in hunk_ids],
                "stats": stats,
            }
            self.protocol.notify(types.PROGRESS, types.ProgressParams(token=job.partial_token, value=partial))
        if job.progress_token is not None and job.running:
            total = max(stats["lines_total"], 1)
            self.work_done_progress.report(
                job.progress_token,
                types.WorkDoneProgressReport(
                    message=_progress_message(stats),
                    percentage=min(100, 100 * stats["lines_done"] // total),
                    cancellable=True,
                ),
            )

    async def _begin_progress(self, job: RewriteJob, server_progress: bool) -> None:
        if job.progress_token is None and server_progress and _supports_progress(self.client_capabilities):
            token = f"specedit-{job.id}-{uuid.uuid4().hex[:8]}"
            try:
                await self.work_done_progress.create_async(token)
                job.progress_token = token
            except Exception as error:  # a client may refuse: no progress then
                log.info("no work-done progress: %s", error)
        if job.progress_token is not None:
            self.work_done_progress.begin(
                job.progress_token,
                types.WorkDoneProgressBegin(title="specedit: rewriting", cancellable=True, percentage=0),
            )

    def _end_progress(self, job: RewriteJob, result: protocol.RewriteResult) -> None:
        if job.progress_token is not None:
            self.work_done_progress.end(
                job.progress_token, types.WorkDoneProgressEnd(message=f"{result['status']}: {job.id}")
            )
            self.work_done_progress.tokens.pop(job.progress_token, None)

    # ------------------------------------------------------------------------------------- writing

    def kick(self, doc: DocumentState) -> None:
        """Make sure the document's writer runs if it has something to write."""
        pump = self._pumps.get(doc.uri)
        if doc.intents and (pump is None or pump.done()):
            self._pumps[doc.uri] = asyncio.ensure_future(self._pump(doc))

    async def _pump(self, doc: DocumentState) -> None:
        """Writes the document's edits, one in flight, each confirmed by its echo (see delivery.py)."""
        try:
            await self._write(doc)
        finally:
            self.notify_waiters()  # planning alone may have settled intents (nothing left to write)

    async def _write(self, doc: DocumentState) -> None:
        while (edit := doc.plan()) is not None:
            try:
                answer = await asyncio.wait_for(
                    self.workspace_apply_edit_async(self._edit_params(doc, edit)), APPLY_TIMEOUT
                )
                applied = bool(answer.applied)
                if not applied:
                    log.info("edit %d not applied: %s", edit.id, answer.failure_reason or "stale")
            except (JsonRpcException, asyncio.TimeoutError) as error:
                log.warning("workspace/applyEdit failed: %s", error)
                applied = False
            doc.on_response(edit, applied)
            if not await self.wait_until(_resolved(edit), ECHO_TIMEOUT):
                log.info("edit %d: no echo within %.1f s; planning it again", edit.id, ECHO_TIMEOUT)
                doc.expire(edit)
            intent = doc.finish(edit)
            if intent.outcome is Outcome.REFUSED:
                log.warning("%s: the editor refused an edit", intent.job.id)
            self.notify_waiters()

    def _edit_params(self, doc: DocumentState, edit: PlannedEdit) -> types.ApplyWorkspaceEditParams:
        index, codec = TextIndex(doc.text), self.workspace.position_codec
        job = self.jobs.get(edit.intent.job.id)
        confirm = edit.intent is (job.final_intent if job else None) and _supports_annotations(self.client_capabilities)
        edits: list[types.TextEdit | types.AnnotatedTextEdit] = []
        for start, end, new_text in edit.edits:
            where = index.range_at(start, end, codec)
            if confirm:
                edits.append(types.AnnotatedTextEdit(range=where, new_text=new_text, annotation_id="specedit"))
            else:
                edits.append(types.TextEdit(range=where, new_text=new_text))
        label = f"specedit: {job.request.instruction or 'sketch'}"[:80] if job else "specedit"
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

    # ------------------------------------------------------------------------------------- commands

    def find_job(self, selector: Any) -> RewriteJob:
        selector = selector if isinstance(selector, Mapping) else {}
        job_id, uri = selector.get("jobId"), selector.get("uri")
        if job_id is not None:
            if job_id not in self.jobs:
                raise InvalidRequestError(f"no job {job_id!r}")
            return self.jobs[job_id]
        candidates = [job for job in self.jobs.values() if uri is None or job.uri == uri]
        if not candidates:
            raise InvalidRequestError("no rewrite to act on" + (f" in {uri}" if uri else ""))
        return candidates[-1]

    async def accept(self, selector: Any) -> protocol.EditResult:
        """Write a job's pending hunks (all, or `hunks`) that the user has not touched."""
        job = self.find_job(selector)
        doc = self._document(job)
        region = job.core.region
        wanted = _selected(selector, region.ids(HunkState.PENDING))
        intent = Intent(job.core, "apply", wanted)
        doc.queue(intent)
        self.kick(doc)
        await self.wait_until(lambda: intent.outcome is not None or job.uri not in self.documents)
        applied = [hunk_id for hunk_id in wanted if region.states[hunk_id] is HunkState.APPLIED]
        return {"jobId": job.id, "applied": applied, "skipped": [i for i in wanted if i not in applied]}

    async def reject(self, selector: Any) -> protocol.EditResult:
        """Stop the job, drop its unwritten hunks, and restore the original where hunks were written."""
        job = self.find_job(selector)
        doc = self._document(job)
        region = job.core.region
        job.stop("cancelled")
        wanted = _selected(selector, sorted(region.hunks))
        for hunk_id in wanted:
            region.mark_rejected(hunk_id)
        intent = Intent(job.core, "revert", [i for i in wanted if region.states[i] is HunkState.APPLIED])
        doc.queue(intent)
        self.kick(doc)
        await self.wait_until(lambda: intent.outcome is not None or job.uri not in self.documents)
        restored = [i for i in intent.hunk_ids or [] if region.states[i] is HunkState.REJECTED]
        skipped = [i for i in wanted if region.states[i] is HunkState.DIRTY]
        return {"jobId": job.id, "applied": restored, "skipped": skipped}

    def cancel(self, selector: Any) -> dict[str, list[str]]:
        selector = selector if isinstance(selector, Mapping) else {}
        running = [job for job in self.jobs.values() if job.running]
        if selector.get("jobId") is not None or selector.get("uri") is not None:
            running = [
                job
                for job in running
                if job.id == selector.get("jobId") or (selector.get("jobId") is None and job.uri == selector.get("uri"))
            ]
        for job in running:
            job.stop("cancelled")
        return {"cancelled": [job.id for job in running]}

    def cancel_progress(self, token: int | str) -> None:
        for job in self.jobs.values():
            if job.progress_token == token:
                job.stop("cancelled")

    def _document(self, job: RewriteJob) -> DocumentState:
        doc = self.documents.get(job.uri)
        if doc is None:
            raise InvalidRequestError(f"{job.uri} is not open")
        return doc

    # --------------------------------------------------------------------------------- code actions

    def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction]:
        only = params.context.only
        if only and not any(protocol.CODE_ACTION_KIND.startswith(kind) for kind in only):
            return []
        doc = self.documents.get(params.text_document.uri)
        if doc is None:
            return []
        lines = re.split(r"\r\n|\r|\n", doc.text)
        first, last = params.range.start.line, params.range.end.line
        if params.range.end.character == 0 and last > first:
            last -= 1  # a selection of whole lines ends at the start of the next one
        end_line = min(last + 1, len(lines))
        if params.range.start == params.range.end and first > 0 and _instruction_comment(lines[first - 1]):
            end_line = next((n for n in range(first, len(lines)) if not lines[n].strip()), len(lines))
        last_line = {"line": len(lines) - 1, "character": self.workspace.position_codec.client_num_units(lines[-1])}
        whole_lines = {
            "start": {"line": first, "character": 0},
            "end": {"line": end_line, "character": 0} if end_line < len(lines) else last_line,
        }
        document = {"uri": doc.uri, "version": doc.version}
        actions = []
        comment = _instruction_comment(lines[first - 1]) if first > 0 else None
        if comment:
            actions.append(
                _action(
                    f"Rewrite as the comment says: {comment}"[:80],
                    {"textDocument": document, "range": whole_lines, "instruction": comment},
                )
            )
        selected = params.range.start != params.range.end
        if selected:
            for preset in self.settings.presets:
                actions.append(
                    _action(
                        preset.title,
                        {"textDocument": document, "range": whole_lines, "instruction": preset.instruction},
                    )
                )
        return actions


def _action(title: str, arguments: dict[str, Any]) -> types.CodeAction:
    return types.CodeAction(
        title=f"specedit: {title}",
        kind=protocol.CODE_ACTION_KIND,
        command=types.Command(title=title, command=protocol.COMMAND_REWRITE, arguments=[arguments]),
    )


_COMMENT = re.compile(
    r"^\s*(?:#|//|--|;+|/\*|\*|<!--)\s*" + re.escape(protocol.INSTRUCTION_COMMENT) + r"\s*(.*?)\s*(?:\*/|-->)?\s*$"
)


def _instruction_comment(line: str) -> str | None:
    """The instruction of a `specedit: ...` comment line, in any common comment syntax.

    >>> _instruction_comment("    # specedit: make it async")
    'make it async'
    >>> _instruction_comment("/* specedit: add logging */")
    'add logging'
    """
    match = _COMMENT.match(line)
    return match.group(1) if match and match.group(1) else None


def _overlap(start_a: int, end_a: int, start_b: int, end_b: int) -> bool:
    """Two regions overlap; an empty one overlaps any region it lies inside (edges included)."""
    if start_a == end_a:
        return start_b <= start_a <= end_b
    if start_b == end_b:
        return start_a <= start_b <= end_a
    return max(start_a, start_b) < min(end_a, end_b)


def _selected(selector: Any, default: list[int]) -> list[int]:
    wanted = selector.get("hunks") if isinstance(selector, Mapping) else None
    if wanted is None:
        return default
    if not isinstance(wanted, list) or not all(isinstance(i, int) for i in wanted):
        raise InvalidRequestError("hunks must be a list of hunk ids")
    return [i for i in default if i in wanted]


def _progress_message(stats: Mapping[str, Any]) -> str:
    return (
        f"{stats['lines_done']}/{stats['lines_total']} lines · {stats['tokens_per_second']:.0f} tok/s · "
        f"{stats['acceptance_rate']:.0%} accepted"
    )


def _resolved(edit: PlannedEdit) -> Callable[[], bool]:
    return lambda: edit.resolved


def _supports_progress(capabilities: types.ClientCapabilities) -> bool:
    return bool(capabilities.window and capabilities.window.work_done_progress)


def _supports_annotations(capabilities: types.ClientCapabilities) -> bool:
    workspace = capabilities.workspace
    return bool(workspace and workspace.workspace_edit and workspace.workspace_edit.change_annotation_support)


def _uncancel() -> None:
    """We answered a cancellation by ending the job: later awaits must not see it again (3.11+)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


# --------------------------------------------------------------------------------------- handlers


def on_initialize(ls: SpeceditServer, params: types.InitializeParams) -> None:
    ls.initialization_settings = section(params.initialization_options)
    ls.update_settings()


async def on_initialized(ls: SpeceditServer, params: types.InitializedParams) -> None:
    await fetch_configuration(ls)


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
    item = params.text_document
    if item.uri in ls.documents:  # opened again without a close: what we knew of it is void
        ls.did_close(item.uri)
    ls.documents[item.uri] = DocumentState(item.uri, item.text, item.version, item.language_id)


def on_did_change(ls: SpeceditServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.did_change(params)


def on_did_close(ls: SpeceditServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.did_close(params.text_document.uri)


def on_shutdown(ls: SpeceditServer, params: None) -> None:
    ls.shutdown_jobs()


def on_progress_cancel(ls: SpeceditServer, params: types.WorkDoneProgressCancelParams) -> None:
    ls.cancel_progress(params.token)


def on_code_action(ls: SpeceditServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    return ls.code_actions(params)


def plain(value: Any) -> Any:
    """JSON as dicts and lists: pygls hands the params of methods it does not know over as namedtuples."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


async def on_rewrite(ls: SpeceditServer, params: Any) -> protocol.RewriteResult:
    try:
        return await ls.rewrite(plain(params))
    except SpeceditError as error:
        raise to_jsonrpc(error) from error


async def command_rewrite(ls: SpeceditServer, *arguments: Any) -> protocol.RewriteResult:
    try:
        job = ls.start_job(plain(arguments[0]) if arguments else {})
    except SpeceditError as error:
        raise to_jsonrpc(error) from error
    # pygls does not pass $/cancelRequest for a command on to its handler: watch the request's future.
    future = ls.protocol._request_futures.get(ls.protocol.msg_id) if ls.protocol.msg_id is not None else None
    if future is not None:
        future.add_done_callback(lambda done: job.stop("cancelled") if done.cancelled() else None)
    return await ls.run_job(job, server_progress=True)


async def command_accept(ls: SpeceditServer, *arguments: Any) -> protocol.EditResult:
    try:
        return await ls.accept(plain(arguments[0]) if arguments else None)
    except SpeceditError as error:
        raise to_jsonrpc(error) from error


async def command_reject(ls: SpeceditServer, *arguments: Any) -> protocol.EditResult:
    try:
        return await ls.reject(plain(arguments[0]) if arguments else None)
    except SpeceditError as error:
        raise to_jsonrpc(error) from error


def command_cancel(ls: SpeceditServer, *arguments: Any) -> dict[str, list[str]]:
    return ls.cancel(plain(arguments[0]) if arguments else None)


def build_server(overrides: Mapping[str, Any] | None = None) -> SpeceditServer:
    """A server with every handler registered; `overrides` are settings that win over the editor's."""
    server = SpeceditServer(overrides)
    server.feature(types.INITIALIZE)(on_initialize)
    server.feature(types.INITIALIZED)(on_initialized)
    server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_did_change_configuration)
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_did_close)
    server.feature(types.SHUTDOWN)(on_shutdown)
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


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Command-line flags as settings (only those given)."""
    names = {
        "engine": "engine",
        "engineTokenFile": "engine_token_file",
        "model": "model",
        "dtype": "dtype",
        "device": "device",
        "draft": "draft",
        "draftModel": "draft_model",
        "draftLayers": "draft_layers",
        "pMin": "p_min",
    }
    return {key: getattr(args, attr) for key, attr in names.items() if getattr(args, attr, None) is not None}


def run_lsp(args: argparse.Namespace) -> int:
    """`specedit lsp`: serve on stdio until the client says exit."""
    verbose = getattr(args, "verbose", 0) or 0
    logging.basicConfig(
        level=logging.WARNING - 10 * verbose, stream=sys.stderr, format="specedit-lsp: %(levelname)s: %(message)s"
    )
    logging.getLogger("pygls").setLevel(logging.WARNING if verbose < 3 else logging.DEBUG)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    server = build_server(overrides_from_args(args))
    # stdout is the LSP channel: pygls gets it, and a stray print() anywhere lands on stderr instead.
    channel = sys.stdout.buffer
    sys.stdout = sys.stderr
    server.start_io(sys.stdin.buffer, channel)
    return 0
