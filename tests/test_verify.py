"""`verify` in isolation: greedy rules, and that speculative sampling is lossless (a statistical test)."""

from __future__ import annotations

import doctest
import itertools
import math

import pytest
import torch

import specedit.engine.loop.verify as verify_module
from specedit.drafters.base import Draft
from specedit.engine.loop.verify import Verdict, verify
from specedit.engine.model.sampling import SamplingConfig, draw_token, target_probs


def test_docstring_examples() -> None:
    assert doctest.testmod(verify_module).failed == 0


def test_greedy_rejects_at_first_mismatch_and_the_bonus_is_the_argmax() -> None:
    logits = torch.eye(4)[[2, 3, 1, 0, 2]] * 5  # argmax per row: 2, 3, 1, 0, 2
    assert verify(Draft((2, 3, 1, 0)), logits, SamplingConfig(), 0) == Verdict(4, 2)
    assert verify(Draft((2, 3, 0, 0)), logits, SamplingConfig(), 0) == Verdict(2, 1)
    assert verify(Draft((1, 3, 1, 0)), logits, SamplingConfig(), 0) == Verdict(0, 2)


def test_verify_needs_one_more_row_than_the_draft() -> None:
    with pytest.raises(ValueError, match="rows"):
        verify(Draft((1, 2)), torch.zeros(2, 4), SamplingConfig(), 0)


def test_top_p_keeps_the_nucleus_only() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = target_probs(logits, SamplingConfig(temperature=1.0, top_p=0.75))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # The top token always stays, however small top_p is.
    assert target_probs(logits, SamplingConfig(temperature=1.0, top_p=0.01))[0, 0] == 1.0


# --- Lossless sampling ------------------------------------------------------------------------------
# A two-token "model" with conditional tables: p_target(x1), p_target(x2 | x1), and a draft model
# q(x1), q(x2 | x1) that disagrees with it. One speculative step drafts d1, d2 from q, verifies, and
# (when fewer than two tokens were committed) samples the rest from the target, as the next step would.
# The committed (x1, x2) must follow p_target(x1) p_target(x2 | x1) exactly.

V = 5
SAMPLES = 5_000
# Chi-square critical value for V*V - 1 = 24 degrees of freedom at p = 1e-4: a correct rule fails this
# test once in ten thousand seeds; the seeds are fixed, so the test is deterministic.
CHI2_CRITICAL = 52.6


def _tables(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    p1 = torch.softmax(torch.randn(V, generator=generator, dtype=torch.float64) * 1.5, -1)
    p2 = torch.softmax(torch.randn(V, V, generator=generator, dtype=torch.float64) * 1.5, -1)
    q1 = torch.softmax(torch.randn(V, generator=generator, dtype=torch.float64) * 1.5, -1)
    q2 = torch.softmax(torch.randn(V, V, generator=generator, dtype=torch.float64) * 1.5, -1)
    return p1, p2, q1, q2


def _sample_pairs(verifier: object, *, stochastic: bool, seed: int = 0) -> torch.Tensor:
    p1, p2, q1, q2 = _tables(seed)
    counts = torch.zeros(V, V, dtype=torch.float64)
    sampling = SamplingConfig(temperature=1.0)
    for trial in range(SAMPLES):
        salt = 1_000_003 * (trial + 1)
        if stochastic:
            d1 = draw_token(q1, seed, salt, stream=7)
            d2 = draw_token(q2[d1], seed, salt, stream=8)
            p_draft = torch.stack([q1, q2[d1]])
        else:  # a deterministic draft: always the same two tokens
            d1, d2, p_draft = 0, 1, None
        # Row i: the target's prediction for draft position i; the last row follows the whole draft
        # (the third token's table does not matter here: use p1).
        logits = torch.log(torch.stack([p1, p2[d1], p1]))
        sampling = SamplingConfig(temperature=1.0, seed=trial)
        verdict = verifier(Draft((d1, d2), p_draft), logits, sampling, 0)  # type: ignore[operator]
        committed = [*[d1, d2][: verdict.n_accepted], verdict.bonus]
        if len(committed) == 1:
            committed.append(draw_token(p2[committed[0]], seed, salt, stream=9))
        counts[committed[0], committed[1]] += 1
    return counts


def _chi2(counts: torch.Tensor, seed: int = 0) -> float:
    p1, p2, _, _ = _tables(seed)
    expected = (p1[:, None] * p2) * SAMPLES
    return float(((counts - expected) ** 2 / expected).sum())


def test_stochastic_draft_rule_is_lossless() -> None:
    assert _chi2(_sample_pairs(verify, stochastic=True)) < CHI2_CRITICAL


def test_deterministic_draft_rule_is_lossless() -> None:
    assert _chi2(_sample_pairs(verify, stochastic=False)) < CHI2_CRITICAL


def _accept_with_target_probability_only(
    draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, position: int
) -> Verdict:
    """A plausible but wrong rule: accept a stochastic draft token with probability p_target(d),
    ignoring p_draft, and on rejection sample from the target unchanged."""
    probs = target_probs(logits, sampling)
    generator = torch.Generator().manual_seed(sampling.seed)
    for i, token in enumerate(draft.tokens):
        if torch.rand((), generator=generator, dtype=torch.float64) >= probs[i, token]:
            return Verdict(i, int(torch.multinomial(probs[i], 1, generator=generator)))
    return Verdict(len(draft), int(torch.multinomial(probs[len(draft)], 1, generator=generator)))


def test_a_wrong_rule_fails_the_same_test() -> None:
    """The test has power: a subtly wrong acceptance rule is caught by a wide margin."""
    assert _chi2(_sample_pairs(_accept_with_target_probability_only, stochastic=True)) > 3 * CHI2_CRITICAL


def test_exact_distribution_is_a_distribution() -> None:
    p1, p2, _, _ = _tables(0)
    total = sum(float(p1[a] * p2[a, b]) for a, b in itertools.product(range(V), range(V)))
    assert math.isclose(total, 1.0)
