"""The rewrite jobs of the language server: started from a call, run on the server's session in a worker
thread, their text turned into settled hunks on the event loop and handed to the document's writer
(live), reported as partial results (preview), or written at the end (final); then accept, reject and
cancel act on them. A live rewrite becomes a preview when its answer removes most of its region
(`guard.py`) or when the user cancels it: what it wrote is taken out, and its hunks are offered.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from specedit.engine.records.errors import EngineUnavailableError, ModelLoadError, SpeceditError
from specedit.engine.records.events import Phase, Step, Text
from specedit.engine.records.prompts import language_for_path
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest
from specedit.engine.session.session import Session
from specedit.lsp import progress, protocol
from specedit.lsp.config import Settings
from specedit.lsp.delivery import DocumentState, Intent, IntentResult, Rebase, WriteOut
from specedit.lsp.documents import TextIndex
from specedit.lsp.engine_status import EngineStatus
from specedit.lsp.errors import InvalidRequestError, StaleVersionError, error_payload
from specedit.lsp.guard import removed_lines, too_destructive
from specedit.lsp.hunks import Hunk, line_end
from specedit.lsp.params import JobSelector, RewriteCall
from specedit.lsp.region import HunkState, RegionTracker
from specedit.lsp.waiting import Waiting
from specedit.lsp.writer import EditWriter

log = logging.getLogger("specedit.lsp")

RETAINED_JOBS = 16  # finished jobs kept per document for accept / reject
KEEP, DROP = "Keep", "Drop"  # what a client without a plugin is asked, where a rewrite became a preview


@dataclass(eq=False)
class RewriteJob:
    """A rewrite request's life: the engine run, its hunks, and how they reach the document."""

    id: str
    uri: str
    write_out: WriteOut
    request: RewriteRequest
    asked: Rebase  # the document at the request's version, and our edits since: hunks are reported in it
    request_start: int  # where the region began when the job started
    partial_token: int | str | None = None
    progress_token: int | str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    stop_reason: protocol.Status | None = None  # cancelled or superseded
    running: bool = True
    stats: progress.LiveStats = field(default_factory=progress.LiveStats)
    reported: int = 0  # hunks sent as partial results so far
    last_report: float = 0.0
    final_intent: Intent | None = None
    offer_on_stop: bool = False  # the user cancelled: what a live rewrite wrote is offered, not kept
    previewed: str | None = None  # a live rewrite shown as a preview instead (the guard, a cancel): why
    removed_lines: int = 0  # by its hunks so far, net (`guard.removed_lines`)

    @cached_property
    def asked_index(self) -> TextIndex:
        return TextIndex(self.asked.text)

    @property
    def delivery(self) -> protocol.Delivery:
        """The delivery as the client sees it now: a live rewrite shown as a preview is one."""
        return "preview" if self.previewed is not None else self.write_out.delivery

    def stop(self, reason: protocol.Status, *, offer: bool = False) -> None:
        """Ask the engine to stop (it checks before every step) and stop writing live. `offer`: the user
        cancelled, and a live rewrite's hunks become a preview (`Rewrites.run`)."""
        if self.running and self.stop_reason is None:
            log.info("%s: %s", self.id, reason)
            self.stop_reason = reason
            self.offer_on_stop = offer
            self.cancel.set()
        self.write_out.stopped = True

    def live_stats(self) -> protocol.ProgressStats:
        return self.stats.to_dict(self.write_out.tracker.lines_done, self.write_out.tracker.lines_total)


