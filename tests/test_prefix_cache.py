"""The prefix cache changes where the prompt's keys and values come from, never the answer.

A wide model on the kernels the self-check chose (as a target is loaded), greedy and seeded sampling:
requests that share a document's prefix give, with the cache, token for token what they give without it,
across misses, full hits, partial hits, evictions, warming and a warming forward cut short between layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from test_invariant import promised, wide_model

from specedit.engine.loop.drafting import generate_drafted
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.loop.rewrite import keep_prompt_head, rewrite, warm_document
from specedit.engine.model import kv_cache
from specedit.engine.model.loading import Interrupted, LoadedModel
from specedit.engine.model.prefix_cache import MIN_SHARED, PrefixCache
from specedit.engine.records.errors import ModelLoadError
from specedit.engine.records.prompts import RewritePrompt, build_prompt, file_prefix
from specedit.engine.records.requests import RewriteRequest, SamplingConfig, WarmRequest

from conftest import build_tokenizer, tiny_engine

VOCAB = 512


def random_ids(length: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


DOCUMENT, OTHER_DOCUMENT = random_ids(150, 1), random_ids(140, 2)
INSTRUCTION, OTHER_INSTRUCTION = random_ids(12, 3), random_ids(9, 4)


def answer(engine: Engine, prompt: Sequence[int], sampling: SamplingConfig) -> Generation:
    """A rewrite's decoding as the product runs it (the copy drafter, the engine's prefix cache)."""
    return generate_drafted(
        engine, list(prompt), method="copy", source_ids=list(prompt), max_new_tokens=60, sampling=sampling
    )


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def loaded(request: pytest.FixtureRequest) -> LoadedModel:
    return wide_model(VOCAB, request.param)


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(), SamplingConfig(temperature=0.9, seed=7)], ids=["greedy", "sampled"]
)
def test_reused_prefixes_keep_the_answer(loaded: LoadedModel, sampling: SamplingConfig) -> None:
    if not promised(loaded):
        return  # no bitwise kernels for this dtype on this CPU, and the verdict says so
    plain = Engine(loaded)
    kept = PrefixCache(budget_bytes=1 << 30)
    cached = Engine(loaded, prefix_cache=kept)
    for engine in (plain, cached):
        engine.eos_token_ids = frozenset()
    prompts = {
        "first": DOCUMENT + INSTRUCTION,
        "again (full hit)": DOCUMENT + INSTRUCTION,
        "another instruction (partial hit)": DOCUMENT + OTHER_INSTRUCTION,
        "another document (miss)": OTHER_DOCUMENT + INSTRUCTION,
        "the first document once more": DOCUMENT + INSTRUCTION,
    }
    expected_reuse = {
        "first": 0,
        "again (full hit)": len(DOCUMENT + INSTRUCTION) - 1,
        "another instruction (partial hit)": len(DOCUMENT),
        "another document (miss)": 0,
        "the first document once more": len(DOCUMENT + INSTRUCTION) - 1,  # the partial hit copied, kept it
    }
    for name, prompt in prompts.items():
        reference = answer(plain, prompt, sampling)
        got = answer(cached, prompt, sampling)
        assert got.tokens == reference.tokens, name
        assert got.stats.reused_tokens == expected_reuse[name], name
        assert got.stats.prefill_tokens == len(prompt) - 1 - expected_reuse[name]


def test_evictions_keep_the_answer_and_the_budget(loaded: LoadedModel) -> None:
    if not promised(loaded):
        return
    plain = Engine(loaded)
    one_document = 200 * bytes_per_token(loaded)  # room for one prompt's cache, not two
    kept = PrefixCache(budget_bytes=one_document)
    cached = Engine(loaded, prefix_cache=kept)
    for engine in (plain, cached):
        engine.eos_token_ids = frozenset()
    sampling = SamplingConfig()
    for prompt, reused in [
        (DOCUMENT + INSTRUCTION, 0),
        (OTHER_DOCUMENT + INSTRUCTION, 0),  # evicts the first
        (DOCUMENT + OTHER_INSTRUCTION, 0),  # so this one misses, and evicts the second
        (DOCUMENT + INSTRUCTION, len(DOCUMENT)),
    ]:
        got = answer(cached, prompt, sampling)
        assert got.tokens == answer(plain, prompt, sampling).tokens
        assert got.stats.reused_tokens == reused
        assert kept.nbytes <= kept.budget_bytes and len(kept) == 1


def test_a_warmed_prefix_and_a_warm_cut_short_between_layers_keep_the_answer(loaded: LoadedModel) -> None:
    if not promised(loaded):
        return
    plain = Engine(loaded)
    kept = PrefixCache(budget_bytes=1 << 30)
    cached = Engine(loaded, prefix_cache=kept)
    for engine in (plain, cached):
        engine.eos_token_ids = frozenset()
    calls = 0

    def stop_in_the_second_layer() -> bool:
        nonlocal calls
        calls += 1
        return calls == 3  # the loop's check, the first layer's, then the second layer's: mid-forward

    assert kept.warm(loaded, DOCUMENT, stop_in_the_second_layer) == 0  # nothing whole was done
    assert calls == 3 and len(kept) == 0
    assert kept.warm(loaded, DOCUMENT[:100]) == 100
    assert kept.warm(loaded, DOCUMENT) == len(DOCUMENT)  # extends the kept 100
    assert len(kept) == 1
    prompt = DOCUMENT + INSTRUCTION
    got = answer(cached, prompt, SamplingConfig())
    assert got.stats.reused_tokens == len(DOCUMENT)
    assert got.tokens == answer(plain, prompt, SamplingConfig()).tokens


def bytes_per_token(loaded: LoadedModel) -> int:
    config = loaded.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * loaded.dtype.itemsize


def test_an_interrupted_forward_is_rolled_back_in_every_layer() -> None:
    loaded = tiny_engine("qwen2", layers=3).loaded
    cache = loaded.new_cache()
    with torch.inference_mode():
        loaded.forward(list(range(20)), cache)
        layers = iter([False, False, True])  # stop before the third layer
        with pytest.raises(Interrupted), loaded.interruptible(lambda: next(layers)):
            loaded.forward(list(range(20, 30)), cache)
    assert kv_cache.layer_lengths(cache) == [30, 30, 20]
    kv_cache.rollback(cache, 20)
    assert kv_cache.layer_lengths(cache) == [20, 20, 20]


def test_the_store_keeps_the_longest_prefix_and_the_most_recent() -> None:
    engine = tiny_engine("qwen2")
    loaded = engine.loaded
    kept = PrefixCache(budget_bytes=1 << 30)
    assert kept.warm(loaded, list(range(40))) == 40
    assert kept.warm(loaded, list(range(60))) == 60
    assert len(kept) == 1  # the 40 were a prefix of the 60: one cache holds both
    cache, held = kept.take([*range(50), 999, 998])
    assert held == 50 and kv_cache.length(cache) == 50  # a copy of what is shared
    assert kept.describe()["tokens"] == [60]  # the kept one is left whole
    kept.put(list(range(50)), cache)
    assert kept.describe()["tokens"] == [60]  # the 60 hold these 50 already: not kept twice
    assert kept.warm(loaded, [*range(50), 7, 7, 7]) == 53  # a newer text of that document: both are kept
    assert kept.describe()["tokens"] == [60, 53]
    cache, held = kept.take([*range(MIN_SHARED - 1), 999])
    assert held == 0 and cache is None  # too little in common: the caller starts a cache
    kept.take(list(range(61)))
    kept.take([*range(50), 7, 7, 7, 0])  # (both taken out whole)
    kept.put(list(range(10)), loaded.new_cache())
    assert len(kept) == 0  # an empty or short cache is not worth keeping

    # Two files share the system prompt: each keeps its own cache.
    system = list(range(500, 520))
    kept.warm(loaded, system + [1] * 30)
    kept.warm(loaded, system + [2] * 30)
    assert len(kept) == 2
    assert kept.take(system + [1] * 31)[1] == 50 and kept.take(system + [2] * 31)[1] == 50

    kept.warm(loaded, [7] * 30)
    size = kept.nbytes  # one 30-token cache
    assert size > 0
    small = PrefixCache(budget_bytes=2 * size)
    for start in (100, 200, 300):
        small.warm(loaded, list(range(start, start + 30)))
    assert len(small) == 2 and small.nbytes <= small.budget_bytes
    assert small.take(list(range(100, 131)))[1] == 0  # the least recently used went
    assert small.take(list(range(300, 331)))[1] == 30


def test_requests_on_one_document_share_its_prompt_up_to_the_request() -> None:
    """The prompt puts the code first: instructions and sketches on one document all start with
    `file_prefix`, which is what warming prefills."""
    tokenizer = tiny_engine("qwen2").tokenizer
    document = "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n"
    start = file_prefix(tokenizer, document, "python")
    prompts = [
        RewritePrompt(document, "Rename add to plus.", None, "python"),
        RewritePrompt(document, None, "def plus(a, b):\n    ...\n", "python"),
    ]
    for prompt in prompts:
        text = build_prompt(tokenizer, prompt)
        assert text.startswith(start)
        assert text.index(document) < text.index(prompt.instruction or prompt.sketch or "")


def test_a_rewrite_after_warming_reads_only_its_request() -> None:
    engine = tiny_engine("llama")
    engine.prefix_cache = PrefixCache(budget_bytes=1 << 30)
    reference_engine = tiny_engine("llama")
    document = "def add(a, b):\n    return a + b\n" * 3
    cached, total = warm_document(engine, WarmRequest(document, "python", "a.py"), lambda: False)
    assert cached == total > 0
    request = RewriteRequest(document, "Rename add to plus.", language="python", max_new_tokens=20)
    result = rewrite(engine, request)
    assert result.generation.stats.reused_tokens >= total - 2  # the file's block; the last token may merge
    assert result.text == rewrite(reference_engine, request).text
    sketch = RewriteRequest(document, sketch="def plus(a, b):\n    ...\n", language="python", max_new_tokens=10)
    assert rewrite(engine, sketch).generation.stats.reused_tokens >= total - 2


def test_an_in_process_session_warms_on_a_thread_of_its_own() -> None:
    from specedit.engine.session.session import local_session

    engine = tiny_engine("qwen2")
    session = local_session(engine=engine)
    document = "def add(a, b):\n    return a + b\n" * 4
    session.warm(WarmRequest(document, "python", "a.py"))  # no prefix cache: nothing to do
    engine.prefix_cache = PrefixCache(budget_bytes=1 << 30)
    session.warm(WarmRequest(document, "python", "a.py"))
    deadline = time.monotonic() + 20
    while not len(engine.prefix_cache):
        assert time.monotonic() < deadline, "the document was not warmed"
        time.sleep(0.01)
    request = RewriteRequest(document, "Rename add to plus.", language="python", max_new_tokens=5)
    outcome = session.run(request)
    assert outcome.stats.reused_tokens > outcome.stats.prefill_tokens


# --- The start every prompt shares, kept across starts ------------------------------------------------


def test_a_cache_written_to_a_file_reads_back_as_it_was(tmp_path: Path) -> None:
    cache = kv_cache.KVCache()
    torch.manual_seed(0)
    for index in range(3):
        cache.update(torch.randn(1, 2, 70, 8), torch.randn(1, 2, 70, 8), index)
    ids = list(range(100, 170))
    kv_cache.write(cache, ids[:50], tmp_path / "start.safetensors")  # its first 50 positions
    read = kv_cache.KVCache()
    assert kv_cache.read(tmp_path / "start.safetensors", read) == ids[:50]
    assert kv_cache.layer_lengths(read) == [50, 50, 50]
    for written, back in zip(cache.layers, read.layers, strict=True):
        assert written.keys is not None and written.values is not None
        assert torch.equal(back.keys, written.keys[..., :50, :]) and torch.equal(
            back.values, written.values[..., :50, :]
        )
    with pytest.raises(ValueError, match="cannot write"):
        kv_cache.write(cache, list(range(71)), tmp_path / "more.safetensors")
    (tmp_path / "other.safetensors").write_bytes(b"not a cache")
    with pytest.raises(Exception):  # noqa: B017 (safetensors' own error, whatever its class)
        kv_cache.read(tmp_path / "other.safetensors", kv_cache.KVCache())


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A wide model with a real tokenizer (prompts are text), named after a model folder holding its
    weights: what the kept start is named by."""
    tokenizer = build_tokenizer()
    loaded = wide_model(len(tokenizer), request.param)
    folder = tmp_path_factory.mktemp("wide")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer, loaded.name = tokenizer, str(folder)
    return loaded


