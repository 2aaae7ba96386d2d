"""Sampling settings, the target distribution, and position-keyed random draws.

Every random draw is keyed by (seed, output position, stream), not by a running generator. Plain decoding
and speculative decoding with a deterministic draft then draw the very same numbers at the same position,
so with a fixed seed they sample the same text, token for token, not just the same distribution.
"""

from __future__ import annotations

import torch

from specedit.engine.records.requests import SamplingConfig

__all__ = ["DRAFT_STREAM", "SamplingConfig", "draw_token", "draw_uniform", "target_probs"]

# Streams of random numbers, so that different uses at one position never share a draw.
SAMPLE_STREAM = 0
ACCEPT_STREAM = 1
RESIDUAL_STREAM = 2
DRAFT_STREAM = 3  # a draft model sampling its own draft


def target_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Temperature, then nucleus (top-p) filtering, then softmax. (n, V) logits -> (n, V) probabilities."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits.to(dtype) / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the tokens ranked above it already hold top_p of the mass; the first stays.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _generator(seed: int, position: int, stream: int) -> torch.Generator:
    generator = torch.Generator()
    # A fixed odd-multiplier mix of the three keys into one 63-bit seed.
    generator.manual_seed((seed * 0x9E3779B1 + position * 0x85EBCA77 + stream * 0xC2B2AE3D) & (2**63 - 1))
    return generator


def draw_token(probs: torch.Tensor, seed: int, position: int, stream: int = SAMPLE_STREAM) -> int:
    """One token from a (V,) distribution, with the draw keyed by (seed, position, stream)."""
    return int(torch.multinomial(probs.cpu(), 1, generator=_generator(seed, position, stream)).item())


def draw_uniform(seed: int, position: int, stream: int = ACCEPT_STREAM) -> float:
    """One uniform number in [0, 1), keyed by (seed, position, stream)."""
    return float(torch.rand((), generator=_generator(seed, position, stream), dtype=torch.float64).item())
