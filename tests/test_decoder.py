"""specedit's own forward of the Llama family (`model.decoder`) against transformers' on the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_kernels import needs_kernel

from specedit.engine.model import decoder, quantized
from specedit.engine.model.loading import load_model

from conftest import build_model, build_tokenizer


def saved(architecture: str, folder: Path, **config: Any) -> Any:
    model = build_model(architecture, 300, seed=5, layers=3)
    for key, value in config.items():
        setattr(model.config, key, value)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_the_decoder_computes_what_transformers_computes(architecture: str, tmp_path: Path) -> None:
    reference = saved(architecture, tmp_path)
    config = decoder.covered(tmp_path)
    assert config is not None and config.num_hidden_layers == 3
    model = decoder.load(tmp_path, config, torch.float64)
    ids = torch.randint(0, 300, (1, 70), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = reference(ids).logits
        cache = model.new_cache()
        pieces = [model(ids[:, start:stop], cache).logits for start, stop in ((0, 40), (40, 41), (41, 70))]
        assert cache.get_seq_length() == 70 and [layer.length() for layer in cache.layers] == [70, 70, 70]
        last = model(ids, model.new_cache(), logits_to_keep=1).logits
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(last, expected[:, -1:], rtol=1e-10, atol=1e-10)


def test_what_the_decoder_does_not_cover_loads_with_transformers(tmp_path: Path) -> None:
    saved("gpt2", tmp_path / "gpt2")
    assert decoder.covered(tmp_path / "gpt2") is None
    loaded = load_model(str(tmp_path / "gpt2"), dtype="float32", weights="float", device="cpu", target=False)
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"
    saved("qwen2", tmp_path / "window", use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert decoder.covered(tmp_path / "window") is None
    saved("llama", tmp_path / "scaled", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert decoder.covered(tmp_path / "scaled") is None
    assert decoder.covered(tmp_path / "nothing-here") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert decoder.covered(tmp_path / "broken") is None


def test_a_decoder_reads_its_end_tokens_and_lacks_no_weight(tmp_path: Path) -> None:
    saved("qwen2", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    config = decoder.covered(tmp_path)
    assert config is not None
    assert decoder.load(tmp_path, config, "auto").generation_config.eos_token_id == [7, 8]
    from safetensors.torch import load_file, save_file

    (file,) = tmp_path.glob("*.safetensors")
    weights = load_file(file)
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, file)
    with pytest.raises(ValueError, match="up_proj"):
        decoder.load(tmp_path, config, "auto")


def test_a_second_load_of_a_covered_model_imports_no_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Start-up: the model's forward (`model.decoder`), its cache and its kept tokenizer need nothing of
    transformers, whose import costs 2 s of a one-off rewrite's start (the first load imports it to build
    the tokenizer it keeps)."""
    script = (
        "import sys; from pathlib import Path; from specedit.engine.model.loading import load_model; "
        f"loaded = load_model({str(tiny_model_dir)!r}, dtype='float32', weights='float', device='cpu', "
        f"kept_folder=Path({str(tmp_path)!r})); "
        "assert type(loaded.model).__name__ == 'Decoder'; "
        "assert loaded.tokenizer.encode('def f(x):') and loaded.tokenizer.apply_chat_template("
        "[{'role': 'user', 'content': 'x'}], add_generation_prompt=True); "
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'transformers')[:3])"
    )
    outputs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert outputs[0].strip() != "[]"  # the first built the tokenizer with transformers, and kept it
    assert outputs[1].strip() == "[]"


