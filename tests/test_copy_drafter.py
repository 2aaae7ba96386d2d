"""The copy drafter: worked examples, the engine's view in a simulation, and properties (no models)."""

from __future__ import annotations

import doctest
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specedit.drafters import copy_drafter
from specedit.drafters.base import NO_DRAFT
from specedit.drafters.copy_drafter import (
    Anchor,
    CopyDrafter,
    CopyDrafterConfig,
    SourceIndex,
    find_anchor,
)

PROMPT = (99_999, 99_998)  # token ids that never occur in a source or target below


# --- the engine's role -------------------------------------------------------------------------------


@dataclass
class Proposal:
    k: int
    pointer: int  # the drafter's pointer when it proposed: the draft must be source[pointer:...]
    tokens: tuple[int, ...]


@dataclass
class Run:
    steps: int = 0  # target forwards
    proposals: list[Proposal] = field(default_factory=list)
    output: list[int] = field(default_factory=list)


def simulate(
    source: Sequence[int],
    target: Sequence[int],
    config: CopyDrafterConfig | None = None,
    max_k: int = 64,
    ks: Sequence[int] = (),
) -> Run:
    """Play the engine with greedy verification: the target model's output is `target`.

    Each step: propose (k: at most `max_k`, or `ks[step]` cycled, and never past the budget, since
    the bonus takes one slot; no proposal at all when k is 0), accept the longest prefix of the
    draft that agrees with `target`, commit it and the bonus (the next target token), give feedback.
    """
    context = list(PROMPT)
    drafter = CopyDrafter(source, output_start=len(PROMPT), config=config)
    run = Run()
    while (budget := len(target) - (len(context) - len(PROMPT))) > 0:
        k = min(ks[run.steps % len(ks)] if ks else max_k, budget - 1)
        if k > 0:
            draft = drafter.propose(context, k).tokens
            run.proposals.append(Proposal(k, drafter.pointer, draft))
        else:
            draft = ()
        out = len(context) - len(PROMPT)
        n = 0
        while n < len(draft) and out + n < len(target) and draft[n] == target[out + n]:
            n += 1
        context += target[out : out + n + 1]  # the accepted tokens and the bonus
        drafter.observe(n)
        run.steps += 1
    run.output = context[len(PROMPT) :]
    return run


# --- worked examples ---------------------------------------------------------------------------------


