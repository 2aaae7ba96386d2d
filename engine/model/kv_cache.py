"""KV caches: `model.decoder`'s own (`KVCache`), measuring and cropping any (the target's and any draft
model's: `length`, `rollback`, from `kv_positions`, which imports no torch), and writing one to a file and
reading it back (the prompts' shared start, kept across starts: `PrefixCache.keep_head`).

The speculative loop keeps this invariant after every step: the cache holds the keys and values of every
committed token except the newest one, the *pending* token, whose keys and values are computed by the next
forward (it is the first input of that forward). So `length(cache) == committed_length - 1`, where the
committed length counts prompt and output. A rejected draft token is simply cropped away.

Layer-skip drafting runs the target with some layers left out, on the target's own cache: the layers it
runs grow by the drafted tokens and the others do not, so `rollback` crops every layer on its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, cast, runtime_checkable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specedit.engine.model.invariant import KV_BUCKET
from specedit.engine.model.kv_positions import Cache as Cache
from specedit.engine.model.kv_positions import held_after_crop, whole_buckets
from specedit.engine.model.kv_positions import layer_lengths as layer_lengths
from specedit.engine.model.kv_positions import length as length
from specedit.engine.model.kv_positions import rollback as rollback


class TensorCache(Cache, Protocol):
    """A cache of torch's tensors (a `KVCache`, transformers' `DynamicCache`): what a forward writes."""

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int, /) -> tuple[torch.Tensor, torch.Tensor]: ...


class TensorLayer(Protocol):
    @property
    def keys(self) -> torch.Tensor | None: ...

    @property
    def values(self) -> torch.Tensor | None: ...


@runtime_checkable
class MakesCache(Protocol):
    def new_cache(self) -> TensorCache: ...


def new_cache(model: torch.nn.Module) -> TensorCache:
    """An empty cache for `model`: a `KVCache` where the model makes its own (`model.decoder`, which needs
    nothing of transformers), else transformers' `DynamicCache`."""
    if isinstance(model, MakesCache):
        return model.new_cache()
    from transformers import DynamicCache

    return cast(TensorCache, DynamicCache())  # (its layers' `crop` is on their concrete classes)


