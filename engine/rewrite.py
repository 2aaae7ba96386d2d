"""One rewrite: prompt, drafters (the copy drafter over the original first), generate, the code back out.

This is what the command line, the daemon and the language server all call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specedit.engine.drafting import generate_drafted
from specedit.engine.errors import ContextLengthError
from specedit.engine.generate import Engine, FinishReason, Generation, StepInfo
from specedit.engine.prompts import AnswerStream, RewritePrompt, build_prompt
from specedit.engine.requests import DRAFT_METHODS, DraftMethod, RewriteRequest

__all__ = ["DRAFT_METHODS", "DraftMethod", "RewriteRequest", "RewriteResult", "rewrite"]


@dataclass
class RewriteResult:
    text: str  # the rewritten region, in the original's line endings
    finish_reason: FinishReason
    generation: Generation

    @property
    def complete(self) -> bool:
        """The model closed its code block (or ended its answer): the text is the whole region."""
        return self.finish_reason in ("stop", "eos")


def rewrite(
    engine: Engine,
    request: RewriteRequest,
    *,
    on_text: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[StepInfo], None] | None = None,
) -> RewriteResult:
    """Rewrite `request.original`; `on_text` streams the new region's text as it is committed."""
    # The model sees "\n" line endings; the answer gets the original's back (CRLF files stay CRLF).
    crlf = "\r\n" in request.original
    original = request.original.replace("\r\n", "\n") if crlf else request.original
    prompt = RewritePrompt(
        original,
        request.instruction,
        request.sketch.replace("\r\n", "\n") if request.sketch is not None else None,
        request.language,
    )
    prompt_ids = engine.tokenize(build_prompt(engine.tokenizer, prompt))
    original_ids = engine.tokenize(original)
    max_new_tokens = _budget(engine, request, len(prompt_ids), len(original_ids))

    # An edit sketch holds the new code: the answer copies from it as well as from the original.
    source_ids = original_ids + (engine.tokenize(prompt.sketch) if prompt.sketch is not None else [])

    answer = AnswerStream(prompt.fence)
    trailing = _TrailingNewline(keep=original.endswith("\n") or not original)

    def emit(_: str) -> None:
        text = trailing.pass_on(answer.take())
        if text and on_text is not None:
            on_text(text.replace("\n", "\r\n") if crlf else text)

    generation = generate_drafted(
        engine,
        prompt_ids,
        method=request.draft,
        source_ids=source_ids,
        max_new_tokens=max_new_tokens,
        sampling=request.sampling,
        stop=answer.feed,
        on_text=emit,
        cancel=cancel,
        on_step=on_step,
    )
    emit("")
    code = trailing.finish(answer.code)
    if on_text is not None and trailing.released_at_end:
        on_text(trailing.released_at_end.replace("\n", "\r\n") if crlf else trailing.released_at_end)
    return RewriteResult(code.replace("\n", "\r\n") if crlf else code, generation.finish_reason, generation)


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
