"""Drafting where the copy runs out: a draft model, layer skip, the chain, and the cost governor.

Exactness as for the copy drafter (float64 tiny models, greedy: token for token; sampling with a sampling
draft model: in distribution), the caches after every step, the tokenizer check, and the back-off.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
from collections.abc import Sequence

import pytest
import torch

from specedit.drafters.base import NO_DRAFT, Draft
from specedit.drafters.chain import ChainDrafter
from specedit.drafters.context_drafter import ContextDrafter
from specedit.drafters.copy_drafter import CopyDrafter
from specedit.drafters.fallback import FallbackConfig, load_fallback, read_calibration
from specedit.drafters.model_drafter import (
    LayerSkipDrafter,
    ModelDraftConfig,
    ModelDrafter,
    check_same_tokenizer,
    decoder_layers,
    format_layers,
    parse_layers,
    skipping_layers,
)
from specedit.engine.loop.drafting import build_drafter
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.loop.governor import CATCH_UP_ROW, RENT, CostGovernor
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.loop.step import StepRecord
from specedit.engine.model import kernels, kv_cache, quantized
from specedit.engine.model.loading import LoadedModel, load_model
from specedit.engine.model.sampling import SamplingConfig
from specedit.engine.records.errors import ModelLoadError, SpeceditError
from specedit.engine.records.events import Step
from specedit.engine.records.requests import RewriteRequest

from conftest import ARCHITECTURES, build_model, build_tokenizer, tiny_engine

ALWAYS = ModelDraftConfig(p_min=0.0, max_draft=6)  # draft every time: the exactness tests need drafts


def draft_model_for(engine: Engine, *, seed: int, layers: int = 1) -> LoadedModel:
    """A different random model with the target's vocabulary: a bad but honest draft model."""
    vocab = engine.model.config.vocab_size
    architecture = engine.model.config.model_type
    model = build_model(architecture, vocab, seed=seed + 100, layers=layers)
    return LoadedModel(model, engine.tokenizer, torch.device("cpu"), torch.float64, "draft")


def generate(
    engine: Engine, prompt: list[int], drafter: object = None, **kwargs: object
) -> tuple[Generation, list[Step]]:
    steps: list[Step] = []
    generation = engine.generate(prompt, drafter=drafter, on_step=steps.append, **kwargs)  # type: ignore[arg-type]
    return generation, steps


def random_prompt(rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(rng.randrange(2, 30))]


# ------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("seed", range(2))
def test_greedy_with_a_draft_model_equals_plain_decoding(architecture: str, seed: int) -> None:
    engine = tiny_engine(architecture, seed=seed)
    rng = random.Random(seed)
    for _ in range(3):
        prompt = random_prompt(rng, len(engine.tokenizer))
        max_new = rng.randrange(1, 50)
        plain, _ = generate(engine, prompt, max_new_tokens=max_new)
        drafter = ModelDrafter(draft_model_for(engine, seed=seed), output_start=len(prompt), config=ALWAYS)
        speculative, steps = generate(engine, prompt, drafter, max_new_tokens=max_new)
        assert speculative.tokens == plain.tokens
        assert all(step.cache_length == step.committed_length - 1 for step in steps)
        if max_new > 1:
            assert speculative.stats.drafted_tokens > 0