def test_the_cache_grows_in_buckets_with_zeros_past_what_it_holds() -> None:
    from specedit.engine.model import kv_cache
    from specedit.engine.model.invariant import KV_BUCKET

    cache = kv_cache.KVCache()
    states = [torch.randn(1, 2, size, 8, dtype=torch.float64) for size in (70, 1, 300)]
    keys, values = cache.update(states[0], -states[0], 0)
    assert keys.shape[-2] == 2 * KV_BUCKET and torch.equal(keys[..., :70, :], states[0])
    assert not keys[..., 70:, :].any() and torch.equal(values[..., :70, :], -states[0])
    cache.update(states[1], -states[1], 0)
    keys, _ = cache.update(states[2], -states[2], 0)  # past the spare room: copied into a larger buffer
    assert cache.get_seq_length() == 371 and keys.shape[-2] == 384 and not keys[..., 371:, :].any()
    assert torch.equal(cache.layers[0].keys, torch.cat(states, dim=-2))
    kv_cache.rollback(cache, 65)
    assert cache.get_seq_length() == 65 and torch.equal(cache.layers[0].keys, states[0][..., :65, :])
    keys, _ = cache.update(states[1], -states[1], 0)
    assert keys.shape[-2] == 2 * KV_BUCKET and not keys[..., 66:, :].any()  # the dropped positions are zeros
    before = kv_cache.nbytes(cache)
    kv_cache.compact(cache)
    assert kv_cache.nbytes(cache) < before and torch.equal(cache.layers[0].values[..., 65:, :], -states[1])
    copy = kv_cache.copy_prefix(cache, 30)
    assert type(copy) is kv_cache.KVCache and torch.equal(copy.layers[0].keys, states[0][..., :30, :])
    half = kv_cache.KVCache(torch.float16)
    keys, _ = half.update(states[0], -states[0], 0)  # rounded as they are added
    assert keys.dtype == torch.float16 and torch.equal(half.layers[0].keys, states[0].half())
    assert kv_cache.copy_prefix(half, 30).layers[0].keys.dtype == torch.float16


