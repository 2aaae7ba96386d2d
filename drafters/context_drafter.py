"""The context drafter: prompt lookup over everything written so far, the output included.

New code repeats itself: a second method shaped like the first, the same names, the closing lines of a
block. Where the last few tokens of the output appeared before (in the prompt or earlier in the output),
propose what followed them there (Saxena 2023, "prompt lookup decoding"; transformers'
`PromptLookupCandidateGenerator`). The copy drafter follows the original in order and covers the copied
part of a rewrite; this one covers repetition inside the new part, where the copy has nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specedit.drafters.base import NO_DRAFT, Draft


@dataclass(frozen=True)
class ContextDrafterConfig:
    """Built by keyword."""

    # Match the last `max_ngram` tokens, then shorter suffixes down to `min_ngram`. One-token matches are
    # mostly chance (a newline, a bracket); the cost governor cuts what does not pay anyway.
    max_ngram: int = 4
    min_ngram: int = 2
    # Repetition inside new code is short: a line or two. Longer drafts are cut by the governor when
    # they stop being accepted, and kept while they are.
    max_draft: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if self.max_draft < 1:
            raise ValueError("max_draft must be >= 1")


class ContextDrafter:
    """Proposes the continuation of the latest earlier occurrence of the context's last n tokens.

    An index maps every n-gram (n in min_ngram..max_ngram) to where its latest occurrence ends; each call
    adds only the n-grams that end at the tokens committed since the previous one.

    >>> drafter = ContextDrafter(ContextDrafterConfig(max_ngram=2, min_ngram=1))
    >>> drafter.propose([1, 2, 3, 4, 2, 3], k=3).tokens  # `2 3` appeared before, followed by `4 2 3`
    (4, 2, 3)
    >>> drafter.propose([1, 2, 3, 4, 2, 3, 9], k=3).tokens  # `9` never appeared before
    ()
    """

    def __init__(self, config: ContextDrafterConfig | None = None) -> None:
        self._config = config or ContextDrafterConfig()
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self._indexed_until = 0  # n-grams ending at positions < this are in the index

    def propose(self, context: Sequence[int], k: int) -> Draft:
        config = self._config
        if len(context) < self._indexed_until:
            raise ValueError("the context shrank: a drafter serves one generation")
        # Index the n-grams that end before the last token (the suffix itself must not match itself).
        for end in range(max(self._indexed_until, 1), len(context)):
            for n in range(config.min_ngram, min(config.max_ngram, end) + 1):
                self._ends[tuple(context[end - n : end])] = end
        self._indexed_until = max(self._indexed_until, len(context))
        length = min(k, config.max_draft)
        for n in range(min(config.max_ngram, len(context)), config.min_ngram - 1, -1):
            found = self._ends.get(tuple(context[len(context) - n :]))
            if found is not None:
                tokens = tuple(context[found : found + length])
                return Draft(tokens) if tokens else NO_DRAFT
        return NO_DRAFT

    def observe(self, n_accepted: int) -> None:
        pass  # the next `propose` reads what was committed