def test_the_prompts_start_is_kept_across_starts_and_keeps_the_answer(saved: LoadedModel, tmp_path: Path) -> None:
    if not promised(saved):
        return
    plain = Engine(saved)
    request = RewriteRequest("def add(a, b):\n    return a + b\n", "Rename add to plus.", max_new_tokens=12)
    reference = rewrite(plain, request)

    first = Engine(saved, prefix_cache=PrefixCache(0))  # no budget for prompts (a one-off rewrite's)
    head = keep_prompt_head(first, tmp_path)
    [file] = tmp_path.glob("head-*.safetensors")
    assert MIN_SHARED <= head < reference.generation.stats.prompt_tokens
    written = file.stat().st_mtime_ns

    again = Engine(saved, prefix_cache=PrefixCache(0))  # the next start reads it
    assert keep_prompt_head(again, tmp_path) == head
    assert file.stat().st_mtime_ns == written
    assert again.prefix_cache is not None and again.prefix_cache.describe()["head_tokens"] == head
    for _ in range(2):  # lent as a copy: every request gets it
        result = rewrite(again, request)
        assert result.generation.stats.reused_tokens == head
        assert result.generation.tokens == reference.generation.tokens and result.text == reference.text
    assert len(again.prefix_cache) == 0  # no prompt kept beside it

    file.write_bytes(b"damaged")  # refused; once deleted, prefilled and written again
    with pytest.raises(ModelLoadError, match=rf"{file.name} changed since specedit wrote it"):
        keep_prompt_head(Engine(saved, prefix_cache=PrefixCache(0)), tmp_path)
    file.unlink()
    damaged = Engine(saved, prefix_cache=PrefixCache(0))
    assert keep_prompt_head(damaged, tmp_path) == head
    assert rewrite(damaged, request).text == reference.text
    assert len(kv_cache.read(file, saved.new_cache())) == head

    not_invariant = tiny_engine("qwen2")  # float64 with no self-check: nothing is kept
    not_invariant.prefix_cache = PrefixCache(0)
    assert keep_prompt_head(not_invariant, tmp_path) == 0


def test_a_kept_start_for_other_ids_is_not_taken(saved: LoadedModel, tmp_path: Path) -> None:
    if not promised(saved):
        return
    ids = list(range(30, 60))
    file = tmp_path / "start.safetensors"
    assert not PrefixCache(0).keep_head(saved, ids, file)  # prefilled, and written
    assert PrefixCache(0).keep_head(saved, ids, file)  # read
    other = PrefixCache(0)
    assert not other.keep_head(saved, ids[:-1], file)  # another start: prefilled, not read
    assert other.take([*ids[:-1], 7, 7])[1] == len(ids) - 1
