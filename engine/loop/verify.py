"""`verify`: which drafted tokens the target keeps, and the token it adds. Pure: no model, no cache.

Glossary (vLLM's rejection sampler uses the same words):
- *draft*: the k proposed tokens d_1..d_k.
- *accepted*: the longest prefix d_1..d_n of the draft the target keeps.
- *bonus*: the token the target adds after the accepted prefix: its correction when d_{n+1} was rejected,
  or one more token when the whole draft was accepted. Every verification commits n + 1 tokens.
- `target_logits` row i is the target's prediction for the position of d_{i+1}; row k, after the whole
  draft, is where a bonus after a fully accepted draft comes from. So it has k + 1 rows.

Rules (lossless: the committed tokens follow the target's own distribution):
- Greedy: accept while d_i equals the target's argmax; the bonus is the argmax at the first mismatch.
- Sampling, deterministic draft (`p_draft is None`: copy drafts, greedy draft models): sample from the
  target at each position and accept while the sample equals the draft; the first sample that differs is
  the bonus. Each committed token is exactly the target's sample, so this is plain sampling; it equals
  accepting d with probability p_target(d), else sampling from p_target with d removed.
- Sampling, stochastic draft: Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023, Algorithm 2): accept
  d_i with probability min(1, p_target(d_i) / p_draft(d_i)); on rejection the bonus comes from
  norm(max(0, p_target - p_draft)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specedit.drafters.base import Draft
from specedit.engine.records.requests import SamplingConfig

if TYPE_CHECKING:  # torch only where sampling draws (a greedy target may run without it: `model.torchless`)
    import torch

    from specedit.engine.model.protocols import Logits


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    bonus: int


def verify(draft: Draft, target_logits: Logits, sampling: SamplingConfig, position: int) -> Verdict:
    """Verify `draft` against the target's (k + 1, V) logits.

    `position` is the output index of the first drafted token; random draws are keyed by it, so plain
    and speculative sampling with one seed draw the same numbers at the same place.

    >>> import torch
    >>> logits = torch.tensor([[0., 9., 0.], [0., 0., 9.], [9., 0., 0.]])  # argmax 1, 2, 0
    >>> verify(Draft((1, 2)), logits, SamplingConfig(), position=0)
    Verdict(n_accepted=2, bonus=0)
    >>> verify(Draft((1, 1)), logits, SamplingConfig(), position=0)  # d_2 rejected, the target says 2
    Verdict(n_accepted=1, bonus=2)
    >>> verify(Draft(), logits[:1], SamplingConfig(), position=0)  # no draft: plain decoding
    Verdict(n_accepted=0, bonus=1)
    """
    k = len(draft)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} rows of target logits for a draft of {k}, got {target_logits.shape[0]}")
    if sampling.greedy:
        return _verify_greedy(draft.tokens, target_logits)
    import torch  # (draws on torch's generators; a target run without torch hands numpy's logits: the same values)

    from specedit.engine.model.sampling import target_probs

    probs = target_probs(torch.as_tensor(target_logits), sampling)  # (k + 1, V)
    if draft.p_draft is None:
        return _verify_deterministic(draft.tokens, probs, sampling.seed, position)
    return _verify_stochastic(draft.tokens, probs, draft.p_draft, sampling.seed, position)


def _verify_greedy(tokens: tuple[int, ...], target_logits: Logits) -> Verdict:
    argmax = target_logits.argmax(-1).tolist()  # (k + 1,); (numpy's too: `model.torchless`)
    n = 0
    while n < len(tokens) and tokens[n] == argmax[n]:
        n += 1
    return Verdict(n, int(argmax[n]))


def _verify_deterministic(tokens: tuple[int, ...], probs: torch.Tensor, seed: int, position: int) -> Verdict:
    from specedit.engine.model.sampling import draw_token

    for i, token in enumerate(tokens):
        sample = draw_token(probs[i], seed, position + i)
        if sample != token:
            return Verdict(i, sample)
    return Verdict(len(tokens), draw_token(probs[len(tokens)], seed, position + len(tokens)))


def _verify_stochastic(
    tokens: tuple[int, ...], probs: torch.Tensor, p_draft: torch.Tensor, seed: int, position: int
) -> Verdict:
    import torch

    from specedit.engine.model.sampling import RESIDUAL_STREAM, draw_token, draw_uniform

    p_draft = p_draft.to(probs.dtype)
    if p_draft.shape[-1] != probs.shape[-1]:  # a draft model whose embedding is padded differently
        width = probs.shape[-1]
        p_draft = torch.nn.functional.pad(p_draft[:, :width], (0, max(0, width - p_draft.shape[-1])))
    for i, token in enumerate(tokens):
        p_t, p_d = float(probs[i, token]), float(p_draft[i, token])
        if p_d > 0.0 and draw_uniform(seed, position + i) < min(1.0, p_t / p_d):
            continue
        residual = (probs[i] - p_draft[i]).clamp_min(0.0)
        total = float(residual.sum())
        # The residual is empty only when p_target == p_draft, where rejection has probability 0.
        residual = residual / total if total > 0.0 else probs[i]
        return Verdict(i, draw_token(residual, seed, position + i, RESIDUAL_STREAM))
    return Verdict(len(tokens), draw_token(probs[len(tokens)], seed, position + len(tokens)))
