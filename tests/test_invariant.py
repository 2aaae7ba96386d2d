"""Row-invariant arithmetic (engine.invariant): a position's logits are the same whatever the forward's size.

The kernels are chosen by the self-check (engine.exactness, tested in test_exactness.py); here, the
attention and the packed linear layers themselves. The slow tier checks the property on the real model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_engine_exactness import NoisyOracleDrafter

from specedit.engine.loop.generate import Engine
from specedit.engine.model import exactness, invariant, kv_cache, loading, quantized
from specedit.engine.model.decoder import Decoder
from specedit.engine.model.loading import LoadedModel, load_model, precision

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
    assert invariant.install_attention(model)
    return model


def chunked_logits(loaded: LoadedModel, context: list[int], continuation: list[int], chunk: int) -> torch.Tensor:
    """Logits of `continuation`'s positions after `context`, computed `chunk` tokens per forward."""
    cache = loaded.new_cache()
    with torch.inference_mode():
        loaded.forward(context, cache, logits_to_keep=1)
        rows = [loaded.forward(continuation[i : i + chunk], cache) for i in range(0, len(continuation), chunk)]
    assert kv_cache.length(cache) == len(context) + len(continuation)
    return torch.cat(rows)


@pytest.mark.parametrize("step_rows", [1, 2])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_invariant_attention_computes_what_transformers_computes(architecture: str, step_rows: int) -> None:
    """Same arithmetic up to rounding (float64): padding keys, repeating query rows and running one token
    as two rows change nothing."""
    stock = build_model(architecture, 300, seed=1)
    patched = _installed(build_model(architecture, 300, seed=1))
    ids = torch.randint(0, 300, (160,), generator=torch.Generator().manual_seed(0)).tolist()
    for chunk in (1, 3, 40):
        expected = chunked_logits(
            LoadedModel(stock, None, torch.device("cpu"), torch.float64, "stock"), ids[:50], ids[50:], chunk
        )
        got = chunked_logits(
            LoadedModel(patched, None, torch.device("cpu"), torch.float64, "patched", step_rows=step_rows),
            ids[:50],
            ids[50:],
            chunk,
        )
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def wide_model(vocab_size: int, dtype: torch.dtype, *, settle: bool = True) -> LoadedModel:
    """Wide enough for the CPU's shape-dependent kernels to show (hidden 256): with ATen's linear layers in
    float32 on AVX2, or transformers' attention, a 1-row and a many-row forward give different logits here.
    Its kernels are chosen by the self-check, as `load_model` does for a target (unless not `settle`)."""
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
    loaded = LoadedModel(Qwen2ForCausalLM(config).to(dtype).eval(), CharTokenizer(), torch.device("cpu"), dtype, "wide")
    if settle:
        loaded.exactness = exactness.settle(loaded)
    return loaded


def auto_dtype() -> torch.dtype:
    """What `--dtype auto` runs on this CPU with float weights (these models'): the dtype whose exactness
    the project promises here."""
    return precision("auto", "float", torch.device("cpu"))[0]


def promised(loaded: LoadedModel) -> bool:
    """Whether `loaded` must be bitwise exact here: it runs in the dtype `auto` picks on this CPU (measured
    on AVX2 and AVX512-BF16). In another dtype the self-check's verdict must only be true: `bitwise`
    (checked by the caller) or `up to near-ties`."""
    assert loaded.exactness is not None
    if loaded.dtype == auto_dtype():
        assert loaded.exactness.bitwise, loaded.exactness
    elif not loaded.exactness.bitwise:
        assert loaded.exactness.claim == "up to near-ties"
    return loaded.exactness.bitwise


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_logits_do_not_depend_on_the_forward_size(dtype: torch.dtype) -> None:
    loaded = wide_model(512, dtype)
    if not promised(loaded):
        return  # this CPU has no bitwise kernels for `dtype`, and the verdict says so
    ids = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = chunked_logits(loaded, ids[:200], ids[200:], 1)
    for chunk in (2, 3, 5, 17, 33, 65):
        assert torch.equal(chunked_logits(loaded, ids[:200], ids[200:], chunk), reference), chunk


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("prompt_seed", [0, 1])
def test_speculation_keeps_the_answer_in_low_precision(prompt_seed: int, dtype: torch.dtype) -> None:
    """Greedy decoding with drafts of 0 to 64 tokens gives plain decoding's tokens in bf16 and float32, not
    only in float64 (test_engine_exactness). With transformers' kernels, some bf16 runs differ on AVX2;
    float32's differences are too small to flip this random model's choices, and are caught by the logits
    test above instead."""
    loaded = wide_model(512, dtype)
    if not promised(loaded):
        return  # this CPU has no bitwise kernels for `dtype`, and the verdict says so
    engine = Engine(loaded)
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
    loaded.step_rows = 2
    cache = loaded.new_cache()
    with torch.inference_mode():
        loaded.forward([1, 2, 3], cache)
        logits = loaded.forward([4], cache)
    assert logits.shape == (1, loaded.model.config.vocab_size)
    assert kv_cache.layer_lengths(cache) == [4, 4]


