"""What prefill and verification reach, against what the CPU can: the machine's integer peak, and a model's
products a row.

A forward of many rows on integer weights is bound by the CPU's multiply-accumulates, not by its memory.
Its time alone says little; its rate beside the peak says how far the kernels are from the limit. The peak
(`integer_peak`) is a short loop of the int8 kernels' own instructions (`kernels_peak.cpp`, in the kernels'
library), from registers only, on each of torch's threads at once: vpdpbusd with VNNI, vpmaddwd on AVX2.
The fastest of 40 trials of 2 ms is kept. Where the threads together fall short of one thread's rate
each, a busy core may hold one back, and the loop runs again for a quarter of a second at most.

A model's products (`forward_ops`) come from its linear layers' shapes: each decoder layer's on every row,
the output layer's on each row whose logits are kept. So a prefill of T tokens computes T *
`per_prompt_token` GOP, and a verification of R rows R * `per_verified_row`. Attention's products are float
ones, stated apart. A multiply-add counts as 2 ops.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from specedit.engine.model import kernels

INT8, NARROW = 8, 4  # the loop's paths: int8 weights' products, and 4- and 5-bit levels'
# A trial's length, and how many: short trials fit between another process's turns on a busy core. On 2
# shared cores, 40 of 2 ms gave the same best within 1% run after run, where 20 of 5 ms varied by 10%.
TRIAL_SECONDS = 0.002
TRIALS = 40
# Threads that reach less than this share of one thread's rate each are taken for a busy core and measured
# again, PAUSE_SECONDS apart, while a path has taken less than RETRY_SECONDS. (Two threads on one core's SMT
# siblings never reach it, and keep the best of their rounds.)
SCALING = 0.85
PAUSE_SECONDS = 0.05
RETRY_SECONDS = 0.25
QUADS = 4  # the loop's iterations come in whole groups of this (`specedit_peak_seconds`)
INSTRUCTIONS = {
    "avx2": "vpmaddwd, 8 lanes",
    "avx2-vnni": "vpdpbusd, 8 lanes",
    "avx512": "vpmaddwd, 16 lanes",
    "avx512-vnni": "vpdpbusd, 16 lanes",
}


@dataclass(frozen=True)
class Peak:
    """The machine's integer peak on the kernels' own instructions, in GOP/s on all of `threads`."""

    gops: float  # int8 weights' multiply-accumulate
    narrow_gops: float  # 4- and 5-bit levels' (with VNNI, int8's instruction: the same)
    threads: int
    variant: str  # the kernels' variant it ran (`kernels.variant`)

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS[self.variant]

    def for_bits(self, bits: int) -> float:
        """The peak for products on weights of `bits`."""
        return self.gops if bits == 8 else self.narrow_gops

    def ceiling(self, products: Mapping[int, float]) -> float | None:
        """The peak for a forward's products by their weights' bits (`ForwardOps`): each part at its own
        peak, so the whole at their harmonic mean by size. None where some run on float weights, which the
        integer peak does not bound."""
        total = sum(products.values())
        if total <= 0 or any(bits not in (8, 5, 4) for bits, gop in products.items() if gop > 0):
            return None
        return total / sum(gop / self.for_bits(bits) for bits, gop in products.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "gops": round(self.gops, 1),
            "narrow_gops": round(self.narrow_gops, 1),
            "threads": self.threads,
            "variant": self.variant,
            "instructions": self.instructions,
        }


@dataclass(frozen=True)
class ForwardOps:
    """A model's products a row, in GOP, by the bits of the weights they run on (0: float weights)."""

    layers: Mapping[int, float]  # every linear layer of every decoder layer
    head: Mapping[int, float]  # the output layer, on a row whose logits are kept
    attention_per_position: float  # float products of a row's attention, per position it attends to

    @property
    def per_prompt_token(self) -> float:
        """A prefilled token's: its logits are not kept."""
        return sum(self.layers.values())

    @property
    def per_verified_row(self) -> float:
        """A verified row's: the output layer runs on it too."""
        return self.per_prompt_token + sum(self.head.values())

    def verified_row_products(self) -> dict[int, float]:
        """`per_verified_row`'s products by their weights' bits."""
        return {bits: self.layers.get(bits, 0.0) + self.head.get(bits, 0.0) for bits in {*self.layers, *self.head}}

    def attention(self, rows: int, context: int) -> float:
        """GOP of the attention of `rows` rows after `context` positions: row i attends to context + i + 1."""
        return self.attention_per_position * (rows * context + rows * (rows + 1) / 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gop_per_prompt_token": _figure(self.per_prompt_token),
            "gop_per_verified_row": _figure(self.per_verified_row),
            "attention_gop_per_position": _figure(self.attention_per_position),
            "by_bits": {str(bits): _figure(gop) for bits, gop in sorted(self.verified_row_products().items())},
        }


def _figure(value: float) -> float:
    """`value` to 5 significant digits: a tiny model's products are millionths of a GOP."""
    return float(f"{value:.5g}")


