"""The one place that measures and crops KV caches (the target's and any draft model's).

The speculative loop keeps this invariant after every step: the cache holds the keys and values of every
committed token except the newest one, the *pending* token, whose keys and values are computed by the next
forward (it is the first input of that forward). So `length(cache) == committed_length - 1`, where the
committed length counts prompt and output. A rejected draft token is simply cropped away.

Layer-skip drafting runs the target with some layers left out, on the target's own cache: the layers it
runs grow by the drafted tokens and the others do not, so `rollback` crops every layer on its own.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


def length(cache: DynamicCache) -> int:
    """Number of positions whose keys and values the cache holds (in its first layer)."""
    return int(cache.get_seq_length())


def layer_lengths(cache: DynamicCache) -> list[int]:
    """Positions held by each layer; all equal except while a layer-skip draft is in flight."""
    return [int(cache.get_seq_length(index)) for index in range(len(cache.layers))]


def rollback(cache: DynamicCache, keep: int) -> None:
    """Drop every position at or after `keep`, in every layer (transformers 5: `crop(-n)` drops the last n)."""
    if length(cache) < keep:
        raise ValueError(f"cannot keep {keep} positions of a cache holding {length(cache)}")
    for index, layer in enumerate(cache.layers):
        drop = int(cache.get_seq_length(index)) - keep
        if drop > 0:
            cast(Any, layer).crop(-drop)  # `crop` is on the concrete (full-attention) layer class


def copy_prefix(cache: DynamicCache, keep: int) -> DynamicCache:
    """A new cache holding copies of the first `keep` positions of `cache` (left as it is)."""
    if length(cache) < keep:
        raise ValueError(f"cannot copy {keep} positions of a cache holding {length(cache)}")
    copy = new_cache()
    for index, layer in enumerate(cache.layers):
        keys, values = cast(Any, layer).keys, cast(Any, layer).values
        copy.update(keys[..., :keep, :].clone(), values[..., :keep, :].clone(), index)
    return copy


def nbytes(cache: DynamicCache) -> int:
    """The memory the cache's keys and values take (their storage: a cropped view still holds it all)."""
    total = 0
    for layer in cache.layers:
        for states in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(states, torch.Tensor):
                total += states.untyped_storage().nbytes()
    return total


def compact(cache: DynamicCache) -> None:
    """Copy each layer's keys and values into storage of their own size: after a rollback they are views
    of the longer tensors they were cropped from, which a kept cache would otherwise hold on to."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            states = getattr(layer, name, None)
            if isinstance(states, torch.Tensor) and states.untyped_storage().nbytes() > states.nbytes:
                setattr(layer, name, states.clone())
