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

Cache = Any  # a `KVCache` (for `model.decoder`'s models), or transformers' `DynamicCache` (for its own)


def new_cache(model: Any) -> Any:
    """An empty cache for `model`: a `KVCache` where the model makes its own (`model.decoder`, which needs
    nothing of transformers), else transformers' `DynamicCache`."""
    if hasattr(model, "new_cache"):
        return model.new_cache()
    from transformers import DynamicCache

    return DynamicCache()


class KVLayer:
    """One layer's keys and values: (1, H_kv, positions, D) each, None until the first update."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])

    def crop(self, keep: int) -> None:
        """Keep the first `keep` positions; a negative `keep` drops that many from the end (as
        transformers' `DynamicCache` layers do)."""
        if self.keys is None or self.values is None:
            return
        keep = keep if keep >= 0 else self.length() + keep
        self.keys, self.values = self.keys[..., :keep, :], self.values[..., :keep, :]


class KVCache:
    """The keys and values of every layer, grown a forward at a time: what `DynamicCache` does for the
    calls `model.decoder` and this module make (`update`, `get_seq_length`, `layers`), without
    transformers."""

    def __init__(self) -> None:
        self.layers: list[KVLayer] = []

    def get_seq_length(self, index: int = 0) -> int:
        return self.layers[index].length() if index < len(self.layers) else 0

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a forward's keys and values to layer `index`; returns all the layer holds."""
        while len(self.layers) <= index:
            self.layers.append(KVLayer())
        layer = self.layers[index]
        if layer.keys is None or layer.values is None:
            layer.keys, layer.values = keys, values
        else:
            layer.keys = torch.cat([layer.keys, keys], dim=-2)
            layer.values = torch.cat([layer.values, values], dim=-2)
        return layer.keys, layer.values


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
            cast(Any, layer).crop(-drop)  # `crop` is on the concrete (full-attention) layer class


def copy_prefix(cache: Cache, keep: int) -> Cache:
    """A new cache holding copies of the first `keep` positions of `cache` (left as it is)."""
    if length(cache) < keep:
        raise ValueError(f"cannot copy {keep} positions of a cache holding {length(cache)}")
    copy = type(cache)()
    for index, layer in enumerate(cache.layers):
        keys, values = cast(Any, layer).keys, cast(Any, layer).values
        copy.update(keys[..., :keep, :].clone(), values[..., :keep, :].clone(), index)
    return copy


def nbytes(cache: Cache) -> int:
    """The memory the cache's keys and values take (their storage: a cropped view still holds it all)."""
    total = 0
    for layer in cache.layers:
        for states in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(states, torch.Tensor):
                total += states.untyped_storage().nbytes()
    return total


def compact(cache: Cache) -> None:
    """Copy each layer's keys and values into storage of their own size: after a rollback they are views
    of the longer tensors they were cropped from, which a kept cache would otherwise hold on to."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            states = getattr(layer, name, None)
            if isinstance(states, torch.Tensor) and states.untyped_storage().nbytes() > states.nbytes:
                setattr(layer, name, states.clone())
