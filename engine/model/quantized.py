"""Integer weights on the CPU: int8, int5 and int4 linear layers with row-invariant arithmetic.

A forward of a few tokens costs what streaming the weights from memory costs. `QuantizedLinear` keeps a
layer's weights as levels with a float16 scale and offset per group of inputs: 8 bits in groups of 128 (32
where the input size is no multiple of 128), 5 and 4 bits in groups of 32. It computes on specedit's
kernels (`model.kernels`): each row's activations are quantized per group to 8 bits, the products summed
exactly in integers, and the groups' sums added in float32 in input order. So a row's result never depends
on the rows beside it, the forward's size, the thread count or the CPU (what `model.exactness` asks of
every kernel). At 5 bits the layers a model's GGUF holds as Q5_0 are taken as they are (`gguf_packed`); at
4 bits the levels follow a Q4_K group's own grid. A load quantizes once and keeps the result in a file the
next load maps (`loading.load_model`'s `kept_folder`). Figures and what was tried: docs/kernels.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from specedit.engine.model import gguf_levels
from specedit.engine.model.kernels import PANEL
from specedit.engine.model.linears import linear_bias, linear_weight, replace_modules

GROUP = 32  # inputs per scale and offset: the least group, and 4-bit weights' always
WIDE_GROUP = 128  # int8 weights' where the input size is a multiple of it (`group_size`)
QUAD = 4  # inputs a packed lane holds
PARTS = ("q", "scales", "offsets")  # a layer's tensors, as `quantize` returns them


class QuantizedLinear(torch.nn.Module):
    """A linear layer on int8 (or int5, int4) weights (see the module docstring); float32 in, float32 out."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        packed: tuple[torch.Tensor, ...] | None = None,
        bits: int = 8,
    ) -> None:  # weight: (out, in); packed: `quantize(weight, bits)`, kept from an earlier start
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = bits
        self.q, self.scales, self.offsets = packed or quantize(weight, bits)
        self.bias = None if bias is None else _padded(bias.detach().to(torch.float32), self.q.shape[0] * PANEL)
        self._kernel = getattr(torch.ops.specedit, f"q{bits}_linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        return self.trimmed(self._kernel(x, self.q, self.scales, self.offsets, self.bias))

    def trimmed(self, output: torch.Tensor) -> torch.Tensor:
        """The kernel's output without the outputs that pad the last panel."""
        return output if output.shape[-1] == self.out_features else output[..., : self.out_features]

    def dequantized(self) -> torch.Tensor:
        """The weights the kernel computes with, dequantized: (out, in) float32."""
        return dequantize(self.q, self.scales, self.offsets, self.bits)[: self.out_features]

    def unpacked(self) -> torch.nn.Linear:
        """The plain `nn.Linear` on the dequantized weights (for transformers' own kernels)."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        linear.weight = torch.nn.Parameter(self.dequantized(), requires_grad=False)
        if self.bias is not None:
            linear.bias = torch.nn.Parameter(self.bias[: self.out_features].clone(), requires_grad=False)
        return linear


def linears(x: torch.Tensor, layers: Sequence[torch.nn.Module]) -> list[torch.Tensor] | None:
    """Each layer on `x`, in one call of the kernel (`specedit::linears`): the activations quantized
    once per group size, every layer's outputs its own call's, bit for bit, whatever their widths. None
    where the layers are not all integer layers (the caller runs them one by one)."""
    integer = [layer for layer in layers if isinstance(layer, QuantizedLinear)]
    if len(integer) != len(layers):
        return None
    outputs = torch.ops.specedit.linears(
        x,
        [layer.q for layer in integer],
        [layer.scales for layer in integer],
        [layer.offsets for layer in integer],
        [layer.bias for layer in integer],
        [layer.bits for layer in integer],
    )
    return [layer.trimmed(output) for output, layer in zip(outputs, integer, strict=True)]


def group_size(in_features: int, bits: int = 8) -> int:
    """Inputs per scale and offset: 128 for int8 weights where `in_features` is a multiple of 128, else 32.

    >>> group_size(896), group_size(576), group_size(896, bits=4), group_size(896, bits=5)
    (128, 32, 32, 32)
    """
    return WIDE_GROUP if bits == 8 and in_features % WIDE_GROUP == 0 else GROUP


def quantize(weight: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, in) weights -> the kernel's packing: uint8 levels (P, in/4, 16 * 4) (a panel's 16 outputs, 4
    inputs each), scales and offsets (P, in/G, 16) float16 (G: `group_size`), P = out / 16 rounded up (the
    padding rows are zeros): `specedit::q8_quantize`, one pass over the weights in their own dtype (float32,
    bf16, float16). At 4 bits (`specedit::q4_quantize`), levels 0..15, two a byte: (P, in/8, 16 * 4), a
    lane's 8 inputs in 4 bytes, the first 4 in the low nibbles. At 5 bits (`quantize5`), levels 0..31, a
    byte each, packed as 8-bit ones."""
    w = weight.detach()
    if bits == 5:
        return pack(*quantize5(w))
    if bits == 4:
        q, scales, offsets = torch.ops.specedit.q4_quantize(w)
    else:
        q, scales, offsets = torch.ops.specedit.q8_quantize(w, group_size(w.shape[1]))
    return q, scales, offsets


def quantize5(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, in) weights -> 5-bit levels (out, in) uint8 in 0..31 and float16 scales and offsets (out, in/32):
    per group of 32 inputs, offset = half(lowest), scale = half((highest - lowest) / 31) (at least 2^-24),
    level = round((w - offset) / scale) within 0..31. A GGUF's Q5_0 layers are not quantized so but read as
    they are (`gguf_packed`)."""
    outputs, inputs = weight.shape
    groups = weight.detach().to(torch.float32).reshape(outputs, inputs // GROUP, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    offsets = low.to(torch.float16)
    scales = ((high - low) / 31).clamp(min=2.0**-24).to(torch.float16)
    if not (torch.isfinite(scales).all() and torch.isfinite(offsets).all()):
        raise ValueError("quantize: a weight beyond float16's range")
    levels = ((groups - offsets[..., None].float()) / scales[..., None].float()).round().clamp(0, 31)
    return levels.to(torch.uint8).reshape(outputs, inputs), scales, offsets


def pack(
    levels: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Byte levels (out, in) with scales and offsets (out, in/G) -> the kernel's packing (`quantize`'s): q
    (P, in/4, 16 * 4) and (P, in/G, 16), the outputs padded with zeros to P * 16."""
    outputs, inputs = levels.shape
    panels = -(-outputs // PANEL)
    q = _padded(levels, panels * PANEL).reshape(panels, PANEL, inputs // QUAD, QUAD).transpose(1, 2)
    scales, offsets = (_padded(t, panels * PANEL).reshape(panels, PANEL, -1).transpose(1, 2) for t in (scales, offsets))
    return q.reshape(panels, inputs // QUAD, PANEL * QUAD).contiguous(), scales.contiguous(), offsets.contiguous()


def levels(q: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """The packed levels as (P*16, in) integers (int16): -128..127 at 8 bits, 0..31 at 5, 0..15 at 4."""
    panels, blocks, _ = q.shape
    if bits == 4:  # a block's low nibbles are its first 4 inputs a lane, the high ones the next 4
        halves = [(half.reshape(panels, blocks, PANEL, QUAD)) for half in (q & 0x0F, q >> 4)]
        eights = torch.cat(halves, dim=3).to(torch.int16)
        return eights.permute(0, 2, 1, 3).reshape(panels * PANEL, blocks * 2 * QUAD)
    signed = q.to(torch.int16) - (128 if bits == 8 else 0)
    return signed.reshape(panels, blocks, PANEL, QUAD).permute(0, 2, 1, 3).reshape(panels * PANEL, blocks * QUAD)


def dequantize(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """The packed weights back as (P*16, in) float32: scale * level + offset (the values the kernel's
    integer sums stand for)."""
    rows = levels(q, bits).to(torch.float32)
    outputs, in_features = rows.shape
    groups = scales.shape[1]
    scale, offset = (t.to(torch.float32).transpose(1, 2).reshape(outputs, groups, 1) for t in (scales, offsets))
    weights = torch.addcmul(offset, rows.reshape(outputs, groups, -1), scale)
    return weights.reshape(outputs, in_features)


def quantize_linears(
    model: torch.nn.Module,
    kept: dict[str, torch.Tensor] | None = None,
    bits: int = 8,
    given: Mapping[str, tuple[torch.Tensor, ...]] | None = None,
) -> int:
    """Replace every linear layer of `model` whose input size is a multiple of 32 (`nn.Linear`, GPT-2's
    `Conv1D`) by a `QuantizedLinear` of `bits`, before any is packed for oneDNN; returns how many were
    packed here (not taken from `kept`). The kernels must be loaded (`kernels.available`). `kept`:
    `packed_layers` of an earlier load of the same model (a layer found there in its width's shapes is taken
    as it is, not quantized again, where that width is `bits`, or 8 at 5 bits). `given` (at 5 bits): layers
    packed already, by name (`gguf_packed`: the layers a GGUF holds as 5-bit levels), taken at 5 bits as
    they are; with them, the other layers take 8 (the GGUF holds them finer)."""
    kept = kept or {}
    given = given or {}
    names = {id(module): name for name, module in model.named_modules()}
    quantized_here = 0

    def quantized(module: torch.nn.Module) -> QuantizedLinear | None:
        nonlocal quantized_here
        weight = linear_weight(module)
        if weight is None or weight.shape[1] % GROUP:
            return None
        name = names[id(module)]
        if name in given:
            return QuantizedLinear(weight, linear_bias(module), given[name], 5)
        packed = tuple(kept.get(f"{name}.{part}") for part in PARTS)
        width = int(kept.get(f"{name}.bits", bits))
        found = [None if t is None else (t.shape, t.dtype) for t in packed]
        if (width == bits or (bits == 5 and width == 8)) and found == _packed_shapes(weight, width):
            return QuantizedLinear(weight, linear_bias(module), packed, width)  # type: ignore[arg-type]
        quantized_here += 1
        return QuantizedLinear(weight, linear_bias(module), bits=8 if given else bits)

    replace_modules(model, quantized)
    return quantized_here + len(given)


def packed_layers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The integer layers of `model` as they are kept (`quantize_linears`' `kept`): `NAME.q`, `NAME.scales`,
    `NAME.offsets` and `NAME.bits` (a uint8 scalar: 8, 5 or 4) per layer."""
    layers = {name: module for name, module in model.named_modules() if isinstance(module, QuantizedLinear)}
    parts = {f"{name}.{part}": getattr(module, part) for name, module in layers.items() for part in PARTS}
    return parts | {f"{name}.bits": torch.tensor(module.bits, dtype=torch.uint8) for name, module in layers.items()}


def gguf_packed(model: torch.nn.Module, gguf: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The linear layers of `model` that the GGUF it was converted from holds as Q5_0 (`gguf_levels`),
    packed for the 5-bit kernel: each only where its weights as loaded are the GGUF's, rounded to their
    dtype (a model tied otherwise, or converted from another file, keeps its own)."""
    modules = dict(model.named_modules())
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))

    def wanted(gguf_name: str) -> bool:  # (the embedding only where the output layer is tied to it)
        return gguf_levels.model_name(gguf_name) in modules and (tied or gguf_name != "token_embd.weight")

    packed = {}
    for gguf_name, levels, scales, offsets in gguf_levels.q5_0_layers(gguf, wanted):
        name = str(gguf_levels.model_name(gguf_name))
        weight = linear_weight(modules[name]) if name not in packed else None
        if weight is None or weight.shape != levels.shape:
            continue
        values = levels.reshape(*scales.shape, GROUP) * scales[..., None].float() + offsets[..., None].float()
        if torch.equal(values.reshape(weight.shape).to(weight.dtype), weight.detach()):
            packed[name] = pack(levels, scales, offsets)
    return packed


class StoredEmbedding(torch.nn.Module):
    """An input embedding kept in the 16-bit dtype it was stored in (bf16, float16), its rows widened to
    float32 as they are looked up: the values of a float32 copy (widening is exact) in half its memory
    (272 MB of the 0.5B model's 544). The table is held as int16 bits, which `.to(float32)` leaves be."""

    def __init__(self, embedding: torch.nn.Embedding) -> None:
        super().__init__()
        weight = embedding.weight.detach().contiguous()
        self.stored = weight.dtype
        self.num_embeddings, self.embedding_dim = weight.shape
        bits = weight.view(torch.int16)
        if bits.untyped_storage().nbytes() > bits.nbytes:  # a view of one allocation holding every weight
            bits = bits.clone()  # as loaded (transformers'): its own copy, so the rest can be freed
        self.bits: torch.Tensor
        self.register_buffer("bits", bits, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bits[ids].view(self.stored).to(torch.float32)


@runtime_checkable
class Embedded(Protocol):
    """A model that names its input embedding: transformers' models, `decoder.Decoder`."""

    def get_input_embeddings(self) -> torch.nn.Module: ...

    def set_input_embeddings(self, value: torch.nn.Module) -> None: ...


def keep_embedding_stored(model: torch.nn.Module) -> bool:
    """Replace the model's input embedding by a `StoredEmbedding` where its table is 16-bit and no other
    layer shares it (an output layer tied to it stays tied); returns whether it was replaced."""
    if not isinstance(model, Embedded):
        return False
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, torch.nn.Embedding) or embedding.weight.dtype not in (torch.bfloat16, torch.float16):
        return False
    shared = [p for _, p in model.named_parameters(remove_duplicate=False) if p is embedding.weight]
    if len(shared) > 1:
        return False
    model.set_input_embeddings(StoredEmbedding(embedding))
    return True


def dequantize_linears(model: torch.nn.Module) -> int:
    """Every `QuantizedLinear` back to an `nn.Linear` on its dequantized weights; returns how many."""
    return replace_modules(model, lambda module: module.unpacked() if isinstance(module, QuantizedLinear) else None)


def is_quantized(model: torch.nn.Module) -> bool:
    return weight_bits(model) is not None


def weight_bits(model: torch.nn.Module) -> int | None:
    """The bits of the model's narrowest integer weights (8, 5 or 4: `--weights int5` keeps some layers at
    8), None where its linear layers are not quantized."""
    return min((module.bits for module in model.modules() if isinstance(module, QuantizedLinear)), default=None)


def _packed_shapes(weight: torch.Tensor, bits: int = 8) -> list[tuple[torch.Size, torch.dtype]]:
    """The shapes and dtypes of `quantize(weight, bits)`'s tensors."""
    outputs, inputs = weight.shape
    panels = -(-outputs // PANEL)
    scales = (torch.Size((panels, inputs // group_size(inputs, bits), PANEL)), torch.float16)
    block = 2 * QUAD if bits == 4 else QUAD  # inputs a lane's 4 bytes hold
    return [(torch.Size((panels, inputs // block, PANEL * QUAD)), torch.uint8), scales, scales]


def _padded(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `rows` (dim 0)."""
    missing = rows - tensor.shape[0]
    if missing <= 0:
        return tensor.contiguous()
    return torch.cat([tensor, tensor.new_zeros(missing, *tensor.shape[1:])]).contiguous()
