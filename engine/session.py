"""Where a rewrite runs: one `Session` type for every front end.

    session = LocalSession(EngineOptions(model="qwen2.5-coder-1.5b-instruct"))   # the model in this process
    session = RemoteSession("/run/user/1000/specedit/engine.sock")                # a running daemon
    session = RemoteSession(None, spawn=EngineOptions())                          # the shared daemon, started on demand
    outcome = session.run(RewriteRequest(original, "Rename add to plus."), on_text=print)

The command line, the language server, the daemon (which serves a `LocalSession`) and the bench all run
rewrites through `run`, which streams the text (`on_text`) and one `StepInfo` per speculative step
(`on_step`), stops within one step of `cancel` being set, and returns a `RewriteOutcome`; errors are
raised as `SpeceditError`s. This module imports no torch until a local session loads its model.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from specedit.engine.options import EngineOptions
from specedit.engine.requests import RewriteOutcome, RewriteRequest, StepInfo

if TYPE_CHECKING:
    from specedit.engine.loop.generate import Engine
    from specedit.engine.serving.client import EngineClient

log = logging.getLogger(__name__)

TextCallback = Callable[[str], None]
StepCallback = Callable[[StepInfo], None]


class Session(Protocol):
    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: TextCallback | None = None,
        on_step: StepCallback | None = None,
        on_queued: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        """Run one rewrite to its end, or until `cancel` is set (from any thread); blocking.

        `on_queued(position)`: how many rewrites run before this one, whenever that changes.
        """
        ...

    def close(self) -> None: ...


def open_engine(options: EngineOptions, *, progress: Any = None) -> Engine:
    """The engine `options` describe: the target (provisioned if it is a known model; its kernels chosen
    by the self-check, whose verdict is remembered in the cache), and the fallback drafter, if any."""
    from specedit.drafters.model_drafter import ModelDraftConfig
    from specedit.engine.loop.generate import Engine
    from specedit.engine.model.fallback import load_fallback
    from specedit.engine.model.loading import load_model
    from specedit.engine.ops.model_store import cache_dir, resolve_model

    _apply_threads(options)
    target = load_model(
        resolve_model(options.model, progress=progress),
        dtype=options.dtype,
        device=options.device,
        verdicts=cache_dir() / "exactness",
    )
    draft_model = resolve_model(options.draft_model, progress=progress) if options.draft_model else None
    fallback = load_fallback(
        target, draft_model=draft_model, layers=options.draft_layers, config=ModelDraftConfig(p_min=options.p_min)
    )
    if fallback is not None:
        log.info("fallback drafter: %s", fallback.describe())
    return Engine(target, fallback)


class LocalSession:
    """The model in this process: loaded on first use (or given), one rewrite at a time."""

    def __init__(self, options: EngineOptions | None = None, *, engine: Engine | None = None, progress: Any = None):
        self.options = options or EngineOptions()
        self._engine = engine
        self._progress = progress
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()

    @property
    def engine(self) -> Engine | None:
        """The engine once loaded (None before)."""
        return self._engine

    def load(self) -> Engine:
        """The engine, loaded now if it was not yet (`ModelLoadError` when it cannot be)."""
        with self._load_lock:
            if self._engine is None:
                log.info("loading %s", self.options.model or "the default model")
                self._engine = open_engine(self.options, progress=self._progress)
            return self._engine

    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: TextCallback | None = None,
        on_step: StepCallback | None = None,
        on_queued: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        from specedit.engine.loop.rewrite import rewrite
        from specedit.engine.model.loading import release_freed_memory

        engine = self.load()
        # One model, one rewrite at a time: a second request waits here, and may be cancelled waiting.
        while not self._run_lock.acquire(timeout=0.05):
            if cancel is not None and cancel.is_set():
                return RewriteOutcome.cancelled_before_start()
        try:
            _apply_threads(self.options)  # torch's thread count is per thread (OpenMP): this one runs it
            result = rewrite(
                engine, request, on_text=on_text, on_step=on_step, cancel=cancel.is_set if cancel else None
            )
        finally:
            release_freed_memory(collect=False)  # a big request's buffers go back to the system
            self._run_lock.release()
        return result.outcome()

    def close(self) -> None:
        self._engine = None


class RemoteSession:
    """Rewrites in an engine daemon: the one at `address`, or (None) the default one, started with the
    `spawn` options when none answers; a daemon started so exits by itself once idle.

    One connection per rewrite: a connection serialises its calls, and a rewrite waiting for another one's
    connection could not be cancelled; connecting to a running daemon takes a millisecond.
    """

    def __init__(
        self,
        address: str | None,
        *,
        token_file: str | None = None,
        spawn: EngineOptions | None = None,
        client_name: str | None = None,
    ) -> None:
        self.address = address
        self._token_file = token_file
        self._spawn = spawn or EngineOptions()
        self._client_name = client_name or f"specedit pid {os.getpid()}"

    def connect(self) -> EngineClient:
        from specedit.engine.serving.client import EngineClient, ensure_daemon
        from specedit.engine.serving.config import DaemonConfig

        if self.address is not None:
            return EngineClient.connect(self.address, token_file=self._token_file, client_name=self._client_name)
        return ensure_daemon(DaemonConfig(options=self._spawn), client_name=self._client_name)

    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: TextCallback | None = None,
        on_step: StepCallback | None = None,
        on_queued: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        with self.connect() as client:
            return client.rewrite(request, on_text=on_text, on_step=on_step, on_queued=on_queued, cancel=cancel)

    def close(self) -> None:
        pass


def _apply_threads(options: EngineOptions) -> None:
    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
