"""Where a rewrite runs: one `Session` type for every front end.

    session = LocalSession(EngineOptions(model="qwen2.5-coder-1.5b-instruct"))   # the model in this process
    session = RemoteSession("/run/user/1000/specedit/engine.sock")                # a running daemon
    session = remote_session("https://team-engine:8000", token_file="team.token")  # a Ray Serve cluster
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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from specedit.engine.errors import SpeceditError
from specedit.engine.options import EngineOptions
from specedit.engine.requests import Phase, RewriteOutcome, RewriteRequest, StepInfo, WarmRequest

if TYPE_CHECKING:
    from specedit.engine.loop.generate import Engine
    from specedit.engine.model.loading import LoadedModel
    from specedit.engine.serving.client import EngineClient

log = logging.getLogger(__name__)

TextCallback = Callable[[str], None]
StepCallback = Callable[[StepInfo], None]
PhaseCallback = Callable[[Phase], None]


class Session(Protocol):
    def run(
        self,
        request: RewriteRequest,
        *,
        on_text: TextCallback | None = None,
        on_step: StepCallback | None = None,
        on_phase: PhaseCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        """Run one rewrite to its end, or until `cancel` is set (from any thread); blocking.

        `on_phase`: where the rewrite is before its first step, whenever that changes (the model loading,
        queued behind others, started).
        """
        ...

    def warm(self, request: WarmRequest) -> None:
        """Offer a document the user has open, to prefill its prompt's start while the engine is idle (see
        `model.prefix_cache`). Returns at once; never loads a model or starts a daemon; errors are logged."""
        ...

    def keep_alive(self, wanted: bool) -> None:
        """While `wanted` (an editor has documents open), keep the engine from exiting when idle; never
        loads a model or starts a daemon."""
        ...

    def close(self) -> None: ...


def open_engine(options: EngineOptions, *, progress: Any = None) -> Engine:
    """The engine `options` describe: the target (provisioned if it is a known model; its kernels chosen
    by the self-check, whose verdict is remembered in the cache), the fallback drafter, if any, and its
    prefix cache, holding the start every prompt shares (`loop.rewrite.keep_prompt_head`)."""
    from specedit.drafters.model_drafter import ModelDraftConfig
    from specedit.engine.loop.generate import Engine
    from specedit.engine.loop.rewrite import keep_prompt_head
    from specedit.engine.model.fallback import load_fallback
    from specedit.engine.model.fetch import resolve_model
    from specedit.engine.model.prefix_cache import PrefixCache
    from specedit.engine.model.store import kept_dir

    target = load_target(options, progress=progress)
    draft_model = resolve_model(options.draft_model, progress=progress) if options.draft_model else None
    fallback = load_fallback(
        target, draft_model=draft_model, layers=options.draft_layers, config=ModelDraftConfig(p_min=options.p_min)
    )
    if fallback is not None:
        log.info("fallback drafter: %s", fallback.describe())
    engine = Engine(target, fallback, PrefixCache(options.prefix_cache_mb * 2**20))
    keep_prompt_head(engine, kept_dir())  # with no budget for prompts too: a one-off rewrite's first prefill
    return engine


def load_target(options: EngineOptions, *, progress: Any = None, remembered: bool = True) -> LoadedModel:
    """The target `options` describe, on their threads: provisioned if it is a known model, its kernels
    chosen by the self-check, whose verdict is taken from the cache if it is there (`remembered`; else the
    self-check runs afresh), its own kernels compiled into the cache once, its tokenizer as built and its
    int8 weights (if it takes them) kept in the cache once."""
    from specedit.engine.model.fetch import resolve_model
    from specedit.engine.model.loading import load_model
    from specedit.engine.model.store import kept_dir, kernels_dir, verdicts_dir

    _apply_threads(options)
    return load_model(
        resolve_model(options.model, progress=progress),
        dtype=options.dtype,
        weights=options.weights,
        device=options.device,
        verdicts=verdicts_dir() if remembered else None,
        kernel_folder=kernels_dir(),
        kept_folder=kept_dir(),
    )


def merged_by_lines(request: RewriteRequest, on_text: TextCallback | None) -> RewriteOutcome | None:
    """The answer to an edit sketch whose every chunk says where it goes (`merge.merge_sketch`): merged by
    its lines in milliseconds, here, with no model (none is loaded, no daemon asked), and streamed whole to
    `on_text`; None for any other request, or when the request asks for the model (`merge="model"`)."""
    if request.sketch is None or request.merge != "auto":
        return None
    from specedit.engine.loop.stats import Stats
    from specedit.engine.merge import merge_sketch

    started = time.perf_counter()
    merged = merge_sketch(request.original, request.sketch, request.sketch_format)
    if not merged.resolved:
        log.info("the model merges the sketch: %s", "; ".join(merged.unresolved))
        return None
    stats = {**Stats(wall_seconds=time.perf_counter() - started).to_dict(), "merge": "lines"}
    if on_text is not None and merged.text:
        on_text(merged.text)
    return RewriteOutcome.finished(merged.text, "stop", stats)


class _Turns:
    """Rewrites take the model one at a time, in the order they came; one waiting is told how many are
    ahead of it (the running one included), again whenever that changes."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._line: list[object] = []  # the running rewrite first

    def take(self, tell: Callable[[int], None], cancel: threading.Event | None) -> object | None:
        """Wait for this rewrite's turn: its ticket, or None if it was cancelled while waiting."""
        ticket = object()
        told = 0
        with self._changed:
            self._line.append(ticket)
            while (ahead := self._line.index(ticket)) > 0:
                if ahead != told:
                    told = ahead
                    tell(ahead)
                self._changed.wait(0.05)
                if cancel is not None and cancel.is_set():
                    self._line.remove(ticket)
                    self._changed.notify_all()
                    return None
        return ticket

    def wanted(self) -> bool:
        """A rewrite runs or waits: warming gives way."""
        with self._changed:
            return bool(self._line)

    def leave(self, ticket: object) -> None:
        with self._changed:
            self._line.remove(ticket)
            self._changed.notify_all()


