"""The chain: the first drafter with a proposal drafts. Copy first, then the fallback, else plain decoding.

The copy drafter proposes where the output repeats the original; where it has nothing (an edit, new
text), the fallback (a draft model, or the target on a subset of its layers) proposes instead. Every
link reads the committed context itself on its next `propose`, so a link that sat out some steps
catches up then: the chain hands over without any bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence

from specedit.drafters.base import NO_DRAFT, Draft, Drafter


class ChainDrafter:
    """Asks `links` in order; the first non-empty proposal is the draft.

    >>> from specedit.drafters.copy_drafter import CopyDrafter
    >>> class Always:  # a fallback that always proposes token 7
    ...     def propose(self, context, k): return Draft((7,) * k, source="fallback")
    ...     def observe(self, n_accepted): pass
    >>> chain = ChainDrafter([CopyDrafter([1, 2, 3], output_start=1), Always()])
    >>> chain.propose([99], k=2).tokens  # the copy has a proposal
    (1, 2)
    >>> chain.observe(2)
    >>> chain.propose([99, 1, 2, 5], k=2).tokens  # 5 is new text: the copy has none
    (7, 7)
    """

    def __init__(self, links: Sequence[Drafter]) -> None:
        if not links:
            raise ValueError("a chain needs at least one drafter")
        self.links = tuple(links)
        self._asked: list[Drafter] = []  # links asked this step, in order; the last one proposed
        self._proposed = False

    def propose(self, context: Sequence[int], k: int) -> Draft:
        self._asked = []
        for link in self.links:
            self._asked.append(link)
            draft = link.propose(context, k)
            if draft.tokens:
                self._proposed = True
                return draft
        self._proposed = False
        return NO_DRAFT

    def observe(self, n_accepted: int) -> None:
        """The proposer hears how many of its tokens were accepted; the links before it, 0 of none."""
        for index, link in enumerate(self._asked):
            proposer = self._proposed and index == len(self._asked) - 1
            link.observe(n_accepted if proposer else 0)
        self._asked = []
