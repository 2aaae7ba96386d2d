"""specedit's own kernels (engine.model.kernels): int8 and int4 weights (engine.model.quantized) compute
what their dequantized weights say, the attention what torch's does, a row's result never depends on the
forward around it, and a model on them keeps plain decoding's answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from test_exactness import speculative_and_plain
from test_invariant import wide_model

from specedit.engine.loop.generate import Engine
from specedit.engine.model import exactness, invariant, kernels, loading, quantized
from specedit.engine.records.errors import ModelLoadError
from specedit.engine.records.options import EngineOptions
from specedit.engine.store import store

unavailable = kernels.available()
needs_kernel = pytest.mark.skipif(unavailable is not None, reason=f"no kernels of our own here: {unavailable}")


def _layer(
    out_features: int, in_features: int, *, bias: bool = True, seed: int = 0, bits: int = 8
) -> quantized.QuantizedLinear:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator) * 0.05
    weight[:, :32] *= 20  # groups of very different ranges: each has its own scale
    return quantized.QuantizedLinear(
        weight, torch.randn(out_features, generator=generator) if bias else None, bits=bits
    )


def _quantized_by_torch(weight: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantized.quantize` written in torch's ops (the engine's own until the kernel did it in one pass)."""
    out_features, in_features = weight.shape
    panels = -(-out_features // 16)
    rows = torch.cat([weight.to(torch.float32), torch.zeros(panels * 16 - out_features, in_features)])
    groups = rows.reshape(-1, in_features // group, group)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 255).clamp(min=2**-24).half().float()  # kept in float16, the levels chosen for it
    offset = (low + 128 * scale).half().float()
    levels = torch.round((groups - offset[..., None]) / scale[..., None]).clamp_(-128, 127) + 128
    # a panel's 16 outputs at 4 inputs a lane: (panels, in/4, 16, 4)
    quads = levels.to(torch.uint8).reshape(panels, 16, in_features // 4, 4).transpose(1, 2)
    q = quads.reshape(panels, in_features // 4, 64).contiguous()
    return q, *(t.half().reshape(panels, 16, -1).transpose(1, 2).contiguous() for t in (scale, offset))


def _group(layer: quantized.QuantizedLinear) -> int:
    """The layer's inputs per scale and offset, as its scales say."""
    return layer.in_features // layer.scales.shape[1]


def _by_the_kernels_rule(layer: quantized.QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """What `specedit::q8_linear` computes, in float64 and torch's ops: each row's activations quantized
    per group of the weights' (levels round(x * 127 / max|x|), step max|x| / 127), the levels' products summed
    exactly per group, then scale * step * that + offset * step * (the levels' sum), summed over groups."""
    rows = x.reshape(-1, layer.in_features).to(torch.float32)
    groups = rows.reshape(rows.shape[0], -1, _group(layer))
    largest = groups.abs().amax(-1, keepdim=True)
    inverse = torch.where(largest > 0, 127 / largest, torch.zeros_like(largest))
    levels = torch.round(groups * inverse)
    step = largest / 127
    weights = quantized.levels(layer.q, layer.bits).to(torch.float64)  # (out padded, in)
    sums = torch.einsum("mgi,ngi->mgn", levels.double(), weights.reshape(weights.shape[0], -1, _group(layer)))
    scales, offsets = (t.transpose(1, 2).reshape(weights.shape[0], -1).double() for t in (layer.scales, layer.offsets))
    total = step.double() * levels.double().sum(-1, keepdim=True)  # (m, g, 1)
    output = (sums * step.double() * scales.T + total * offsets.T).sum(1)
    if layer.bias is not None:
        output = output + layer.bias.double()
    return output[:, : layer.out_features].reshape(*x.shape[:-1], layer.out_features)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("in_features", "group"), [(96, 32), (256, 128)])
def test_the_kernels_quantization_is_torchs_bit_for_bit(dtype: torch.dtype, in_features: int, group: int) -> None:
    """int8 weights take groups of 128 inputs where the input size allows, else 32."""
    weight = (torch.randn(130, in_features, generator=torch.Generator().manual_seed(3)) * 0.1).to(dtype)
    weight[5, :group] = 0.5  # a constant group
    weight[7, group : 2 * group] *= 1000  # a wide one
    assert quantized.group_size(in_features) == group
    for ours, theirs in zip(quantized.quantize(weight), _quantized_by_torch(weight, group), strict=True):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def _float16s_rounding(groups: torch.Tensor) -> torch.Tensor:
    """What rounding a group's offset (a value within its range) to float16 may add to its weights' error:
    2^-11 of the group's largest magnitude."""
    return groups.abs().amax(-1) * 2**-11


@needs_kernel
def test_quantization_keeps_each_weight_within_a_510th_of_its_groups_range() -> None:
    weight = torch.randn(40, 96, generator=torch.Generator().manual_seed(1))
    weight[1, :32] += 3  # a group far from zero: its offset's rounding counts
    weight[3, 32:64] = 0.25  # a constant group: its range is 0, its weights exact
    q, scales, offsets = quantized.quantize(weight)
    assert q.shape == (3, 24, 64) and scales.shape == offsets.shape == (3, 3, 16)  # 40 outputs: 3 panels
    assert scales.dtype == offsets.dtype == torch.float16
    restored = quantized.dequantize(q, scales, offsets)
    assert torch.equal(restored[40:], torch.zeros(8, 96))  # the padding
    groups = weight.reshape(40, 3, 32)
    error = (restored[:40].reshape(40, 3, 32) - groups).abs().amax(-1)
    range_ = groups.amax(-1) - groups.amin(-1)
    assert (error <= range_ / 510 * 1.001 + _float16s_rounding(groups) + 1e-6).all()
    assert (error <= range_ / 510 * 1.001 + 1e-6).float().mean() > 0.9  # most groups: the levels' error alone
    assert torch.equal(restored[3, 32:64], weight[3, 32:64])


def _4_bit_squared_error(groups: torch.Tensor, steps: int) -> torch.Tensor:
    """Each group's squared error on 4-bit levels from its lowest weight, `steps` levels to its highest."""
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = torch.clamp((high - low) / steps, min=2**-24).half().float()
    offset = low.half().float()
    levels = torch.clamp(torch.round((groups - offset) / scale), 0, 15)
    return (levels * scale + offset - groups).pow(2).sum(-1)


@needs_kernel
def test_4_bit_quantization_keeps_each_weight_within_a_16th_of_its_groups_range() -> None:
    """16 levels from a group's lowest weight, 8 to 15 steps to its highest (whichever leaves the least
    squared error), two a byte: (P, in/8, 64); never more squared error than 15 steps leave, which random
    groups mostly take."""
    weight = torch.randn(40, 96, generator=torch.Generator().manual_seed(1))
    weight[3, 32:64] = 0.25  # a constant group: its weights exact
    q, scales, offsets = quantized.quantize(weight, 4)
    assert q.shape == (3, 12, 64) and scales.shape == offsets.shape == (3, 3, 16)
    restored = quantized.dequantize(q, scales, offsets, 4)
    assert torch.equal(restored[40:], torch.zeros(8, 96))  # the padding
    groups = weight.reshape(40, 3, 32)
    difference = restored[:40].reshape(40, 3, 32) - groups
    error = difference.abs().amax(-1)
    range_ = groups.amax(-1) - groups.amin(-1)
    assert (error <= range_ / 16 * 1.001 + _float16s_rounding(groups) + 1e-6).all()
    assert (error <= range_ / 30 * 1.001 + _float16s_rounding(groups) + 1e-6).float().mean() > 0.6
    assert (difference.pow(2).sum(-1) <= _4_bit_squared_error(groups, 15) * (1 + 1e-5)).all()
    assert torch.equal(restored[3, 32:64], weight[3, 32:64])
    levels = quantized.levels(q, 4)
    assert int(levels.min()) == 0 and int(levels.max()) == 15
    # the lowest weight of each group is level 0: the offset, the lowest weight rounded to float16
    lowest = restored[:40].reshape(40, 3, 32).amin(-1)
    assert torch.equal(lowest, groups.amin(-1).half().float())


@needs_kernel
def test_4_bit_quantization_finds_the_grid_a_groups_weights_lie_on() -> None:
    """Weights that are evenly spaced values s steps apart from a group's lowest to its highest, s <= 15 (a
    GGUF's Q4_K levels, stored in bf16), come back as they are within their rounding, where 15 steps from
    lowest to highest would miss every grid whose s does not divide 15."""
    generator = torch.Generator().manual_seed(5)
    steps = torch.arange(1, 16).repeat_interleave(4)  # 60 groups, 4 of each span
    levels = torch.stack([torch.randint(0, int(s) + 1, (32,), generator=generator) for s in steps])
    levels[:, 0], levels[:, 1] = 0, steps  # both ends present
    step = 0.001 + 0.02 * torch.rand(60, 1, generator=generator)
    lowest = -8 * step * torch.rand(60, 1, generator=generator)
    weight = (step * levels + lowest).to(torch.bfloat16).reshape(20, 96)
    restored = quantized.dequantize(*quantized.quantize(weight, 4), bits=4)[:20].reshape(60, 32)
    groups = weight.float().reshape(60, 32)
    rounding = 2**-7 * groups.abs().amax(-1) + 0.01 * step.squeeze(1)  # bf16's of the extremes, float16's scale
    assert ((restored - groups).abs().amax(-1) <= rounding).all()
    missed = 15 % steps != 0
    fifteen = _4_bit_squared_error(groups, 15)
    assert (fifteen[missed] > 20 * (restored - groups).pow(2).sum(-1)[missed]).all()


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5, 4])
@pytest.mark.parametrize(
    ("out_features", "in_features"), [(48, 64), (40, 96), (7, 32), (130, 160), (24, 256), (7, 384)]
)
def test_the_kernel_computes_its_weights_on_activations_quantized_by_group(
    out_features: int, in_features: int, bits: int
) -> None:
    layer = _layer(out_features, in_features, bits=bits)
    x = torch.randn(2, 9, in_features, generator=torch.Generator().manual_seed(2))  # (batch, rows, in)
    x[0, 1, :32] = 0  # a group of zeros
    x[1, 2, 32 % in_features :] *= 1000  # groups of very different ranges
    output = layer(x)
    assert output.shape == (2, 9, out_features)
    assert torch.allclose(output.double(), _by_the_kernels_rule(layer, x), atol=1e-3, rtol=1e-5)
    # the same product as the float32 activations', within what 8-bit activations lose (1/254 of a group's
    # largest, per activation)
    exact = x.double() @ layer.dequantized().double().T + layer.bias[:out_features].double()  # type: ignore[index]
    group = _group(layer)
    assert group == (128 if bits == 8 and in_features % 128 == 0 else 32)
    groups = x.reshape(2, 9, -1, group).abs().amax(-1, keepdim=True).expand(-1, -1, -1, group).reshape(x.shape)
    bound = (groups.double() / 254) @ layer.dequantized().double().abs().T
    assert ((output.double() - exact).abs() <= bound + 1e-3).all()
    assert not torch.equal(output.double(), exact)
    unpacked = layer.unpacked()  # what transformers' kernels get: the float32 activations
    assert torch.allclose(unpacked(x).double(), exact, atol=1e-3)
    unbiased = _layer(out_features, in_features, bias=False, bits=bits)
    assert torch.equal(unbiased(x) + layer.bias[:out_features], output)  # type: ignore[index]


def _at_the_extremes(inputs: int = 64) -> tuple[quantized.QuantizedLinear, torch.Tensor]:
    """Every weight at its group's top level, 255 as stored, but the group's first at 0, and activations at
    +127 or -127 throughout: each pair of products (vpmaddwd's, AVX2 without VNNI) sums 2 * 255 * 127 =
    64,770, the most it ever does, where vpmaddubsw's 16-bit pairs would saturate at 32,767. `inputs` 64:
    two groups of 32; 256: two of 128."""
    weight = torch.ones(16, inputs)
    weight[:, :: quantized.group_size(inputs)] = -1.0
    return quantized.QuantizedLinear(weight, None), torch.cat([torch.ones(2, inputs), -torch.ones(2, inputs)])


@needs_kernel
@pytest.mark.parametrize("inputs", [64, 256])
def test_the_largest_levels_never_overflow_a_16_bit_pair(inputs: int) -> None:
    layer, x = _at_the_extremes(inputs)
    assert int(quantized.levels(layer.q, 8).max()) == 127  # levels less 128: 255 as stored
    expected = _by_the_kernels_rule(layer, x)
    assert torch.allclose(layer(x).double(), expected, rtol=1e-6)
    assert torch.allclose(expected, x.double() @ layer.dequantized()[:16].double().T, rtol=1e-3)


@needs_kernel
@pytest.mark.parametrize("bits", [8, 5, 4])
@pytest.mark.parametrize("in_features", [64, 896])
def test_a_rows_result_does_not_depend_on_the_forward_around_it(in_features: int, bits: int) -> None:
    """Forwards of 1 to 70 rows (the kernel's paths: up to 4 rows streaming the weights, more in blocks of
    rows and panels, 9 panels leaving a part block), any rows beside, on 1 or 2 threads: the same bits for
    the same row."""
    layer = _layer(130, in_features, bits=bits)
    x = torch.randn(70, in_features, generator=torch.Generator().manual_seed(3))
    whole = layer(x)
    for rows in (1, 2, 3, 4, 5, 6, 7, 13, 33, 64):
        assert torch.equal(layer(x[:rows]), whole[:rows]), rows
        assert torch.equal(layer(x[70 - rows :]), whole[70 - rows :]), rows
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(layer(x), whole)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize(("bits", "within"), [(8, 0.05), (5, 0.2), (4, 0.5)])
def test_a_model_on_integer_weights_keeps_plain_decodings_answer(bits: int, within: float) -> None:
    loaded = wide_model(512, torch.float32, settle=False)
    reference = loaded.model(torch.tensor([list(range(20, 60))])).logits
    assert quantized.quantize_linears(loaded.model, bits=bits) == 2 * 7 + 1  # 7 a layer, and the output layer
    assert quantized.weight_bits(loaded.model) == bits
    loaded.exactness = exactness.settle(loaded)
    assert loaded.exactness.bitwise and loaded.exactness.linear == f"int{bits}" and loaded.step_rows == 1
    assert f"int{bits} linear" in loaded.exactness.describe()
    logits = loaded.forward(list(range(20, 60)), loaded.new_cache())
    assert (logits - reference[0]).abs().max() < within * reference.abs().max()  # the same model, quantized
    speculative, plain = speculative_and_plain(loaded)
    assert speculative.tokens == plain.tokens
    assert speculative.stats.exactness is not None and speculative.stats.exactness["linear"] == f"int{bits}"
    with invariant.stock_kernels(loaded.model):  # transformers' kernels on the dequantized weights
        assert not quantized.is_quantized(loaded.model)
        stock = loaded.model(torch.tensor([list(range(20, 60))])).logits
    assert quantized.is_quantized(loaded.model)
    error = (stock[0] - logits).abs().max()  # the float32 activations against their 8-bit levels
    assert 0 < error < (0.04 if bits == 4 else 0.06) * stock.abs().max()


@needs_kernel
def test_auto_weights_are_int4_for_a_known_model_whose_weights_are_4_bit(tiny_model_dir: Any, tmp_path: Path) -> None:
    if torch.backends.cpu.get_cpu_capability() not in loading.AUTO_INT8_CAPABILITIES:
        pytest.skip("`auto` takes no integer weights on this CPU")
    folder = tmp_path / "hf"
    shutil.copytree(tiny_model_dir, folder)
    assert store.auto_weights(folder) == "int8"  # no completion marker: not a known model
    assert quantized.weight_bits(loading.load_model(str(folder), device="cpu").model) == 8
    (folder / store.MARKER_NAME).write_text(json.dumps({"name": store.QWEN_CODER_1_5B.name}))  # its Q4_K
    assert store.auto_weights(folder) == "int4"
    four = loading.load_model(str(folder), device="cpu")
    assert quantized.weight_bits(four.model) == 4 and four.exactness is not None and four.exactness.linear == "int4"
    asked = loading.load_model(str(folder), weights="int8", device="cpu")  # asked for: as asked
    assert quantized.weight_bits(asked.model) == 8
    (folder / store.MARKER_NAME).write_text(json.dumps({"name": store.DEFAULT_MODEL.name}))  # Q5_0 and Q8_0
    assert store.auto_weights(folder) == "int5"
    assert loading.auto_integer(str(folder)) == "int8"  # not the store's folder: no GGUF to read Q5_0 from


@needs_kernel
def test_int8_weights_are_loaded_where_asked_and_float_ones_otherwise(tiny_model_dir: Any) -> None:
    asked = loading.load_model(str(tiny_model_dir), dtype="float32", weights="int8", device="cpu")
    assert quantized.is_quantized(asked.model) and asked.exactness is not None and asked.exactness.linear == "int8"
    four = loading.load_model(str(tiny_model_dir), weights="int4", device="cpu")  # dtype auto: float32
    assert quantized.weight_bits(four.model) == 4 and four.exactness is not None and four.exactness.linear == "int4"
    refused = loading.load_model(str(tiny_model_dir), dtype="float32", weights="float", device="cpu")
    assert not quantized.is_quantized(refused.model) and refused.exactness is not None
    assert refused.exactness.linear != "int8"
    prompt = asked.tokenizer("def f(x):\n    return x")["input_ids"]
    both = [Engine(loaded).generate(prompt, max_new_tokens=8).tokens for loaded in (asked, refused)]
    assert all(len(tokens) == 8 for tokens in both)


@needs_kernel
def test_int8_weights_quantized_once_are_read_back_the_same(
    tiny_model_dir: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load quantizes and keeps the weights in a file; the next reads them without quantizing and
    computes the same bits; a file changed since it was written is refused, and quantized again once deleted;
    a changed model is quantized again."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    kept_dir = tmp_path / "int8"

    def load() -> loading.LoadedModel:
        return loading.load_model(str(model_dir), dtype="float32", weights="int8", device="cpu", kept_folder=kept_dir)

    prompt = list(range(20, 60))
    with torch.inference_mode():
        first = load().model(torch.tensor([prompt])).logits
        [kept] = kept_dir.glob("int8-*.safetensors")
        with monkeypatch.context() as patched:
            patched.setattr(quantized, "quantize", lambda weight, bits=8: pytest.fail("quantized again"))
            again = load()
            assert quantized.is_quantized(again.model)
            assert torch.equal(again.model(torch.tensor([prompt])).logits, first)
        kept.write_bytes(b"not a safetensors file")
        with pytest.raises(ModelLoadError, match=rf"{kept.name} changed since specedit wrote it"):
            load()
        kept.unlink()
        assert torch.equal(load().model(torch.tensor([prompt])).logits, first)
        assert kept.stat().st_size > 100  # written again
        weights = model_dir / "model.safetensors"
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # "changed"
        assert torch.equal(load().model(torch.tensor([prompt])).logits, first)
    [replaced] = kept_dir.glob("int8-*.safetensors")
    assert replaced != kept  # one kept file per model: the stale one is gone


@needs_kernel
def test_a_cache_that_cannot_be_written_still_loads(tiny_model_dir: Any, tmp_path: Path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    loaded = loading.load_model(
        str(tiny_model_dir), dtype="float32", weights="int8", device="cpu", kept_folder=blocked / "loaded"
    )
    assert quantized.is_quantized(loaded.model) and loaded.tokenizer.encode("def f(x):")


@needs_kernel
def test_a_16_bit_embedding_stays_16_bit_and_computes_the_same(tiny_model_dir: Any, tmp_path: Path) -> None:
    """On int8 weights the input embedding, stored in bf16, keeps its bf16 table (half a float32 copy's
    memory) and gives the float32 copy's logits bit for bit; one tied to the output layer stays float."""
    from transformers import AutoModelForCausalLM

    stored = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(stored)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, stored / name)
    loaded = loading.load_model(str(stored), dtype="float32", weights="int8", device="cpu")
    embedding = loaded.model.get_input_embeddings()
    assert isinstance(embedding, quantized.StoredEmbedding) and embedding.bits.dtype == torch.int16
    prompt = torch.tensor([list(range(20, 60))])
    with torch.inference_mode():
        logits = loaded.model(prompt).logits
        widened = embedding.bits.view(torch.bfloat16).float()
        loaded.model.set_input_embeddings(torch.nn.Embedding.from_pretrained(widened))
        assert torch.equal(loaded.model(prompt).logits, logits)
    tied = torch.nn.Embedding(8, 4).to(torch.bfloat16)

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = tied, torch.nn.Linear(4, 8, bias=False)
            self.head.weight = tied.weight

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.embed

    assert not quantized.keep_embedding_stored(Tied())


def test_auto_takes_int8_on_avx2_and_avx512_kernels_in_float32_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "available", lambda folder=None: None)
    cpu = torch.device("cpu")
    for capability in ("AVX2", "AVX512"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability)
        assert loading.int8_weights("auto", cpu, torch.float32)
        assert not loading.int8_weights("auto", cpu, torch.bfloat16)  # native bf16 keeps bf16
        assert not loading.int8_weights("float", cpu, torch.float32)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")  # steered to SSE4.1
    assert not loading.int8_weights("auto", cpu, torch.float32)
    assert loading.int8_weights("int8", cpu, torch.float32)
    assert not loading.int8_weights("auto", torch.device("cuda"), torch.float32)


def test_int8_weights_that_cannot_run_are_a_clear_error_or_float(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "available", lambda folder=None: "specedit's kernels need a C++ compiler (g++)")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    cpu = torch.device("cpu")
    with pytest.raises(ModelLoadError, match="--weights int8: specedit's kernels need a C\\+\\+ compiler"):
        loading.int8_weights("int8", cpu, torch.float32)
    with pytest.raises(ModelLoadError, match="computes in float32"):
        loading.int8_weights("int8", cpu, torch.bfloat16)
    assert not loading.int8_weights("auto", cpu, torch.float32)  # auto: float32, said in the log


def test_a_missing_compiler_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(kernels, "_registered", lambda: False)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    kernels._load.cache_clear()
    try:
        reason = kernels.available(tmp_path / "kernels")
    finally:
        kernels._load.cache_clear()
    if exactness.cpu_class() == "baseline":
        assert reason is not None and "AVX2" in reason
    else:
        assert reason is not None and "did not compile" in reason and "no-such-compiler" in reason
    assert not list((tmp_path / "kernels").glob("*.so"))


def test_a_cpu_without_what_the_kernels_are_compiled_for_is_told_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """AVX2 without F16C (which the float16 scales are widened with) or FMA: a reason, never a library
    that would fault on its first instruction."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: ["sse4_2", "avx", "avx2", "fma"])
    reason = kernels.library(tmp_path)
    assert isinstance(reason, str) and "AVX2, FMA and F16C" in reason and "lacks f16c" in reason
    monkeypatch.setattr(kernels, "cpu_flags", lambda: [])  # not x86
    assert kernels.library(tmp_path) == (
        "specedit's kernels need an x86 CPU with AVX2, FMA and F16C (this one lacks avx2, fma, f16c)"
    )
    assert not list(tmp_path.iterdir())


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 64), (4, 4, 8), (6, 2, 24)])
def test_the_attention_on_own_kernels_is_torchs_and_row_invariant(heads: int, kv_heads: int, head_dim: int) -> None:
    """Grouped-query heads and head sizes that are not a multiple of 16 (padded), against torch's attention
    with the same causal mask, and each query row the same whatever the forward's size."""
    generator = torch.Generator().manual_seed(5)
    length = 300  # past the kernel's chunk of 256 keys for the weighted values
    query = torch.randn(1, heads, length, head_dim, generator=generator)
    key, value = (torch.randn(1, kv_heads, length, head_dim, generator=generator) for _ in range(2))
    module = torch.nn.Module()
    whole, _ = invariant.invariant_attention(module, query, key, value, None)  # (1, q, H, D)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=causal, enable_gqa=kv_heads != heads
    ).transpose(1, 2)
    assert whole.shape == (1, length, heads, head_dim)
    assert torch.allclose(whole, expected, atol=1e-5)
    for first in (0, 37, 63, 64, 100, 149, 250, 256, 299):  # the last queries, after a cache of `first` positions
        part, _ = invariant.invariant_attention(module, query[:, :, first:], key, value, None)
        assert torch.equal(part, whole[:, first:]), first


@needs_kernel
def test_the_attention_reads_float16_keys_and_values_as_their_float32_widening() -> None:
    """A cache in float16 (`--kv-cache float16`): the same bits as the float32 kernel on those
    keys and values widened, each query row its own whatever the forward's size, past a key chunk."""
    generator = torch.Generator().manual_seed(9)
    query = torch.randn(6, 300, 64, generator=generator)
    key, value = (torch.randn(2, 300, 64, generator=generator).half() for _ in range(2))
    whole = kernels.attention(query, key, value, 0, 0.125)
    assert torch.equal(whole, kernels.attention(query, key.float(), value.float(), 0, 0.125))
    for first in (1, 64, 255, 299):
        assert torch.equal(kernels.attention(query[:, first:], key, value, first, 0.125), whole[first:]), first
    buffer = torch.zeros(2, 2, 384, 64, dtype=torch.float16)  # a cache's buffers, longer than what it holds
    buffer[0, :, :300], buffer[1, :, :300] = key, value
    assert torch.equal(kernels.attention(query, buffer[0, :, :300], buffer[1, :, :300], 0, 0.125), whole)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        kernels.attention(query, key, value.float(), 0, 0.125)


@needs_kernel
@pytest.mark.parametrize(("bits", "inputs"), [((8, 8, 8), 96), ((4, 4, 4), 96), ((5, 5, 8), 96), ((5, 8, 4), 256)])
def test_layers_in_one_call_are_each_layers_own_call(bits: tuple[int, int, int], inputs: int) -> None:
    """q, k and v (or gate and up) in one call: the activations quantized once per group size, each layer's
    outputs its own call's bit for bit, whatever the rows (1 to 70: both of the kernel's paths), padded
    outputs, biases or none, and the layers' widths (int5's q and k beside int8's v; at 256 inputs int8's
    groups of 128 beside 32); a float layer among them is left to the caller."""
    layers = [_layer(64, inputs, bits=bits[0], seed=1), _layer(40, inputs, bits=bits[1], seed=2)]
    layers.append(_layer(16, inputs, bias=False, seed=3, bits=bits[2]))
    x = torch.randn(70, inputs, generator=torch.Generator().manual_seed(4))
    for rows in (1, 2, 3, 4, 5, 70):
        together = quantized.linears(x[:rows], layers)
        assert together is not None and [t.shape for t in together] == [(rows, 64), (rows, 40), (rows, 16)]
        for output, layer in zip(together, layers, strict=True):
            assert torch.equal(output, layer(x[:rows])), rows
    assert quantized.linears(x, [layers[0], torch.nn.Linear(inputs, 16)]) is None


def _same_levels(
    levels: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor
) -> tuple[quantized.QuantizedLinear, quantized.QuantizedLinear]:
    """5-bit levels (out, in) 0..31, scales and offsets (out, in/32) as a 5-bit layer, and as an 8-bit one of
    the same weights (each level + 128 as stored: scale * (stored - 128) + offset, groups of 32)."""
    weight = torch.zeros(levels.shape)  # (only its shape is read)
    five = quantized.QuantizedLinear(weight, None, quantized.pack(levels, scales, offsets), bits=5)
    eight = quantized.QuantizedLinear(weight, None, quantized.pack(levels + 128, scales, offsets), bits=8)
    return five, eight


@needs_kernel
@pytest.mark.parametrize("inputs", [96, 896])
def test_5_bit_levels_compute_what_8_bit_ones_do_on_the_same_levels(inputs: int) -> None:
    """The 5-bit kernel (AVX2: vpmaddubsw, half a group in 16-bit lanes) sums each group's products as the
    8-bit one does: on the same levels, scales and offsets in groups of 32, the same bits, every row count;
    at the extremes (every level 31, activations +-127: 8 products of 3,937 in a 16-bit lane) too."""
    generator = torch.Generator().manual_seed(11)
    levels = torch.randint(0, 32, (40, inputs), generator=generator, dtype=torch.uint8)
    scales = (torch.rand(40, inputs // 32, generator=generator) * 0.01 + 1e-4).half()
    offsets = (-16 * scales.float()).half()  # Q5_0's: w = d * (level - 16)
    five, eight = _same_levels(levels, scales, offsets)
    assert torch.equal(five.dequantized(), eight.dequantized())
    x = torch.randn(70, inputs, generator=generator)
    for rows in (1, 2, 3, 4, 5, 7, 13, 64, 70):
        assert torch.equal(five(x[:rows]), eight(x[:rows])), rows
    (top, top8), extremes = _5_bit_extremes(inputs)
    assert torch.equal(top(extremes), top8(extremes))
    assert torch.allclose(top(extremes).double(), extremes.double() @ top.dequantized().double().T, rtol=1e-5)


def _5_bit_extremes(
    inputs: int = 96,
) -> tuple[tuple[quantized.QuantizedLinear, quantized.QuantizedLinear], torch.Tensor]:
    """Every 5-bit level 31 and activations at +-127 throughout: a 16-bit lane sums 8 products of 3,937
    (31,496) before it is widened (AVX2 without VNNI); as 5-bit and 8-bit layers."""
    groups = inputs // quantized.GROUP
    layers = _same_levels(torch.full((16, inputs), 31, dtype=torch.uint8), torch.ones(16, groups).half(),
                          torch.zeros(16, groups).half())  # fmt: skip
    return layers, torch.cat([torch.ones(2, inputs), -torch.ones(2, inputs)])


def _rms_norm_by_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@needs_kernel
def test_the_layers_glue_is_torchs_to_rounding_and_each_row_its_own() -> None:
    """RMSNorm within a float32 rounding of torch's (its sum of squares in double), the rotary embeddings
    torch's bit for bit, SiLU times up within a few roundings of torch's; a row's result the same alone
    or among others, and an element past the last whole vector computed as one inside it."""
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(9, 896, generator=generator) * 5
    weight = torch.randn(896, generator=generator)
    normed = kernels.rms_norm(x, weight, 1e-6)
    assert torch.allclose(normed, _rms_norm_by_torch(x, weight, 1e-6), rtol=2e-6, atol=1e-6)
    assert all(torch.equal(kernels.rms_norm(x[r : r + 1], weight, 1e-6), normed[r : r + 1]) for r in range(9))
    assert torch.equal(kernels.rms_norm(torch.zeros(1, 896), weight, 1e-6), torch.zeros(1, 896))

    heads, width, rows = 6, 64, 7
    states = torch.randn(1, rows, heads * width, generator=generator)
    cos, sin = (torch.randn(rows, width, generator=generator) for _ in range(2))
    cos, sin = torch.cat([cos[:, : width // 2]] * 2, -1), torch.cat([sin[:, : width // 2]] * 2, -1)
    rotated = kernels.rotary(states, cos, sin, heads)  # (heads, rows, width)
    split = states.view(1, rows, heads, width).transpose(1, 2)
    turned = torch.cat((-split[..., width // 2 :], split[..., : width // 2]), dim=-1)
    assert torch.equal(rotated[None], split * cos + turned * sin)
    assert torch.equal(kernels.rotary(states[:, 3:4], cos[3:4], sin[3:4], heads), rotated[:, 3:4])

    gate = torch.randn(3, 4864 + 5, generator=generator) * 8
    gate[0, :4] = torch.tensor([0.0, -100.0, 100.0, -1e-30])
    up = torch.randn(3, 4864 + 5, generator=generator)
    product = kernels.silu_mul(gate, up)
    expected = torch.nn.functional.silu(gate.double()) * up.double()
    assert torch.allclose(product.double(), expected, rtol=1e-6, atol=1e-30)
    assert all(torch.equal(kernels.silu_mul(gate[r], up[r]), product[r]) for r in range(3))
    tail = torch.cat([gate[0, :3], gate[1, -5:]]), torch.cat([up[0, :3], up[1, -5:]])
    assert torch.equal(kernels.silu_mul(*tail), torch.cat([product[0, :3], product[1, -5:]]))


@needs_kernel
def test_a_decoder_on_the_kernels_glue_computes_what_its_torch_glue_does(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 on the CPU with the kernels loaded: the layers' glue is theirs (one call where torch took
    6-8), the logits torch's to rounding, and on integer weights a row's logits the same whatever the
    forward around it. Called outside inference mode, as a user of the class may: the model enters it itself
    (the cache's buffers are inference tensors, which autograd may not keep for a backward)."""
    from specedit.engine.model import decoder

    config = decoder.covered(tiny_model_dir)
    assert config is not None
    model = decoder.load(tiny_model_dir, config, torch.float32)
    ids = torch.tensor([list(range(3, 40))])
    calls: list[str] = []
    for name in ("rms_norm", "rotary", "silu_mul"):
        monkeypatch.setattr(kernels, name, _counting(getattr(kernels, name), name, calls))
    own = model(ids).logits
    layers = config.num_hidden_layers
    expected = {"rms_norm": 2 * layers + 1, "rotary": 2 * layers, "silu_mul": layers}
    assert {name: calls.count(name) for name in set(calls)} == expected
    with monkeypatch.context() as torch_glue:
        torch_glue.setattr(decoder.kernels, "loaded", lambda: False)
        assert torch.allclose(model(ids).logits, own, rtol=1e-4, atol=1e-4)
    quantized.quantize_linears(model)  # (torch's float32 products are not row-invariant: the kernel's are)
    whole, cache = model(ids).logits, model.new_cache()
    pieces = [model(ids[:, :20], cache=cache), model(ids[:, 20:21], cache=cache), model(ids[:, 21:], cache=cache)]
    assert torch.equal(torch.cat([piece.logits for piece in pieces], dim=1), whole)


def _counting(function: Any, name: str, calls: list[str]) -> Any:
    def counted(*args: Any) -> Any:
        calls.append(name)
        return function(*args)

    return counted


VARIANT_CHECK = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from test_kernels import _5_bit_extremes, _at_the_extremes, _layer
    from specedit.engine.model import kernels, quantized
    assert kernels.available() is None
    x = torch.randn(70, 96, generator=torch.Generator().manual_seed(7))
    layer, four, wide = _layer(40, 96), _layer(40, 96, bits=4), _layer(40, 256)  # wide: groups of 128
    five = _layer(40, 96, bits=5)
    query, key, value = torch.randn(3, 6, 300, 48, generator=torch.Generator().manual_seed(8)) * 3
    y = torch.randn(70, 256, generator=torch.Generator().manual_seed(9))
    tall = (x.repeat(2, 1)[:133], y.repeat(2, 1)[:133])  # from 128 rows AVX2 splits its weights once a panel
    linear = torch.cat([weights(rows) for weights in (layer, four, five)
                        for rows in (tall[0], x, x[:4], x[:3], x[:2], x[:1])]
                       + [wide(rows) for rows in (tall[1], y, y[:4], y[:3], y[:2], y[:1])])
    attention = torch.cat([kernels.attention(query[:, 20:], key[:2], value[:2], 20, 0.3),  # 3 heads a kv head
                           kernels.attention(query[:, 250:], key[:2], value[:2], 250, 0.3),  # 2 key chunks
                           kernels.attention(query[:, 299:], key[:2], value[:2], 299, 0.3),
                           kernels.attention(query[:, 240:], key[:2].half(), value[:2].half(), 240, 0.3)])
    extreme, at = _at_the_extremes()
    glue = torch.cat([kernels.rms_norm(x, x[0], 1e-6), kernels.silu_mul(x * 9, x.flip(0)),
                      kernels.silu_mul(x[0, :13] * 9, x[1, :13]).expand(70, 13),
                      kernels.rotary(x[:, :64], x[:, 64:80].repeat(1, 2), x[:, 80:96].repeat(1, 2), 2)[1]], dim=1)
    pairs = (([layer, _layer(16, 96, seed=1)], x), ([four, _layer(16, 96, seed=1, bits=4)], x),
             ([wide, _layer(16, 256, seed=1)], y), ([five, _layer(16, 96, seed=1)], x),
             ([_layer(8, 256, seed=2, bits=5), wide, _layer(8, 256, seed=3, bits=4)], y))
    together = torch.cat([torch.cat(quantized.linears(rows, pair), dim=1)
                          for pair, inputs in pairs for rows in (inputs, inputs[:3])])
    wide_extreme, wide_at = _at_the_extremes(256)  # groups of 128
    (top, _), top_at = _5_bit_extremes()
    extremes = torch.cat([extreme(at.repeat(rows, 1)) for rows in (1, 8, 33)]  # 4, 32 (AMX's tiles) and 132 rows
                         + [wide_extreme(wide_at.repeat(rows, 1)) for rows in (1, 8, 33)]
                         + [top(top_at.repeat(rows, 1)) for rows in (1, 8, 33)])
    torch.save({"variant": kernels.variant(), "linear": linear, "attention": attention, "extremes": extremes,
                "glue": glue, "together": together}, sys.argv[2])
    """
)


@needs_kernel
def test_every_variant_of_the_kernels_gives_the_same_bits(tmp_path: Path) -> None:
    """Each output is one lane, computed the same way on 8-lane and 16-lane vectors, with VNNI's 4-product
    sums, AVX2's 2-product ones or AMX's tiles: every variant this CPU runs (`SPECEDIT_KERNELS`) gives the
    same bits, every row count, both ops, int8, int5 and int4 weights, and the levels at their extremes."""
    variants = kernels.runnable_variants()
    if len(variants) == 1:
        pytest.skip(f"torch runs {torch.backends.cpu.get_cpu_capability()} here: the AVX2 kernels only")
    results = {}
    for variant in variants:
        # (an AVX-VNNI CPU steered to AVX2 by ATEN_CPU_CAPABILITY would still take avx2-vnni: named instead)
        steering = {kernels.VARIANT_VARIABLE: variant}
        out = tmp_path / f"{variant}.pt"
        command = [sys.executable, "-c", VARIANT_CHECK, str(Path(__file__).parent), str(out)]
        completed = subprocess.run(command, env={**os.environ, **steering}, capture_output=True, text=True, timeout=600)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results[variant] = torch.load(out)
    assert [results[variant]["variant"] for variant in variants] == variants
    for variant in variants[1:]:
        assert torch.equal(results[variant]["linear"], results["avx2"]["linear"]), variant
        assert torch.equal(results[variant]["attention"], results["avx2"]["attention"]), variant
        assert torch.equal(results[variant]["extremes"], results["avx2"]["extremes"]), variant
        assert torch.equal(results[variant]["glue"], results["avx2"]["glue"]), variant
        assert torch.equal(results[variant]["together"], results["avx2"]["together"]), variant


@needs_kernel  # (which a C++ compiler built)
def test_the_avx_vnni_variant_compiles_where_the_cpu_cannot_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AVX-VNNI without AVX-512 (recent Intel laptops) is a variant of its own, with 16 vector
    registers (its blocks sized for them), that no machine of the project's runs: it must still compile,
    to AVX-VNNI's own instruction."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: ["avx2", "fma", "f16c", "avx_vnni"])
    flags = kernels.compile_flags("avx2-vnni")
    assert "-mavxvnni" in flags and not any(flag.startswith("-mavx512") for flag in flags)
    library = tmp_path / "kernels-avx-vnni.so"
    assert kernels.compile_library(os.environ.get("CXX") or "g++", flags, library) is None
    listing = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "{vex} vpdpbusd" in listing and "zmm" not in listing


def test_the_weights_option_is_checked() -> None:
    assert EngineOptions().weights == "auto"
    assert EngineOptions(weights="int4").weights == "int4"
    with pytest.raises(ValueError, match="weights must be one of auto, int8, int5, int4, float"):
        EngineOptions(weights="int3")


def test_the_kv_cache_option_is_checked_and_reaches_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--kv-cache` (`specedit.kvCache`): float32 by default, float16 asked for, nothing else; the engine's
    load gets it."""
    from specedit.engine.backends import local

    assert EngineOptions().kv_cache == "float32"
    with pytest.raises(ValueError, match="kv_cache must be one of float32, float16"):
        EngineOptions(kv_cache="int8")
    given: dict[str, Any] = {}
    monkeypatch.setattr(loading, "load_model", lambda source, **options: given.update(options))
    monkeypatch.setattr("specedit.engine.store.fetch.resolve_model", lambda name, progress=None: "folder")
    local.load_target(EngineOptions(kv_cache="float16"))
    assert given["kv_cache"] == "float16"
