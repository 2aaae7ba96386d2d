"""The model in this process: the backend every engine runs its rewrites on (`session.Backend`).

    backend = LocalBackend(EngineOptions(model="qwen2.5-coder-1.5b-instruct"))
    outcome = Session(backend).run(RewriteRequest(original, "Rename add to plus."), on_event=print)

The model loads on first use. One set of cores runs one rewrite at a time: the others wait their turn,
fairly across clients (a client's k-th waiting rewrite goes after every other client's earlier-numbered
ones, so one busy editor cannot starve another), each told where it is (`Phase`). Between rewrites the
documents editors have open (`warm`, the most recent first) are prefilled into the prefix cache, giving
way within a layer as soon as a rewrite waits, and resumed after it. This module imports torch only when
the model loads; the daemon, a cluster replica and the command line all run their rewrites here, on the
process's one model thread (`model.model_thread`: whichever thread asked, the model runs on that one).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, cast

from specedit.engine.model.model_thread import on_model_thread, serve_while, serving
from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.events import Event, Phase, Text
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.stats import Stats

if TYPE_CHECKING:
    from specedit.engine.loop.generate import Engine
    from specedit.engine.model.loading import LoadedModel
    from specedit.engine.model.prefix_cache import PrefixCache
    from specedit.engine.sketch.sketch import Sketch
    from specedit.engine.store.fetch import ProgressCallback

log = logging.getLogger(__name__)
T = TypeVar("T")

WARM_PENDING = 8  # documents waiting to be warmed; the least recently offered go


def open_engine(options: EngineOptions, *, progress: ProgressCallback | None = None, one_off: bool = False) -> Engine:
    """The engine `options` describe: the target (provisioned if it is a known model; its kernels chosen
    by the self-check, whose verdict is remembered in the cache), the fallback drafter, if any, and its
    prefix cache, holding the start every prompt shares (`loop.rewrite.keep_prompt_head`). `one_off`: see
    `load_target`; without a fallback asked for, such a process runs the target without importing torch where
    an earlier load kept it so (`model.torchless`: the same logits, bit for bit, 2 s sooner)."""
    if one_off and not options.has_fallback:
        without_torch = _torchless_engine(options, progress)
        if without_torch is not None:
            return without_torch
    target = load_target(options, progress=progress, one_off=one_off)  # first: torch is imported in there
    from specedit.drafters.fallback import load_fallback
    from specedit.drafters.model_drafter import ModelDraftConfig
    from specedit.engine.loop.generate import Engine
    from specedit.engine.loop.rewrite import keep_prompt_head
    from specedit.engine.model.prefix_cache import PrefixCache
    from specedit.engine.store.fetch import resolve_model
    from specedit.engine.store.store import kept_dir, kernels_dir

    draft_model = resolve_model(options.draft_model, progress=progress) if options.draft_model else None
    fallback = load_fallback(
        target,
        draft_model=draft_model,
        layers=options.draft_layers,
        config=ModelDraftConfig(p_min=options.p_min),
        kernel_folder=kernels_dir(),
        kept_folder=kept_dir(),
    )
    if fallback is not None:
        log.info("fallback drafter: %s", fallback.describe())
    prefix_cache = PrefixCache(options.prefix_cache_mb * 2**20)
    engine = Engine(target, fallback, prefix_cache)
    keep_prompt_head(engine, kept_dir())  # with no budget for prompts too: a one-off rewrite's first prefill
    from specedit.engine.model import torchless

    try:  # for the next one-off rewrite, which then need not import torch
        head = (prefix_cache.head_ids, prefix_cache.head_file) if prefix_cache.head_file is not None else None
        torchless.keep(target, options, kept_dir(), head)
    except OSError as error:  # no room, no right to write: the next one imports torch too
        log.info("not kept for a start without torch: %s", error)
    return engine


def _torchless_engine(options: EngineOptions, progress: ProgressCallback | None) -> Engine | None:
    """An engine on the target as an earlier load kept it for a process without torch (`model.torchless`),
    with the prompts' kept start and no other prefix cache (a one-off rewrite's); None where none was kept
    for `options`."""
    from specedit.engine.model import torchless
    from specedit.engine.model.aside import read_aside
    from specedit.engine.store.fetch import resolve_model
    from specedit.engine.store.store import kept_dir

    source = resolve_model(options.model, progress=progress)
    description = torchless.find(options, kept_dir(), source)
    # The tokenizer read in a second process, started first, while the model is mapped here (0.5 s and 0.25
    # s on an AMD EPYC Zen 3, each holding its GIL); without the byte table, which would take a core from
    # the first forwards.
    tokenizer = read_aside(source, kept_dir(), byte_table=False) if description is not None else None
    if description is None or tokenizer is None:
        return None
    from specedit.engine.loop.generate import Engine
    from specedit.engine.model.torchless_model import KernelError, TorchlessModel

    try:
        target = TorchlessModel(description, tokenizer)
        head = target.kept_head()
    except (OSError, ValueError, KeyError, TypeError, KernelError) as error:  # the torch path then
        log.warning("the model kept for a start without torch did not load (%s): loading it with torch", error)
        tokenizer.close()
        return None
    if options.threads is not None:
        target.set_threads(options.threads)
    log.info("loaded %s without torch (kept by an earlier load: model.torchless)", source)
    # (what the loop reads of a prefix cache: `KeptHead`)
    return Engine(target, prefix_cache=cast("PrefixCache | None", head))


def load_target(
    options: EngineOptions,
    *,
    progress: ProgressCallback | None = None,
    remembered: bool = True,
    one_off: bool = False,
) -> LoadedModel:
    """The target `options` describe, on their threads: provisioned if it is a known model, its kernels
    chosen by the self-check, whose verdict is taken from the cache if it is there (`remembered`; else the
    self-check runs afresh), its own kernels compiled into the cache once, its tokenizer as built and its
    int8 weights (if it takes them) kept in the cache once. `one_off`: for a process that runs a rewrite or
    a few and exits (`specedit rewrite` without a daemon), its kept tokenizer is read in a second process
    while this one imports torch (`model.aside`), which it does here, after."""
    from specedit.engine.model.aside import read_aside
    from specedit.engine.store.fetch import resolve_model
    from specedit.engine.store.store import kept_dir, kernels_dir, verdicts_dir

    source = resolve_model(options.model, progress=progress)
    tokenizer = read_aside(source, kept_dir()) if one_off else None
    from specedit.engine.model.loading import load_model

    apply_threads(options)
    return load_model(
        source,
        dtype=options.dtype,
        weights=options.weights,
        kv_cache=options.kv_cache,
        device=options.device,
        verdicts=verdicts_dir() if remembered else None,
        kernel_folder=kernels_dir(),
        kept_folder=kept_dir(),
        tokenizer=tokenizer,
    )


def apply_threads(options: EngineOptions, engine: Engine | None = None) -> None:
    """torch's thread count is per thread (OpenMP): set it on the thread that runs the model (through the
    engine's target, where there is one: it may run without torch's Python, `model.torchless`)."""
    if options.threads is None:
        return
    if engine is not None:
        engine.loaded.set_threads(options.threads)
        return
    import torch

    torch.set_num_threads(options.threads)


@dataclass(eq=False)
class _Ticket:
    client: str
    key: tuple[bool, int, int]  # (it lets rewrites go first, its client's turns ahead of it, arrival): the order
    told: int = -1  # the place last told


@dataclass
class Turns:
    """Rewrites take the model one at a time, fairly across clients: a client's k-th rewrite in line waits
    behind every other client's rewrites numbered below k (arrival breaks ties). Each is told how many are
    ahead of it (the running one included) when it arrives, and again whenever that changes. A turn for
    work other than a rewrite (`LocalBackend.in_turn`) lets every rewrite that waits go first."""

    _changed: threading.Condition = field(default_factory=threading.Condition)
    _waiting: list[_Ticket] = field(default_factory=list)
    _running: _Ticket | None = None
    _arrivals: int = 0

    def take(
        self,
        client: str,
        tell: Callable[[int], None],
        cancel: threading.Event,
        *,
        told: bool = False,
        after_rewrites: bool = False,
    ) -> _Ticket | None:
        """Wait for this rewrite's turn: its ticket, or None if it was cancelled while waiting. `told`: the
        rewrite was told something already (the model loading), so that none ahead goes unsaid.
        `after_rewrites`: the turn is for other work, which lets every rewrite that waits go first."""
        with self._changed:
            in_line = sum(ticket.client == client for ticket in self._line())
            ticket = _Ticket(client, (after_rewrites, in_line, self._arrivals), told=0 if told else -1)
            self._arrivals += 1
            self._waiting.append(ticket)
            while True:
                ahead = (self._running is not None) + sum(other.key < ticket.key for other in self._waiting)
                if ahead != ticket.told and (ahead > 0 or ticket.told < 0):  # its turn is no news: "started" is
                    ticket.told = ahead
                    tell(ahead)
                if ahead == 0:
                    break
                self._changed.wait(0.05)
                if cancel.is_set():
                    self._waiting.remove(ticket)
                    self._changed.notify_all()
                    return None
            self._waiting.remove(ticket)
            self._running = ticket
            return ticket

    def leave(self, ticket: _Ticket) -> None:
        with self._changed:
            assert self._running is ticket
            self._running = None
            self._changed.notify_all()

    def wanted(self) -> bool:
        """A rewrite runs or waits: warming gives way."""
        with self._changed:
            return self._running is not None or bool(self._waiting)

    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)

    def _line(self) -> list[_Ticket]:
        return [*self._waiting, *([self._running] if self._running is not None else [])]


class _Turn:
    """One rewrite's hold on the model: its place among the rewrites (`Turns`), then the model itself
    (warming, if it holds it, gives way within its step). A long prefill gives way between its parts to
    the rewrites that wait (`give_way`): a short rewrite waits for a part of it, not for all of it."""

    def __init__(
        self,
        backend: LocalBackend,
        client: str,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        *,
        after_rewrites: bool = False,
    ):
        self._backend, self._client, self._emit, self._cancel = backend, client, emit, cancel
        self._after_rewrites = after_rewrites
        self._ticket: _Ticket | None = None
        self.waited = 0.0  # seconds spent waiting for the model

    def take(self, *, told: bool) -> bool:
        """Wait for the model; False when the rewrite was cancelled while it waited."""
        backend, asked = self._backend, time.monotonic()
        self._ticket = backend._turns.take(
            self._client,
            lambda ahead: self._emit(Phase("queued", ahead)),
            self._cancel,
            told=told,
            after_rewrites=self._after_rewrites,
        )
        if self._ticket is not None:
            backend._giving_way += 1
            backend._run_lock.acquire()
            backend._giving_way -= 1
        self.waited += time.monotonic() - asked
        return self._ticket is not None

    def give_way(self) -> None:
        """Between two parts of a prefill (on the model thread): rewrites that wait take the model first,
        in their turns, run here meanwhile (this one, told where it is, after them); then it goes on where
        it was. Cancelled meanwhile, it holds nothing (the prefill stops before its next part). A rewrite
        run so (above another one's prefill on the model thread's stack) keeps the model to its end: the one
        beneath waits for it, and can go on only after it."""
        if self._backend._turns.waiting() and not serving():
            self.leave()
            serve_while(lambda: self.take(told=True))

    def leave(self) -> None:
        if self._ticket is not None:
            self._backend._run_lock.release()
            self._backend._turns.leave(self._ticket)
            self._ticket = None


class LocalBackend:
    """The model in this process: loaded on first use (or given), one rewrite at a time, in fair turns."""

    def __init__(
        self,
        options: EngineOptions | None = None,
        *,
        engine: Engine | None = None,
        progress: ProgressCallback | None = None,
        one_off: bool = False,
    ):
        """`one_off`: a process that runs a rewrite or a few and exits (`load_target`)."""
        self.options = options or EngineOptions()
        self._engine = engine
        self._progress = progress
        self._one_off = one_off
        self._load_lock = threading.Lock()
        self._failure: SpeceditError | None = None  # why the model did not load
        self._turns = Turns()
        self._run_lock = threading.Lock()  # the model: a rewrite whose turn came, or warming between them
        self._giving_way = 0  # rewrites whose turn came, waiting for warming to let go of the model
        self._to_warm: OrderedDict[str, WarmRequest] = OrderedDict()  # by document name, newest last
        self._warm_lock = threading.Lock()
        self._warmer: threading.Thread | None = None
        self.warming: str | None = None  # the document being prefilled now, for status

    def beside(self, options: EngineOptions | None = None, *, engine: Engine | None = None) -> LocalBackend:
        """Another model's backend in this process that takes turns with this one (one set of cores: a
        replica's multiplexed models run one rewrite at a time between them, as one model does)."""
        other = LocalBackend(options, engine=engine, progress=self._progress)
        other._turns, other._run_lock = self._turns, self._run_lock
        return other

    @property
    def engine(self) -> Engine | None:
        """The engine once loaded (None before)."""
        return self._engine

    @property
    def waiting(self) -> int:
        """Rewrites not started yet: waiting for their turn, or for warming to give way."""
        return self._turns.waiting() + self._giving_way

    def load(self) -> Engine:
        """The engine, loaded now if it was not yet (`ModelLoadError` when it cannot be: the rewrites that
        waited for the load, and those after, get the same error, and it is not tried again)."""
        with self._load_lock:
            if self._failure is not None:
                raise self._failure
            if self._engine is None:
                log.info("loading %s", self.options.model or "the default model")
                try:
                    self._engine = on_model_thread(
                        lambda: open_engine(self.options, progress=self._progress, one_off=self._one_off)
                    )
                except SpeceditError as error:
                    self._failure = error
                    raise
                self._warm_soon()  # what was offered while it loaded
            return self._engine

    def run(
        self,
        request: RewriteRequest | CompletionRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,
    ) -> RewriteOutcome:
        loading = self._engine is None
        if loading:
            emit(Phase("loading"))  # torch's import included
        engine = self.load()  # torch imported there, not before: see `load_target`
        from specedit.engine.loop.completion import complete
        from specedit.engine.loop.completion import refuse_early_if_too_long as refuse_early_completion
        from specedit.engine.loop.rewrite import refuse_early_if_too_long, rewrite
        from specedit.engine.model.memory import release_freed_memory

        if isinstance(request, RewriteRequest):
            # Before its turn, cheaply (a fraction of a second for 1 MB): an outsized request holds no one
            # up; the whole bound is counted in its turn (`prepare_rewrite`).
            refuse_early_if_too_long(engine, request, bound=2)
        else:
            refuse_early_completion(engine, request)
        turn = _Turn(self, client, emit, cancel)
        if not turn.take(told=loading):
            return RewriteOutcome.cancelled_before_start(Stats.before_start(queue_seconds=round(turn.waited, 4)))
        on_text = lambda delta: emit(Text(delta))  # noqa: E731

        def work() -> RewriteOutcome:
            apply_threads(self.options, engine)
            if isinstance(request, CompletionRequest):
                run = complete(
                    engine, request, on_text=on_text, on_step=emit, cancel=cancel.is_set, pause=turn.give_way
                )
                return run.outcome()
            done = rewrite(
                engine, request, on_text=on_text, on_step=emit, cancel=cancel.is_set, pause=turn.give_way, sketch=sketch
            )
            return done.outcome()

        try:
            emit(Phase("started"))
            outcome = on_model_thread(work)
        finally:
            turn.leave()
            release_freed_memory(collect=False)  # a big request's buffers go back to the system
            self._warm_soon()
        return dataclasses.replace(
            outcome, stats=dataclasses.replace(outcome.stats, queue_seconds=round(turn.waited, 4))
        )

    # -- warming

    def warm(self, request: WarmRequest) -> bool:
        """Offer a document to prefill while no rewrite runs or waits (a newer text of the same document
        replaces one not yet warmed), once the model is loaded (warming never loads it); False where the
        engine keeps no prompts."""
        engine = self._engine
        if self.options.prefix_cache_mb == 0 or (
            engine is not None and (engine.prefix_cache is None or not engine.prefix_cache.keeps_prompts)
        ):
            return False
        with self._warm_lock:
            self._to_warm.pop(request.name, None)
            self._to_warm[request.name] = request
            while len(self._to_warm) > WARM_PENDING:
                self._to_warm.popitem(last=False)
        self._warm_soon()
        return True

    def to_warm(self) -> int:
        with self._warm_lock:
            return len(self._to_warm)

    def in_turn(
        self, work: Callable[[], T], emit: Callable[[Event], None], cancel: threading.Event, client: str
    ) -> T | None:
        """`work` in a turn of its own, after the rewrites that wait (see `Backend.in_turn`)."""
        turn = _Turn(self, client, emit, cancel, after_rewrites=True)
        if not turn.take(told=False):
            return None
        try:
            return work()
        finally:
            turn.leave()
            self._warm_soon()  # warming gave way to this turn, as to a rewrite's

    def prefill(self, request: WarmRequest, should_stop: Callable[[], bool]) -> tuple[int, int]:
        """Warm `request` now (on the model thread), between rewrites, giving way to one as soon as it waits or
        `should_stop()`; (tokens cached, tokens of the prompt's start) (see `loop.rewrite.warm_document`)."""
        from specedit.engine.loop.rewrite import warm_document

        engine = self.load()

        def work() -> tuple[int, int]:
            apply_threads(self.options, engine)
            return warm_document(engine, request, lambda: self._turns.wanted() or should_stop())

        with self._run_lock:
            return on_model_thread(work)

    def _warm_soon(self) -> None:
        """Start the warmer thread, if documents wait and none runs."""
        with self._warm_lock:
            if self._to_warm and self._warmer is None and self._engine is not None:
                self._warmer = threading.Thread(target=self._warm_offered, name="specedit-warm", daemon=True)
                self._warmer.start()

    def _warm_offered(self) -> None:
        """Prefill the offered documents, newest first, while no rewrite wants the model; one a rewrite cut
        short goes back in line after those offered since."""
        while True:
            with self._warm_lock:
                if not self._to_warm or self._turns.wanted():
                    self._warmer = None
                    return  # the rewrite that wants the model starts the warmer again when it is done
                name, request = self._to_warm.popitem()
            self.warming = name
            try:
                cached, total = self.prefill(request, lambda: False)
            except Exception:
                log.exception("warming %s failed", name or "a document")
                continue
            finally:
                self.warming = None
            log.info("warm %s: %d of %d prompt tokens cached", name, cached, total)
            with self._warm_lock:
                if cached < total and self._turns.wanted() and name not in self._to_warm:
                    self._to_warm[name] = request
                    self._to_warm.move_to_end(name, last=False)

    def keep_alive(self, wanted: bool) -> None:
        pass  # this process is the engine: it lives as long as its front end

    def start(self) -> None:
        self.load()

    def close(self) -> None:
        self._engine = None
