"""One rewrite: prepared (prompt, ids, budget), then run (drafters, generate, the code back out).

`prepare_rewrite` is everything that does not depend on how the answer is decoded: the prompt (the
model's chat template, primed with the opening fence), its token ids, what the copy drafter copies from,
the output budget checked against the context, and the rules that turn the answer back into the region
(the closing fence, CRLF, the final newline). `run_rewrite` decodes it with the drafters a request asks
for. `specedit bench` times our methods through both and gives the peers the same prepared prompt;
everything else calls `rewrite`, through a `session.Session`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specedit.engine.loop.drafting import generate_drafted
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.loop.threads import FreeCores
from specedit.engine.records.errors import ContextLengthError
from specedit.engine.records.events import Step
from specedit.engine.records.prompts import AnswerStream, RewritePrompt, build_prompt, file_prefix
from specedit.engine.records.requests import (
    DraftMethod,
    FinishReason,
    RewriteOutcome,
    RewriteRequest,
    WarmRequest,
    status_of,
)
from specedit.engine.sketch.merge import SketchMerge
from specedit.engine.sketch.sketch import Sketch
from specedit.engine.store.kept import kept_file


@dataclass
class RewriteRun:
    """One run of the loop on a prepared rewrite: the region it wrote, why it ended, and the generation
    (`outcome()`: the record a session hands on)."""

    text: str  # the rewritten region, in the original's line endings
    finish_reason: FinishReason
    generation: Generation
    merge_unresolved: tuple[str, ...] | None = None  # a sketch merged by the model: why not by its lines

    @property
    def complete(self) -> bool:
        """The model closed its code block (or ended its answer): the text is the whole region."""
        return status_of(self.finish_reason) == "complete"

    def outcome(self) -> RewriteOutcome:
        stats = self.generation.stats
        if self.merge_unresolved is not None:
            stats = dataclasses.replace(stats, merge="model", merge_unresolved=self.merge_unresolved)
        return RewriteOutcome.finished(self.text, self.finish_reason, stats)


@dataclass(frozen=True)
class PreparedRewrite:
    """A request made ready for any decoder: the prompt's ids and the rules for the answer."""

    request: RewriteRequest
    prompt: RewritePrompt  # with "\n" line endings
    prompt_text: str  # the chat template applied: what the model reads
    prompt_ids: list[int]
    source_ids: list[int]  # what the copy drafter copies from: the sketch merged by lines, the original, the sketch
    max_new_tokens: int
    crlf: bool  # the original has CRLF line endings: the answer gets them back
    sketch_merge: SketchMerge | None = None  # the sketch merged by its lines, as far as they say where

    @property
    def fence(self) -> str:
        return self.prompt.fence

    @property
    def keeps_final_newline(self) -> bool:
        return self.prompt.original.endswith("\n") or not self.prompt.original

    def region_text(self, code: str) -> str:
        """The region a finished answer's `code` stands for (for a decoder that does not stream)."""
        if not self.keeps_final_newline and code.endswith("\n"):
            code = code[:-1]
        return code.replace("\n", "\r\n") if self.crlf else code


def prepare_rewrite(engine: Engine, request: RewriteRequest, sketch: Sketch | None = None) -> PreparedRewrite:
    """The prompt, its ids and the budget of `request` (`ContextLengthError` when it does not fit). `sketch`
    is the request's sketch as the session read it (`sketch.Sketch`); without it, the request's sketch is
    read here, as it is."""
    if request.sketch is not None and sketch is None:
        sketch = Sketch.read(request.original, request.sketch, request.sketch_format, from_chat=False, merge=False)
    # The model sees "\n" line endings; the answer gets the original's back (CRLF files stay CRLF).
    crlf = "\r\n" in request.original
    prompt = dataclasses.replace(
        request.prompt(sketch.format if sketch is not None else None),
        original=request.original.replace("\r\n", "\n"),
        sketch=request.sketch.replace("\r\n", "\n") if request.sketch is not None else None,
    )
    refuse_early_if_too_long(engine, request)
    prompt_text = build_prompt(engine.tokenizer, prompt)
    prompt_ids = engine.tokenize(prompt_text)
    original_ids = engine.tokenize(prompt.original)
    source_ids = original_ids
    sketch_merge = None
    if prompt.sketch is not None and sketch is not None:
        # The sketch merged by its lines is the first draft: a model that agrees with it writes it at copy
        # speed; where it does not (or a chunk could not be placed), the original and the sketch's new code.
        sketch_merge = sketch.by_lines()
        merged = sketch_merge.text.replace("\r\n", "\n")  # in the original's line endings
        source_ids = engine.tokenize(merged) + original_ids + engine.tokenize(prompt.sketch)
    max_new_tokens = _budget(engine, request, len(prompt_ids), len(original_ids))
    return PreparedRewrite(request, prompt, prompt_text, prompt_ids, source_ids, max_new_tokens, crlf, sketch_merge)