class LocalSession:
    """The model in this process: loaded on first use (or given), one rewrite at a time, in turn."""

    def __init__(self, options: EngineOptions | None = None, *, engine: Engine | None = None, progress: Any = None):
        self.options = options or EngineOptions()
        self._engine = engine
        self._progress = progress
        self._load_lock = threading.Lock()
        self._turns = _Turns()
        self._run_lock = threading.Lock()  # the model: a rewrite whose turn came, or warming between them
        self._warm_lock = threading.Lock()
        self._warm_next: WarmRequest | None = None
        self._warmer: threading.Thread | None = None

    def beside(self, options: EngineOptions | None = None, *, engine: Engine | None = None) -> LocalSession:
        """Another model's session in this process that takes turns with this one (one set of cores: a
        replica's multiplexed models run one rewrite at a time between them, as one model does)."""
        other = LocalSession(options, engine=engine, progress=self._progress)
        other._turns, other._run_lock = self._turns, self._run_lock
        return other

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
        on_phase: PhaseCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        merged = merged_by_lines(request, on_text)
        if merged is not None:
            return merged
        tell = on_phase or (lambda phase: None)
        if self._engine is None:
            tell(Phase("loading"))  # torch's import included
        from specedit.engine.loop.rewrite import rewrite
        from specedit.engine.model.loading import release_freed_memory

        engine = self.load()
        # One model, one rewrite at a time: later requests wait here in turn, and may be cancelled waiting.
        ticket = self._turns.take(lambda ahead: tell(Phase("queued", ahead)), cancel)
        if ticket is None:
            return RewriteOutcome.cancelled_before_start()
        try:
            with self._run_lock:  # warming, if it holds the model, gives way within its step
                tell(Phase("started"))
                try:
                    _apply_threads(self.options)  # torch's thread count is per thread (OpenMP): this one runs it
                    result = rewrite(
                        engine, request, on_text=on_text, on_step=on_step, cancel=cancel.is_set if cancel else None
                    )
                finally:
                    release_freed_memory(collect=False)  # a big request's buffers go back to the system
        finally:
            self._turns.leave(ticket)
        return result.outcome()

    def prefill(self, request: WarmRequest, should_stop: Callable[[], bool]) -> tuple[int, int]:
        """Warm `request` now, in this thread, between rewrites, giving way to one as soon as it waits or
        `should_stop()`; (tokens cached, tokens of the prompt's start) (see `loop.rewrite.warm_document`)."""
        from specedit.engine.loop.rewrite import warm_document

        engine = self.load()
        with self._run_lock:
            _apply_threads(self.options)
            return warm_document(engine, request, lambda: self._turns.wanted() or should_stop())

    def warm(self, request: WarmRequest) -> None:
        """Prefill `request` on a thread of its own once the model is loaded (a newer offer replaces one
        not yet started, and stops one running)."""
        if self._engine is None or self._engine.prefix_cache is None or not self._engine.prefix_cache.keeps_prompts:
            return
        with self._warm_lock:
            self._warm_next = request
            if self._warmer is None:
                self._warmer = threading.Thread(target=self._warm_offered, name="specedit-warm", daemon=True)
                self._warmer.start()

    def _warm_offered(self) -> None:
        while True:
            with self._warm_lock:
                request, self._warm_next = self._warm_next, None
                if request is None:
                    self._warmer = None
                    return
            try:
                self.prefill(request, lambda: self._warm_next is not None)
            except Exception:
                log.exception("warming %s failed", request.name or "a document")

    def keep_alive(self, wanted: bool) -> None:
        pass  # this process is the engine: it lives as long as its front end

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
        self._held: EngineClient | None = None  # see keep_alive
        self._held_lock = threading.Lock()

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
        on_phase: PhaseCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> RewriteOutcome:
        merged = merged_by_lines(request, on_text)
        if merged is not None:  # no daemon is started (or its model loaded) for it
            return merged
        with self.connect() as client:
            return client.rewrite(request, on_text=on_text, on_step=on_step, on_phase=on_phase, cancel=cancel)

    def warm(self, request: WarmRequest) -> None:
        """Offer `request` to the daemon if one answers (none is started for it)."""
        try:
            with self._connect_running() as client:
                client.warm(request)
        except SpeceditError as error:
            log.debug("not warmed: %s", error)

    def keep_alive(self, wanted: bool) -> None:
        """Hold a connection to the daemon while `wanted`, if one answers: a daemon exits once no client is
        connected for its idle timeout, and an editor with documents open is a client even between rewrites.
        Each call re-opens it (the daemon may have started, or been restarted, since)."""
        with self._held_lock:
            if self._held is not None:
                self._held.close()
                self._held = None
            if wanted:
                try:
                    self._held = self._connect_running()
                except SpeceditError as error:
                    log.debug("no daemon to keep: %s", error)

    def _connect_running(self) -> EngineClient:
        """A connection to the daemon if one answers; none is started."""
        from specedit.engine.serving.client import EngineAddress, EngineClient
        from specedit.engine.serving.config import DaemonConfig

        address = self.address if self.address is not None else EngineAddress.of(DaemonConfig(options=self._spawn))
        return EngineClient.connect(address, token_file=self._token_file, client_name=self._client_name)

    def close(self) -> None:
        self.keep_alive(False)


def remote_session(
    address: str | None,
    *,
    token_file: str | None = None,
    spawn: EngineOptions | None = None,
    client_name: str | None = None,
) -> Session:
    """The session for an engine address: a cluster's (`http(s)://HOST:PORT`, `serving.cluster`; the
    model `spawn` names, if any, is chosen among the deployment's), or a daemon's (a socket path,
    `tcp://HOST:PORT`; None: the shared one, started with `spawn`)."""
    if address is not None and address.startswith(("http://", "https://")):
        from specedit.engine.serving.cluster import HttpSession

        return HttpSession(address, token_file=token_file, model=spawn.model if spawn else None)
    return RemoteSession(address, token_file=token_file, spawn=spawn, client_name=client_name)


def _apply_threads(options: EngineOptions) -> None:
    if options.threads is not None:
        import torch

        torch.set_num_threads(options.threads)
