"""The machine's integer peak and a model's products a row (engine.model.peak), and `specedit doctor`'s
shares of it. No test asserts a speed: only that the figures are there, positive and counted right."""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from specedit.cli.main import main
from specedit.engine.model import decoder, kernels, peak, quantized

# The default model's shapes (Qwen2.5-Coder-0.5B-Instruct's config.json), with no weights.
HALF_B = {
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
TINY = {**HALF_B, "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
TINY.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def shapes_only(raw: dict[str, object]) -> decoder.Decoder:
    config = decoder.DecoderConfig.covering(raw)
    assert config is not None
    with torch.device("meta"):
        return decoder.Decoder(config)


def test_the_products_of_a_tiny_model_are_its_layers_shapes_counted_by_hand() -> None:
    ops = peak.forward_ops(shapes_only(TINY))
    # a layer: q 64 -> 64, k and v 64 -> 32, o 64 -> 64, gate and up 64 -> 96, down 96 -> 64; two layers
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 64 * 96 + 96 * 64
    assert ops.per_prompt_token == pytest.approx(2 * 2 * layer / 1e9)
    assert ops.per_verified_row == pytest.approx(2 * (2 * layer + 64 * 100) / 1e9)  # and the head 64 -> 100
    # attention: q.k and the weighted values, 4 heads 16 wide, in 2 layers, a position
    assert ops.attention_per_position == pytest.approx(2 * 2 * 4 * 16 * 2 / 1e9)
    assert ops.attention(rows=3, context=10) == pytest.approx(ops.attention_per_position * (11 + 12 + 13))
    assert ops.layers == {0: ops.per_prompt_token}  # float weights


def test_gpt2s_transposed_layers_count_too() -> None:
    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    ops = peak.forward_ops(GPT2LMHeadModel(config))
    layer = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32  # c_attn, c_proj; c_fc, c_proj (Conv1D's nx -> nf)
    assert ops.per_prompt_token == pytest.approx(2 * 2 * layer / 1e9)
    assert ops.per_verified_row - ops.per_prompt_token == pytest.approx(2 * 32 * 50 / 1e9)


def test_the_default_models_products_are_the_issues_figures() -> None:
    """About 0.72 GOP a prompt token, about 1.0 a verified row with the tied 151,936 x 896 head."""
    ops = peak.forward_ops(shapes_only(HALF_B))
    assert ops.per_prompt_token == pytest.approx(0.7157, abs=1e-4)
    assert ops.per_verified_row - ops.per_prompt_token == pytest.approx(2 * 151936 * 896 / 1e9)
    assert ops.per_verified_row == pytest.approx(0.9879, abs=1e-4)


@pytest.mark.skipif(kernels.available() is not None, reason="no kernels of our own here")
def test_integer_layers_count_by_their_bits() -> None:
    model = shapes_only({**TINY, "tie_word_embeddings": False})
    model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_()
    quantized.quantize_linears(model, bits=4)
    ops = peak.forward_ops(model)
    assert set(ops.layers) == {4} and set(ops.head) == {4}
    whole = peak.Peak(gops=100.0, narrow_gops=200.0, threads=2, variant="avx2")
    assert whole.ceiling({4: 1.0}) == 200.0
    assert whole.ceiling({8: 1.0, 4: 1.0}) == pytest.approx(2 / (1 / 100 + 1 / 200))  # each part at its peak
    assert whole.ceiling({0: 1.0, 8: 1.0}) is None  # float weights: the integer peak does not bound them


def test_the_peak_is_measured_once_a_process() -> None:
    found = peak.integer_peak(threads=2)
    if isinstance(found, str):
        pytest.skip(found)
    assert math.isfinite(found.gops) and found.gops > 0 and math.isfinite(found.narrow_gops) and found.narrow_gops > 0
    assert found.threads == 2 and found.variant == kernels.variant() and found.instructions
    assert peak.integer_peak(threads=2) is found  # cached
    assert found.to_dict()["gops"] == round(found.gops, 1)


def test_the_peak_loop_refuses_what_it_cannot_run() -> None:
    if kernels.available() is not None or kernels.loaded_library() is None:
        pytest.skip(f"no kernels of our own here: {kernels.available()}")
    loop = ctypes.CDLL(str(kernels.loaded_library()))
    loop.specedit_peak_seconds.restype = ctypes.c_double
    loop.specedit_peak_seconds.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    assert loop.specedit_peak_seconds(0, 4, 8) == -1.0  # no threads
    assert loop.specedit_peak_seconds(1, 3, 8) == -1.0  # not whole groups of 4
    assert loop.specedit_peak_seconds(1, 4, 5) == -1.0  # no such path
    assert loop.specedit_peak_seconds(2, 4, 4) >= 0.0


def test_doctor_reports_the_peak_and_the_phases_shares(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path))
    assert main(["doctor", "--model", str(tiny_model_dir), "--threads", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["forward_ops"]) >= {"gop_per_prompt_token", "gop_per_verified_row", "attention_gop_per_position"}
    phases = report["phases"]
    assert phases["prefill"]["rows"] == 256 and phases["verification"]["rows"] == 32
    for phase in phases.values():
        assert phase["seconds"] > 0 and phase["gops"] > 0
    if report["integer_peak"] is None:  # no compiler here: said why, and no shares
        assert report["integer_peak_unavailable"] and phases["prefill"]["share"] is None
    else:
        assert report["integer_peak"]["gops"] > 0 and report["integer_peak"]["threads"] == 2
        for phase in phases.values():
            assert phase["share"] == pytest.approx(phase["gops"] / phase["ceiling_gops"], abs=1e-3)
    assert main(["doctor", "--model", str(tiny_model_dir), "--threads", "2"]) == 0
    printed = capsys.readouterr().out
    assert "integer peak:" in printed and "prefill of 256 tokens:" in printed
    assert "verification of 32 rows:" in printed
