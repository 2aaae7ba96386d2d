"""A model kept for a start without torch (`model.torchless`'s description) run through specedit's kernels'
C ABI (`kernels.cpp`) on numpy's buffers: `model.decoder`'s forward, op for op, bit for bit.

`TorchlessModel` offers the loop what it reads of a `loading.LoadedModel` (`loop.generate.Engine`):
`forward`, `new_cache`, `exactness`, `row_invariant`, `max_positions`, `device`, `model` (its generation
config), `tokenizer`, `name`, `inference`, `get_threads` and `set_threads`; `KeptHead` what a one-off
rewrite reads of a `PrefixCache` (`take`, `put`, `keeps_prompts`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TypedDict

import numpy as np

from specedit.engine.model.kv_positions import Cache, common_prefix, held_after_crop, whole_buckets
from specedit.engine.model.protocols import Tokenizer
from specedit.engine.store.integrity import is_sealed

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")  # fmt: skip  # `specedit_decoder_layer`'s order
NORMS = ("input_layernorm", "post_attention_layernorm")


class Shapes(TypedDict):
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    max_positions: int | None


class KeptHeadFile(TypedDict):
    ids: list[int]  # the start every prompt shares
    file: str  # its cache (`PrefixCache.keep_head`)


class Description(TypedDict):
    """What `torchless.keep` writes of a model and `torchless.find` reads back: the files a forward without
    torch maps, and the conditions they hold under."""

    conditions: dict[str, object]  # `torchless.described_conditions`
    name: str
    folder: str  # the model's safetensors
    library: str  # the kernels' compiled library
    weights: str  # the kept integer weights
    tables: str  # the cos and sin tables
    cache: str  # float32 or float16
    bucket: int
    spare: int
    exactness: dict[str, object]
    head: KeptHeadFile | None
    eos_token_id: int | list[int] | None
    config: Shapes


class KernelError(RuntimeError):
    """What a function of the kernels' C ABI said went wrong."""