def run_rewrite(
    engine: Engine,
    prepared: PreparedRewrite,
    *,
    draft: DraftMethod | None = None,
    on_text: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[Step], None] | None = None,
    pause: Callable[[], None] | None = None,
) -> RewriteRun:
    """Decode `prepared` with the drafters `draft` asks for (default: the request's own method);
    `on_text` streams the new region's text as it is committed; `pause` between parts of a long prefill
    (`Engine.generate`)."""
    crlf = prepared.crlf
    answer = AnswerStream(prepared.fence)
    trailing = _TrailingNewline(keep=prepared.keeps_final_newline)
    started, first_text = time.perf_counter(), None

    def emit(_: str) -> None:
        nonlocal first_text
        text = trailing.pass_on(answer.take())
        if text and first_text is None:
            first_text = time.perf_counter() - started
        if text and on_text is not None:
            on_text(text.replace("\n", "\r\n") if crlf else text)

    # Fewer threads while other programs keep cores busy, where the self-check found the same answer there.
    exactness, on_cpu = engine.loaded.exactness, engine.device.type == "cpu"
    cores = FreeCores(exactness.fewer_threads if exactness is not None and on_cpu else (), engine.loaded)

    def stepped(info: Step) -> None:
        cores.between_steps()
        if on_step is not None:
            on_step(info)

    try:
        generation = generate_drafted(
            engine,
            prepared.prompt_ids,
            method=draft or prepared.request.draft,
            source_ids=prepared.source_ids,
            max_new_tokens=prepared.max_new_tokens,
            sampling=prepared.request.sampling,
            stop=answer.feed,
            on_text=emit,
            cancel=cancel,
            on_step=stepped,
            pause=pause,
        )
    finally:
        cores.restore()
    generation.stats.threads = cores.mostly if on_cpu else None
    emit("")
    generation.stats.first_text_seconds = first_text
    code = trailing.finish(answer.code)
    if on_text is not None and trailing.released_at_end:
        on_text(trailing.released_at_end.replace("\n", "\r\n") if crlf else trailing.released_at_end)
    unresolved = tuple(prepared.sketch_merge.unresolved) if prepared.sketch_merge is not None else None
    return RewriteRun(code.replace("\n", "\r\n") if crlf else code, generation.finish_reason, generation, unresolved)


def rewrite(
    engine: Engine,
    request: RewriteRequest,
    *,
    on_text: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[Step], None] | None = None,
    pause: Callable[[], None] | None = None,
    sketch: Sketch | None = None,
) -> RewriteRun:
    """Rewrite `request.original`; `on_text` streams the new region's text as it is committed. `sketch`: the
    request's sketch as the session read it (`prepare_rewrite`)."""
    prepared = prepare_rewrite(engine, request, sketch)
    return run_rewrite(engine, prepared, on_text=on_text, cancel=cancel, on_step=on_step, pause=pause)


def warm_document(engine: Engine, request: WarmRequest, should_stop: Callable[[], bool]) -> tuple[int, int]:
    """Prefill the start every request on `request.document` shares into the engine's prefix cache, giving
    way as soon as `should_stop()` is true. Returns (tokens cached, tokens of that start); (0, 0) when the
    engine keeps no prompts or the document cannot fit the context."""
    prefix_cache = engine.prefix_cache
    limit = engine.max_positions
    document = request.document.replace("\r\n", "\n")
    if (
        prefix_cache is None
        or not prefix_cache.keeps_prompts
        or (limit is not None and len(document) > limit * CHARS_PER_TOKEN_BOUND)
    ):
        return 0, 0
    ids = engine.tokenize(file_prefix(engine.tokenizer, document, request.language))
    if limit is not None and len(ids) >= limit // 2:  # no answer of its size would fit after it
        return 0, 0
    return prefix_cache.warm(engine.torch_target, ids, should_stop), len(ids)


