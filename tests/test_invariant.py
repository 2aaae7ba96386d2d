"""Row-invariant arithmetic (engine.invariant): a position's logits are the same whatever the forward's size.

The slow tier checks the property on the real model in bf16, where transformers' own attention breaks it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_engine_exactness import NoisyOracleDrafter

from specedit.engine import invariant, kv_cache
from specedit.engine.generate import Engine
from specedit.engine.loading import LoadedModel, load_model

from conftest import ARCHITECTURES, CharTokenizer, build_model, tiny_engine


@pytest.mark.parametrize(
    ("first", "end", "calls"),
    [
        (60, 70, [(60, 64), (64, 70)]),  # two key lengths: 64 and 128
        (0, 33, [(0, 16), (16, 33)]),  # never a 1-row call
        (5, 6, [(5, 6)]),
        (100, 165, [(100, 128), (128, 146), (146, 165)]),
        (128, 193, [(128, 160), (160, 192), (192, 193)]),  # a 1-row call repeats its row
    ],
)
def test_query_calls_split_by_key_length_and_block(first: int, end: int, calls: list[tuple[int, int]]) -> None:
    assert invariant._query_calls(first, end) == calls
    for start, stop in calls:
        assert 1 <= stop - start <= invariant.MAX_QUERY_ROWS
        assert invariant._kv_length(start) == invariant._kv_length(stop - 1)  # one key length per call


def _installed(model: Any) -> Any:
    assert invariant.install(model)
    return model


def chunked_logits(loaded: LoadedModel, context: list[int], continuation: list[int], chunk: int) -> torch.Tensor:
    """Logits of `continuation`'s positions after `context`, computed `chunk` tokens per forward."""
    cache = kv_cache.new_cache()
    with torch.inference_mode():
        loaded.forward(context, cache, logits_to_keep=1)
        rows = [loaded.forward(continuation[i : i + chunk], cache) for i in range(0, len(continuation), chunk)]
    assert kv_cache.length(cache) == len(context) + len(continuation)
    return torch.cat(rows)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_invariant_attention_computes_what_transformers_computes(architecture: str) -> None:
    """Same arithmetic up to rounding (float64): padding keys and repeating query rows change nothing."""
    stock = build_model(architecture, 300, seed=1)
    patched = _installed(build_model(architecture, 300, seed=1))
    ids = torch.randint(0, 300, (160,), generator=torch.Generator().manual_seed(0)).tolist()
    for chunk in (1, 3, 40):
        expected = chunked_logits(
            LoadedModel(stock, None, torch.device("cpu"), torch.float64, "stock"), ids[:50], ids[50:], chunk
        )
        got = chunked_logits(
            LoadedModel(patched, None, torch.device("cpu"), torch.float64, "patched", row_invariant=True),
            ids[:50],
            ids[50:],
            chunk,
        )
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def _bf16_model(vocab_size: int) -> LoadedModel:
    """Wide enough for oneDNN's shape-dependent kernels to show (hidden 256): without `install`, these
    tests fail here (logits differ between a 1-row and a many-row forward)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    model = _installed(Qwen2ForCausalLM(config).to(torch.bfloat16).eval())
    return LoadedModel(model, CharTokenizer(), torch.device("cpu"), torch.bfloat16, "bf16", row_invariant=True)


def test_bf16_logits_do_not_depend_on_the_forward_size() -> None:
    loaded = _bf16_model(512)
    ids = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = chunked_logits(loaded, ids[:200], ids[200:], 1)
    for chunk in (2, 3, 5, 17, 33, 65):
        assert torch.equal(chunked_logits(loaded, ids[:200], ids[200:], chunk), reference), chunk


@pytest.mark.parametrize("prompt_seed", [0, 1])
def test_speculation_keeps_the_answer_in_bf16(prompt_seed: int) -> None:
    """Greedy decoding with drafts of 0 to 64 tokens gives plain decoding's tokens in bf16, not only in
    float64 (test_engine_exactness). With transformers' attention, 5 of these 6 runs differ."""
    engine = Engine(_bf16_model(512))
    engine.eos_token_ids = frozenset()
    prompt = torch.randint(0, 512, (150,), generator=torch.Generator().manual_seed(prompt_seed)).tolist()
    plain = engine.generate(prompt, max_new_tokens=200)
    for seed in range(3):
        drafter = NoisyOracleDrafter(plain.tokens, len(prompt), 512, seed)
        speculative = engine.generate(prompt, max_new_tokens=200, drafter=drafter)
        assert speculative.tokens == plain.tokens, seed
        assert speculative.stats.target_forwards < plain.stats.target_forwards


def test_a_one_token_forward_leaves_one_position_in_the_cache() -> None:
    engine = tiny_engine("qwen2")
    loaded = engine.loaded
    _installed(loaded.model)
    loaded.row_invariant = True
    cache = kv_cache.new_cache()
    with torch.inference_mode():
        loaded.forward([1, 2, 3], cache)
        logits = loaded.forward([4], cache)
    assert logits.shape == (1, loaded.model.config.vocab_size)
    assert kv_cache.layer_lengths(cache) == [4, 4]


def test_load_model_installs_it_for_a_target_and_not_for_a_draft(tiny_model_dir: Any) -> None:
    target = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    draft = load_model(str(tiny_model_dir), dtype="float32", device="cpu", row_invariant=False)
    assert target.row_invariant and target.model.config._attn_implementation == invariant.ATTENTION_NAME
    assert not draft.row_invariant and draft.model.config._attn_implementation == "sdpa"


def test_the_peer_baseline_runs_on_transformers_attention_and_gives_it_back(tiny_model_dir: Any) -> None:
    target = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    with invariant.transformers_attention(target.model):
        assert target.model.config._attn_implementation == "sdpa"
    assert target.model.config._attn_implementation == invariant.ATTENTION_NAME
