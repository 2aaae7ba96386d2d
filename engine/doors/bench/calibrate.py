"""`specedit calibrate`: choose the layers the target drafts with (layer skip), on a sample of code.

Method (after Zhang et al. 2023, "Draft & Verify", which searches the skipped set by its effect on the
output; we rank layers one by one instead of running their Bayesian search, since every candidate costs
a forward over the sample here):
1. One full forward over the sample: the target's own next-token choices (its argmax at every position).
2. Every layer but the first, left out alone: how often the model still agrees with the target (its
   argmax, at every position). Layers whose absence changes the least are the cheapest to skip.
3. Candidates: leave out the 1, 2, 3, ... least important layers. For each, the measured agreement
   `alpha`, counted where the drafter is confident (top probability >= `p_min`: where it would draft),
   and the measured cost of a one-token draft forward relative to a full one, `c`, give the
   expected speed-up of drafting gamma tokens (Leviathan et al. 2023, eq. 1 and its cost model):
   (1 - alpha^(gamma + 1)) / ((1 - alpha) (gamma c + 1)), best gamma in 1..8.
4. The best candidate is saved next to the model (`specedit-layers.json`, see `drafters.fallback`), with
   what was measured.

The agreement is measured teacher-forced (the skipped model reads its own hidden states at every
position), while drafting reads the full model's keys and values for the committed text: the real
acceptance is usually a little higher. On a CPU a forward is not much cheaper without half its layers
(the output layer and the attention over the context stay), so the expected speed-up there is often
below 1: the file says so, and the cost governor switches layer skip off where it does not pay.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from specedit.drafters.model_drafter import decoder_layers, format_layers, parse_layers, skipping_layers
from specedit.engine.model import kv_cache
from specedit.engine.model.loading import LoadedModel

MAX_GAMMA = 8


@dataclass(frozen=True)
class Candidate:
    kept: str  # layer list, as `--draft layers:` takes it
    skipped: int
    acceptance: float  # agreement with the target where the drafter is confident
    confident: float  # share of positions where it is confident (would draft)
    cost: float  # one-token draft forward / one-token full forward
    expected_speedup: float
    draft_length: int  # the gamma that maximises the expected speed-up


def expected_speedup(acceptance: float, cost: float) -> tuple[float, int]:
    """Leviathan et al.'s expected speed-up of drafting gamma tokens, at its best gamma.

    >>> round(expected_speedup(0.8, 0.1)[0], 2)  # a cheap, good drafter
    2.47
    >>> expected_speedup(0.5, 0.6)[0] < 1.0  # half right at 60% of the cost: slower than plain
    True
    """
    best = (0.0, 1)
    for gamma in range(1, MAX_GAMMA + 1):
        # Expected tokens committed by one forward: 1 + alpha + ... + alpha^gamma.
        tokens = sum(acceptance**i for i in range(gamma + 1))
        best = max(best, (tokens / (gamma * cost + 1), gamma))
    return best


def calibrate(
    target: LoadedModel,
    sample_ids: Sequence[int],
    *,
    p_min: float = 0.5,
    on_progress: Callable[[str], None] | None = None,
) -> list[Candidate]:
    """Every candidate layer list, best first (see the module docstring)."""
    say = on_progress or (lambda _: None)
    model = target.model
    count = len(decoder_layers(model))
    if count < 2:
        raise ValueError("layer skip needs a model with at least two layers")
    ids = list(sample_ids)
    with torch.inference_mode():
        reference = _predictions(target, ids, ())[1]  # (T,) the target's argmax
        importance: list[tuple[float, int]] = []
        for layer in range(1, count):
            _, agree = _agreement(target, ids, (layer,), reference, 0.0)
            importance.append((agree, layer))
            say(f"without layer {layer}: agreement {agree:.3f}")
        full_cost = _forward_seconds(target, ids, ())
        order = [layer for _, layer in sorted(importance, reverse=True)]  # least important first
        candidates = []
        for skipped in range(1, count):  # keep at least layer 0
            left_out = tuple(sorted(order[:skipped]))
            confident, agree = _agreement(target, ids, left_out, reference, p_min)
            cost = _forward_seconds(target, ids, left_out) / full_cost
            speedup, gamma = expected_speedup(agree, cost)
            kept = [layer for layer in range(count) if layer not in left_out]
            candidates.append(
                Candidate(
                    format_layers(kept),
                    skipped,
                    round(agree, 4),
                    round(confident, 4),
                    round(cost, 4),
                    round(speedup, 4),
                    gamma,
                )
            )
            say(f"skip {skipped:2d}: agreement {agree:.3f}, cost {cost:.2f} -> expected {speedup:.2f}x")
    return sorted(candidates, key=lambda c: c.expected_speedup, reverse=True)


def calibration_record(
    target: LoadedModel, candidates: Sequence[Candidate], *, sample_tokens: int, p_min: float
) -> dict[str, object]:
    """What `specedit calibrate` saves next to the model: the best candidate's layers (what
    `--draft layers:auto` reads), what was measured for it, and every other candidate."""
    best = candidates[0]
    return {
        "layers": list(parse_layers(best.kept)),
        **asdict(best),
        "p_min": p_min,
        "sample_tokens": sample_tokens,
        "device": str(target.device),
        "dtype": target.dtype_name,
        "measured": time.strftime("%Y-%m-%d"),
        "candidates": [asdict(candidate) for candidate in candidates],
    }


def _predictions(target: LoadedModel, ids: list[int], skipped: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Top probability and argmax at every position, with `skipped` layers left out. (T,), (T,)"""
    with skipping_layers(target.model, skipped):
        logits = target.forward(ids, target.new_cache())  # (T, V)
    top, argmax = torch.softmax(logits.float(), dim=-1).max(dim=-1)
    return top, argmax


def _agreement(
    target: LoadedModel, ids: list[int], skipped: Sequence[int], reference: torch.Tensor, p_min: float
) -> tuple[float, float]:
    """(share of positions where the skipped model is confident, its agreement with the target there)."""
    top, argmax = _predictions(target, ids, skipped)
    confident = top >= p_min
    if not bool(confident.any()):
        return 0.0, 0.0
    agree = float((argmax[confident] == reference[confident]).float().mean())
    return float(confident.float().mean()), agree


def _forward_seconds(target: LoadedModel, ids: list[int], skipped: Sequence[int], repeats: int = 5) -> float:
    """Median time of a one-token forward after the sample, with `skipped` layers left out."""
    cache = target.new_cache()
    target.forward(ids[:-1], cache, logits_to_keep=1)
    times = []
    with skipping_layers(target.model, skipped):
        for _ in range(repeats + 1):
            start = time.perf_counter()
            target.forward(ids[-1:], cache, logits_to_keep=1)
            times.append(time.perf_counter() - start)
            kv_cache.rollback(cache, len(ids) - 1)
    return statistics.median(times[1:])  # the first is a warm-up
