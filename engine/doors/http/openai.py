"""OpenAI's API shapes, as data: what a client may ask (`ChatCompletionsBody`, `CompletionsBody`), and what it
gets back (completions, chunks, usage, models, errors).

Every option a client may send is honoured or refused by name, never silently ignored: the options this
door runs (`model`, `messages` / `prompt`, `stream`, `stream_options.include_usage`, `temperature`, `top_p`,
`seed`, `max_tokens` / `max_completion_tokens`, `stop`, `prediction`); the ones that change nothing when
they hold their default (`n` 1, `presence_penalty` 0, `logprobs` false, `tools` empty, ...) or are the
client's own bookkeeping (`user`, `metadata`); anything else is an `invalid_request_error` that names it.
Parsing never touches the engine: a request over the limits is refused before anything is tokenized,
with the socket's limits (`requests`: each text, the stop strings, the messages) and a few of its own
(a model's name, a seed that fits 64 bits).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict, TypeVar

from specedit.engine.records.requests import (
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MIN_TEMPERATURE,
    ChatMessage,
    RewriteOutcome,
    SamplingConfig,
)
from specedit.engine.records.stats import DrafterStats

# OpenAI's own default: a client that says nothing samples at temperature 1.
DEFAULT_TEMPERATURE = 1.0
# Options that ask for nothing as long as they hold these values (what clients send by default).
NO_OP_DEFAULTS: dict[str, tuple[object, ...]] = {
    "n": (1, None),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logprobs": (False, None),
    "top_logprobs": (0, None),
    "logit_bias": ({}, None),
    "tools": ([], None),
    "tool_choice": ("none", "auto", None),
    "parallel_tool_calls": (True, False, None),
    "response_format": ({"type": "text"}, None),
    "store": (False, None),
    "service_tier": ("auto", "default", None),
    "echo": (False, None),
    "best_of": (1, None),
    "suffix": (None, ""),
}
CLIENT_BOOKKEEPING = ("user", "metadata")  # the client's own labels; they change nothing in the answer
MAX_MODEL_CHARS = 256  # a model's name (it is said back in an error)
MAX_SEED = 2**63 - 1  # a seed the sampler's generator takes
TEXT_PART = "text"
T = TypeVar("T")
D = TypeVar("D")
JSONObject = Mapping[str, object]  # a request's body, as `cluster.json_object` parsed it

FinishReason = Literal["stop", "length"]


# ------------------------------------------------------------------------------ the shapes it answers


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(TypedDict):
    error: ErrorDetail


class CachedTokens(TypedDict):
    cached_tokens: int


class CompletionTokensDetails(TypedDict):
    reasoning_tokens: int
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens
    completion_tokens_details: CompletionTokensDetails


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str
    refusal: None


class ChatChoice(TypedDict):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: FinishReason


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(TypedDict, total=False):
    """A streamed piece of the assistant's message: its role first, then its content."""

    role: Literal["assistant"]
    content: str


class ChunkChoice(TypedDict):
    index: int
    delta: Delta
    logprobs: None
    finish_reason: FinishReason | None


class _ChatChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]


class ChatChunk(_ChatChunk, total=False):
    usage: Usage  # the last chunk's, where the client asked for it (no choices then)


class TextChoice(TypedDict):
    index: int
    text: str
    logprobs: None
    finish_reason: FinishReason | None


class _TextCompletion(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]


class TextCompletion(_TextCompletion, total=False):
    usage: Usage  # the whole answer's (not a streamed piece's)