class Rewrites:
    """Every rewrite job of one server, by id. `lsp` is the server, for what goes to the client (progress,
    messages); the documents, the writer and the waiting are the server's own; `settings` and `session`
    give the current ones."""

    def __init__(
        self,
        lsp: LanguageServer,
        documents: dict[str, DocumentState],
        writer: EditWriter,
        waiting: Waiting,
        settings: Callable[[], Settings],
        session: Callable[[], Session],
        engine: EngineStatus | None = None,
    ) -> None:
        self._lsp = lsp
        self._documents = documents
        self._writer = writer
        self._waiting = waiting
        self._settings = settings
        self._session = session
        self._engine = engine or EngineStatus(lambda params: None)
        self._asking: set[asyncio.Future[None]] = set()  # questions to clients without a plugin (`_ask_to_keep`)
        self.jobs: dict[str, RewriteJob] = {}
        self._numbers = itertools.count(1)
        self._engine_error_shown = False

    # ------------------------------------------------------------------------------------------ start

    async def start(self, call: RewriteCall) -> RewriteJob:
        """A job for `call` on the document as it is now; errors before anything runs are raised.

        The request names the version the user saw; the server's own writing since (a live rewrite's) does
        not make it stale: its range is carried over. A running rewrite it overlaps is superseded first,
        and its provisional text taken out, so that the new one reads the document without it."""
        doc = self._documents.get(call.uri)
        if doc is None:
            raise InvalidRequestError(f"{call.uri} is not open")
        version = doc.version if call.version is None else call.version
        rebase = self._rebase(doc, version)
        start, end = 0, len(rebase.text)
        if call.range is not None:
            codec, then = self._lsp.workspace.position_codec, TextIndex(rebase.text)
            start, end = then.offset_at(call.range.start, codec), then.offset_at(call.range.end, codec)
            if end < start:
                raise InvalidRequestError("the range ends before it starts")
        self._request(call, rebase.text[start:end])  # a bad request supersedes nothing
        superseded = self._supersede(doc, *self._now(doc, rebase, start, end, call.range is None))
        if superseded:
            await self._waiting.until(
                lambda: (
                    not any(doc.pending_intents(job.write_out) for job in superseded) or call.uri not in self._documents
                )
            )
            if call.uri not in self._documents:
                raise InvalidRequestError(f"{call.uri} was closed")
            rebase = self._rebase(doc, version)
        now_start, now_end = self._now(doc, rebase, start, end, call.range is None)
        request = self._request(call, doc.text[now_start:now_end])

        job_id = f"r{next(self._numbers)}"
        delivery = call.delivery or self._settings().delivery
        label = f"specedit: {call.instruction or 'sketch'}"[:80]
        write_out = WriteOut.start(
            job_id, delivery, request.original, now_start, label=label, newline=line_end(doc.text)
        )
        doc.write_outs.append(write_out)
        job = RewriteJob(
            job_id,
            call.uri,
            write_out,
            request,
            rebase,
            now_start,
            partial_token=call.partial_token,
            progress_token=call.work_done_token,
        )
        self.jobs[job_id] = job
        what = (call.instruction or "sketch")[:60]
        log.info("%s: %s %s [%d:%d] (%s)", job_id, delivery, call.uri, now_start, now_end, what)
        return job

    def _request(self, call: RewriteCall, original: str) -> RewriteRequest:
        settings = self._settings()
        try:
            return RewriteRequest(
                original=original,
                instruction=call.instruction,
                sketch=call.sketch,
                language=language_for_path(unquote(urlparse(call.uri).path)),
                draft=settings.draft,
                max_new_tokens=call.max_new_tokens or settings.max_new_tokens,
                path=unquote(urlparse(call.uri).path) if call.uri.startswith("file:") else None,  # (`chat_answer`)
            )
        except ValueError as error:
            raise InvalidRequestError(str(error)) from None

    @staticmethod
    def _now(doc: DocumentState, rebase: Rebase, start: int, end: int, whole: bool) -> tuple[int, int]:
        """Where the request's range is in the document now (all of it, for a whole-document request)."""
        return (0, len(doc.text)) if whole else rebase.range(start, end)

    @staticmethod
    def _rebase(doc: DocumentState, version: int) -> Rebase:
        rebase = doc.since(version)
        if rebase is None:
            raise StaleVersionError(f"{doc.uri} is at version {doc.version}, not {version}")
        return rebase

    def _supersede(self, doc: DocumentState, start: int, end: int) -> list[RewriteJob]:
        """A newer request on an overlapping range: the running jobs end `superseded` (returned, their
        provisional text on its way out); a finished one is forgotten (its hunks can no longer be accepted
        or rejected), as are all but the latest finished ones (RETAINED_JOBS per document)."""
        superseded: list[RewriteJob] = []
        finished = [job for job in self.jobs.values() if job.uri == doc.uri and not job.running]
        for other in [job for job in self.jobs.values() if job.uri == doc.uri]:
            region = other.write_out.region
            if other.running and overlap(region.start, region.end, start, end):
                other.stop("superseded")
                self._stop_writing(other)
                superseded.append(other)
            elif not other.running and (
                overlap(region.start, region.end, start, end) or finished.index(other) < len(finished) - RETAINED_JOBS
            ):
                del self.jobs[other.id]
                if other.write_out in doc.write_outs:
                    doc.write_outs.remove(other.write_out)
        return superseded

    # -------------------------------------------------------------------------------------------- run

    async def run(self, job: RewriteJob, *, server_progress: bool = False) -> protocol.RewriteResult:
        """Run `job` on the server's session to its end; its result, errors included."""
        try:
            session = self._session()
        except SpeceditError as error:
            job.running = False
            return self._error_result(job, error)
        events = session.stream(job.request, cancel=job.cancel)
        job.progress_token = await progress.begin(self._lsp, job.progress_token, job.id, server_progress)
        ticker = asyncio.ensure_future(self._tick(job))

        ending: RewriteOutcome | BaseException | None = None
        while ending is None:
            try:
                event = await anext(events)
            except asyncio.CancelledError:  # $/cancelRequest (or shutdown): end the job, still answer
                _uncancel()
                job.stop("cancelled", offer=True)
                continue
            except Exception as error:  # reported to the client; the server carries on
                ending = error
                break
            if isinstance(event, Text):
                self._on_text(job, event.delta)
            elif isinstance(event, Step):
                if job.stats.last is None:
                    self._engine.ready()
                job.stats.step(event)
                self._report(job)
            elif isinstance(event, Phase):
                if event.name == "loading":
                    self._engine.loading()
                else:
                    self._engine.ready()
                job.stats.phase = event
                self._report(job, force=True)
            else:
                ending = event.outcome
        job.running = False
        ticker.cancel()
        if job.offer_on_stop and job.write_out.delivery == "live" and job.previewed is None:
            self._to_preview(job, "cancelled")  # what it wrote is taken out, and offered
        elif not isinstance(ending, RewriteOutcome) or not ending.complete or job.stop_reason is not None:
            self._stop_writing(job)  # its provisional text goes; a complete one's is replaced by its end
        while True:
            try:
                result = await self._conclude(job, ending)
                break
            except asyncio.CancelledError:
                _uncancel()
                job.stop("cancelled")
        if job.progress_token is not None:
            progress.end(self._lsp, job.progress_token, job.id, result)
        log.info("%s: %s %s", job.id, result["status"], result.get("message", ""))
        if server_progress and result.get("offered", {}).get("hunks"):
            asking = asyncio.ensure_future(self._ask_to_keep(job, result.get("message", "")))
            self._asking.add(asking)
            asking.add_done_callback(self._asking.discard)
        return result

    async def _ask_to_keep(self, job: RewriteJob, message: str) -> None:
        """A client without a plugin (the command) cannot show a preview: it is asked to keep or drop it."""
        params = types.ShowMessageRequestParams(
            type=types.MessageType.Warning,
            message=f"specedit: {message}. Keep it?",
            actions=[types.MessageActionItem(title=KEEP), types.MessageActionItem(title=DROP)],
        )
        try:
            chosen = await self._lsp.window_show_message_request_async(params)
            if chosen is not None and chosen.title in (KEEP, DROP) and job.id in self.jobs:
                act = self.accept if chosen.title == KEEP else self.reject
                await act(JobSelector(job.id))
        except Exception as error:  # no answer, or the client cannot ask: the hunks stay offered
            log.info("%s: not asked to keep it: %s", job.id, error)

    async def _tick(self, job: RewriteJob) -> None:
        """Until the first step, a report every progress.TICK_INTERVAL: the user sees the model load, not a stall."""
        while job.running and job.stats.last is None:
            await asyncio.sleep(progress.TICK_INTERVAL)
            if job.running and job.stats.last is None:
                self._report(job, force=True)

    def _on_text(self, job: RewriteJob, text: str) -> None:
        doc = self._documents.get(job.uri)
        hunks = job.write_out.feed(text)
        if hunks:
            self._guard(job, hunks)  # before they are written
        if doc is not None:
            doc.settled(job.write_out, hunks)
            self._writer.kick(doc)
        if hunks:
            self._report(job, force=True)

    async def _conclude(self, job: RewriteJob, ending: RewriteOutcome | BaseException) -> protocol.RewriteResult:
        if isinstance(ending, BaseException):
            return self._error_result(job, ending)
        outcome = ending
        doc = self._documents.get(job.uri)
        status: protocol.Status
        message = ""
        if job.stop_reason is None and (error := outcome.error()) is not None and outcome.status != "incomplete":
            return await self._not_written(job, doc, outcome, error)
        if outcome.complete and job.stop_reason is None:
            try:
                hunks = job.write_out.finish(outcome.text)
            except ValueError as error:  # the stream and the final text disagree: a bug, never written
                return self._error_result(job, error)
            self._guard(job, hunks)  # before the last hunks are written
            if doc is not None:
                doc.settled(job.write_out, hunks)
                if job.write_out.delivery == "final" and not job.write_out.region.conflict:
                    job.final_intent = Intent(job.write_out, "apply", confirm=True)
                    doc.queue(job.final_intent)
                self._writer.kick(doc)
            self._report(job, force=True)
            status = "complete"
        elif outcome.status == "incomplete":
            status, message = "error", outcome.problem
        else:
            status = job.stop_reason or "cancelled"

        if doc is not None:
            await self._waiting.until(lambda: not doc.pending_intents(job.write_out) or job.uri not in self._documents)
        if status == "complete" and job.write_out.region.conflict:
            status, message = "conflict", "the document was edited where the rewrite had not written yet"
        if job.final_intent is not None and job.final_intent.result is IntentResult.REFUSED:
            status, message = "error", "the editor did not apply the edit"
        result: protocol.RewriteResult = {
            "jobId": job.id,
            "status": status,
            "stats": outcome.stats.to_dict(),
            "delivery": job.delivery,
        }
        if job.previewed is not None and status in ("complete", "cancelled"):
            message = self._preview_message(job)
        if message:
            result["message"] = message
        if job.partial_token is None:
            result["hunks"] = [self._hunk_payload(job, hunk_id) for hunk_id in sorted(job.write_out.region.hunks)]
        if doc is not None and job.write_out.region.ids(HunkState.APPLIED):
            result["written"] = self._written(job, doc)
        if doc is not None and job.previewed is not None:
            result["offered"] = self._offered(job, doc)
        if job.stop_reason is not None:
            result["stepsAfterCancel"] = outcome.stats.steps_after_cancel or 0
        if job.uri not in self._documents:
            self.jobs.pop(job.id, None)
        return result

    async def _not_written(
        self, job: RewriteJob, doc: DocumentState | None, outcome: RewriteOutcome, error: SpeceditError
    ) -> protocol.RewriteResult:
        """An answer not to write (no merge of its sketch, or empty: `session.judged`) is never left in the
        document: nothing more is written, and what a live rewrite wrote already is restored; no hunk is
        offered."""
        self._stop_writing(job)
        if doc is not None:
            await self._drop(job, doc, sorted(job.write_out.region.hunks))
            await self._waiting.until(lambda: not doc.pending_intents(job.write_out) or job.uri not in self._documents)
        return {"jobId": job.id, "status": "error", "message": str(error), "stats": outcome.stats.to_dict()}

    # ----------------------------------------------------------------------------- live to preview

    def _guard(self, job: RewriteJob, settled: list[Hunk]) -> None:
        """A live rewrite whose settled hunks remove most of its region, on an instruction that asks for no
        removal (`guard.too_destructive`), is shown as a preview instead: it runs on to its end."""
        job.removed_lines += removed_lines(settled)
        if not job.write_out.writes_live:
            return
        why = too_destructive(job.request.instruction, job.removed_lines, job.write_out.tracker.lines_total)
        if why is not None:
            self._to_preview(job, why)

    def _to_preview(self, job: RewriteJob, why: str) -> None:
        """The live rewrite writes no more: what it wrote is taken out (its hunks pending again, offered to
        `accept`), its provisional text too; its hunks are reported as a preview's from now on."""
        log.info("%s: shown as a preview: %s", job.id, why)
        job.previewed = why
        job.write_out.stopped = True
        doc = self._documents.get(job.uri)
        if doc is not None:
            doc.queue(Intent(job.write_out, "revert", offer=True))
            doc.settled(job.write_out, [])
            self._writer.kick(doc)
        self._report(job, force=True)

    def _preview_message(self, job: RewriteJob) -> str:
        """One line on why a live rewrite ended as a preview, with its final count."""
        region = job.write_out.region
        if job.previewed == "cancelled":
            count = len(region.ids(HunkState.PENDING))
            return (
                "cancelled" if not count else f"cancelled: {count} hunk{'s' if count != 1 else ''} shown as a preview"
            )
        lines = job.write_out.tracker.lines_total
        why = too_destructive(job.request.instruction, job.removed_lines, lines) or job.previewed
        return f"shown as a preview: {why}"

    def _stop_writing(self, job: RewriteJob) -> None:
        """The job writes no more into its document: what it wrote provisionally is taken out."""
        job.write_out.stopped = True
        doc = self._documents.get(job.uri)
        if doc is not None:
            doc.settled(job.write_out, [])
            self._writer.kick(doc)

    def _error_result(self, job: RewriteJob, error: BaseException) -> protocol.RewriteResult:
        if isinstance(error, (EngineUnavailableError, ModelLoadError)) and not self._engine_error_shown:
            self._engine_error_shown = True  # once, not on every request
            self._lsp.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Error, message=f"specedit: {error}")
            )
        if not isinstance(error, SpeceditError):
            log.error("%s failed", job.id, exc_info=error)
        payload = error_payload(error)
        return {"jobId": job.id, "status": "error", "stats": {}, "message": payload["message"], "error": payload}

    # -------------------------------------------------------------------------------------- reporting

    def _hunk_payload(self, job: RewriteJob, hunk_id: int) -> protocol.HunkPayload:
        hunk = job.write_out.region.hunks[hunk_id]
        start, end = job.asked.back(job.request_start + hunk.start, job.request_start + hunk.end)
        where = job.asked_index.range_payload(start, end, self._lsp.workspace.position_codec)
        return {"id": hunk.id, "range": where, "newText": hunk.new_text, "oldText": job.asked.text[start:end]}

    def _written(self, job: RewriteJob, doc: DocumentState) -> protocol.WrittenHunks:
        """Where the job's written hunks are now, for the editor to mark them (each can still be undone)."""
        region = job.write_out.region
        return self._placed(doc, region, [(i, region.applied_range(i)) for i in region.ids(HunkState.APPLIED)])

    def _offered(self, job: RewriteJob, doc: DocumentState) -> protocol.WrittenHunks:
        """Where the old text of the job's pending hunks is now (those the user has not touched), for the
        editor to show them as a preview, each one `accept`able."""
        region = job.write_out.region
        return self._placed(doc, region, [(i, region.pending_range(i)) for i in region.ids(HunkState.PENDING)])

    def _placed(
        self, doc: DocumentState, region: RegionTracker, places: list[tuple[int, tuple[int, int] | None]]
    ) -> protocol.WrittenHunks:
        index, codec = doc.index(), self._lsp.workspace.position_codec
        hunks: list[protocol.HunkPayload] = []
        for hunk_id, where in places:
            if where is not None:
                hunk = region.hunks[hunk_id]
                where_now = index.range_payload(*where, codec)
                hunks.append({"id": hunk_id, "range": where_now, "newText": hunk.new_text, "oldText": hunk.old_text})
        return {"version": doc.version, "hunks": hunks}

    def _report(self, job: RewriteJob, *, force: bool = False) -> None:
        """Partial results (new hunks, stats) and work-done progress, at most every progress.REPORT_INTERVAL."""
        now = time.perf_counter()
        if not force and now - job.last_report < progress.REPORT_INTERVAL:
            return
        job.last_report = now
        stats = job.live_stats()
        if stats["phase"] == "loading" and self._engine.state == "loading":  # what the load is at, if known
            stats["message"] = f"{self._engine.message} · {stats['seconds']:.0f} s"
        lsp = self._lsp
        if job.partial_token is not None:
            hunk_ids = sorted(job.write_out.region.hunks)[job.reported :]
            job.reported += len(hunk_ids)
            partial: protocol.RewritePartialResult = {
                "jobId": job.id,
                "hunks": [self._hunk_payload(job, hunk_id) for hunk_id in hunk_ids],
                "stats": stats,
                "delivery": job.delivery,
            }
            doc = self._documents.get(job.uri)
            if job.write_out.delivery == "live" and doc is not None:
                partial["written"] = self._written(job, doc)
            lsp.protocol.notify(types.PROGRESS, types.ProgressParams(token=job.partial_token, value=partial))
        if job.progress_token is not None and job.running:
            progress.report(lsp, job.progress_token, stats)

    # ------------------------------------------------------------------------- accept, reject, cancel

    def find(self, selector: JobSelector) -> RewriteJob:
        if selector.job_id is not None:
            if selector.job_id not in self.jobs:
                raise InvalidRequestError(f"no job {selector.job_id!r}")
            return self.jobs[selector.job_id]
        candidates = [job for job in self.jobs.values() if selector.uri is None or job.uri == selector.uri]
        if not candidates:
            raise InvalidRequestError("no rewrite to act on" + (f" in {selector.uri}" if selector.uri else ""))
        return candidates[-1]

    async def accept(self, selector: JobSelector) -> protocol.EditResult:
        """Write a job's pending hunks (all, or the selected) that the user has not touched."""
        job = self.find(selector)
        doc = self._document(job)
        region = job.write_out.region
        wanted = selector.pick(region.ids(HunkState.PENDING))
        intent = Intent(job.write_out, "apply", wanted)
        await self._carry_out(job, doc, intent)
        applied = [hunk_id for hunk_id in wanted if region.states[hunk_id] is HunkState.APPLIED]
        return {"jobId": job.id, "applied": applied, "skipped": [i for i in wanted if i not in applied]}

    async def reject(self, selector: JobSelector) -> protocol.EditResult:
        """Stop the job, drop its unwritten hunks, and restore the original where hunks were written."""
        job = self.find(selector)
        doc = self._document(job)
        region = job.write_out.region
        job.stop("cancelled")
        wanted = selector.pick(sorted(region.hunks))
        intent = await self._drop(job, doc, wanted)
        restored = [i for i in intent.hunk_ids or [] if region.states[i] is HunkState.REJECTED]
        skipped = [i for i in wanted if region.states[i] is HunkState.DIRTY]
        return {"jobId": job.id, "applied": restored, "skipped": skipped}

    async def _drop(self, job: RewriteJob, doc: DocumentState, hunk_ids: list[int]) -> Intent:
        """Reject `hunk_ids`: those not written are no longer offered, those written are restored."""
        region = job.write_out.region
        for hunk_id in hunk_ids:
            region.mark_rejected(hunk_id)
        intent = Intent(job.write_out, "revert", [i for i in hunk_ids if region.states[i] is HunkState.APPLIED])
        await self._carry_out(job, doc, intent)
        return intent

    async def _carry_out(self, job: RewriteJob, doc: DocumentState, intent: Intent) -> None:
        doc.queue(intent)
        self._writer.kick(doc)
        await self._waiting.until(lambda: intent.result is not None or job.uri not in self._documents)

    def cancel(self, selector: JobSelector) -> dict[str, list[str]]:
        running = [job for job in self.jobs.values() if job.running]
        if selector.job_id is not None:
            running = [job for job in running if job.id == selector.job_id]
        elif selector.uri is not None:
            running = [job for job in running if job.uri == selector.uri]
        for job in running:
            job.stop("cancelled", offer=True)
        return {"cancelled": [job.id for job in running]}

    def cancel_progress(self, token: int | str) -> None:
        for job in self.jobs.values():
            if job.progress_token == token:
                job.stop("cancelled", offer=True)

    def close_document(self, uri: str) -> None:
        """The document closed: its running jobs stop, its finished ones are forgotten."""
        for job in [job for job in self.jobs.values() if job.uri == uri]:
            job.stop("cancelled")
            if not job.running:
                del self.jobs[job.id]

    def stop_all(self) -> None:
        for job in self.jobs.values():
            job.stop("cancelled")

    def _document(self, job: RewriteJob) -> DocumentState:
        doc = self._documents.get(job.uri)
        if doc is None:
            raise InvalidRequestError(f"{job.uri} is not open")
        return doc


def overlap(start_a: int, end_a: int, start_b: int, end_b: int) -> bool:
    """Two regions overlap; an empty one overlaps any region it lies inside (edges included)."""
    if start_a == end_a:
        return start_b <= start_a <= end_b
    if start_b == end_b:
        return start_a <= start_b <= end_a
    return max(start_a, start_b) < min(end_a, end_b)


def _uncancel() -> None:
    """We answered a cancellation by ending the job: later awaits must not see it again (3.11+)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()
