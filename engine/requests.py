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
DraftMethod = Literal["copy", "none"]
DRAFT_METHODS: tuple[DraftMethod, ...] = ("copy", "none")


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
    draft: DraftMethod = "copy"
    sampling: SamplingConfig = SamplingConfig()
    max_new_tokens: int | None = None  # None: room for the original twice over, within the context

    def __post_init__(self) -> None:
        if self.draft not in DRAFT_METHODS:
            raise ValueError(f"draft must be one of {DRAFT_METHODS}, got {self.draft!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        RewritePrompt(self.original, self.instruction, self.sketch, self.language)  # validates