class ModelCard(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[ModelCard]


# ------------------------------------------------------------------------------------------ requests


class OpenAIError(Exception):
    """A request this door refuses or cannot answer: rendered in OpenAI's error shape with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.kind, self.param = status, code, kind, param

    def body(self) -> ErrorBody:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def invalid(message: str, *, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, code=code, param=param)


@dataclass(frozen=True)
class Generation:
    """What any of the two endpoints asks the engine for, checked."""

    model: str
    stream: bool
    include_usage: bool
    sampling: SamplingConfig
    max_tokens: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class ChatCompletionsBody:
    generation: Generation
    messages: tuple[ChatMessage, ...]
    prediction: str | None


@dataclass(frozen=True)
class CompletionsBody:
    generation: Generation
    prompt: str


def chat_completions_body(body: JSONObject) -> ChatCompletionsBody:
    """The `/v1/chat/completions` request, checked (`OpenAIError` naming the first thing wrong)."""
    known = {"messages", "prediction"}
    generation = _generation(body, known)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("`messages` must be a non-empty list", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"`messages` holds at most {MAX_MESSAGES:,} messages", param="messages")
    return ChatCompletionsBody(generation, tuple(_message(m, i) for i, m in enumerate(messages)), _prediction(body))


def completions_body(body: JSONObject) -> CompletionsBody:
    """The `/v1/completions` request (one prompt), checked."""
    generation = _generation(body, {"prompt"})
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise invalid("`prompt` must be one non-empty string (this door takes one prompt a request)", param="prompt")
    return CompletionsBody(generation, prompt)


def _generation(body: JSONObject, own: set[str]) -> Generation:
    runs = {"model", "stream", "stream_options", "temperature", "top_p", "seed", "max_tokens"}
    runs |= {"max_completion_tokens", "stop"} | own
    for name, value in body.items():
        if name in runs or name in CLIENT_BOOKKEEPING:
            continue
        if name in NO_OP_DEFAULTS and value in NO_OP_DEFAULTS[name]:
            continue
        what = f"`{name}` = {value!r}" if name in NO_OP_DEFAULTS else f"`{name}`"
        raise invalid(f"{what} is not supported by this engine", param=name, code="unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_CHARS:
        raise invalid("`model` must name a model (see /v1/models)", param="model")
    stream = _typed(body, "stream", bool, False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise invalid("`stream_options` takes only `include_usage`", param="stream_options")
    if options and not stream:
        raise invalid("`stream_options` goes with `stream: true`", param="stream_options")
    include_usage = _typed(options, "include_usage", bool, False)
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE)
    top_p = _number(body, "top_p", 1.0)
    seed = _typed(body, "seed", int, 0)
    if abs(seed) > MAX_SEED:
        raise invalid(f"`seed` must be within ±{MAX_SEED}", param="seed")
    if not 0 <= temperature <= 2:
        raise invalid("`temperature` must be between 0 and 2", param="temperature")
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE  # as good as greedy, where a division by it would overflow
    try:
        sampling = SamplingConfig(temperature=temperature, top_p=top_p, seed=abs(seed))
    except ValueError as error:
        raise invalid(str(error), param="top_p") from None
    limits = [_typed(body, name, int, None) for name in ("max_tokens", "max_completion_tokens")]
    max_tokens = min((limit for limit in limits if limit is not None), default=None)
    if max_tokens is not None and max_tokens < 1:
        raise invalid("`max_tokens` must be at least 1", param="max_tokens")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else ()
    if stop is not None and (
        not stops
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
        or len(stops) > MAX_STOP_STRINGS
    ):
        raise invalid(
            f"`stop` is a string or a list of up to {MAX_STOP_STRINGS} non-empty strings of at most "
            f"{MAX_STOP_CHARS:,} characters",
            param="stop",
        )
    return Generation(model, stream, include_usage, sampling, max_tokens, stops)


def _typed(body: JSONObject, name: str, kind: type[T], default: D) -> T | D:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and kind is not bool:
        raise invalid(f"`{name}` must be a number", param=name)
    if not isinstance(value, kind):
        raise invalid(f"`{name}` has the wrong type", param=name)
    return value


def _number(body: JSONObject, name: str, default: float) -> float:
    """An option that is a number, integer or not (never a boolean), as a float."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        raise invalid(f"`{name}` must be a number", param=name)
    if not isinstance(value, (int, float)):
        raise invalid(f"`{name}` has the wrong type", param=name)
    return float(value)


def _message(value: object, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise invalid(f"{where} must be an object", param=where)
    unknown = set(value) - {"role", "content", "name"}
    if unknown:
        raise invalid(f"{where}: `{sorted(unknown)[0]}` is not supported by this engine", param=where)
    role = value.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        raise invalid(f"{where}: the role must be system, developer, user or assistant", param=where)
    return ChatMessage(role, _text(value.get("content"), f"{where}.content"))


def _text(content: object, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == TEXT_PART for part in content):
        texts = [part.get("text") for part in content]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    raise invalid(f"{where} must be a string or a list of text parts", param=where)


def _prediction(body: JSONObject) -> str | None:
    prediction = body.get("prediction")
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content" or set(prediction) - {"type", "content"}:
        raise invalid('`prediction` is {"type": "content", "content": ...}', param="prediction")
    return _text(prediction.get("content"), "prediction.content")


# ------------------------------------------------------------------------------------------ answers


def finish_reason(outcome: RewriteOutcome) -> FinishReason:
    """OpenAI's word: the model ended its answer or hit a stop string (`stop`), or ran out of tokens."""
    return "length" if outcome.finish_reason == "length" else "stop"


def usage(outcome: RewriteOutcome, *, predicted: bool) -> Usage:
    """The usage block: tokens in and out, and (with a prediction) how many of the prediction's tokens the
    answer took (`accepted_prediction_tokens`: the copy drafter's accepted ones) and how many it proposed
    that the model did not write (`rejected_prediction_tokens`, counted in the completion's tokens, as
    OpenAI counts them)."""
    stats = outcome.stats
    copy = stats.drafters.get("copy", DrafterStats()) if predicted else DrafterStats()
    prompt, completion, rejected = stats.prompt_tokens, stats.generated_tokens, copy.wasted
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion + rejected,
        "total_tokens": prompt + completion + rejected,
        "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": copy.accepted,
            "rejected_prediction_tokens": rejected,
        },
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def chat_completion(request_id: str, model: str, text: str, outcome: RewriteOutcome, usage_: Usage) -> ChatCompletion:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason(outcome),
            }
        ],
        "usage": usage_,
    }


def chat_chunk(
    request_id: str,
    model: str,
    delta: Delta | None,
    reason: FinishReason | None = None,
    usage_: Usage | None = None,
) -> ChatChunk:
    """A streamed piece: a delta (or, with `usage_` and no delta, the usage chunk, with no choices)."""
    choices: list[ChunkChoice] = (
        [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]
    )
    chunk: ChatChunk = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def text_completion(
    request_id: str, model: str, text: str, reason: FinishReason | None, usage_: Usage | None
) -> TextCompletion:
    """A `/v1/completions` answer, or one streamed piece of it (no usage, `reason` None until the last)."""
    body: TextCompletion = {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def models(ids: list[str]) -> ModelList:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "specedit"} for name in ids],
    }
