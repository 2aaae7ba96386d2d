"""The copy drafter: the original region is the draft.

A rewrite mostly copies the original, so the cheapest guess for the next tokens is "the original, from
where the output is now". The drafter keeps a *pointer* into the original's token ids (`source`) and
proposes `source[pointer : pointer + L]`:

- **In a copy run** the output's new tokens equal `source[pointer]`, `source[pointer + 1]`, ...: the
  pointer only advances, no search.
- **After a mismatch** (an edit) it *re-anchors*: it looks for where the end of the output appears in the
  source (`find_anchor`): short matches only in a window after the pointer, nearest first, like a diff;
  long matches anywhere, through an n-gram index built once. No match: no proposal, and the target writes
  the edit itself, one token per forward.
- **Draft length** L is `run_gain` times the *run*: how many of the latest output tokens agree with the
  source before the pointer. After a re-anchor the run is the match length, so a long match starts long
  and a chance match of one token starts short; each fully accepted draft (plus the bonus) adds to the
  run, so L grows ~3-fold per step, up to `max_draft`. No ramp from scratch after every re-anchor.

Where the lengths pay off, measured on the CPU here (Qwen2.5-Coder-0.5B bf16, 2 threads): one target
forward over k tokens costs 86 ms (k=1), 116 (8), 148 (16), 190 (32), 281 (64). A drafted token costs
~3 ms, a forward ~86 ms: long drafts are cheap when accepted, and a short wrong one costs next to nothing.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from specedit.drafters.base import NO_DRAFT, Draft


@dataclass(frozen=True)
class CopyDrafterConfig:
    """Draft lengths and matching thresholds of the copy drafter; built by keyword.

    The defaults were chosen on a simulation of the engine over 400 real edits of `shared/data/edits`
    (docs/drafting.md). The score was flat within the ranges tried: they are safe rather than finely tuned.
    """

    # The longest draft: inside a copy run nearly every token of it is accepted.
    max_draft: int = 64
    # The first draft, before any run: the first text waits for its forward, and a first line that changes
    # wastes it all (measured: 16 gives the first text 15-18% sooner than 64, docs/drafting.md).
    initial_draft: int = 16
    # Draft length per token of the agreeing run: more saves forwards after real anchors, and wastes more on
    # chance anchors inside new code (2 scored best).
    run_gain: int = 2
    # Matches this long are trusted anywhere in the source (a moved block, a deletion longer than `window`).
    global_key: int = 6
    # Shorter matches are trusted only this many tokens after the pointer (and back to the last confirmed
    # position, see `CopyDrafter`): 256 tokens are ~25 lines of code.
    window: int = 256
    # How many recent output tokens a suffix match compares: the longest match that counts, and the run
    # that confirms a position.
    history: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.initial_draft <= self.max_draft:
            raise ValueError("need 1 <= initial_draft <= max_draft")
        if self.run_gain < 1:
            raise ValueError("run_gain must be >= 1")
        if not 1 <= self.global_key <= self.history:
            raise ValueError("need 1 <= global_key <= history")
        if self.window < 0:
            raise ValueError("window must be >= 0")


@dataclass(frozen=True)
class Anchor:
    """Where the output continues in the source: `source[position]` is the next token to propose.

    `match_length` tokens of the output's end equal the source tokens just before `position`.
    """

    position: int
    match_length: int


class SourceIndex:
    """Where each token and each `key_length`-gram of `source` ends; built once, in O(len(source)).

    Positions are *ends*: `end` means the token or n-gram is `source[end - n : end]`, so an end is
    directly the position a copy would continue from. Lists are ascending.
    """

    def __init__(self, source: Sequence[int], key_length: int) -> None:
        self.source = tuple(source)
        self.key_length = key_length
        self._token_ends: dict[int, list[int]] = {}
        self._key_ends: dict[tuple[int, ...], list[int]] = {}
        for end in range(1, len(self.source) + 1):
            self._token_ends.setdefault(self.source[end - 1], []).append(end)
            if end >= key_length:
                self._key_ends.setdefault(self.source[end - key_length : end], []).append(end)

    def token_ends(self, token: int) -> list[int]:
        return self._token_ends.get(token, [])

    def key_ends(self, key: tuple[int, ...]) -> list[int]:
        return self._key_ends.get(key, [])


def suffix_match_length(source: Sequence[int], end: int, tail: Sequence[int]) -> int:
    """How many of the last tokens of `tail` equal the source tokens just before `end`.

    >>> suffix_match_length([1, 2, 3, 4], end=3, tail=[9, 2, 3])
    2
    """
    m = 0
    while m < len(tail) and m < end and source[end - 1 - m] == tail[-1 - m]:
        m += 1
    return m


def find_anchor(
    index: SourceIndex, tail: Sequence[int], pointer: int, window: int, confirmed: int | None = None
) -> Anchor | None:
    """The best place in the source to continue the output that ends with `tail`; None if none.

    `pointer` is where the output was in the source (where it stopped agreeing); `confirmed <= pointer`
    the last place known for sure (default: the pointer). Candidates, in order of preference on equal
    match length (nearest first, like a diff):
    1. near: any match (>= 1 token) ending in `[pointer, pointer + window]`, then in `[confirmed, pointer)`;
    2. far: matches of at least `index.key_length` tokens anywhere, at or after the pointer, then behind.
    The longest match wins: the longer the output already agrees with the source there, the longer it
    is likely to keep agreeing.

    Example: the line `1 2 0` appears twice; the output wrote a new line `7 0` and then `1 2 0` again.
    The second copy continues the output (its match also covers the `0` before it), not the first:

    >>> index = SourceIndex([1, 2, 0, 3, 4, 0, 1, 2, 0, 5, 0], key_length=3)
    >>> find_anchor(index, tail=[7, 0, 1, 2, 0], pointer=5, window=4)
    Anchor(position=9, match_length=4)

    A token never seen in the source has no anchor: the target writes the edit itself.

    >>> find_anchor(index, tail=[7, 8], pointer=5, window=4) is None
    True
    """
    best: Anchor | None = None
    near_start = pointer if confirmed is None else min(confirmed, pointer)
    for end in _candidate_ends(index, tail, near_start, pointer, pointer + window):
        m = suffix_match_length(index.source, end, tail)
        if best is None or m > best.match_length:
            best = Anchor(end, m)
            if m == len(tail):  # cannot be beaten, and later candidates lose ties
                break
    return best


def _candidate_ends(
    index: SourceIndex, tail: Sequence[int], near_start: int, pointer: int, near_stop: int
) -> Iterator[int]:
    """Ends of possible matches of `tail`, in order of preference on ties (see `find_anchor`)."""
    if not tail:
        return
    near = index.token_ends(tail[-1])
    split = bisect_left(near, pointer)
    yield from near[split : bisect_right(near, near_stop)]
    yield from reversed(near[bisect_left(near, near_start) : split])
    if len(tail) >= index.key_length:
        far = index.key_ends(tuple(tail[-index.key_length :]))
        split = bisect_left(far, pointer)
        yield from far[split:]
        yield from reversed(far[:split])


class CopyDrafter:
    """Drafts the continuation of the output from `source`, the token ids of the original region.

    `context` (what `propose` gets) is the prompt followed by the committed output; the output starts
    at `context[output_start]`. Each call reads only the tokens committed since the previous call.

    Worked examples: `0` is a newline, `99` the prompt; `step` plays the engine with greedy
    verification (accept the longest agreeing prefix, then the target's own bonus token) and shows each
    proposal. (`tests/test_copy_drafter.py` runs these examples.)

    >>> def step(drafter, context, target):
    ...     draft = drafter.propose(context, k=64).tokens
    ...     out = context[1:]
    ...     n = 0
    ...     while n < len(draft) and len(out) + n < len(target) and draft[n] == target[len(out) + n]:
    ...         n += 1
    ...     context += target[len(out) : len(out) + n + 1]  # the accepted tokens and the bonus
    ...     drafter.observe(n)
    ...     return draft

    A pure copy. The first draft is short here, to show the length follow the run: 3 tokens agree
    (2 accepted, then the bonus `0`), so the next draft is 2 * 3 = 6 tokens; then 2 * 10 = 20.

    >>> source = [1, 2, 0, 3, 4, 0, 5, 6, 0, 7, 8, 0, 9, 0]
    >>> drafter = CopyDrafter(source, output_start=1, config=CopyDrafterConfig(initial_draft=2))
    >>> context = [99]
    >>> [step(drafter, context, target=source) for _ in range(3)]
    [(1, 2), (3, 4, 0, 5, 6, 0), (8, 0, 9, 0)]
    >>> drafter.propose(context, k=64) == NO_DRAFT, drafter.pointer == len(source)  # at the end
    (True, True)

    An insertion: a new line `7 8 0` before `3 4 0`. The new tokens have no match, so no draft; the
    newline that ends the new line matches the newline just before the pointer (the insertion point).
    A one-token match is weak evidence: a 2-token draft.

    >>> source = [1, 2, 0, 3, 4, 0]
    >>> target = [1, 2, 0, 7, 8, 0, 3, 4, 0]
    >>> drafter, context = CopyDrafter(source, output_start=1), [99]
    >>> [step(drafter, context, target) for _ in range(4)]
    [(1, 2, 0, 3, 4, 0), (), (), (3, 4)]

    A deletion: the line `5 6 0` is gone. The output's `0 3` matches the source after the deleted line.

    >>> source = [1, 2, 0, 5, 6, 0, 3, 4, 0]
    >>> target = [1, 2, 0, 3, 4, 0]
    >>> drafter, context = CopyDrafter(source, output_start=1), [99]
    >>> [step(drafter, context, target) for _ in range(2)]
    [(1, 2, 0, 5, 6, 0, 3, 4, 0), (4, 0)]

    A replaced line: `5 6 0` becomes `5 7 0`. The `7` has no match; the nearest newline after the
    pointer is the end of the replaced line, so the copy resumes with the line after it. (Had the whole
    line been replaced, its newline would first match at the insertion point, as above: one wasted
    2-token draft, then `0 3` re-anchors after the replaced line.)

    >>> source = [1, 2, 0, 5, 6, 0, 3, 4, 0]
    >>> target = [1, 2, 0, 5, 7, 0, 3, 4, 0]
    >>> drafter, context = CopyDrafter(source, output_start=1), [99]
    >>> [step(drafter, context, target) for _ in range(3)]
    [(1, 2, 0, 5, 6, 0, 3, 4, 0), (), (3, 4)]

    A repeated line: `3 4 0` appears twice and the line `5 0` between the copies is deleted. After the
    first copy the output continues with the second one, not with the first (which is behind the pointer).

    >>> source = [1, 0, 3, 4, 0, 5, 0, 3, 4, 0, 6, 0]
    >>> target = [1, 0, 3, 4, 0, 3, 4, 0, 6, 0]
    >>> drafter, context = CopyDrafter(source, output_start=1), [99]
    >>> [step(drafter, context, target) for _ in range(2)]
    [(1, 0, 3, 4, 0, 5, 0, 3, 4, 0, 6, 0), (4, 0, 6, 0)]
    >>> drafter.pointer
    8

    The end of the original: the output goes on (a closing fence, `9`) but there is nothing to copy.

    >>> source = [1, 2, 0]
    >>> target = [1, 2, 0, 9]
    >>> drafter, context = CopyDrafter(source, output_start=1), [99]
    >>> [step(drafter, context, target) for _ in range(2)]
    [(1, 2, 0), ()]
    """

    def __init__(self, source: Sequence[int], output_start: int, config: CopyDrafterConfig | None = None):
        if output_start < 0:
            raise ValueError("output_start must be >= 0")
        self._config = config or CopyDrafterConfig()
        self._index = SourceIndex(source, self._config.global_key)
        self._source = self._index.source
        self._read_until = output_start  # context[:_read_until] has been read
        self._tail: deque[int] = deque(maxlen=self._config.history)  # the latest output tokens
        self._pointer = 0  # where the output is in the source
        self._in_sync = True
        # How many of the latest output tokens agree with the source just before the pointer: the
        # anchor's match, then every token copied since. It sets the draft length.
        self._run = 0
        # The pointer as of the last time the whole remembered tail (`history` tokens) agreed with the
        # source. Short matches are searched back to there: an anchor on a chance match of a few tokens
        # (even one that got some accepted) must not drag the search window past the real continuation.
        self._confirmed = 0
        self._last_draft = 0  # length of the last proposal, until its feedback arrives
        # The shortest match a re-anchor trusts. It doubles (up to `global_key`) with every draft the
        # target rejects outright and halves with every draft it takes from: in new text one-token matches
        # are chance (measured: drafting on each cost 6% over plain decoding on polyglot, docs/drafting.md).
        self._min_match = 1

    @property
    def pointer(self) -> int:
        """Index in `source` of the next token the output is expected to copy."""
        return self._pointer

    @property
    def in_sync(self) -> bool:
        """Whether the output agrees with the source at the pointer (False: lost, no proposals)."""
        return self._in_sync

    @property
    def draft_length(self) -> int:
        """Length of the next proposal, before the engine's cap `k`: `run_gain` times the run (0 while
        lost), as of the last `propose`."""
        if not self._tail:  # nothing written yet
            return self._config.initial_draft
        return min(self._config.run_gain * self._run, self._config.max_draft)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to `min(k, draft_length)` source tokens from the pointer; NO_DRAFT if lost or at the end."""
        self._read(context)
        if not self._in_sync:
            self._reanchor()
        tokens = self._source[self._pointer : self._pointer + min(k, self.draft_length)]
        if not self._in_sync or not tokens:
            self._last_draft = 0
            return NO_DRAFT
        self._last_draft = len(tokens)
        return Draft(tokens)

    def observe(self, n_accepted: int) -> None:
        """Check the feedback. The draft length needs none: the next `propose` reads the accepted tokens
        and the bonus from the context, the same way as tokens committed without a proposal."""
        if not 0 <= n_accepted <= self._last_draft:
            raise ValueError(f"{n_accepted} accepted of a {self._last_draft}-token draft")
        if self._last_draft:
            if n_accepted == 0:
                self._min_match = min(2 * self._min_match, self._config.global_key)
            else:
                self._min_match = max(1, self._min_match // 2)
        self._last_draft = 0

    def _read(self, context: Sequence[int]) -> None:
        """Advance the pointer over the output committed since the last call; note any mismatch."""
        if len(context) < self._read_until:
            raise ValueError("the context shrank: a drafter serves one generation")
        for token in context[self._read_until :]:
            self._tail.append(token)
            if self._in_sync and self._pointer < len(self._source) and self._source[self._pointer] == token:
                self._pointer += 1
                self._extend_run(1)
            else:  # an edit, or the end of the source: the pointer stays where the copy stopped
                self._in_sync = False
                self._run = 0
        self._read_until = len(context)

    def _reanchor(self) -> None:
        """Find where the output continues in the source; stay lost (no proposals) if nowhere."""
        tail = tuple(self._tail)
        anchor = find_anchor(self._index, tail, self._pointer, self._config.window, self._confirmed)
        if anchor is not None and anchor.match_length >= self._min_match:
            self._pointer = anchor.position
            self._in_sync = True
            self._extend_run(anchor.match_length)

    def _extend_run(self, n_tokens: int) -> None:
        self._run += n_tokens
        if self._run >= self._config.history:
            self._confirmed = self._pointer
