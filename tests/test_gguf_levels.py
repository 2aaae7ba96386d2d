"""A GGUF's Q5_0 layers read as they are (engine.model.gguf_levels) and computed on the 5-bit kernel
(`--weights int5`): the tensor index is the `gguf` package's, the levels its dequantization, and a model
converted from a GGUF computes those layers on exactly the GGUF's weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_engine_exactness import NoisyOracleDrafter
from test_kernels import needs_kernel
from test_model_store import FakeIndex, write_tiny_qwen2_gguf

from specedit.engine.loop.generate import Engine
from specedit.engine.model import gguf_levels, kernels, loading, quantized
from specedit.engine.store import fetch, store

# q, k, o, gate and up of both layers, and the output layer, as Q5_0; v, down and the embedding F32
Q5_0_NAMES = (
    *(f"blk.{i}.{part}.weight" for i in (0, 1) for part in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")),
    "output.weight",
)


def test_the_index_and_levels_are_the_gguf_packages(tmp_path: Path) -> None:
    from gguf import GGUFReader

    path = tmp_path / "tiny.gguf"
    values = write_tiny_qwen2_gguf(path, q5_0=Q5_0_NAMES)
    index = gguf_levels.tensor_index(path)
    reference = {tensor.name: tensor for tensor in GGUFReader(path).tensors}
    assert index.keys() == reference.keys()
    for name, entry in index.items():
        assert entry.start == reference[name].data_offset, name
        assert entry.kind == reference[name].tensor_type.value, name
        assert entry.shape == tuple(reversed([int(d) for d in reference[name].shape])), name
    read = {name: (levels, scales, offsets) for name, levels, scales, offsets in gguf_levels.q5_0_layers(path)}
    assert sorted(read) == sorted(Q5_0_NAMES)
    for name, (levels, scales, offsets) in read.items():
        assert levels.dtype == torch.uint8 and int(levels.max()) <= 31 and scales.dtype == torch.float16
        weights = levels.reshape(*scales.shape, 32).float() * scales[..., None].float() + offsets[..., None].float()
        expected = torch.from_numpy(np.asarray(values[name], dtype=np.float32))
        assert torch.equal(weights.reshape(expected.shape), expected), name  # bit for bit
    first = gguf_levels.q5_0_layers(path, lambda name: name.startswith("blk.1."))
    assert next(first)[0].startswith("blk.1.")
    first.close()  # stopped early: the file's map closes, no array pointing into it
    assert gguf_levels.model_name("blk.1.ffn_up.weight") == "model.layers.1.mlp.up_proj"
    assert gguf_levels.model_name("blk.1.attn_q.bias") is None
    assert gguf_levels.model_name("output.weight") == gguf_levels.model_name("token_embd.weight") == "lm_head"


def test_a_file_that_is_not_a_whole_gguf_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(gguf_levels.GGUFError, match="not a GGUF file"):
        gguf_levels.tensor_index(other)
    whole = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(whole)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(gguf_levels.GGUFError, match="ends inside its header"):
        gguf_levels.tensor_index(cut)


def _converted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, object]]:
    """A tiny GGUF with Q5_0 layers through the store's real converter, known to the store as a model
    whose `--weights auto` is int5."""
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path / "cache"))
    gguf_file = tmp_path / "tiny.gguf"
    values = write_tiny_qwen2_gguf(gguf_file, q5_0=Q5_0_NAMES)
    index = FakeIndex(tmp_path, [gguf_file.read_bytes()])
    spec = index.spec(weights="int5")
    folder = fetch.ensure_model(spec, downloader=index)
    monkeypatch.setitem(store.KNOWN_MODELS, spec.name, spec)
    return folder, values


def _integer_layers(loaded: loading.LoadedModel) -> dict[str, quantized.QuantizedLinear]:
    return {name: m for name, m in loaded.model.named_modules() if isinstance(m, quantized.QuantizedLinear)}


@needs_kernel
def test_int5_computes_a_ggufs_q5_0_layers_on_its_own_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, values = _converted(tmp_path, monkeypatch)
    assert store.source_gguf(folder) == store.gguf_path(store.KNOWN_MODELS["fake-model"])
    kept = tmp_path / "kept"
    loaded = loading.load_model(str(folder), weights="int5", device="cpu", kept_folder=kept)
    layers = _integer_layers(loaded)
    five = {name for name, module in layers.items() if module.bits == 5}
    assert five == {gguf_levels.model_name(name) for name in Q5_0_NAMES}  # the rest at 8 bits
    assert {module.bits for name, module in layers.items() if name not in five} == {8}
    for name in Q5_0_NAMES:  # the GGUF's weights exactly, not their bf16 rounding
        expected = torch.from_numpy(np.asarray(values[name], dtype=np.float32))
        assert torch.equal(layers[str(gguf_levels.model_name(name))].dequantized(), expected), name
    assert loaded.exactness is not None and loaded.exactness.bitwise and loaded.exactness.linear == "int5"
    prompt = loaded.tokenizer("a test")["input_ids"] * 4
    logits = loaded.forward(prompt, loaded.new_cache())
    engine = Engine(loaded)
    engine.eos_token_ids = frozenset()
    plain = engine.generate(prompt, max_new_tokens=24)
    drafter = NoisyOracleDrafter(plain.tokens, len(prompt), len(loaded.tokenizer), 0)
    assert engine.generate(prompt, max_new_tokens=24, drafter=drafter).tokens == plain.tokens

    [kept_file] = kept.glob("int5-*.safetensors")  # read back: the same widths and bits, no GGUF read
    monkeypatch.setattr(quantized, "gguf_packed", lambda *_: pytest.fail("the kept weights were not used"))
    again = loading.load_model(str(folder), weights="int5", device="cpu", kept_folder=kept)
    assert {name: module.bits for name, module in _integer_layers(again).items()} == {
        name: module.bits for name, module in layers.items()
    }
    assert torch.equal(again.forward(prompt, again.new_cache()), logits)
    assert kept_file.exists()


@needs_kernel
@pytest.mark.parametrize(("variant", "expected"), [("avx2", 5), ("avx2-vnni", 8), ("avx512", 8), ("avx512-vnni", 8)])
def test_auto_takes_int5_on_avx2_without_vnni_only(
    variant: str, expected: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--weights auto` for a model whose own weights are mostly Q5_0: int5 where AVX2's vpmaddubsw makes it
    the faster, int8 with VNNI or AVX-512 (the kernels loaded are this machine's: only the choice is
    steered)."""
    if torch.backends.cpu.get_cpu_capability() not in loading.AUTO_INT8_CAPABILITIES:
        pytest.skip("`auto` takes no integer weights on this CPU")
    folder, _ = _converted(tmp_path, monkeypatch)
    monkeypatch.setattr(kernels, "variant", lambda: variant)
    loaded = loading.load_model(str(folder), device="cpu")
    assert quantized.weight_bits(loaded.model) == expected


@needs_kernel
def test_int5_without_a_gguf_quantizes_every_layer_to_5_bits(tiny_model_dir: Path) -> None:
    loaded = loading.load_model(str(tiny_model_dir), weights="int5", device="cpu")
    widths = {module.bits for module in loaded.model.modules() if isinstance(module, quantized.QuantizedLinear)}
    assert widths == {5} and loaded.exactness is not None and loaded.exactness.linear == "int5"


def test_a_folder_is_only_taken_for_its_gguf_where_the_store_converted_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path / "cache"))
    elsewhere = tmp_path / "hf"
    elsewhere.mkdir()
    (elsewhere / store.MARKER_NAME).write_text(json.dumps({"name": store.DEFAULT_MODEL.name}))
    assert store.source_gguf(elsewhere) is None  # a known model's marker, but not the store's folder
    assert store.source_gguf(store.converted_path()) is None  # the store's, without its GGUF in place
