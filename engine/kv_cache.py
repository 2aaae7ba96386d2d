"""The one place that measures and crops KV caches (the target's and any draft model's).

The speculative loop keeps this invariant after every step: the cache holds the keys and values of every
committed token except the newest one, the *pending* token, whose keys and values are computed by the next
forward (it is the first input of that forward). So `length(cache) == committed_length - 1`, where the
committed length counts prompt and output. A rejected draft token is simply cropped away.
"""

from __future__ import annotations

from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


def length(cache: DynamicCache) -> int:
    """Number of positions whose keys and values the cache holds."""
    return int(cache.get_seq_length())


def rollback(cache: DynamicCache, keep: int) -> None:
    """Drop every position at or after `keep` (transformers 5: `crop(-n)` drops the last n positions)."""
    drop = length(cache) - keep
    if drop < 0:
        raise ValueError(f"cannot keep {keep} positions of a cache holding {length(cache)}")
    if drop:
        cache.crop(-drop)
