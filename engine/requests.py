"""What a rewrite asks for: plain frozen dataclasses, with no torch import.

The language server, the daemon's clients and the command line's parser import these; keeping torch out
of them lets an editor's language server start in a fraction of a second when the model runs in the
shared daemon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specedit.engine.prompts import RewritePrompt

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "float64")
# auto: copy, then the configured fallback; copy: the copy drafter alone; fallback: the fallback alone
# (a draft model or layer skip); none: plain decoding. See `engine.drafting`.
DraftMethod = Literal["auto", "copy", "fallback", "none"]
DRAFT_METHODS: tuple[DraftMethod, ...] = ("auto", "copy", "fallback", "none")


@dataclass(frozen=True)
class FallbackOptions:
    """What drafts where the copy has nothing, as a user configures it (see `engine.drafting`).

    `draft_model`: a model folder, .gguf or known name with the target's tokenizer; `layers`: the target's
    own layers to draft with, a list like `0-11,20-23` or `auto` (what `specedit calibrate` saved). At most
    one of the two; neither means plain decoding where the copy has nothing.
    """

    draft_model: str | None = None
    layers: str | None = None
    # Stop drafting at the first token whose probability is below this (about 0.5 removed the energy
    # penalty of long drafts on every task in the seed measurements).
    p_min: float = 0.5

    def __post_init__(self) -> None:
        if self.draft_model is not None and self.layers is not None:
            raise ValueError("choose a draft model or layer skip, not both")
        if not 0.0 <= self.p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {self.p_min}")

    @property
    def configured(self) -> bool:
        return self.draft_model is not None or self.layers is not None


def layer_skip_option(value: str) -> str | None:
    """The layer list a `--draft layers[:LIST]` value asks for (`auto` when bare); None for other values.

    >>> layer_skip_option("layers:0-11,20-23"), layer_skip_option("layers"), layer_skip_option("copy")
    ('0-11,20-23', 'auto', None)
    """
    if value != "layers" and not value.startswith("layers:"):
        return None
    return value.partition(":")[2] or "auto"


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy decoding (argmax), and then top_p and seed are unused."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
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

    def __post_init__(self) -> None:
        if self.draft not in DRAFT_METHODS:
            raise ValueError(f"draft must be one of {DRAFT_METHODS}, got {self.draft!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        RewritePrompt(self.original, self.instruction, self.sketch, self.language)  # validates
