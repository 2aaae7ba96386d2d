"""Where rewrites run: a small protocol, in-process or in the shared engine daemon.

The language server calls `RewriteBackend.run` from a worker thread of its own; callbacks come back on
that thread. `cancel` is checked by the engine before every speculative step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from specedit.engine.requests import FallbackOptions, RewriteRequest
from specedit.lsp.config import INPROCESS, Settings

if TYPE_CHECKING:
    from specedit.engine.client import EngineClient
    from specedit.engine.generate import Engine

log = logging.getLogger(__name__)

BackendStatus = Literal["complete", "cancelled", "incomplete"]


class StepReport(Protocol):
    """One engine step: `engine.generate.StepInfo` in process, `engine.client.RemoteStep` from the daemon."""

    @property
    def step(self) -> int: ...
    @property
    def committed_length(self) -> int: ...
    @property
    def drafted(self) -> int: ...
    @property
    def accepted(self) -> int: ...
    @property
    def generated_tokens(self) -> int: ...


@dataclass
class BackendResult:
    text: str  # the rewritten region (the original's line endings)
    status: BackendStatus  # incomplete: the token budget ran out before the code was finished
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)


class RewriteBackend(Protocol):
    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: Callable[[str], None],
        on_step: Callable[[StepReport], None],
        cancel: threading.Event,
    ) -> BackendResult:
        """Run one rewrite to its end (or until `cancel` is set); blocking."""
        ...

    def close(self) -> None: ...


class InProcessBackend:
    """Loads the model in this process, once, on first use; one rewrite at a time."""

    def __init__(
        self,
        model: str | None,
        *,
        dtype: str = "auto",
        device: str | None = None,
        fallback: FallbackOptions | None = None,
    ) -> None:
        self._model, self._dtype, self._device = model, dtype, device
        self._fallback = fallback or FallbackOptions()
        self._engine: Engine | None = None
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()

    def engine(self) -> Engine:
        with self._load_lock:
            if self._engine is None:
                from specedit.engine.drafting import open_engine

                log.info("loading model %s", self._model or "(default)")
                self._engine = open_engine(self._model, dtype=self._dtype, device=self._device, fallback=self._fallback)
            return self._engine

    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: Callable[[str], None],
        on_step: Callable[[StepReport], None],
        cancel: threading.Event,
    ) -> BackendResult:
        from specedit.engine.rewrite import rewrite

        engine = self.engine()
        # One model, one rewrite at a time: a second request waits here, and may be cancelled waiting.
        while not self._run_lock.acquire(timeout=0.05):
            if cancel.is_set():
                return BackendResult("", "cancelled", "cancelled")
        try:
            result = rewrite(engine, request, on_text=on_text, cancel=cancel.is_set, on_step=on_step)
        finally:
            self._run_lock.release()
        status: BackendStatus = (
            "complete" if result.complete else "cancelled" if result.finish_reason == "cancelled" else "incomplete"
        )
        return BackendResult(result.text, status, result.finish_reason, result.generation.stats.to_dict())

    def close(self) -> None:
        self._engine = None


class DaemonBackend:
    """Runs rewrites in the shared engine daemon: the one at `address`, or (None) the default one, started
    when none answers, with this server's model settings; it exits by itself once idle.

    One connection per rewrite: a connection serialises its calls, and a rewrite waiting for another
    one's connection could not be cancelled; connecting to a running daemon takes a millisecond.
    """

    def __init__(self, address: str | None, settings: Settings) -> None:
        self._address = address
        self._settings = settings

    def _connect(self) -> EngineClient:
        from specedit.engine.client import EngineClient, ensure_daemon
        from specedit.engine.daemon import DaemonConfig

        name = f"specedit lsp pid {os.getpid()}"
        if self._address is not None:
            return EngineClient.connect(self._address, token_file=self._settings.engine_token_file, client_name=name)
        settings = self._settings
        config = DaemonConfig(
            model=settings.model, dtype=settings.dtype, device=settings.device, fallback=settings.fallback
        )
        return ensure_daemon(config, client_name=name)

    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: Callable[[str], None],
        on_step: Callable[[StepReport], None],
        cancel: threading.Event,
    ) -> BackendResult:
        with self._connect() as client:
            result = client.rewrite(request, on_text=on_text, on_step=on_step, cancel=cancel)
        status: BackendStatus = "incomplete"
        if result.status in ("complete", "cancelled"):
            status = "complete" if result.status == "complete" else "cancelled"
        return BackendResult(result.text, status, result.finish_reason or result.status, dict(result.stats))

    def close(self) -> None:
        pass


def make_backend(settings: Settings) -> RewriteBackend:
    if settings.engine == INPROCESS:
        return InProcessBackend(
            settings.model, dtype=settings.dtype, device=settings.device, fallback=settings.fallback
        )
    return DaemonBackend(settings.engine, settings)