def test_a_draft_model_of_the_target_itself_is_always_accepted() -> None:
    """The drafter's forwards are right: drafting with the target's own weights, nothing is rejected."""
    engine = tiny_engine("qwen2", seed=3)
    prompt = engine.tokenize("def add(a, b):\n")
    plain, _ = generate(engine, prompt, max_new_tokens=40)
    same = LoadedModel(
        build_model("qwen2", len(engine.tokenizer), seed=3),
        engine.tokenizer,
        torch.device("cpu"),
        torch.float64,
        "same",
    )
    drafter = ModelDrafter(same, output_start=len(prompt), config=ALWAYS)
    speculative, _ = generate(engine, prompt, drafter, max_new_tokens=40)
    assert speculative.tokens == plain.tokens
    assert speculative.stats.accepted_tokens == speculative.stats.drafted_tokens > 0
    assert speculative.stats.target_forwards <= 40 // (ALWAYS.max_draft + 1) + 1


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("kept", ["0", "0-1,3"])
def test_greedy_with_layer_skip_equals_plain_decoding(architecture: str, kept: str) -> None:
    engine = tiny_engine(architecture, seed=5, layers=4)
    rng = random.Random(5)
    for _ in range(3):
        prompt = random_prompt(rng, len(engine.tokenizer))
        max_new = rng.randrange(1, 50)
        plain, _ = generate(engine, prompt, max_new_tokens=max_new)
        cache = engine.loaded.new_cache()
        drafter = LayerSkipDrafter(engine.loaded, cache, parse_layers(kept), output_start=len(prompt), config=ALWAYS)
        # Between steps every layer holds every committed token but the pending one: the drafted
        # positions of the kept layers were cropped away.
        lengths: list[tuple[list[int], int]] = []
        speculative = engine.generate(
            prompt,
            drafter=drafter,
            max_new_tokens=max_new,
            cache=cache,
            on_step=lambda step, cache=cache, lengths=lengths: lengths.append(
                (kv_cache.layer_lengths(cache), step.committed_length)
            ),
        )
        assert speculative.tokens == plain.tokens
        assert lengths and all(layers == [committed - 1] * 4 for layers, committed in lengths)
        # The model is whole again.
        assert not any(type(layer).__name__ == "_SkippedLayer" for layer in decoder_layers(engine.model))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_chain_equals_plain_decoding_across_hand_overs(architecture: str) -> None:
    """Copy runs and fallback drafts alternate (the original is half the answer); the output is exact, and
    whenever the draft model drafts, its cache holds exactly the committed tokens it was fed."""
    engine = tiny_engine(architecture, seed=11)
    prompt = engine.tokenize("class Point:\n")
    plain, _ = generate(engine, prompt, max_new_tokens=120)
    # The original: the answer with every other stretch of 15 tokens replaced by unrelated tokens.
    original = [t if (i // 15) % 2 == 0 else (t + 7) % len(engine.tokenizer) for i, t in enumerate(plain.tokens)]
    model_drafter = ModelDrafter(draft_model_for(engine, seed=11), output_start=len(prompt), config=ALWAYS)
    chain = ChainDrafter([CopyDrafter(original, output_start=len(prompt)), model_drafter])

    checks: list[bool] = []
    model_drafted = 0
    propose = model_drafter.propose

    def checked_propose(context: Sequence[int], k: int) -> Draft:
        nonlocal model_drafted
        draft = propose(context, k)
        model_drafted += len(draft)
        # After its catch-up the cache covered the context; it now also holds the drafted tokens but
        # the last one.
        expected = [*context, *draft.tokens[:-1]] if draft.tokens else list(context)
        checks.append(model_drafter.cached_tokens == expected)
        checks.append(kv_cache.length(model_drafter.cache) == len(model_drafter.cached_tokens))
        return draft

    model_drafter.propose = checked_propose  # type: ignore[method-assign]
    full = [*prompt, *plain.tokens]
    after_steps: list[bool] = []

    def on_step(step: Step) -> None:
        # After every step the draft model's cache is a prefix of the committed tokens (rejected
        # drafted positions dropped), and shorter than the committed length.
        cached = model_drafter.cached_tokens
        after_steps.append(cached == full[: len(cached)] and len(cached) < step.committed_length)

    speculative = engine.generate(prompt, drafter=chain, max_new_tokens=120, on_step=on_step)
    assert speculative.tokens == plain.tokens
    assert all(checks) and len(checks) > 4
    assert after_steps and all(after_steps)
    # Both links drafted: the copy in the copied stretches, the draft model in the others.
    assert 0 < model_drafted < speculative.stats.drafted_tokens


def test_the_chain_reports_which_drafter_proposed() -> None:
    engine = tiny_engine("llama", seed=2, layers=3)
    prompt = engine.tokenize("for i in range(10):\n")
    plain, _ = generate(engine, prompt, max_new_tokens=90)
    engine.fallback = FallbackConfig(layers=(0, 1), draft=ALWAYS)
    original = engine.tokenizer.decode(plain.tokens[:45])  # the first half of the answer
    request = RewriteRequest(original=original, instruction="go on", max_new_tokens=90)
    result = rewrite(engine, request)
    plain_result = rewrite(
        engine, RewriteRequest(original=original, instruction="go on", max_new_tokens=90, draft="none")
    )
    assert result.generation.tokens == plain_result.generation.tokens
    drafters = result.generation.stats.drafters
    assert set(drafters) == {"copy", "context", "layers"}
    assert drafters["copy"].proposals > 0 and drafters["layers"].proposals > 0
    stats = result.generation.stats
    assert sum(d.drafted for d in drafters.values()) == stats.drafted_tokens
    assert sum(d.accepted for d in drafters.values()) == stats.accepted_tokens
    assert all(d.wasted == d.drafted - d.accepted for d in drafters.values())
    assert stats.to_dict()["drafters"]["copy"]["drafted"] == drafters["copy"].drafted


@pytest.mark.parametrize("method", ["auto", "copy", "fallback", "none"])
def test_every_draft_method_of_a_rewrite_equals_plain_decoding(method: str) -> None:
    engine = tiny_engine("qwen2", seed=4, layers=3)
    engine.fallback = FallbackConfig(layers=(0, 2), draft=ALWAYS)
    original = "def add(a, b):\n    return a + b\n"
    results = [
        rewrite(engine, RewriteRequest(original=original, instruction="rename", max_new_tokens=60, draft=d))
        for d in ("none", method)
    ]
    assert results[1].generation.tokens == results[0].generation.tokens
    assert results[1].text == results[0].text


def test_the_fallback_method_needs_a_fallback() -> None:
    engine = tiny_engine("qwen2", seed=4)
    with pytest.raises(SpeceditError, match="no fallback drafter"):
        rewrite(engine, RewriteRequest(original="x = 1\n", instruction="go", max_new_tokens=5, draft="fallback"))


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_context_drafter_equals_plain_decoding(architecture: str) -> None:
    engine = tiny_engine(architecture, seed=12)
    rng = random.Random(12)
    for _ in range(3):
        prompt = random_prompt(rng, len(engine.tokenizer))
        plain, _ = generate(engine, prompt, max_new_tokens=80)
        speculative, _ = generate(engine, prompt, ContextDrafter(), max_new_tokens=80)
        assert speculative.tokens == plain.tokens
        assert speculative.stats.drafted_tokens > 0


@pytest.mark.parametrize("module", ["chain", "context_drafter", "model_drafter"])
def test_worked_examples_in_docstrings(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"specedit.drafters.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_worked_examples_of_the_calibration() -> None:
    import doctest

    from specedit.engine.doors.bench import calibrate

    result = doctest.testmod(calibrate)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------------------------- sampling

V = 6
SAMPLES = 2400
# chi-square, 35 degrees of freedom (36 cells of token pairs), p = 0.001
CHI2_CRITICAL = 66.6


def _pair_distribution(engine: Engine, prompt: list[int]) -> torch.Tensor:
    """The target's exact distribution of its first two sampled tokens at temperature 1."""
    with torch.inference_mode():
        first = torch.softmax(engine.model(torch.tensor([prompt])).logits[0, -1], dim=-1)
        table = torch.zeros(V, V, dtype=torch.float64)
        for a in range(V):
            second = torch.softmax(engine.model(torch.tensor([[*prompt, a]])).logits[0, -1], dim=-1)
            table[a] = first[a] * second
    return table


def test_sampling_with_a_sampling_draft_model_is_lossless() -> None:
    """The draft model samples (a stochastic draft, with p_draft); the verifier's min(1, p_target/p_draft)
    rule keeps the target's distribution. Different seeds give different draws."""
    engine = tiny_engine("gpt2", seed=1, vocab_size=V)
    prompt = [1, 2, 3]
    expected = _pair_distribution(engine, prompt) * SAMPLES
    draft_model = draft_model_for(engine, seed=1)
    counts = torch.zeros(V, V, dtype=torch.float64)
    stochastic = 0
    for seed in range(SAMPLES):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        drafter = ModelDrafter(draft_model, output_start=len(prompt), config=ALWAYS, sampling=sampling)
        draft = drafter.propose(prompt, 2)
        stochastic += draft.p_draft is not None
        drafter = ModelDrafter(draft_model, output_start=len(prompt), config=ALWAYS, sampling=sampling)
        generation = engine.generate(prompt, max_new_tokens=2, drafter=drafter, sampling=sampling)
        counts[generation.tokens[0], generation.tokens[1]] += 1
    assert stochastic == SAMPLES
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRITICAL, chi2


# ----------------------------------------------------------------------------------------- tokenizers


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path: object) -> None:
    target = build_tokenizer()
    same = build_tokenizer()
    check_same_tokenizer(target, same)  # the same vocabulary: fine
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    other.train_from_iterator(["completely different text"] * 4, trainer)
    with pytest.raises(ModelLoadError, match="needs the target's tokenizer"):
        check_same_tokenizer(target, PreTrainedTokenizerFast(tokenizer_object=other))


def test_a_tokenizer_of_the_same_size_but_other_tokens_is_refused() -> None:
    target = build_tokenizer()
    shuffled = build_tokenizer()
    vocab = shuffled.get_vocab()

    class Renamed:
        def __len__(self) -> int:
            return len(vocab)

        def get_vocab(self) -> dict[str, int]:
            first, second = sorted(vocab)[10:12]
            swapped = dict(vocab)
            swapped[first], swapped[second] = vocab[second], vocab[first]
            return swapped

    with pytest.raises(ModelLoadError, match="maps tokens differently"):
        check_same_tokenizer(target, Renamed())


def test_load_fallback_checks_the_draft_models_tokenizer(tiny_model_dir: object, tmp_path: object) -> None:
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = Path(str(tmp_path)) / "other"
    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    other.train_from_iterator(["unrelated words"] * 4, trainers.BpeTrainer(vocab_size=280, show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=other)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    engine = tiny_engine("qwen2")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_fallback(engine.loaded, draft_model=str(folder))
    fallback = load_fallback(engine.loaded, draft_model=str(tiny_model_dir))  # trained on the same corpus
    assert fallback is not None and fallback.name == "draft-model"


@pytest.mark.skipif(kernels.available() is not None, reason="no kernels of our own here")
def test_a_draft_model_keeps_what_it_derives_and_shares_the_targets_tokenizer(
    tiny_model_dir: object, tmp_path: object
) -> None:
    """A draft model's integer weights are kept for the next start as the target's are (it was quantized,
    and its tokenizer built with transformers, at every start: 4.4-5.9 s for the 0.5B beside the 1.5B);
    where its tokenizer files are the target's, byte for byte, it takes the target's tokenizer, read once;
    other files, its own, checked against the target's."""
    from pathlib import Path

    draft, kept = Path(str(tmp_path)) / "draft", Path(str(tmp_path)) / "kept"
    shutil.copytree(str(tiny_model_dir), draft)
    target = load_model(str(tiny_model_dir), weights="int8", device="cpu", kept_folder=kept)
    fallback = load_fallback(target, draft_model=str(draft), kept_folder=kept)
    assert fallback is not None and fallback.draft_model is not None
    assert fallback.draft_model.tokenizer is target.tokenizer
    assert len(list(kept.glob("int8-*.safetensors"))) == 2  # the target's and the draft's
    config = draft / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 7}))
    fallback = load_fallback(target, draft_model=str(draft), kept_folder=kept)
    assert fallback is not None and fallback.draft_model is not None
    assert fallback.draft_model.tokenizer is not target.tokenizer
    assert fallback.draft_model.tokenizer.get_vocab() == target.tokenizer.get_vocab()