def forward_ops(model: torch.nn.Module) -> ForwardOps:
    """The products of `model`'s forward a row, from its linear layers' shapes (`nn.Linear`, GPT-2's
    `Conv1D`, and their integer and packed forms): 2 * in * out ops a layer. The output layer is the one
    `get_output_embeddings` (or `lm_head`) names. Attention: q.k and the weighted values, 2 * heads *
    head width multiply-adds a layer per position."""
    head = _output_layer(model)
    layers: dict[int, float] = {}
    output: dict[int, float] = {}
    for module in model.modules():
        shape = _linear_shape(module)
        if shape is None:
            continue
        gop = 2 * shape[0] * shape[1] / 1e9
        bits = int(getattr(module, "bits", 0))
        counted = output if module is head else layers
        counted[bits] = counted.get(bits, 0.0) + gop
    config: Any = model.config  # transformers' or `DecoderConfig`: GPT-2's too, by their attribute maps
    heads = int(config.num_attention_heads)
    width = heads * int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    attention = 2 * 2 * width * int(config.num_hidden_layers) / 1e9
    return ForwardOps(layers, output, attention)


def _output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    output = getter() if callable(getter) else getattr(model, "lm_head", None)
    return output if isinstance(output, torch.nn.Module) else None


def _linear_shape(module: torch.nn.Module) -> tuple[int, int] | None:
    """(inputs, outputs) of a linear layer in any of its forms, else None."""
    inputs, outputs = getattr(module, "in_features", None), getattr(module, "out_features", None)
    if isinstance(inputs, int) and isinstance(outputs, int):
        return inputs, outputs
    inputs, outputs = getattr(module, "nx", None), getattr(module, "nf", None)  # GPT-2's Conv1D
    if isinstance(inputs, int) and isinstance(outputs, int):
        return inputs, outputs
    return None


def integer_peak(threads: int | None = None, folder: Path | None = None) -> Peak | str:
    """This machine's integer peak on `threads` of torch's (default: its count, the engine's), measured once a
    process: 0.1-0.3 s a path (without VNNI, two). The loop is in the kernels' library, loaded from
    `folder` (`kernels.available`) where it is not yet. A string where it cannot run: why."""
    unavailable = kernels.available(folder)
    library = kernels.loaded_library()
    if unavailable is not None or library is None:
        return unavailable or "the kernels were loaded from a library this process does not know"
    count = max(1, threads if threads is not None else torch.get_num_threads())
    return _measured(count, kernels.variant(), str(library))


@cache
def _measured(threads: int, variant: str, library: str) -> Peak:
    loop = ctypes.CDLL(library)  # loaded already (torch's `load_library`): the same handle
    loop.specedit_peak_seconds.restype = ctypes.c_double
    loop.specedit_peak_seconds.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    loop.specedit_peak_ops.restype = ctypes.c_int64
    loop.specedit_peak_ops.argtypes = [ctypes.c_int64]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the pool the loop's threads come from
    try:
        gops = _best_gops(loop, threads, INT8)
        narrow = gops if variant.endswith("vnni") else _best_gops(loop, threads, NARROW)
    finally:
        torch.set_num_threads(before)
    return Peak(gops, narrow, threads, variant)


def _best_gops(loop: ctypes.CDLL, threads: int, path: int) -> float:
    """The path's GOP/s on `threads`: iterations grown until the faster of two runs on one thread takes a
    quarter of `TRIAL_SECONDS`, scaled to it, then the fastest of `TRIALS` runs on all. (Sized on one thread:
    waking the pool's other threads can take longer than a short run.) A busy core slows a run and never
    speeds one, so the fastest is the machine's. Where all threads together fall short of `SCALING` times
    one thread's rate each, another process may hold a core: measured again (`RETRY_SECONDS`)."""

    def seconds(iterations: int, on: int) -> float:
        taken = float(loop.specedit_peak_seconds(on, iterations, path))
        assert taken >= 0, "threads >= 1, whole groups of QUADS, a known path"
        return taken

    iterations, taken = 1024, 0.0
    while taken < TRIAL_SECONDS / 4:
        iterations *= 4
        taken = min(seconds(iterations, 1), seconds(iterations, 1))
    ops = float(loop.specedit_peak_ops(path))
    one_thread = ops * iterations / taken
    iterations = max(QUADS, round(iterations * TRIAL_SECONDS / taken / QUADS) * QUADS)
    best, started = 0.0, time.monotonic()
    while True:
        best = max(best, ops * iterations * threads / min(seconds(iterations, threads) for _ in range(TRIALS)))
        if best >= SCALING * threads * one_thread or time.monotonic() - started > RETRY_SECONDS:
            return best / 1e9
        time.sleep(PAUSE_SECONDS)


def share(gops: float | None, ceiling: float | None) -> float | None:
    """`gops` as a share of `ceiling`, to 3 places; None where either is unknown."""
    return round(gops / ceiling, 3) if gops is not None and ceiling else None


def phase_rate(rows: int, gop_per_row: float, seconds: float, ceiling: float | None) -> dict[str, float | int | None]:
    """A phase's figures: its rows, seconds, GOP/s and share of `ceiling` (`Peak.ceiling`)."""
    gops = rows * gop_per_row / seconds if seconds > 0 else None
    return {
        "rows": rows,
        "seconds": _figure(seconds),
        "gops": _figure(gops) if gops else None,
        "share": share(gops, ceiling),
    }
