"""How many positions a KV cache holds, and dropping the last ones: for every kind of cache the loop meets
(`kv_cache.KVCache`, transformers' `DynamicCache`, `torchless.TorchlessCache`), without importing torch, so
that a target run without it (`model.torchless`) goes through the same loop. `kv_cache` says why the loop
crops where it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class CacheLayer(Protocol):
    def crop(self, keep: int, /) -> None:
        """Keep the first `keep` positions; a negative `keep` drops that many from the end."""
        ...


class Cache(Protocol):
    """A KV cache as the loop measures and crops it: a `KVCache` (for `model.decoder`'s models),
    transformers' `DynamicCache` (for its own), a `TorchlessCache`."""

    @property
    def layers(self) -> Sequence[CacheLayer]: ...

    def get_seq_length(self, index: int = 0, /) -> int: ...


def length(cache: Cache) -> int:
    """Number of positions whose keys and values the cache holds (in its first layer)."""
    return int(cache.get_seq_length())


def layer_lengths(cache: Cache) -> list[int]:
    """Positions held by each layer; all equal except while a layer-skip draft is in flight."""
    return [int(cache.get_seq_length(index)) for index in range(len(cache.layers))]


def rollback(cache: Cache, keep: int) -> None:
    """Drop every position at or after `keep`, in every layer (transformers 5: `crop(-n)` drops the last n)."""
    if length(cache) < keep:
        raise ValueError(f"cannot keep {keep} positions of a cache holding {length(cache)}")
    for index, layer in enumerate(cache.layers):
        drop = int(cache.get_seq_length(index)) - keep
        if drop > 0:
            layer.crop(-drop)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens `a` and `b` share, at most `limit`."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if count >= limit or x != y:
            break
        count += 1
    return count


def held_after_crop(held: int, keep: int) -> int:
    """The positions a layer holding `held` keeps when cropped to `keep`; a negative `keep` drops that many
    from the end (as transformers' `DynamicCache` layers do)."""
    return min(held, max(0, keep if keep >= 0 else held + keep))


def whole_buckets(positions: int, bucket: int) -> int:
    """`positions` rounded up to whole buckets of `bucket` (the attention's key lengths: `kv_cache.KVLayer`)."""
    return -(-positions // bucket) * bucket
