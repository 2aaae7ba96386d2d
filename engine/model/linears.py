"""The linear layers of a model, and swapping them for other implementations (packed, quantized) and back.

`invariant.pack_linears` and `quantized.quantize_linears` replace the layers, each with its own class;
both walk the model the same way, here. Only torch: the modules that import this one import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def linear_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """A linear layer's weight as (out, in): `nn.Linear`'s own, GPT-2's `Conv1D` (y = x @ W + b, W: (in,
    out)) transposed; None for any other module."""
    if isinstance(module, torch.nn.Linear):
        return module.weight
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor):  # transformers' GPT-2 layer
        return weight.t()
    return None


def linear_bias(module: torch.nn.Module) -> torch.Tensor | None:
    """A linear layer's bias (`nn.Linear`'s or `Conv1D`'s), or None."""
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are (`device`, as transformers' models and `decoder.Decoder` say it)."""
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def children(model: torch.nn.Module) -> Iterator[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Every (parent, name, child) of the model, listed before any is replaced."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            yield parent, name, child


def replace_modules(model: torch.nn.Module, replacement: Callable[[torch.nn.Module], torch.nn.Module | None]) -> int:
    """Each module for which `replacement` gives another is replaced by it; returns how many were."""
    replaced = 0
    for parent, name, child in list(children(model)):
        new = replacement(child)
        if new is not None:
            setattr(parent, name, new)
            replaced += 1
    return replaced
