"""What the editor shows while a rewrite runs: its live stats, and LSP work-done progress.

A job's `LiveStats` say where it is (loading, queued, reading the file, then writing) and how fast it
writes. Work-done progress carries them to a client that shows progress (a token the client gave, or one
the server creates); partial results carry them to the editors' plugins (`jobs.Rewrites._report`).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from specedit.engine.records.events import DecodingRate, Phase, Step
from specedit.lsp import protocol

log = logging.getLogger("specedit.lsp")

REPORT_INTERVAL = 0.1  # s between progress reports
TICK_INTERVAL = 0.5  # s between reports while nothing is written yet (the elapsed time moves on)

Token = int | str


@dataclass
class LiveStats:
    """Stats of a running rewrite: where it is before its first step (`Phase`), then the engine's latest
    step report. The rate counts decoding only (`DecodingRate`)."""

    started: float = field(default_factory=time.perf_counter)
    phase: Phase | None = None
    last: Step | None = None
    decoding: DecodingRate = field(default_factory=DecodingRate)

    def step(self, info: Step) -> None:
        self.decoding.step(info)
        self.last = info

    def to_dict(self, lines_done: int, lines_total: int) -> protocol.ProgressStats:
        now = time.perf_counter()
        generated = self.last.generated_tokens if self.last else 0
        rate = self.decoding.rate(generated)
        stats: protocol.ProgressStats = {
            "phase": "writing" if self.last else self.phase.name if self.phase else "starting",
            "seconds": round(now - self.started, 1),
            "generated_tokens": generated,
            "tokens_per_second": round(rate, 1) if rate is not None else 0.0,
            "acceptance_rate": round(self.last.acceptance_rate, 4) if self.last else 0.0,
            "target_forwards": self.last.step if self.last else 0,
            "lines_done": lines_done,
            "lines_total": lines_total,
            "message": "",
        }
        stats["message"] = progress_message(stats, self.phase, rate)
        return stats


def progress_message(stats: protocol.ProgressStats, phase: Phase | None, rate: float | None) -> str:
    """What the editor shows: the model loading, the queue, the prefill, then the lines written."""
    seconds = stats["seconds"]
    if stats["phase"] == "starting":
        return f"starting · {seconds:.0f} s"
    if stats["phase"] == "loading":
        return f"loading the model · {seconds:.0f} s"
    if stats["phase"] == "queued" and phase is not None and phase.ahead > 0:
        return f"waiting for {phase.ahead} other rewrite{'s' if phase.ahead != 1 else ''} · {seconds:.0f} s"
    if stats["phase"] != "writing":
        return f"reading the file · {seconds:.0f} s"
    speed = "…" if rate is None else f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"
    return (
        f"{stats['lines_done']}/{stats['lines_total']} lines · {speed} tok/s · {stats['acceptance_rate']:.0%} accepted"
    )


async def begin(lsp: LanguageServer, token: Token | None, job_id: str, server_progress: bool) -> Token | None:
    """Begin work-done progress on the client's token, or on one the server creates where it was asked
    to (`server_progress`) and the client shows progress. The token in use, or None: no progress."""
    if token is None and server_progress and _supports_progress(lsp.client_capabilities):
        created = f"specedit-{job_id}-{uuid.uuid4().hex[:8]}"
        try:
            await lsp.work_done_progress.create_async(created)
            token = created
        except Exception as error:  # a client may refuse: no progress then
            log.info("no work-done progress: %s", error)
    if token is not None:
        lsp.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title="specedit: rewriting", cancellable=True, percentage=0)
        )
    return token


def report(lsp: LanguageServer, token: Token, stats: protocol.ProgressStats) -> None:
    total = max(stats["lines_total"], 1)
    lsp.work_done_progress.report(
        token,
        types.WorkDoneProgressReport(
            message=stats["message"], percentage=min(100, 100 * stats["lines_done"] // total), cancellable=True
        ),
    )


def end(lsp: LanguageServer, token: Token, job_id: str, result: protocol.RewriteResult) -> None:
    """End the progress with the result's first line, led by its status."""
    said = (result.get("message", "").splitlines() or [job_id])[0]
    ending = said if said.startswith(result["status"]) else f"{result['status']}: {said}"
    lsp.work_done_progress.end(token, types.WorkDoneProgressEnd(message=ending))
    lsp.work_done_progress.tokens.pop(token, None)


def _supports_progress(capabilities: types.ClientCapabilities) -> bool:
    return bool(capabilities.window and capabilities.window.work_done_progress)
