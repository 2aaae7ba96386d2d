"""Speculation changes the speed, never the answer: speculative output equals plain decoding.

Tiny random models of three architectures in float64, greedy and seeded sampling, many seeds, prompts
and lengths; EOS inside a draft, the budget inside a draft, an empty original, and drafts longer than the
budget. After every step the cache holds every committed token but the pending one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from specedit.drafters.base import Draft
from specedit.drafters.copy_drafter import CopyDrafter
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.model.sampling import SamplingConfig
from specedit.engine.records.events import Step
from specedit.engine.records.requests import RewriteRequest

from conftest import ARCHITECTURES, tiny_engine


class NoisyOracleDrafter:
    """Proposes the reference continuation with random corruptions and random lengths, and sometimes
    more tokens than it was allowed (the engine must cut those)."""

    def __init__(self, reference: Sequence[int], output_start: int, vocab_size: int, seed: int) -> None:
        self.reference = list(reference)
        self.output_start = output_start
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        position = len(context) - self.output_start
        length = self.rng.choice([0, 1, 3, 8, 64])
        if self.rng.random() > 0.2:
            length = min(length, k)  # otherwise: over budget on purpose
        draft = self.reference[position : position + length]
        if draft and self.rng.random() < 0.3:
            draft[self.rng.randrange(len(draft))] = self.rng.randrange(self.vocab_size)
        return Draft(tuple(draft))

    def observe(self, n_accepted: int) -> None:
        pass


def run(engine: Engine, prompt: list[int], drafter: object = None, **kwargs: object) -> tuple[Generation, list[Step]]:
    steps: list[Step] = []
    generation = engine.generate(prompt, drafter=drafter, on_step=steps.append, **kwargs)
    if steps:
        assert steps[-1].generated_tokens == len(generation.tokens)  # type: ignore[arg-type]
    return generation, steps


def assert_cache_invariant(steps: list[Step]) -> None:
    assert steps, "no step ran"
    for step in steps:
        assert step.cache_length == step.committed_length - 1, step


def random_prompt(rng: random.Random, vocab_size: int) -> list[int]:
    return [rng.randrange(1, vocab_size) for _ in range(rng.randrange(1, 40))]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("seed", range(4))
def test_greedy_speculation_equals_plain_decoding(architecture: str, seed: int) -> None:
    engine = tiny_engine(architecture, seed=seed)
    vocab = len(engine.tokenizer)
    rng = random.Random(seed)
    for _ in range(3):
        prompt = random_prompt(rng, vocab)
        max_new = rng.randrange(1, 60)
        plain, plain_steps = run(engine, prompt, max_new_tokens=max_new)
        assert len(plain.tokens) == max_new  # no EOS configured: the budget ends it, exactly
        assert plain.stats.target_forwards == max_new
        assert_cache_invariant(plain_steps)

        drafters = [
            NoisyOracleDrafter(plain.tokens, len(prompt), vocab, seed),
            CopyDrafter(plain.tokens, output_start=len(prompt)),  # the original is the answer itself
            CopyDrafter(prompt, output_start=len(prompt)),  # an unrelated original
            CopyDrafter([], output_start=len(prompt)),  # an empty original
        ]
        for drafter in drafters:
            speculative, steps = run(engine, prompt, drafter, max_new_tokens=max_new)
            assert speculative.tokens == plain.tokens, type(drafter).__name__
            assert speculative.text == plain.text
            assert_cache_invariant(steps)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_copy_of_the_answer_needs_few_forwards(architecture: str) -> None:
    engine = tiny_engine(architecture, seed=7)
    prompt = engine.tokenize("def add(a, b):\n")
    plain, _ = run(engine, prompt, max_new_tokens=200)
    speculative, _steps = run(engine, prompt, CopyDrafter(plain.tokens, output_start=len(prompt)), max_new_tokens=200)
    assert speculative.tokens == plain.tokens
    assert speculative.stats.target_forwards <= 12, speculative.stats.to_dict()
    assert speculative.stats.accepted_tokens + speculative.stats.target_forwards == 200


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("eos_at", [0, 1, 5, 17])
def test_eos_inside_a_draft_ends_generation_exactly(architecture: str, eos_at: int) -> None:
    engine = tiny_engine(architecture, seed=3)
    prompt = engine.tokenize("for i in range(10):\n")
    free, _ = run(engine, prompt, max_new_tokens=40)
    eos = free.tokens[eos_at]
    engine.eos_token_ids = frozenset({eos})
    expected = free.tokens[: free.tokens.index(eos) + 1]  # EOS is the last token, included

    plain, _ = run(engine, prompt, max_new_tokens=40)
    assert plain.tokens == expected and plain.finish_reason == "eos"
    # The copy drafter proposes the whole free-running output: EOS sits inside the draft.
    speculative, steps = run(engine, prompt, CopyDrafter(free.tokens, output_start=len(prompt)), max_new_tokens=40)
    assert speculative.tokens == expected and speculative.finish_reason == "eos"
    assert speculative.text == plain.text
    assert_cache_invariant(steps)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("max_new", [1, 2, 7, 33])
def test_budget_inside_a_draft_is_exact(architecture: str, max_new: int) -> None:
    engine = tiny_engine(architecture, seed=5)
    prompt = engine.tokenize("class Point:\n")
    free, _ = run(engine, prompt, max_new_tokens=80)
    drafter = NoisyOracleDrafter(free.tokens, len(prompt), len(engine.tokenizer), seed=max_new)
    drafter.rng.random = lambda: 0.99  # type: ignore[method-assign]  # never corrupt, always over budget
    speculative, steps = run(engine, prompt, drafter, max_new_tokens=max_new)
    assert speculative.tokens == free.tokens[:max_new]
    assert speculative.finish_reason == "length"
    assert_cache_invariant(steps)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_sampling_with_a_deterministic_draft_equals_plain_sampling(architecture: str, seed: int) -> None:
    """Draws are keyed by position, so a copy draft changes nothing, not even one sample."""
    engine = tiny_engine(architecture, seed=seed)
    prompt = engine.tokenize("const f = (x) => x * 2;\n")
    for sampling in (SamplingConfig(temperature=1.0, seed=seed), SamplingConfig(temperature=0.7, top_p=0.9, seed=seed)):
        plain, _ = run(engine, prompt, max_new_tokens=50, sampling=sampling)
        other_seed, _ = run(
            engine, prompt, max_new_tokens=50, sampling=SamplingConfig(temperature=1.0, seed=seed + 100)
        )
        assert other_seed.tokens != plain.tokens  # the seed matters: the comparison below is not vacuous
        for drafter in (
            CopyDrafter(plain.tokens, output_start=len(prompt)),
            NoisyOracleDrafter(plain.tokens, len(prompt), len(engine.tokenizer), seed),
        ):
            speculative, steps = run(engine, prompt, drafter, max_new_tokens=50, sampling=sampling)
            assert speculative.tokens == plain.tokens
            assert_cache_invariant(steps)


def test_cancel_stops_before_the_next_step() -> None:
    engine = tiny_engine("qwen2")
    prompt = engine.tokenize("x")
    steps: list[Step] = []
    generation = engine.generate(prompt, max_new_tokens=100, on_step=steps.append, cancel=lambda: len(steps) >= 3)
    assert generation.finish_reason == "cancelled"
    assert len(steps) == 3 and len(generation.tokens) == 3


def test_stop_callback_cuts_a_step_short() -> None:
    engine = tiny_engine("gpt2", seed=2)
    prompt = engine.tokenize("def f():\n")
    free, _ = run(engine, prompt, max_new_tokens=30)
    seen: list[str] = []

    def stop(piece: str) -> bool:
        seen.append(piece)
        return len(seen) == 10

    speculative = engine.generate(
        prompt, max_new_tokens=30, drafter=CopyDrafter(free.tokens, output_start=len(prompt)), stop=stop
    )
    assert speculative.finish_reason == "stop"
    assert speculative.text == "".join(seen)
    assert free.text.startswith(speculative.text)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rewrite_with_an_instruction_or_a_sketch_equals_plain_decoding(architecture: str) -> None:
    engine = tiny_engine(architecture, seed=11)
    original = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    pass\n"
    sketch = "# ... existing code ...\nclass Point:\n    x: int = 0\n"
    for fields in ({"instruction": "Rename add to plus."}, {"sketch": sketch}):
        copy = rewrite(engine, RewriteRequest(original=original, language="python", max_new_tokens=60, **fields))
        plain = rewrite(
            engine, RewriteRequest(original=original, language="python", max_new_tokens=60, draft="none", **fields)
        )
        assert copy.generation.tokens == plain.generation.tokens
        assert copy.text == plain.text