class _PackedLinear(ctypes.Structure):  # kernels.cpp's PackedLinear
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("panels", ctypes.c_int64),
        ("blocks", ctypes.c_int64),
        ("scales", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("groups", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("bits", ctypes.c_int64),
    ]


class _Kernels:
    """The C ABI of specedit's kernels (`kernels.cpp`), on numpy arrays."""

    def __init__(self, library: Path) -> None:
        self.library = ctypes.CDLL(str(library))  # torch's C++ libraries come with it (its rpath)
        pointer, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
        for name, arguments in {
            "specedit_rms_norm": [pointer, i64, i64, pointer, f64, pointer],
            "specedit_linear": [pointer, i64, i64, ctypes.POINTER(_PackedLinear), pointer],
            "specedit_decoder_layer": [pointer, i64, i64, pointer, pointer, f64, ctypes.POINTER(_PackedLinear),
                                       pointer, pointer, i64, pointer, pointer, i64, i64, i64, i64, f64, i64, i64,
                                       pointer],
        }.items():  # fmt: skip
            function = getattr(self.library, name)
            function.argtypes, function.restype = arguments, ctypes.c_char_p
        self.library.specedit_set_threads.argtypes = [i64]
        self.library.specedit_threads.restype = i64

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        out = np.empty_like(x)
        _check(self.library.specedit_rms_norm(_at(x), *x.shape, _at(weight), eps, _at(out)))
        return out

    def linear(self, x: np.ndarray, layer: _PackedLinear) -> np.ndarray:
        out = np.empty((x.shape[0], layer.panels * 16), np.float32)
        _check(self.library.specedit_linear(_at(x), *x.shape, ctypes.byref(layer), _at(out)))
        return out


def _at(array: np.ndarray) -> int:
    if not array.flags.c_contiguous:
        raise ValueError("the kernels take contiguous arrays")
    return int(array.ctypes.data)


def _check(error: bytes | None) -> None:
    if error is not None:
        raise KernelError(error.decode(errors="replace"))


@dataclass(frozen=True)
class KeptVerdict:
    """The self-check's verdict as the torch path's load settled it (`exactness.Exactness.to_dict()`)."""

    found: dict[str, object]

    @property
    def bitwise(self) -> bool:
        return bool(self.found["bitwise"])

    @property
    def fewer_threads(self) -> tuple[int, ...]:
        threads = self.found.get("fewer_threads")
        return tuple(int(count) for count in threads) if isinstance(threads, (list, tuple)) else ()

    def to_dict(self) -> dict[str, object]:
        return dict(self.found)


class KeptHead:
    """The start every prompt shares (`loop.rewrite.keep_prompt_head`), prefilled by the load that kept the
    model and kept in a file (`PrefixCache.keep_head`): what a one-off rewrite's `PrefixCache` hands it
    (`take`), read back here. A one-off rewrite keeps nothing for later (`put`)."""

    keeps_prompts = False

    def __init__(
        self, model: TorchlessModel, ids: tuple[int, ...], layers: list[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        self.model, self.ids, self.layers = model, ids, layers  # each layer's keys and values (H_kv, n, D)

    def take(self, ids: Sequence[int]) -> tuple[TorchlessCache | None, int]:
        """A cache holding the head where `ids` start with all of it (and go on), else None."""
        if common_prefix(self.ids, ids, len(ids) - 1) < len(self.ids):
            return None, 0
        cache = self.model.new_cache()
        for layer, (keys, values) in zip(cache.layers, self.layers, strict=True):
            layer.reserve(len(self.ids))
            layer.keys[:, : len(self.ids)] = keys
            layer.values[:, : len(self.ids)] = values
        return cache, len(self.ids)

    def put(self, ids: Sequence[int], cache: TorchlessCache) -> None:
        pass


class TorchlessCache:
    """The keys and values of every layer (`TorchlessLayer`), as `kv_cache.KVCache` keeps them, in numpy
    arrays: what `kv_cache.length` and `kv_cache.rollback` read and crop (`get_seq_length`, `layers`)."""

    def __init__(
        self, layers: int, kv_heads: int, width: int, dtype: type[np.generic], bucket: int, spare: int
    ) -> None:
        self.layers = [TorchlessLayer(kv_heads, width, dtype, bucket, spare) for _ in range(layers)]

    def get_seq_length(self, index: int = 0) -> int:
        return self.layers[index].length() if index < len(self.layers) else 0


class TorchlessLayer:
    """One layer's keys and values: `kv_cache.KVLayer`'s buffers (H_kv, capacity, D), grown in the same whole
    buckets with the same spare room, zeros past the positions held."""

    def __init__(self, kv_heads: int, width: int, dtype: type[np.generic], bucket: int, spare: int) -> None:
        self.keys = self.values = np.zeros((kv_heads, 0, width), dtype)
        self.bucket, self.spare = bucket, spare  # `invariant.KV_BUCKET`, `kv_cache.SPARE_POSITIONS`
        self._length = 0

    def length(self) -> int:
        return self._length

    def crop(self, keep: int) -> None:
        """`KVLayer.crop`: keep the first `keep` positions (a negative `keep` drops that many from the end)."""
        keep = held_after_crop(self._length, keep)
        self.keys[:, keep : self._length] = 0
        self.values[:, keep : self._length] = 0
        self._length = keep

    def reserve(self, count: int) -> int:
        """Room for `count` more positions, held from now on; returns the positions up to the end of the
        bucket the last one falls in (the view `specedit::decoder_layer` is given, as `KVLayer.reserve`)."""
        end = self._length + count
        if self.keys.shape[1] < end:
            capacity = whole_buckets(end, self.bucket) + self.spare
            shape = (self.keys.shape[0], capacity, self.keys.shape[2])
            keys, values = np.zeros(shape, self.keys.dtype), np.zeros(shape, self.values.dtype)
            keys[:, : self._length] = self.keys[:, : self._length]
            values[:, : self._length] = self.values[:, : self._length]
            self.keys, self.values = keys, values
        self._length = end
        return whole_buckets(end, self.bucket)


@dataclass(frozen=True)
class CPU:
    """Where a model without torch runs (`protocols.Device`)."""

    type: str = "cpu"

    def __str__(self) -> str:
        return self.type


@dataclass(frozen=True)
class _Layer:
    input_norm: np.ndarray
    post_norm: np.ndarray
    linears: ctypes.Array[_PackedLinear]  # seven, in `LINEARS`' order


class TorchlessModel:
    """A kept model (`keep`'s description) run through the kernels' C ABI: see the module docstring."""

    device = CPU()
    dtype_name = "float32"

    def __init__(self, description: Description, tokenizer: Tokenizer) -> None:
        self.name: str = description["name"]
        self.tokenizer = tokenizer
        self.exactness = KeptVerdict(description["exactness"])
        config = description["config"]
        self.hidden, self.heads, self.kv_heads = config["hidden"], config["heads"], config["kv_heads"]
        self.width, self.vocab, self.eps = config["head_dim"], config["vocab"], float(config["eps"])
        self.max_positions: int | None = config["max_positions"]
        self.model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=description["eos_token_id"]))
        self._cache_dtype = np.float16 if description["cache"] == "float16" else np.float32
        self._bucket, self._spare = int(description["bucket"]), int(description["spare"])
        self._kept_head = description["head"]
        self._kernels = _Kernels(Path(description["library"]))
        stored = _mapped(Path(description["folder"]).glob("*.safetensors"))
        packed = _mapped([Path(description["weights"])])
        tables = _mapped([Path(description["tables"])])
        self.cos, self.sin = tables["cos"], tables["sin"]  # (L, D) each, torch's
        self._embedding = stored["model.embed_tokens.weight"]

        def linear(name: str) -> _PackedLinear:
            q, scales, offsets = (packed[f"{name}.{part}"] for part in ("q", "scales", "offsets"))
            bias = stored.get(f"{name}.bias")
            padded = None
            if bias is not None:  # `QuantizedLinear`'s: float32, zeros to the last panel's end
                padded = np.zeros(q.shape[0] * 16, np.float32)
                padded[: bias.shape[0]] = _widened(bias)
                self._kept.append(padded)
            return _PackedLinear(
                _at(q), q.shape[0], q.shape[1], _at(scales), _at(offsets), scales.shape[1],
                _at(padded) if padded is not None else None, int(packed[f"{name}.bits"]),
            )  # fmt: skip

        self._kept: list[np.ndarray] = []  # the padded biases the packed layers point into (the rest: `_mapped`)
        self._layers = []
        for index in range(config["layers"]):
            prefix = f"model.layers.{index}"
            seven = (_PackedLinear * 7)(*(linear(f"{prefix}.{name}") for name in LINEARS))
            norms = [_widened(stored[f"{prefix}.{name}.weight"]) for name in NORMS]
            self._layers.append(_Layer(norms[0], norms[1], seven))
        self._norm = _widened(stored["model.norm.weight"])
        self._output = linear("lm_head")
        self._mapped = (stored, packed, tables)

    @property
    def row_invariant(self) -> bool:
        return self.exactness.bitwise

    def kept_head(self) -> KeptHead | None:
        """The start every prompt shares, as the load that kept this model prefilled it; None where it is
        not kept (or no longer whole)."""
        if self._kept_head is None or not is_sealed(Path(self._kept_head["file"])):
            return None
        stored = _mapped([Path(self._kept_head["file"])])
        layers = [(stored[f"{index}.keys"][0], stored[f"{index}.values"][0]) for index in range(len(self._layers))]
        return KeptHead(self, tuple(self._kept_head["ids"]), layers)

    def inference(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def get_threads(self) -> int:
        return int(self._kernels.library.specedit_threads())

    def set_threads(self, count: int) -> None:
        self._kernels.library.specedit_set_threads(count)

    def new_cache(self) -> TorchlessCache:
        return TorchlessCache(
            len(self._layers), self.kv_heads, self.width, self._cache_dtype, self._bucket, self._spare
        )

    def forward(self, ids: Sequence[int], cache: Cache, logits_to_keep: int = 0) -> np.ndarray:
        """`LoadedModel.forward` (a 1-row step as one row): (T, V) logits, or the last `logits_to_keep`
        rows'; the cache grows by len(ids) positions."""
        assert isinstance(cache, TorchlessCache)  # (`new_cache`'s)
        first, count = cache.get_seq_length(), len(ids)
        x = self._embedded(ids)  # (T, hidden)
        out = np.empty_like(x)
        cos, sin = self.cos[first : first + count], self.sin[first : first + count]  # (T, D)
        for layer, kept in zip(self._layers, cache.layers, strict=True):
            positions = kept.reserve(count)
            _check(self._kernels.library.specedit_decoder_layer(
                _at(x), count, self.hidden, _at(layer.input_norm), _at(layer.post_norm), self.eps, layer.linears,
                _at(cos), _at(sin), self.width, _at(kept.keys), _at(kept.values), self._cache_dtype == np.float16,
                positions, kept.keys.shape[1], first, self.width**-0.5, self.heads, self.kv_heads, _at(out),
            ))  # fmt: skip
            x, out = out, x
        rows = x[-logits_to_keep:] if logits_to_keep else x
        normed = self._kernels.rms_norm(np.ascontiguousarray(rows), self._norm, self.eps)
        return self._kernels.linear(normed, self._output)[:, : self.vocab]  # (T or logits_to_keep, V)

    def _embedded(self, ids: Sequence[int]) -> np.ndarray:
        """`StoredEmbedding`'s rows: the stored 16-bit values widened to float32 (exactly): (T, hidden)."""
        return _widened(self._embedding[np.asarray(ids, dtype=np.int64)])


def _widened(stored: np.ndarray) -> np.ndarray:
    """16-bit floats (bfloat16 as its bits, float16) widened to float32, exactly; float32 as it is."""
    if stored.dtype == np.uint16:  # bfloat16: its bits are a float32's upper half
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(stored, dtype=np.float32)


_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U8": np.uint8, "I8": np.int8,
           "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip


def _mapped(files: Iterator[Path] | list[Path]) -> dict[str, np.ndarray]:
    """The tensors of safetensors files as read-only numpy views of the files mapped into memory (bfloat16
    as its bits, uint16): what `safetensors.torch.load_file` maps, without torch."""
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        with file.open("rb") as opened:
            mapped = mmap.mmap(opened.fileno(), 0, access=mmap.ACCESS_READ)
        size = int.from_bytes(mapped[:8], "little")
        header = json.loads(mapped[8 : 8 + size])
        header.pop("__metadata__", None)
        for name, entry in header.items():
            dtype = np.dtype(_DTYPES[entry["dtype"]])
            start, end = entry["data_offsets"]
            flat = np.frombuffer(mapped, dtype, (end - start) // dtype.itemsize, 8 + size + start)
            tensors[name] = flat.reshape(entry["shape"])
    return tensors