def keep_prompt_head(engine: Engine, folder: Path | None) -> int:
    """Hold the start every prompt shares (the system prompt, up to the user's code) in the engine's prefix
    cache for good: read from `folder` where a start of the same model on the same kernels kept it, else
    prefilled and kept there (`PrefixCache.keep_head`). Returns its length in tokens; 0 where the engine
    keeps no prefixes, or where its prefill is not row-invariant (the start computed alone would not be,
    bit for bit, the start computed inside a prompt)."""
    from specedit.engine.model.exactness import fingerprint
    from specedit.engine.model.loading import weight_files
    from specedit.engine.model.prefix_cache import common_prefix

    prefix_cache = engine.prefix_cache
    if prefix_cache is None or not engine.loaded.row_invariant:
        return 0
    loaded = engine.torch_target
    # Two prompts that differ from their code on: the tokens they share are every prompt's start.
    one, other = (engine.tokenize(file_prefix(engine.tokenizer, code, tag)) for code, tag in (("a", "py"), ("1", "")))
    ids = one[: common_prefix(one, other, len(one))]
    files = weight_files(loaded.name)
    named_by = f"{fingerprint(loaded)}\0{json.dumps(ids)}".encode()
    file = kept_file(folder, "head", files, "safetensors", named_by) if folder is not None and files else None
    prefix_cache.keep_head(loaded, ids, file)
    return len(ids)


# A token of a code model's vocabulary covers a few characters (3-4 on code for Qwen2.5's); tokenizing the
# first CHARS_PER_TOKEN_BOUND characters a token could cover is enough to refuse most inputs too long for
# the context without tokenizing all of them (a 1 MB file costs a second of tokenizing on the CPU).
CHARS_PER_TOKEN_BOUND = 8


def refuse_early_if_too_long(engine: Engine, request: RewriteRequest, *, bound: int = CHARS_PER_TOKEN_BOUND) -> None:
    """`ContextLengthError` when the request's texts already overflow the context with the answer they
    need (the rule of `_budget`, on a lower bound of their tokens): the original, and the instruction or
    sketch, each tokenized no further than `bound` characters a position of the context, from two on
    (text of short tokens is refused after a quarter of the work). With a `bound` of 2, cheap enough to
    run before a rewrite takes its turn (0.1 s for 1 MB): an outsized request is refused without holding
    the model while the others wait."""
    limit = engine.max_positions
    asked = request.instruction if request.instruction is not None else request.sketch or ""
    if limit is None or len(request.original) + len(asked) <= limit // 2:  # a token is at least one character
        return
    for per_position in (per for per in (2, 4, CHARS_PER_TOKEN_BOUND) if per <= bound):
        chars = limit * per_position
        original = len(engine.tokenize(request.original[:chars].replace("\r\n", "\n")))
        said = len(engine.tokenize(asked[:chars]))
        answer = min(request.max_new_tokens or original, original + 16)
        cut = max(len(request.original), len(asked)) > chars
        if original + said + answer > limit:
            what = "the instruction" if request.instruction is not None else "the sketch"
            counted = " (at least: only their first part is counted)" if cut else ""
            raise ContextLengthError(
                f"the input is too long for the model: the code takes {original} tokens and {what} {said}"
                f"{counted}, and the answer needs {answer} more, but the context holds {limit}; rewrite a "
                "smaller region"
            )
        if not cut:
            return


def _budget(engine: Engine, request: RewriteRequest, prompt_tokens: int, original_tokens: int) -> int:
    """The output budget, checked against the model's context window."""
    wanted = request.max_new_tokens or 2 * original_tokens + 256
    limit = engine.max_positions
    if limit is None:
        return wanted
    room = limit - prompt_tokens
    # The answer repeats the region, so the region must fit twice (prompt and answer).
    if room < min(wanted, original_tokens + 16):
        raise ContextLengthError(
            f"the input is too long for the model: the prompt takes {prompt_tokens} tokens and the answer "
            f"needs about {original_tokens} more, but the context holds {limit}; rewrite a smaller region"
        )
    return min(wanted, room)


class _TrailingNewline:
    """Matches the answer's final newline to the original: the model always ends its code with a newline
    before the fence, the original may not. Newlines at the end of the streamed text are held back
    until more text follows, so the streamed text always equals the final text."""

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._held = ""
        self.released_at_end = ""

    def pass_on(self, text: str) -> str:
        if self._keep or not text:
            return text
        text = self._held + text
        stripped = text.rstrip("\n")
        self._held = text[len(stripped) :]
        return stripped

    def finish(self, code: str) -> str:
        if self._keep:
            return code
        if code.endswith("\n"):
            code = code[:-1]
        self.released_at_end = self._held[:-1] if self._held else ""
        return code