@pytest.mark.skipif(kernels.available() is not None, reason="no kernels of our own here")
def test_a_draft_model_takes_an_int4_targets_weights(tiny_model_dir: object) -> None:
    """A target on int4 weights gets a draft on int4 weights (0.6 of int8's bytes a drafted token); one on
    int8 or float weights, the draft's `auto`."""
    four = load_model(str(tiny_model_dir), weights="int4", device="cpu")
    fallback = load_fallback(four, draft_model=str(tiny_model_dir))
    assert fallback is not None and fallback.draft_model is not None
    assert quantized.weight_bits(fallback.draft_model.model) == 4
    eight = load_model(str(tiny_model_dir), weights="int8", device="cpu")
    fallback = load_fallback(eight, draft_model=str(tiny_model_dir))
    assert fallback is not None and fallback.draft_model is not None
    assert quantized.weight_bits(fallback.draft_model.model) == 8


# ---------------------------------------------------------------------------------------- layer lists


def test_layer_lists_parse_and_print() -> None:
    assert parse_layers("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_layers((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    for bad in ("", "a-b", "1-", "0,,2"):
        with pytest.raises(ValueError, match="bad layer list"):
            parse_layers(bad)


def test_layer_skip_refuses_lists_that_cannot_draft() -> None:
    engine = tiny_engine("qwen2", layers=3)
    for kept, message in [("1-2", "keep layer 0"), ("0-2", "at least one"), ("0,5", "in 0..2")]:
        with pytest.raises(ModelLoadError, match=message):
            load_fallback(engine.loaded, layers=kept)


def test_skipping_layers_restores_the_model_after_an_error() -> None:
    engine = tiny_engine("gpt2", layers=3)
    before = list(decoder_layers(engine.model))
    with pytest.raises(RuntimeError), skipping_layers(engine.model, (1, 2)):
        assert type(decoder_layers(engine.model)[1]).__name__ == "_SkippedLayer"
        raise RuntimeError("boom")
    assert list(decoder_layers(engine.model)) == before


def test_layers_auto_reads_the_calibration_next_to_the_model(tmp_path: object) -> None:
    from pathlib import Path

    engine = tiny_engine("qwen2", layers=3)
    folder = Path(str(tmp_path))
    engine.loaded.name = str(folder)
    with pytest.raises(ModelLoadError, match="specedit calibrate"):
        load_fallback(engine.loaded, layers="auto")
    (folder / "specedit-layers.json").write_text('{"layers": [0, 2], "acceptance": 0.5}')
    assert read_calibration(str(folder))["layers"] == (0, 2)
    fallback = load_fallback(engine.loaded, layers="auto")
    assert fallback is not None and fallback.layers == (0, 2)
    (folder / "specedit-layers.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_fallback(engine.loaded, layers="auto")


# ---------------------------------------------------------------------------------------------- back-off


class ScriptedDrafter:
    """Proposes wrong tokens while `wrong` is set, and the known answer otherwise (a test double)."""

    def __init__(self, answer: Sequence[int], output_start: int, vocab: int) -> None:
        self.answer = list(answer)
        self.output_start = output_start
        self.vocab = vocab
        self.wrong = True
        self.proposals = 0

    def propose(self, context: Sequence[int], k: int) -> Draft:
        position = len(context) - self.output_start
        tokens = self.answer[position : position + min(k, 16)]
        if not tokens:
            return NO_DRAFT
        self.proposals += 1
        if self.wrong:
            tokens = [(t + 1) % self.vocab for t in tokens]
        return Draft(tuple(tokens))

    def observe(self, n_accepted: int) -> None:
        pass


def test_drafts_that_are_always_rejected_switch_speculation_off_and_the_copy_brings_it_back() -> None:
    engine = tiny_engine("llama", seed=6)
    prompt = engine.tokenize("def add(a, b):\n")
    plain, _ = generate(engine, prompt, max_new_tokens=160)
    scripted = ScriptedDrafter(plain.tokens, len(prompt), len(engine.tokenizer))
    governor = CostGovernor()
    drafter = governor.gate(scripted, "copy", max_draft=64, cheap=True)

    drafted_steps: list[int] = []

    def on_step(step: Step) -> None:
        drafted_steps.append(step.drafted)
        if step.generated_tokens >= 80:
            scripted.wrong = False  # the copy matches again

    generation = engine.generate(prompt, max_new_tokens=160, drafter=drafter, governor=governor, on_step=on_step)
    assert generation.tokens == plain.tokens
    first_half = drafted_steps[:60]
    # Switched off within a bounded number of steps: a 16-token draft halves to 0 in 5 rejections.
    assert sum(1 for d in first_half if d) <= 5
    assert first_half[5:] == [0] * len(first_half[5:])
    # ... and back on when the copy matches: the later steps commit many tokens each.
    assert generation.stats.target_forwards < 80 + 80 // 4
    assert generation.stats.drafters["copy"].accepted > 40
    assert generation.stats.drafters["copy"].held_back_steps >= 60


def test_a_copy_of_an_unrelated_original_stops_drafting() -> None:
    engine = tiny_engine("qwen2", seed=8)
    prompt = engine.tokenize("const f = (x) => x * 2;\n")
    original = engine.tokenize("".join(["if (x == null) { throw new Error('bad'); }\n"] * 6))
    governor = CostGovernor()
    drafter = governor.gate(CopyDrafter(original, output_start=len(prompt)), "copy", max_draft=64, cheap=True)
    plain, _ = generate(engine, prompt, max_new_tokens=150)
    speculative, _ = generate(engine, prompt, drafter, max_new_tokens=150, governor=governor)
    assert speculative.tokens == plain.tokens
    # Wasted drafted tokens are bounded: a few halvings of one first draft, and short shadow revivals.
    assert speculative.stats.drafted_tokens - speculative.stats.accepted_tokens < 64 + 4 * 8


def _cost(source: str, drafted: int, accepted: int, wall: float, position: int = 100) -> StepRecord:
    committed = accepted + 1
    return StepRecord(source, drafted, accepted, committed, wall, 2 * wall, position)


def test_the_governor_measures_plain_decoding_with_a_probe_and_judges_by_it() -> None:
    governor = CostGovernor()
    gated = governor.gate(ScriptedDrafter([1] * 100, 0, 5), "copy", max_draft=64, cheap=True)
    link = governor.links["copy"]
    governor.record(_cost("copy", 64, 64, 0.3))  # all accepted: paid, no clock needed
    assert link.cap == 64 and not governor.probing
    governor.record(_cost("copy", 64, 3, 0.5))  # partial: needs the plain cost -> a probe
    assert governor.probing
    assert gated.propose([0] * 10, 64) == NO_DRAFT  # the probe holds drafting back
    governor.record(_cost("", 0, 0, 0.1))  # the plain step: 0.1 s a token
    assert not governor.probing and governor.plain_wall == pytest.approx(0.1)
    assert link.cap == 32  # 4 tokens for 0.5 s did not pay against 0.1 s a token
    governor.record(_cost("copy", 32, 9, 0.25))  # 10 tokens for 0.25 s: paid
    assert link.cap == 64
    governor.record(_cost("copy", 8, 0, 0.01))  # rejected outright: never pays, however cheap
    assert link.cap == 4


def test_a_model_drafter_whose_whole_draft_is_accepted_may_still_not_pay() -> None:
    """Its draft forwards count: 4 tokens accepted whole for 0.6 s against 0.1 s a plain token is a loss."""
    governor = CostGovernor()
    governor.gate(ScriptedDrafter([1] * 100, 0, 5), "layers", max_draft=8, cheap=False)
    link = governor.links["layers"]
    governor.record(_cost("layers", 4, 4, 0.6))  # needs the plain cost: a probe
    assert governor.probing and link.cap == 8
    governor.record(_cost("", 0, 0, 0.1))
    assert link.cap == 2  # judged by the probe: 5 tokens for 0.6 s did not pay
    governor.record(_cost("layers", 2, 2, 0.2))  # 3 tokens for 0.2 s: paid
    assert link.cap == 4


def test_an_expensive_link_that_stops_paying_is_probed_after_a_growing_cool_down() -> None:
    governor = CostGovernor()
    inner = ScriptedDrafter([1] * 1000, 0, 5)
    gated = governor.gate(inner, "layers", max_draft=8, cheap=False)
    link = governor.links["layers"]
    governor.record(_cost("", 0, 0, 0.1))
    for drafted in (8, 4, 2, 1):  # rejected outright each time: 8 -> 4 -> 2 -> 1 -> off
        governor.record(_cost("layers", drafted, 0, 0.12))
    assert link.cap == 0
    context = [0] * 10
    asked = []
    for _ in range(30):
        before = inner.proposals
        draft = gated.propose(context, 8)
        asked.append(inner.proposals > before)
        gated.observe(0)
        if draft.tokens:  # the probe: a one-token draft, rejected again
            assert len(draft) == 1
            governor.record(_cost("layers", 1, 0, 0.12))
        context = [*context, 0]
    # Off for 4 steps, probed, off for 8, probed, off for 16, probed: the inner drafter is rarely asked.
    assert [i for i, a in enumerate(asked) if a] == [4, 13]
    assert link.cooldown == 32


class BackloggedDrafter(ScriptedDrafter):
    """A scripted draft model that must first read what was committed since it last proposed: each
    backlog token costs it `row` seconds (a test double for `ModelDrafter`'s catch-up)."""

    def __init__(self, answer: Sequence[int], output_start: int, vocab: int, row: float) -> None:
        super().__init__(answer, output_start, vocab)
        self.wrong = False
        self.row = row
        self.read = 0  # the context it has read
        self.caught_up = (0, 0.0)

    def backlog(self, context: Sequence[int]) -> int:
        return len(context) - self.read

    def propose(self, context: Sequence[int], k: int) -> Draft:
        tokens = self.backlog(context)
        self.caught_up = (tokens, tokens * self.row)
        self.read = len(context)
        return super().propose(context, k)

    def observe(self, n_accepted: int) -> None:
        self.read += n_accepted  # as a draft model reads its own tokens while drafting


def test_a_draft_model_reads_a_long_backlog_only_once_waiting_has_cost_as_much() -> None:
    """Ski rental: 200 tokens to read at the first catch-up's price (CATCH_UP_ROW of a plain step of 0.1 s
    each) wait until the steps it sat out would have saved as much (RENT of a plain step each); a short
    backlog is read at once; and the catch-up is not held against the step that paid it."""
    governor = CostGovernor()
    row = CATCH_UP_ROW * 0.1
    inner = BackloggedDrafter([1] * 1000, 0, 5, row=row)
    gated = governor.gate(inner, "draft-model", max_draft=8, cheap=False)
    link = governor.links["draft-model"]
    context = [0] * 200
    assert gated.propose(context, 8) == NO_DRAFT  # no plain step timed yet: it prices the backlog
    governor.record(_cost("", 0, 0, 0.1, position=201))
    context.append(0)
    waited = 0
    while not (draft := gated.propose(context, 8)).tokens:  # each a plain step
        waited += 1
        governor.record(_cost("", 0, 0, 0.1, position=len(context) + 1))
        context.append(0)
        assert waited < 40
    # at the k-th ask, 200 + k tokens to read against a rent of k * RENT * 0.1 s (this step's included)
    asked = next(k for k in itertools.count(1) if (200 + k) * row <= k * RENT * 0.1)
    assert asked > 10 and waited == asked - 1 and inner.proposals == 1 and len(draft) == 8
    assert link.row_seconds == pytest.approx(row) and link.rent == 0.0
    gated.observe(8)
    # 8 accepted for the catch-up and 0.1 s more: judged on the 0.1 s, it paid
    sunk = inner.caught_up[1]
    governor.record(StepRecord("draft-model", 8, 8, 9, sunk + 0.1, 2 * (sunk + 0.1), len(context) + 9))
    assert link.cap == 8 and link.backoffs == 0 and link.balance > 0
    context += [1] * 9
    assert inner.backlog(context) == 1 and gated.propose(context, 8).tokens  # the target's token: read at once
    assert inner.proposals == 2


def test_the_one_token_a_caught_up_draft_model_reads_counts_against_its_step() -> None:
    """Its catch-up of one token is the forward that gives its first draft token: part of the draft's
    cost, not sunk. 2 tokens accepted, 3 committed in 0.32 s against 0.1 s plain steps: a loss, even
    though leaving out that 0.06 s forward would have made it look like a saving."""
    governor = CostGovernor()
    inner = BackloggedDrafter([1] * 100, 0, 5, row=0.06)
    inner.wrong = False
    gated = governor.gate(inner, "draft-model", max_draft=2, cheap=False)
    link = governor.links["draft-model"]
    context = [0] * 10
    inner.read = len(context) - 1  # caught up but for the target's last token
    governor.record(_cost("", 0, 0, 0.1, position=10))
    draft = gated.propose(context, 2)
    assert len(draft) == 2 and inner.caught_up == (1, 0.06)
    gated.observe(2)
    governor.record(StepRecord("draft-model", 2, 2, 3, 0.32, 0.64, 13))
    assert link.backoffs == 1 and link.cap == 1 and link.balance < 0


def test_a_model_drafter_knows_its_backlog() -> None:
    engine = tiny_engine("qwen2", seed=9)
    inner = ModelDrafter(draft_model_for(engine, seed=9), output_start=3, config=ALWAYS)
    context = [5, 6, 7, 8, 9]
    assert inner.backlog(context) == 5
    draft = inner.propose(context, 4)
    assert inner.caught_up[0] == 5 and inner.caught_up[1] > 0
    inner.observe(2)  # 2 of its drafted tokens accepted, then the target's own
    context = [*context, *draft.tokens[:2], 3]
    assert inner.backlog(context) == 1
    assert inner.backlog([5, 6, 1]) == 1  # a context it has not read past its second token


def test_a_model_drafter_unsure_of_its_first_token_backs_off() -> None:
    """A draft model that proposes nothing still spent a forward; the governor counts that against it."""
    engine = tiny_engine("qwen2", seed=9)
    prompt = engine.tokenize("def add(a, b):\n")
    unsure = ModelDraftConfig(p_min=0.999, max_draft=8)  # a random model is never that sure
    governor = CostGovernor()
    inner = ModelDrafter(draft_model_for(engine, seed=9), output_start=len(prompt), config=unsure)
    calls = 0
    propose = inner.propose

    def counting(context: Sequence[int], k: int) -> Draft:
        nonlocal calls
        calls += 1
        return propose(context, k)

    inner.propose = counting  # type: ignore[method-assign]
    drafter = governor.gate(inner, "draft-model", max_draft=8, cheap=False)
    generation = engine.generate(prompt, max_new_tokens=100, drafter=drafter, governor=governor)
    assert generation.stats.drafted_tokens == 0
    assert calls <= 12  # 8 -> 4 -> 2 -> 1 -> off, then probes after 4, 8, 16, 32, 64 steps


def test_build_drafter_governs_every_link() -> None:
    engine = tiny_engine("qwen2", seed=4, layers=3)
    engine.fallback = FallbackConfig(layers=(0, 1), draft=ALWAYS)
    cache = engine.loaded.new_cache()
    drafter, governor = build_drafter(
        engine, "auto", source_ids=[1, 2, 3], output_start=5, sampling=SamplingConfig(), cache=cache
    )
    assert isinstance(drafter, ChainDrafter) and governor is not None
    assert set(governor.links) == {"copy", "context", "layers"}
    assert governor.links["copy"].cheap and governor.links["context"].cheap and not governor.links["layers"].cheap
    assert (
        build_drafter(engine, "none", source_ids=[], output_start=0, sampling=SamplingConfig(), cache=cache)[1] is None
    )
    for method, names in [("copy", {"copy"}), ("fallback", {"layers"})]:
        _, governor = build_drafter(
            engine, method, source_ids=[1], output_start=1, sampling=SamplingConfig(), cache=cache
        )  # type: ignore[arg-type]
        assert governor is not None and set(governor.links) == names


def test_pairs_table_is_a_distribution() -> None:
    engine = tiny_engine("gpt2", seed=1, vocab_size=V)
    table = _pair_distribution(engine, [1, 2, 3])
    assert float(table.sum()) == pytest.approx(1.0)
    assert all(float(table[a, b]) > 0 for a, b in itertools.product(range(V), range(V)))


# ---------------------------------------------------------------------------------------------- energy


def test_joules_come_from_the_nvml_energy_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: a stand-in NVML module counts millijoules; a request reports the joules it spanned."""
    import sys
    import types

    from specedit.engine.model import energy

    readings = iter(range(1_000_000, 10_000_000, 250_000))  # mJ, rising by 250 J a reading
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetTotalEnergyConsumption=lambda handle: next(readings)
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(energy, "_nvml_handle", lambda pynvml, device: "gpu0")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    meter = energy.EnergyMeter(torch.device("cuda"))
    assert meter.available
    engine = tiny_engine("qwen2")
    engine.energy = meter
    generation = engine.generate(engine.tokenize("def add(a, b):\n"), max_new_tokens=3)
    assert generation.stats.joules == pytest.approx(250.0)
    assert generation.stats.to_dict()["joules"] == 250.0


def test_no_energy_counter_on_the_cpu_or_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from specedit.engine.model import energy

    assert energy.EnergyMeter(torch.device("cpu")).read() is None

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    meter = energy.EnergyMeter(torch.device("cuda"))
    assert not meter.available and meter.read() is None