class _RoundedToHalf:
    """A float32 `KVCache` given every key and value rounded to float16 first."""

    def __init__(self) -> None:
        from specedit.engine.model import kv_cache

        self.inner = kv_cache.KVCache()
        self.layers = self.inner.layers

    def get_seq_length(self, index: int = 0) -> int:
        return self.inner.get_seq_length(index)

    def update(self, keys: torch.Tensor, values: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.update(keys.half().float(), values.half().float(), index)


def _in_pieces(loaded: Any, ids: list[int], cache: Any) -> torch.Tensor:
    """The logits of 700 `ids` forwarded in pieces on `cache`: a prompt, one token, many, a few, then a
    rollback to 405 and the rest (the cache grown past its spare room, and cropped)."""
    from specedit.engine.model import kv_cache

    with torch.inference_mode():
        logits = [loaded.forward(ids[:100], cache)]
        for start, stop in ((100, 101), (101, 420), (420, 437)):
            logits.append(loaded.forward(ids[start:stop], cache))
        kv_cache.rollback(cache, 405)
        logits.append(loaded.forward(ids[405:700], cache))
    return torch.cat(logits)


@needs_kernel
def test_a_forward_on_the_decoders_cache_is_a_forward_on_transformers_cache(tiny_model_dir: Path) -> None:
    """Bit for bit, in float32 on the engine's kernels, across the cache's growth and a rollback; and the
    float16 cache the decoder makes there (`--kv-cache float16`) is the float32 one given its keys and values
    rounded to float16."""
    from transformers import DynamicCache

    from specedit.engine.model import kv_cache

    assert load_model(str(tiny_model_dir), dtype="float32", device="cpu").new_cache().dtype is None  # the default
    loaded = load_model(str(tiny_model_dir), dtype="float32", weights="auto", kv_cache="float16", device="cpu")
    ids = torch.randint(0, loaded.model.config.vocab_size, (700,), generator=torch.Generator().manual_seed(2)).tolist()
    rows = []
    made = loaded.new_cache()
    assert made.dtype == torch.float16 and loaded.exactness is not None
    assert "float32, float16 cache" in loaded.exactness.describe()
    for cache in (kv_cache.KVCache(), DynamicCache(), made, _RoundedToHalf()):
        rows.append(_in_pieces(loaded, ids, cache))
    assert torch.equal(rows[0], rows[1])  # the layers in one call each (`KVCache`), and op by op (transformers')
    assert all(layer._whole[1] is not None for layer in loaded.model.model.layers)
    assert made.layers[0].keys is not None and made.layers[0].keys.dtype == torch.float16
    assert torch.equal(rows[2], rows[3]) and not torch.equal(rows[2], rows[0])  # (what it costs: docs/kernels.md)


@needs_kernel
@pytest.mark.parametrize(
    ("architecture", "kv_heads", "weights", "kv"),
    [("qwen2", 1, "int8", "float32"), ("llama", 2, "int4", "float16"), ("qwen2", 1, "int5", "float16")],
)
def test_a_layer_in_one_call_is_the_layer_op_by_op(
    architecture: str, kv_heads: int, weights: str, kv: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On integer weights and heads of whole vectors, a layer runs as one call (`specedit::decoder_layer`):
    the logits and the cache's keys and values are those of the layer's ops called one by one, bit for bit,
    across the cache's growth and a rollback. int5: v and down at 8 bits beside the others' 5, as a GGUF's
    Q8_0 and Q6_K layers are kept (`quantized.quantize_linears`)."""

    saved(architecture, tmp_path, num_attention_heads=2, num_key_value_heads=kv_heads, head_dim=16)
    build_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), dtype="float32", weights=weights, kv_cache=kv, device="cpu", target=False)
    layers = loaded.model.model.layers
    if weights == "int5":
        for layer in layers:
            for parent, name in ((layer.self_attn, "v_proj"), (layer.mlp, "down_proj")):
                five = getattr(parent, name)
                bias = None if five.bias is None else five.bias[: five.out_features]
                setattr(parent, name, quantized.QuantizedLinear(five.dequantized(), bias, bits=8))
    ids = torch.randint(0, 300, (700,), generator=torch.Generator().manual_seed(4)).tolist()

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        cache = loaded.new_cache()
        logits = _in_pieces(loaded, ids, cache)
        return logits, [states for layer in cache.layers for states in (layer.keys, layer.values)]

    whole, whole_cache = run()
    assert all(layer._whole[1] is not None for layer in layers)  # it ran as one call a layer
    assert whole_cache[0].dtype == getattr(torch, kv)
    monkeypatch.setattr(decoder.Layer, "_whole_layer", lambda self: None)
    by_op, by_op_cache = run()
    assert torch.equal(whole, by_op) and all(map(torch.equal, whole_cache, by_op_cache))


def test_the_peer_baseline_of_a_decoder_model_runs_transformers_class_and_gives_it_back(tiny_model_dir: Path) -> None:
    """The bench's plain-stock (`as_transformers_runs_it`) on a model of specedit's own forward: the
    transformers class on the same weights, with no kept prefix (the engine's, in specedit's own cache,
    would not fit it); afterwards the engine is as it was, its kept prefix too."""
    from specedit.engine.backends.local import LocalBackend
    from specedit.engine.doors.bench.bench import as_transformers_runs_it
    from specedit.engine.loop.rewrite import prepare_rewrite, run_rewrite
    from specedit.engine.records.options import EngineOptions
    from specedit.engine.records.requests import RewriteRequest
    from specedit.engine.session.session import Session

    backend = LocalBackend(EngineOptions(model=str(tiny_model_dir)))
    session, engine = Session(backend), backend.load()
    original = "def add(a, b):\n    return a + b\n"
    request = RewriteRequest(original, instruction="Rename add to plus.", language="python", max_new_tokens=12)
    ours = session.run(request)
    assert isinstance(engine.model, decoder.Decoder) and engine.prefix_cache is not None and len(engine.prefix_cache)
    with as_transformers_runs_it(engine):
        assert type(engine.model).__name__ == "Qwen2ForCausalLM" and engine.prefix_cache is None
        stock = run_rewrite(engine, prepare_rewrite(engine, request), draft="none")
    assert isinstance(engine.model, decoder.Decoder) and engine.loaded.model is engine.model
    assert engine.prefix_cache is not None and len(engine.prefix_cache)
    assert stock.generation.tokens and ours.text  # both ran to their budget or their end


def test_an_output_layer_tied_to_the_embedding_is_the_embedding(tmp_path: Path) -> None:
    """A tied model's folder holds no `lm_head.weight`: the decoder's output layer is its embedding."""
    reference = build_model("llama", 300, seed=5, layers=2)
    reference.config.tie_word_embeddings = True
    reference.tie_weights()
    reference.save_pretrained(tmp_path)
    config = decoder.covered(tmp_path)
    assert config is not None and config.tie_word_embeddings
    model = decoder.load(tmp_path, config, torch.float64)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-10, atol=1e-10)