class KVLayer:
    """One layer's keys and values in a buffer of (1, H_kv, capacity, D) each, grown in whole buckets of the
    attention's key lengths (`invariant.KV_BUCKET`) and zeros past the positions it holds: the attention
    reads the keys of a bucket as a view, where it would otherwise copy them padded with zeros. `dtype`: the
    buffers' (the keys and values rounded to it as they are added), else the first keys'."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[..., : self._length, :]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[..., : self._length, :]

    def length(self) -> int:
        return self._length

    @torch.inference_mode()  # the buffers are inference tensors when a forward made them: written as such
    def crop(self, keep: int) -> None:
        """Keep the first `keep` positions; a negative `keep` drops that many from the end (as transformers'
        `DynamicCache` layers do). The dropped ones are zeroed."""
        keep = held_after_crop(self._length, keep)
        if self._keys is not None and self._values is not None:
            self._keys[..., keep : self._length, :] = 0
            self._values[..., keep : self._length, :] = 0
        self._length = keep

    @torch.inference_mode()
    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add a forward's keys and values; returns the buffers up to the end of the bucket the last
        position falls in (zeros past the positions held)."""
        start = self._length
        held_keys, held_values = self.reserve(keys.shape[-2], keys)
        held_keys[..., start : self._length, :] = keys
        held_values[..., start : self._length, :] = values
        return held_keys, held_values

    def reserve(self, count: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for `count` more positions, counted as held from now on: the buffers up to the end of the bucket
        the last one falls in, for the forward to write its keys and values into at the length before this
        call (`specedit::decoder_layer` does, in `model.decoder`). `like`: keys shaped as the buffers are but
        for any number of positions, in the activations' dtype (the buffers' where `dtype` is None)."""
        end = self._length + count
        if self._keys is None or self._values is None or self._keys.shape[-2] < end:
            with torch.inference_mode():
                self._resize(_buckets(end) + SPARE_POSITIONS, like)
        assert self._keys is not None and self._values is not None
        self._length = end
        bucket = _buckets(end)
        return self._keys[..., :bucket, :], self._values[..., :bucket, :]

    @torch.inference_mode()
    def compact(self) -> None:
        """The buffers cut to the bucket holding the last position (a kept cache's spare room freed)."""
        if self._keys is not None and self._keys.shape[-2] > _buckets(self._length):
            self._resize(_buckets(self._length), self._keys)

    def _resize(self, capacity: int, like: torch.Tensor) -> None:
        shape = (*like.shape[:-2], capacity, like.shape[-1])
        keys, values = (like.new_zeros(shape, dtype=self.dtype or like.dtype) for _ in range(2))
        if self._keys is not None and self._values is not None:
            keys[..., : self._length, :] = self._keys[..., : self._length, :]
            values[..., : self._length, :] = self._values[..., : self._length, :]
        self._keys, self._values = keys, values


SPARE_POSITIONS = 4 * KV_BUCKET  # room to grow into before the buffers are copied into larger ones


def _buckets(positions: int) -> int:
    """`positions` rounded up to whole attention buckets."""
    return whole_buckets(positions, KV_BUCKET)


class KVCache:
    """The keys and values of every layer (`KVLayer`), for `model.decoder`'s models: what `DynamicCache`
    does for the calls the decoder and this module make (`update`, `get_seq_length`, `layers`), without
    transformers, and with no copy of the cache at every forward. `dtype`: what its layers keep (`KVLayer`);
    the decoder keeps float16 on specedit's kernels where `--kv-cache float16` asks (`Decoder.new_cache`)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.layers: list[KVLayer] = []

    def get_seq_length(self, index: int = 0) -> int:
        return self.layers[index].length() if index < len(self.layers) else 0

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a forward's keys and values to layer `index` (`KVLayer.append`)."""
        return self.layer(index).append(keys, values)

    def layer(self, index: int) -> KVLayer:
        """Layer `index`'s keys and values (made empty, with those before it, where the cache has none yet)."""
        while len(self.layers) <= index:
            self.layers.append(KVLayer(self.dtype))
        return self.layers[index]


def copy_prefix(cache: Cache, keep: int) -> Cache:
    """A new cache holding copies of the first `keep` positions of `cache` (left as it is)."""
    if length(cache) < keep:
        raise ValueError(f"cannot copy {keep} positions of a cache holding {length(cache)}")
    copy = KVCache(cache.dtype) if isinstance(cache, KVCache) else cast(TensorCache, type(cache)())
    for index, layer in enumerate(cast(Sequence[TensorLayer], cache.layers)):
        keys, values = layer.keys, layer.values
        assert keys is not None and values is not None
        copy.update(keys[..., :keep, :].clone(), values[..., :keep, :].clone(), index)
    return copy


def write(cache: Cache, ids: Sequence[int], path: Path) -> None:
    """Save the keys and values of `ids`, the first positions `cache` holds, to the file `path` (safetensors,
    the ids in its metadata) for `read`."""
    if length(cache) < len(ids):
        raise ValueError(f"cannot write {len(ids)} positions of a cache holding {length(cache)}")
    tensors = {}
    for index, layer in enumerate(cache.layers):
        for name in ("keys", "values"):
            tensors[f"{index}.{name}"] = getattr(layer, name)[..., : len(ids), :].contiguous()
    save_file(tensors, path, metadata={"ids": json.dumps(list(ids))})


@torch.inference_mode()  # as a forward makes them: a later forward appends to them in place
def read(path: Path, cache: TensorCache) -> list[int]:
    """Fill the empty `cache` with what `write` saved in `path`; returns the ids whose keys and values they
    are. Raises `OSError` or safetensors' error for an unreadable file, `ValueError` for another kind."""
    with safe_open(path, framework="pt") as stored:
        ids = json.loads((stored.metadata() or {}).get("ids", "null"))
        names = sorted(stored.keys())
        layers = len(names) // 2
        if not isinstance(ids, list) or names != sorted(f"{i}.{n}" for i in range(layers) for n in ("keys", "values")):
            raise ValueError(f"{path} holds no cache that `write` saved")
        for index in range(layers):
            keys, values = stored.get_tensor(f"{index}.keys"), stored.get_tensor(f"{index}.values")
            if keys.shape[-2] != len(ids) or values.shape != keys.shape:
                raise ValueError(f"{path} holds {keys.shape[-2]} positions for {len(ids)} ids")
            cache.update(keys, values, index)
    return [int(token) for token in ids]


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
        if isinstance(layer, KVLayer):
            layer.compact()
            continue
        for name in ("keys", "values"):
            states = getattr(layer, name, None)
            if isinstance(states, torch.Tensor) and states.untyped_storage().nbytes() > states.nbytes:
                setattr(layer, name, states.clone())
