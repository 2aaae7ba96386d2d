"""What a rewrite asks for and what it reports: plain frozen dataclasses, with no torch import.

One request (`RewriteRequest`) and one result (`RewriteOutcome`), the same in process and on both sides of
every transport (`wire` sends them field for field; the events between them are `events`'). The
language server, the daemon's clients and the command line import these; keeping torch out of them lets
an editor's language server start in a fraction of a second when the model runs in the shared daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specedit.engine.records.errors import EmptyAnswerError, IncompleteOutputError, MergeError, SpeceditError
from specedit.engine.records.prompts import RewritePrompt
from specedit.engine.records.stats import Stats

# auto: copy, then the configured fallback; copy: the copy drafter alone; fallback: the fallback alone
# (a draft model or layer skip); none: plain decoding. See `loop.drafting`.
DraftMethod = Literal["auto", "copy", "fallback", "none"]

# Larger inputs are refused before any model work, wherever a request comes from (the command line, the
# language server, the daemon's socket): a rewrite repeats the whole input through the model, and the
# default model's context holds 32k tokens (about 100 KB of code) for prompt and answer together.
MAX_INPUT_BYTES = 1_000_000
# A request whose texts are longer costs a noticeable share of the CPU before the model sees it (a sketch's
# merge by its lines: 0.3-0.8 s for 1 MB), which beside another client's rewrite slows every step of it
# (the interpreter's lock and the cores are shared): that work takes a turn, as a rewrite does
# (`Backend.in_turn`).
HEAVY_CHARS = 100_000
# Sampling settings outside these are refused: a temperature of 1e-300 divides the logits into infinities.
MIN_TEMPERATURE = 1e-3
MIN_TOP_P = 1e-6
DRAFT_METHODS: tuple[DraftMethod, ...] = ("auto", "copy", "fallback", "none")
# How an edit sketch is merged. auto: by its lines where every chunk says where it goes (`merge`), in
# milliseconds and without the model; else by the model, with that partial merge as its draft. model: by
# the model always (the merge is still its draft).
MergeMethod = Literal["auto", "model"]
MERGE_METHODS: tuple[MergeMethod, ...] = ("auto", "model")
# How a sketch is written: lazy (elided with comments), or a patch (`sketch.patches`). auto: the session
# finds it in the sketch's text when it reads the sketch (`sketch.Sketch`).
SketchFormat = Literal["auto", "lazy", "udiff", "search-replace", "v4a"]
SKETCH_FORMATS: tuple[SketchFormat, ...] = ("auto", "lazy", "udiff", "search-replace", "v4a")


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy decoding (argmax), and then top_p and seed are unused."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, 100], got {self.temperature}")
        if not MIN_TOP_P <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [{MIN_TOP_P}, 1], got {self.top_p}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RewriteRequest:
    original: str  # the region to rewrite (whole file or a selection)
    instruction: str | None = None
    sketch: str | None = None
    language: str = ""
    draft: DraftMethod = "auto"
    sampling: SamplingConfig = SamplingConfig()
    max_new_tokens: int | None = None  # None: room for the original twice over, within the context
    merge: MergeMethod = "auto"  # for a sketch
    sketch_format: SketchFormat = "auto"  # how the sketch is written; auto: found in its text (`sketch.Sketch`)
    allow_empty: bool = False  # an empty answer for a region that has code is written (else it is refused)
    # The file the region is of, as the user named it (None: not known). A chat answer's code block named
    # for another file is refused by this name (`chat_answer`).
    path: str | None = None

    def __post_init__(self) -> None:
        for name in ("original", "instruction", "sketch", "path"):
            _check_size(name, getattr(self, name))
        if self.draft not in DRAFT_METHODS:
            raise ValueError(f"draft must be one of {DRAFT_METHODS}, got {self.draft!r}")
        if self.merge not in MERGE_METHODS:
            raise ValueError(f"merge must be one of {MERGE_METHODS}, got {self.merge!r}")
        if self.sketch_format not in SKETCH_FORMATS:
            raise ValueError(f"sketch_format must be one of {SKETCH_FORMATS}, got {self.sketch_format!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        RewritePrompt(self.original, self.instruction, self.sketch)  # validates (an instruction or a sketch)

    @property
    def heavy(self) -> bool:
        """Whether its texts are long enough that the work on them outside the model takes a turn
        (`HEAVY_CHARS`)."""
        return len(self.original) + len(self.instruction or self.sketch or "") > HEAVY_CHARS

    def prompt(self, written_as: SketchFormat | None = None) -> RewritePrompt:
        """What the model is asked (line endings as given). A sketch is written as its request names, else
        as `written_as` says: the format its reading found in its text (`sketch.Sketch.format`)."""
        written = self.sketch_format
        if self.sketch is not None and written == "auto":
            if written_as is None or written_as == "auto":
                raise ValueError("a sketch's format is found by reading it (`sketch.Sketch`): give it as written_as")
            written = written_as
        return RewritePrompt(self.original, self.instruction, self.sketch, self.language, written)


ChatRole = Literal["system", "developer", "user", "assistant"]
CHAT_ROLES: tuple[ChatRole, ...] = ("system", "developer", "user", "assistant")
MAX_STOP_STRINGS = 4  # OpenAI's limit
# Each stop string's characters: every step searches the answer's end as long as the longest one.
MAX_STOP_CHARS = 1_000
MAX_MESSAGES = 2_048  # a chat's messages (their text is bounded as one, `MAX_INPUT_BYTES`)


@dataclass(frozen=True)
class ChatMessage:
    role: ChatRole
    content: str


@dataclass(frozen=True)
class CompletionRequest:
    """A generation as OpenAI's API asks for one (`http`): chat `messages`, which the model's chat
    template turns into the prompt, or a raw `prompt`, continued by the model. `prediction` is the text
    the answer will mostly repeat (OpenAI's Predicted Outputs: the file being edited): the copy drafter's
    source, as the original is a rewrite's. The answer is the model's alone, whatever the prediction
    says; `stop` strings end it (not included)."""

    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None  # exactly one of messages and prompt
    prediction: str | None = None
    sampling: SamplingConfig = SamplingConfig()
    max_new_tokens: int | None = None  # None: as much as the context holds
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if bool(self.messages) == (self.prompt is not None):
            raise ValueError("give exactly one of messages and prompt")
        for message in self.messages:
            if message.role not in CHAT_ROLES:
                raise ValueError(f"a message's role must be one of {', '.join(CHAT_ROLES)}, not {message.role!r}")
        _check_size("prompt", self.prompt)
        _check_size("prediction", self.prediction)
        _check_size("messages", "".join(message.content for message in self.messages))
        if len(self.stop) > MAX_STOP_STRINGS or not all(0 < len(stop) <= MAX_STOP_CHARS for stop in self.stop):
            raise ValueError(f"stop holds at most {MAX_STOP_STRINGS} strings of 1 to {MAX_STOP_CHARS:,} characters")
        if len(self.messages) > MAX_MESSAGES:
            raise ValueError(f"a chat holds at most {MAX_MESSAGES:,} messages")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


@dataclass(frozen=True)
class WarmRequest:
    """A document the user has open: the engine may prefill the start every request on it shares (the
    system prompt and the file, `prompts.file_prefix`) while it has nothing else to do."""

    document: str
    language: str = ""
    name: str = ""  # which document (an editor's URI): a newer text of it replaces one not yet warmed

    def __post_init__(self) -> None:
        _check_size("document", self.document)


def _check_size(name: str, value: str | None) -> None:
    # UTF-8 takes at most 4 bytes a character: only a long text is measured exactly.
    if (
        value is not None
        and len(value) * 4 > MAX_INPUT_BYTES
        and len(value.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES
    ):
        raise ValueError(f"the {name} is larger than {MAX_INPUT_BYTES:,} bytes; rewrite a smaller region")


FinishReason = Literal["eos", "stop", "length", "cancelled"]
# complete: the answer to write. The others write nothing: incomplete (the token budget ran out before the
# code was finished), cancelled, not_a_merge (the answer to a sketch is not a merge of it: `merge_checks`),
# empty (nothing, or only whitespace, for a region that has code). The session judges (`session.judged`).
OutcomeStatus = Literal["complete", "incomplete", "cancelled", "not_a_merge", "empty"]


def status_of(finish_reason: FinishReason) -> OutcomeStatus:
    """The one mapping from the loop's finish reason to a status: the model closing its code block
    (`stop`) or ending its answer (`eos`) completes the rewrite; running out of budget does not."""
    if finish_reason in ("eos", "stop"):
        return "complete"
    return "incomplete" if finish_reason == "length" else "cancelled"


@dataclass(frozen=True)
class RewriteOutcome:
    """How a rewrite ended, wherever it ran. Errors are raised, not returned; an answer that must not be
    written is an outcome too, with the reason (`problem`) and the error a front end reports (`error`)."""

    text: str  # the rewritten region, in the original's line endings
    status: OutcomeStatus
    finish_reason: FinishReason | None  # None: cancelled before it ran
    stats: Stats  # what it cost; every front end shows `Stats.to_dict()`
    problem: str = ""  # why an answer is not to be written (incomplete, not_a_merge, empty)

    @classmethod
    def finished(cls, text: str, finish_reason: FinishReason, stats: Stats) -> RewriteOutcome:
        return cls(text, status_of(finish_reason), finish_reason, stats)

    @classmethod
    def cancelled_before_start(cls, stats: Stats | None = None) -> RewriteOutcome:
        return cls("", "cancelled", None, stats or Stats.before_start())

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    def error(self) -> SpeceditError | None:
        """The error a front end reports for an answer it must not write (None: complete or cancelled)."""
        errors: dict[str, type[SpeceditError]] = {
            "incomplete": IncompleteOutputError,
            "not_a_merge": MergeError,
            "empty": EmptyAnswerError,
        }
        return errors[self.status](self.problem) if self.status in errors else None