def test_load_model_settles_a_target_and_packs_a_draft(tiny_model_dir: Any) -> None:
    target = load_model(str(tiny_model_dir), dtype="float32", weights="float", device="cpu")
    draft = load_model(str(tiny_model_dir), dtype="float32", weights="float", device="cpu", target=False)
    assert isinstance(target.model, Decoder) and isinstance(draft.model, Decoder)  # Qwen2: specedit's own forward
    assert target.exactness is not None and target.exactness.attention == "row-invariant"
    assert draft.exactness is None
    if invariant.can_pack(torch.float32):  # a draft's kernels are simply the fastest
        assert any(isinstance(module, invariant.PackedLinear) for module in draft.model.modules())
    int8 = load_model(str(tiny_model_dir), dtype="float32", weights="auto", device="cpu", target=False)
    if loading.int8_weights("auto", torch.device("cpu"), torch.float32):  # int8 weights for a draft too
        assert quantized.is_quantized(int8.model)


def test_packing_keeps_the_weights_bit_for_bit() -> None:
    if not invariant.can_pack(torch.float32):
        pytest.skip("oneDNN has no float32 linear kernel on this CPU")
    stock = build_model("gpt2", 300, seed=2, dtype=torch.float32)  # GPT-2's Conv1D holds its weight transposed
    packed = build_model("gpt2", 300, seed=2, dtype=torch.float32)
    assert invariant.pack_linears(packed) == 2 * 4 + 1  # per layer: qkv, proj, fc, proj; the output layer
    ids = torch.tensor([list(range(40))])
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
    assert invariant.unpack_linears(packed) == 9
    first = packed.transformer.h[0].attn.c_attn
    assert torch.equal(first.weight, stock.transformer.h[0].attn.c_attn.weight.t())


def test_the_peer_baseline_runs_on_stock_kernels_and_gives_them_back(tiny_model_dir: Any) -> None:
    target = load_model(str(tiny_model_dir), dtype="float32", weights="float", device="cpu")
    packed_before = [m for m in target.model.modules() if isinstance(m, invariant.PackedLinear)]
    ids = list(range(3, 40))
    ours = target.forward(ids, target.new_cache())
    with invariant.stock_kernels(target.model) as stock:  # transformers' own class on the same weights
        assert type(stock).__name__ == "Qwen2ForCausalLM" and stock.config._attn_implementation == "sdpa"
        assert not any(isinstance(m, invariant.PackedLinear) for m in stock.modules())
        theirs = stock(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    assert [m for m in target.model.modules() if isinstance(m, invariant.PackedLinear)] == packed_before
    transformers_loaded = build_model("gpt2", 300, dtype=torch.float32)  # one of transformers' own classes
    assert invariant.install_attention(transformers_loaded) and invariant.pack_linears(transformers_loaded)
    with invariant.stock_kernels(transformers_loaded) as stock:  # itself, for the while
        assert stock is transformers_loaded and stock.config._attn_implementation == "sdpa"
        assert not any(isinstance(m, invariant.PackedLinear) for m in stock.modules())
    assert transformers_loaded.config._attn_implementation == invariant.ATTENTION_NAME
    assert any(isinstance(m, invariant.PackedLinear) for m in transformers_loaded.modules())
