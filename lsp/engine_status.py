"""What an editor's status item says about the engine: the `specedit/engine` notification.

The server starts the engine with the editor (`loadOnStart`). The model may be fetched first (on first
use), then it loads: seconds to minutes. `EngineStatus` says so as it happens: `loading` with a one-line
message, then `ready`, or `failed` with the error. A rewrite that waits for the load says it too (its
`Phase("loading")`), so an editor that leaves the start to the first rewrite sees the same.

Fetch progress comes from the model store's callback (`fetch.ProgressCallback`), which only an engine in
this process reports; a daemon's clients see "loading the model" until it is ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specedit.engine.store.fetch import STAGE_ASSEMBLE, STAGE_CONVERT, STAGE_DOWNLOAD, STAGE_LOCK
from specedit.lsp import protocol

LOADING = "loading the model"
READY = "ready"
NOTIFY_INTERVAL = 0.25  # s between two notifications of the same state (a fetch reports every chunk)
_MB = 1_000_000


def provisioning_message(stage: str, done: int, total: int | None) -> str:
    """One line for a stage of fetching the model.

    >>> provisioning_message("assemble", 120_400_000, 491_400_064)
    'fetching the model 120/491 MB'
    >>> provisioning_message("download", 2, 6)   # two parts in, the third on its way
    'fetching the model: part 3 of 6'
    """
    if stage == STAGE_LOCK:
        return "waiting for another process that fetches the model"
    if stage == STAGE_DOWNLOAD and total:
        return f"fetching the model: part {min(done + 1, total)} of {total}"
    if stage == STAGE_ASSEMBLE and total:
        return f"fetching the model {done // _MB}/{total // _MB} MB"
    if stage == STAGE_CONVERT:
        return "converting the model (once)"
    return LOADING


class EngineStatus:
    """The engine's state as the editor last heard it. Its methods may be called from any thread; `send`
    must be too (the server's hops onto its event loop)."""

    def __init__(self, send: Callable[[protocol.EngineParams], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self.state: protocol.EngineState | None = None  # None: nothing said yet
        self.message = ""
        self._sent_at = 0.0
        self._progress_sent = False  # the last message sent was a fetch's progress

    def loading(self, message: str = LOADING) -> None:
        self._set("loading", message)

    def ready(self) -> None:
        self._set("ready", READY)

    def failed(self, error: BaseException) -> None:
        self._set("failed", str(error) or type(error).__name__)

    def provisioning(self, stage: str, done: int, total: int | None) -> None:
        """`fetch.ProgressCallback`: on the thread that fetches the model."""
        self._set("loading", provisioning_message(stage, done, total), throttled=True)

    def _set(self, state: protocol.EngineState, message: str, *, throttled: bool = False) -> None:
        with self._lock:
            if (state, message) == (self.state, self.message):
                return
            now = time.monotonic()
            quiet = throttled and self._progress_sent and now - self._sent_at < NOTIFY_INTERVAL
            self.state, self.message = state, message
            if quiet:
                return
            self._sent_at, self._progress_sent = now, throttled
        self._send({"state": state, "message": message})
