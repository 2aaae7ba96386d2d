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