def test_docstring_examples() -> None:
    """The worked examples in the module (pure copy, insertion, deletion, replaced line, repeated line,
    end of the original, and `find_anchor`'s) are the first unit tests."""
    result = doctest.testmod(copy_drafter, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 20
    assert result.failed == 0


@pytest.mark.parametrize(
    ("name", "source", "target", "expected"),
    [
        ("pure copy", [1, 2, 0, 3, 4, 0], [1, 2, 0, 3, 4, 0], [(1, 2, 0, 3, 4)]),
        ("insertion", [1, 2, 0, 3, 4, 0], [1, 2, 0, 7, 8, 0, 3, 4, 0], [(1, 2, 0, 3, 4, 0), (), (), (3, 4)]),
        ("deletion", [1, 2, 0, 5, 6, 0, 3, 4, 0], [1, 2, 0, 3, 4, 0], [(1, 2, 0, 5, 6), (4,)]),
        (
            "replaced line",
            [1, 2, 0, 5, 6, 0, 3, 4, 0],
            [1, 2, 0, 5, 7, 0, 3, 4, 0],
            [(1, 2, 0, 5, 6, 0, 3, 4), (), (3, 4)],
        ),
        (
            "repeated line",
            [1, 0, 3, 4, 0, 5, 0, 3, 4, 0, 6, 0],
            [1, 0, 3, 4, 0, 3, 4, 0, 6, 0],
            [(1, 0, 3, 4, 0, 5, 0, 3, 4), (4, 0, 6)],
        ),
        ("end of the original", [1, 2, 0], [1, 2, 0, 9, 9, 9], [(1, 2, 0), ()]),
    ],
)
def test_worked_examples_through_the_engine(
    name: str, source: list[int], target: list[int], expected: list[tuple[int, ...]]
) -> None:
    """The same examples as the docstring, as the engine plays them (k capped by the budget)."""
    run = simulate(source, target)
    assert run.output == target
    assert [p.tokens for p in run.proposals] == expected, name


def test_find_anchor_prefers_the_copy_after_the_pointer_even_beyond_the_window() -> None:
    line = [11, 12, 13, 14, 0]
    source = [50, *line, *range(100, 200), *line, 5, 0]
    index = SourceIndex(source, key_length=4)
    first_copy, second_copy = 1 + len(line), len(source) - 2
    # Two equally long matches: the one at or after the pointer wins, though far beyond the window.
    assert find_anchor(index, [7, *line], pointer=10, window=8) == Anchor(second_copy, 5)
    # With the pointer past both copies, the nearest one behind it.
    assert find_anchor(index, [7, *line], pointer=len(source), window=8) == Anchor(second_copy, 5)
    # A longer match wins wherever it is: the first copy also matches the `50` before it.
    assert find_anchor(index, [50, *line], pointer=10, window=8) == Anchor(first_copy, 6)


def test_find_anchor_trusts_short_matches_only_near_the_pointer() -> None:
    source = [1, 2, 3, *range(100, 140), 4, 5]
    index = SourceIndex(source, key_length=3)
    assert find_anchor(index, [9, 4], pointer=3, window=8) is None  # `4` is 40 tokens away
    assert find_anchor(index, [9, 4], pointer=3, window=64) == Anchor(44, 1)
    assert find_anchor(index, [9, 2], pointer=3, window=64) is None  # behind the pointer
    assert find_anchor(index, [9, 2], pointer=3, window=64, confirmed=0) == Anchor(2, 1)


def test_find_anchor_longest_match_wins_then_nearest() -> None:
    source = [5, 1, 0, 6, 1, 0, 7, 1, 0]
    index = SourceIndex(source, key_length=8)
    assert find_anchor(index, [1, 0], pointer=0, window=9) == Anchor(3, 2)
    assert find_anchor(index, [7, 1, 0], pointer=0, window=9) == Anchor(9, 3)


def test_a_deleted_block_longer_than_the_window_is_found_by_the_global_key() -> None:
    head, block, rest = list(range(1, 20)), list(range(100, 400)), list(range(500, 540))
    config = CopyDrafterConfig(window=16, global_key=4, initial_draft=64)  # the head in the first draft
    run = simulate([*head, *block, *rest], [*head, *rest], config)
    # After the deletion the output writes tokens of `rest` alone until 4 of them match anywhere.
    anchored = next(p for p in run.proposals[1:] if p.tokens)
    assert anchored.pointer == len(head) + len(block) + 4
    assert run.steps <= 8


def code_like_lines(n_lines: int, seed: int = 0) -> list[list[int]]:
    """Lines of code-like token ids: an indent, 2-10 tokens with Zipf-like frequencies (a few very
    common, as in code), a newline `0`; one line in ten repeats an earlier one (`return`, `}`, ...)."""
    rng = random.Random(seed)
    weights = [1 / rank for rank in range(1, 3001)]
    lines: list[list[int]] = []
    for _ in range(n_lines):
        if lines and rng.random() < 0.1:
            lines.append(list(rng.choice(lines)))
        else:
            body = rng.choices(range(200, 3200), weights, k=rng.randint(2, 10))
            lines.append([100 + rng.randrange(4), *body, 0])
    return lines


def _flat(lines: list[list[int]]) -> list[int]:
    return [token for line in lines for token in line]


LINES = code_like_lines(300)  # 2367 tokens
NEW_LINE = [101, 5001, 5002, 5003, 5004, 0]


@pytest.mark.parametrize(
    ("edit", "target_lines", "max_steps"),
    # max_steps: what the default config takes (38, 42, 45, 59, 40, 34, 52, with a first draft of 16),
    # plus ~10%. A pure copy takes the
    # least possible after the first draft's ramp (17 tokens, 35, then 65 a step): 2 + ceil(2315 / 65) =
    # 38; an edit costs its new tokens (one per forward) and a few steps to re-anchor.
    [
        ("pure copy", LINES, 38),
        ("one token changed", [*LINES[:150], [*LINES[150][:2], 5000, *LINES[150][3:]], *LINES[151:]], 45),
        ("replaced line", [*LINES[:150], NEW_LINE, *LINES[151:]], 48),
        ("inserted 3 lines", [*LINES[:150], NEW_LINE, NEW_LINE, NEW_LINE, *LINES[150:]], 62),
        ("deleted 3 lines", [*LINES[:150], *LINES[153:]], 43),
        ("deleted 60 lines", [*LINES[:100], *LINES[160:]], 36),
        ("moved 10 lines", [*LINES[:50], *LINES[200:210], *LINES[50:200], *LINES[210:]], 56),
    ],
)
def test_edit_scenarios_on_code_like_tokens(edit: str, target_lines: list[list[int]], max_steps: int) -> None:
    target = _flat(target_lines)
    run = simulate(_flat(LINES), target)
    assert run.output == target
    assert run.steps <= max_steps, edit


# --- the drafter's contract --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"max_draft": 0},
        {"initial_draft": 0},
        {"initial_draft": 65},
        {"run_gain": 0},
        {"global_key": 0},
        {"global_key": 65},
        {"history": 4},
        {"window": -1},
    ],
)
def test_config_rejects_nonsense(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        CopyDrafterConfig(**fields)


def test_observe_checks_the_feedback() -> None:
    drafter = CopyDrafter([1, 2, 3], output_start=0)
    drafter.observe(0)  # after no proposal: the engine's budget-1 step
    assert drafter.propose([], k=2).tokens == (1, 2)
    with pytest.raises(ValueError):
        drafter.observe(3)
    drafter.observe(2)
    with pytest.raises(ValueError):
        drafter.observe(1)  # the feedback was already given


def test_k_caps_the_draft_and_k0_proposes_nothing() -> None:
    drafter = CopyDrafter(list(range(100)), output_start=0)
    assert drafter.propose([], k=0) == NO_DRAFT
    assert drafter.propose([], k=5).tokens == (0, 1, 2, 3, 4)


def test_the_context_may_not_shrink() -> None:
    drafter = CopyDrafter([1, 2, 3], output_start=1)
    drafter.propose([9, 1, 2], k=4)
    with pytest.raises(ValueError):
        drafter.propose([9, 1], k=4)


class TailOnlyContext(Sequence[int]):
    """A context that fails the test when read before `readable_from` (what was read before)."""

    def __init__(self, tokens: list[int], readable_from: int) -> None:
        self.tokens, self.readable_from = tokens, readable_from

    def __len__(self) -> int:
        return len(self.tokens)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        start = i.start if isinstance(i, slice) else i
        assert start is not None and start >= self.readable_from, f"read {i} of a long context"
        return self.tokens[i]


def test_each_call_reads_only_the_new_tokens() -> None:
    source = list(range(10_000))
    target = [*source[:5000], 77, 78, *source[5000:]]
    drafter = CopyDrafter(source, output_start=1)
    context, read_before = [99], 1
    while len(context) - 1 < len(target):
        draft = drafter.propose(TailOnlyContext(context, readable_from=read_before), k=64).tokens
        read_before = len(context)
        out = len(context) - 1
        n = 0
        while n < len(draft) and out + n < len(target) and draft[n] == target[out + n]:
            n += 1
        context += target[out : out + n + 1]
        drafter.observe(n)


def test_an_empty_source_never_proposes() -> None:
    run = simulate([], [1, 2, 3])
    assert run.output == [1, 2, 3]
    assert all(not p.tokens for p in run.proposals)


# --- properties --------------------------------------------------------------------------------------

sources = st.lists(st.integers(0, 40), min_size=1, max_size=400)


@st.composite
def configs(draw: st.DrawFn) -> CopyDrafterConfig:
    max_draft = draw(st.integers(1, 64))
    return CopyDrafterConfig(
        max_draft=max_draft,
        initial_draft=draw(st.integers(1, max_draft)),
        run_gain=draw(st.integers(1, 4)),
        global_key=draw(st.integers(1, 12)),
        window=draw(st.integers(0, 300)),
    )


@given(source=sources, target=st.lists(st.integers(50, 90), min_size=1, max_size=200), config=configs())
@settings(max_examples=150, deadline=None)
def test_never_proposes_when_the_output_has_no_match(
    source: list[int], target: list[int], config: CopyDrafterConfig
) -> None:
    """Only the first proposal (nothing written yet: the copy is assumed) is made; the target then
    writes every token itself."""
    run = simulate(source, target, config)
    assert all(not p.tokens for p in run.proposals[1:])
    assert run.steps == len(target)


@given(source=st.lists(st.integers(0, 5), min_size=1, max_size=3000), config=configs())
@settings(max_examples=150, deadline=None)
def test_a_pure_copy_takes_few_steps(source: list[int], config: CopyDrafterConfig) -> None:
    """The run (accepted tokens and bonuses), and with it the draft length, at least doubles each step
    until `max_draft`; then each step commits `max_draft + 1` tokens. Repetitive sources (few distinct
    tokens) change nothing: a copy run never searches."""
    run = simulate(source, source, config)
    ramp = math.ceil(math.log2(config.max_draft / config.initial_draft)) + 1
    assert run.steps <= ramp + math.ceil(len(source) / config.max_draft) + 1
    assert all(p.tokens for p in run.proposals)


@st.composite
def edited(draw: st.DrawFn, alphabet: int = 1000) -> tuple[list[int], list[int], int, int]:
    """A source, its edited version, the number of edits and the number of new tokens written."""
    source = draw(st.lists(st.integers(0, alphabet), min_size=1, max_size=600))
    target = list(source)
    n_edits = draw(st.integers(0, 3))
    new_tokens = 0
    for _ in range(n_edits):
        at = draw(st.integers(0, len(target)))
        deleted = draw(st.integers(0, 12))
        inserted = draw(st.lists(st.integers(0, alphabet), max_size=12))
        target[at : at + deleted] = inserted
        new_tokens += len(inserted)
    return source, target, n_edits, new_tokens


@given(case=edited(), config=configs(), ks=st.lists(st.integers(0, 80), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_proposals_are_slices_of_the_source_within_k(
    case: tuple[list[int], list[int], int, int], config: CopyDrafterConfig, ks: list[int]
) -> None:
    source, target, _, _ = case
    run = simulate(source, target, config, ks=ks)
    assert run.output == target
    for p in run.proposals:
        assert len(p.tokens) <= min(p.k, config.max_draft)
        assert p.tokens == tuple(source[p.pointer : p.pointer + len(p.tokens)])


@given(case=edited())
@settings(max_examples=200, deadline=None)
def test_few_edits_take_few_steps(case: tuple[list[int], list[int], int, int]) -> None:
    """Outside the edits the copy resumes: steps are about the new tokens (which the target writes one
    per forward) plus a few per edit to re-anchor and ramp up, plus the copy at ~64 tokens a step."""
    source, target, n_edits, new_tokens = case
    run = simulate(source, target)
    assert run.output == target
    assert run.steps <= new_tokens + 6 * n_edits + math.ceil(len(target) / 64) + 2
