"""A GGUF's 5-bit weights (Q5_0) as they are, for specedit's 5-bit kernel (`specedit::q5_linear`).

A model converted from a GGUF (the default one) holds in its bf16 folder the GGUF's weights dequantized and
rounded to bf16; quantizing those again to int8 keeps them only within int8's error. Q5_0 stores a group of
32 weights as a float16 scale d and 32 levels q in 0..31, w = d * (q - 16): the 5-bit kernel takes exactly
that, scale d and offset -16 d (exact in float16), so that the layers a GGUF holds as Q5_0 (the 0.5B
model's q, k, o, gate and up and half its v; a tied model's output layer too) compute on the GGUF's own
weights, and on AVX2 without VNNI in one multiply-add a pair where int8 takes two.

Only the tensor index is parsed here (the `gguf` package's reader builds every metadata field as numpy
arrays: 8.6 s for the 0.5B model's vocabulary, here about 0.1 s); the blocks are read from a memory map.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

Q5_0 = 6  # ggml's type number of Q5_0 blocks
Q5_0_BLOCK = (32, 22)  # weights a block, bytes a block: float16 d, 32 fifth bits, 16 bytes of nibbles
_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF's scalar types
_STRING, _ARRAY = 8, 9
# transformers' names for a Qwen2 / Llama GGUF's tensors (`blk.N.` + these)
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # as torch has it: (rows, inputs)
    kind: int  # ggml's type number
    start: int  # byte offset in the file


class GGUFError(ValueError):
    """A file that is not a GGUF this reader knows."""


def tensor_index(path: Path) -> dict[str, TensorEntry]:
    """The tensors of a GGUF file (version 2 or 3) by name: shape, type and where their bytes start."""
    with path.open("rb") as file:
        magic, version = struct.unpack("<4sI", _read(file, 8))
        if magic != b"GGUF" or version not in (2, 3):
            raise GGUFError(f"{path} is not a GGUF file of version 2 or 3")
        tensors, fields = struct.unpack("<QQ", _read(file, 16))
        alignment = 32
        for _ in range(fields):
            key = _string(file)
            kind = _u32(file)
            if key == "general.alignment" and kind == 4:
                alignment = _u32(file)
            else:
                _skip_value(file, kind)
        entries = []
        for _ in range(tensors):
            name = _string(file)
            count = _u32(file)
            dims = struct.unpack(f"<{count}Q", _read(file, 8 * count))
            kind, offset = struct.unpack("<IQ", _read(file, 12))
            entries.append((name, tuple(reversed(dims)), kind, offset))
        data = -(-file.tell() // alignment) * alignment
    return {name: TensorEntry(name, shape, kind, data + offset) for name, shape, kind, offset in entries}


def model_name(gguf_name: str) -> str | None:
    """The module a GGUF tensor's weights are in transformers' names (`model.layers.0.self_attn.q_proj`), or
    None for a tensor that is not a linear layer's. The output layer is `output.weight`, or the embedding
    where a model ties them (the caller checks which: `quantized.gguf_packed`)."""
    if gguf_name in ("output.weight", "token_embd.weight"):
        return "lm_head"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return None


def q5_0_layers(
    path: Path, wanted: Callable[[str], bool] = lambda name: True
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each Q5_0 tensor of the GGUF (that `wanted` takes, by its name) as (name, levels, scales, offsets):
    levels (rows, inputs) uint8 in 0..31, scales and offsets (rows, inputs / 32) float16, the weights scales *
    levels + offsets exactly."""
    entries = [e for e in tensor_index(path).values() if e.kind == Q5_0 and len(e.shape) == 2 and wanted(e.name)]
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for entry in entries:
            rows, inputs = entry.shape
            weights, size = Q5_0_BLOCK
            if inputs % weights:
                raise GGUFError(f"{entry.name}: {inputs} inputs is not a whole number of Q5_0 blocks")
            blocks = np.frombuffer(mapped, np.uint8, rows * inputs // weights * size, entry.start)
            decoded = q5_0_levels(blocks.reshape(rows, inputs // weights, size))  # copies: none points into the map,
            del blocks  # which closes only when no array does (also where the caller stops early)
            yield (entry.name, *decoded)


def q5_0_levels(blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q5_0 blocks (rows, groups, 22) -> levels (rows, groups * 32) uint8, scales and offsets (rows, groups)
    float16: level j of a block is nibble j of its 16 bytes (the low ones first, then the high ones) with
    bit j of its 32-bit word of fifth bits above it; w = d * (level - 16)."""
    rows, groups, _ = blocks.shape
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
    fifth = np.ascontiguousarray(blocks[..., 2:6]).view("<u4")[..., 0]
    nibbles = blocks[..., 6:22]
    levels = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # (rows, groups, 32)
    levels |= (((fifth[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
    offsets = (-16 * d.astype(np.float32)).astype(np.float16)  # exact: a power of two times a float16
    if not (np.isfinite(d).all() and np.isfinite(offsets).all()):
        raise GGUFError("a Q5_0 scale beyond float16's range")
    return (
        torch.from_numpy(levels.reshape(rows, groups * 32)),
        torch.from_numpy(np.ascontiguousarray(d)),
        torch.from_numpy(offsets),
    )


def _read(file: BinaryIO, size: int) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise GGUFError(f"{getattr(file, 'name', 'the file')} ends inside its header")
    return data


def _u32(file: BinaryIO) -> int:
    value: int = struct.unpack("<I", _read(file, 4))[0]
    return value


def _string(file: BinaryIO) -> str:
    size: int = struct.unpack("<Q", _read(file, 8))[0]
    return _read(file, size).decode("utf-8", errors="replace")


def _skip_value(file: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        file.seek(struct.unpack("<Q", _read(file, 8))[0], 1)
    elif kind == _ARRAY:
        item, count = struct.unpack("<IQ", _read(file, 12))
        if item in _VALUE_SIZES:
            file.seek(_VALUE_SIZES[item] * count, 1)
        else:
            for _ in range(count):
                _skip_value(file, item)
    elif kind in _VALUE_SIZES:
        file.seek(_VALUE_SIZES[kind], 1)
    else:
        raise GGUFError(f"a metadata value of unknown type {kind}")
