"""One generation as OpenAI's API asks for it (`requests.CompletionRequest`): the prompt, the copy source,
the budget, the stop strings, then the same speculative loop as a rewrite.

Chat messages get the model's chat template (a raw prompt goes in as it is). The copy drafter copies from
the prediction (OpenAI's Predicted Outputs) where there is one, else from the messages themselves: an
edit format that answers with the whole file (aider's `whole`) repeats the file it was sent. The answer is
what the model alone writes, whatever the prediction says (the loop is lossless).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specedit.engine.loop.drafting import generate_drafted
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.records.errors import ContextLengthError
from specedit.engine.records.events import Step
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome


@dataclass
class Completion:
    text: str
    generation: Generation
    prompt_tokens: int

    def outcome(self) -> RewriteOutcome:
        return RewriteOutcome.finished(self.text, self.generation.finish_reason, self.generation.stats)


def complete(
    engine: Engine,
    request: CompletionRequest,
    *,
    on_text: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[Step], None] | None = None,
    pause: Callable[[], None] | None = None,
) -> Completion:
    """Generate the answer to `request`; `on_text` streams it as it is committed (a stop string never)."""
    prompt_ids = engine.tokenize(prompt_text(engine.tokenizer, request))
    if request.prediction is not None:
        source = request.prediction
    else:
        source = "\n".join(message.content for message in request.messages if message.role != "system")
    source_ids = engine.tokenize(source)
    limit = engine.max_positions
    room = (limit - len(prompt_ids)) if limit is not None else request.max_new_tokens or 4096
    if room < 1:
        raise ContextLengthError(
            f"the prompt takes {len(prompt_ids)} tokens, and the model's context holds {limit}: no room for an answer"
        )
    stops = StopStrings(request.stop)

    def emit(_: str) -> None:
        released = stops.take()
        if released and on_text is not None:
            on_text(released)

    generation = generate_drafted(
        engine,
        prompt_ids,
        method="auto",
        source_ids=source_ids,
        max_new_tokens=min(request.max_new_tokens or room, room),
        sampling=request.sampling,
        stop=stops.feed if request.stop else None,
        on_text=emit if request.stop else on_text,
        cancel=cancel,
        on_step=on_step,
        pause=pause,
    )
    if request.stop:
        emit("")
    return Completion(stops.text if request.stop else generation.text, generation, len(prompt_ids))


def refuse_early_if_too_long(engine: Engine, request: CompletionRequest, *, bound: int = 8) -> None:
    """`ContextLengthError` when the prompt, or the prediction (the answer it stands for), alone takes more
    positions than the model's context holds: each tokenized no further than `bound` characters a
    position, from two on. Cheap enough to run before the request takes its turn (0.1 s for 1 MB; as a
    rewrite's, `rewrite.refuse_early_if_too_long`): an outsized request holds no one up."""
    limit = engine.max_positions
    said = request.prompt if request.prompt is not None else "\n".join(m.content for m in request.messages)
    texts = {"the prompt": said, "the prediction": request.prediction or ""}
    for what, text in texts.items():
        if limit is None or len(text) <= limit:  # a token is at least one character
            continue
        for per_position in (per for per in (2, 4, 8) if per <= bound):
            tokens = len(engine.tokenize(text[: limit * per_position]))
            if tokens > limit:
                raise ContextLengthError(
                    f"the input is too long for the model: {what} takes over {limit} tokens, all the context"
                )
            if len(text) <= limit * per_position:
                break


def prompt_text(tokenizer: object, request: CompletionRequest) -> str:
    """The text the model reads: the chat template applied to the messages (with the assistant's turn
    opened), or the raw prompt. A last message of the assistant's is the start of its answer, which the
    model goes on with (a prefill, as llama.cpp's server takes it: how `specedit bench` primes the code
    block for `openai-prediction`)."""
    if request.prompt is not None:
        return request.prompt
    messages = [{"role": message.role, "content": message.content} for message in request.messages]
    started = messages.pop()["content"] if messages[-1]["role"] == "assistant" else ""
    render = getattr(tokenizer, "apply_chat_template", None)
    if render is None or not getattr(tokenizer, "chat_template", None):
        # A base model has no template: the turns as plain text, the answer's turn open.
        return "".join(f"{m['role']}: {m['content']}\n\n" for m in messages) + "assistant: " + started
    text: str = render(messages, tokenize=False, add_generation_prompt=True)
    return text + started


class StopStrings:
    """The answer up to the first of the stop strings (OpenAI's `stop`, which are not part of it).

    `feed` takes text as the model writes it and returns True once a stop string is complete; `take`
    returns the text released since the last call, holding back an end that could still become a stop
    string, so a stop string never reaches the client.

    >>> stops = StopStrings(("\\n\\n",))
    >>> stops.feed("x = 1\\n"), stops.take()
    (False, 'x = 1')
    >>> stops.feed("\\ny = 2"), stops.take(), stops.text
    (True, '', 'x = 1')
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = stop
        self._text = ""
        self._released = 0
        self._end: int | None = None  # where the first stop string starts, once one is complete

    @property
    def stopped(self) -> bool:
        return self._end is not None

    @property
    def text(self) -> str:
        return self._text if self._end is None else self._text[: self._end]

    def feed(self, text: str) -> bool:
        if self._end is not None:
            return True
        searched_from = max(0, len(self._text) - max((len(s) for s in self._stop), default=0))
        self._text += text
        found = [at for stop in self._stop if (at := self._text.find(stop, searched_from)) >= 0]
        if found:
            self._end = min(found)
        return self._end is not None

    def take(self) -> str:
        end = self._end if self._end is not None else len(self._text) - self._held_back()
        released = self._text[self._released : end] if end > self._released else ""
        self._released = max(self._released, end)
        return released

    def _held_back(self) -> int:
        """How many of the last characters could be the start of a stop string."""
        for size in range(min(len(self._text), max(map(len, self._stop), default=0) - 1), 0, -1):
            if any(stop.startswith(self._text[-size:]) for stop in self._stop):
                return size
        return 0
