"""The `Drafter` protocol: one hot method (`propose`) and one feedback hook (`observe`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # (the loop imports this without torch: `model.torchless`)
    import torch


@dataclass(frozen=True)
class Draft:
    """Proposed tokens, and for a stochastic drafter the distribution each was sampled from.

    `p_draft is None` means a deterministic draft (copy drafts, greedy draft models): the verifier then
    accepts while a sample from the target equals the draft. Otherwise `p_draft` has shape
    (len(tokens), vocab) and the verifier uses the min(1, p_target/p_draft) rule.
    An empty draft means "no proposal". `source` names the drafter that proposed it (for the stats and
    the cost governor; a chain's drafts carry the name of the link that proposed).
    """

    tokens: tuple[int, ...] = ()
    p_draft: torch.Tensor | None = field(default=None, compare=False)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.p_draft is not None and self.p_draft.shape[0] != len(self.tokens):
            raise ValueError("p_draft needs one row per drafted token")

    def __len__(self) -> int:
        return len(self.tokens)


NO_DRAFT = Draft()


class Drafter(Protocol):
    """Proposes the continuation of `context` (prompt + committed output token ids)."""

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """At most `k` tokens that likely follow `context`; an empty draft for "no proposal"."""
        ...

    def observe(self, n_accepted: int) -> None:
        """Feedback after each verify: how many of the last proposal's tokens the target accepted."""
        ...


@runtime_checkable
class CatchesUp(Protocol):
    """A drafter that must first read what was committed since it last proposed (a draft model on its own
    cache): `backlog` tokens before proposing on `context`; `caught_up` is what its last proposal read
    (tokens, seconds)."""

    caught_up: tuple[int, float]

    def backlog(self, context: Sequence[int]) -> int: ...


class NoDrafter:
    """Never proposes: the loop degenerates to plain decoding, one token per target forward."""

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return NO_DRAFT

    def observe(self, n_accepted: int) -> None:
        pass
