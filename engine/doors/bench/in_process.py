"""Our methods and transformers' prompt lookup, run in this process on the bench's engine.

`run_ours` runs the product's own rewrite path (`loop.rewrite.run_rewrite`, what the local backend calls)
with a method's draft; `as_transformers_runs_it` puts the target on transformers' attention and ATen's
linear kernels for `plain-stock` and `prompt-lookup`, the peers a user of transformers would run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from specedit.engine.doors.bench.method_run import MethodRun, Timer
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import PreparedRewrite, run_rewrite
from specedit.engine.model.invariant import stock_kernels
from specedit.engine.model.peak import forward_ops
from specedit.engine.records.events import Step
from specedit.engine.records.prompts import extract_code
from specedit.engine.records.requests import DraftMethod

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def run_ours(engine: Engine, prepared: PreparedRewrite, *, draft: DraftMethod) -> MethodRun:
    """Our loop as the product runs it (`loop.rewrite.run_rewrite`, what the local backend calls)."""
    timer = Timer()

    def on_step(_: Step) -> None:
        timer.mark_first()

    result = run_rewrite(engine, prepared, draft=draft, on_step=on_step)
    wall, cpu, prefill, decode = timer.finish()
    stats = result.generation.stats
    ops = forward_ops(engine.torch_target.model)
    rows = stats.target_forwards + stats.drafted_tokens  # each forward's pending token and its draft
    run = MethodRun(
        result.generation.tokens,
        result.text,
        wall,
        cpu,
        prefill,
        decode,
        stats.target_forwards,
        stats.drafted_tokens,
        stats.accepted_tokens,
        stats.joules,
        {name: drafter.to_dict() for name, drafter in sorted(stats.drafters.items())},
    )
    # The engine's own phases (`Stats`): its prefill is every prompt token but the last, which the first
    # step computes with its draft.
    run.prefill_gops = _gops(stats.prefill_tokens * ops.per_prompt_token, stats.prefill_seconds)
    run.decode_gops = _gops(rows * ops.per_verified_row, stats.decode_seconds)
    return run


def _gops(gop: float, seconds: float) -> float | None:
    """GOP/s to 4 significant digits (a tiny model's are hundredths)."""
    return float(f"{gop / seconds:.4g}") if gop > 0 and seconds > 0 else None


@contextmanager
def as_transformers_runs_it(engine: Engine) -> Iterator[PreTrainedModel]:
    """The target on transformers' attention and ATen's linear kernels, one row per step, on the threads
    it is given however busy the cores (the self-check's fewer threads were found for other kernels),
    and with no kept prefix (computed on other kernels, and perhaps in another cache), while inside. Yields
    the model so run."""
    loaded = engine.torch_target
    rows, verdict, model, kept = loaded.step_rows, loaded.exactness, loaded.model, engine.prefix_cache
    loaded.step_rows, engine.prefix_cache = 1, None
    if verdict is not None:
        loaded.exactness = dataclasses.replace(verdict, fewer_threads=())
    try:
        with stock_kernels(model) as stock:
            loaded.model = engine.model = stock
            yield stock
    finally:
        loaded.step_rows, loaded.exactness, engine.prefix_cache = rows, verdict, kept
        loaded.model = engine.model = model


def run_prompt_lookup(engine: Engine, prepared: PreparedRewrite, lookup_tokens: int) -> MethodRun:
    from transformers import GenerationMixin, StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    timer = Timer()
    forwards = 0

    class _Streamer(BaseStreamer):
        def __init__(self) -> None:
            self.calls = 0

        def put(self, value: torch.Tensor) -> None:
            nonlocal forwards
            self.calls += 1
            if self.calls > 1:  # the first call carries the prompt
                timer.mark_first()
                forwards += 1

        def end(self) -> None:
            pass

    prompt_ids = prepared.prompt_ids
    closing = f"\n{prepared.fence}\n"

    class _ClosingFence(StoppingCriteria):
        """Done once the answer holds the closing fence. (`stop_strings` does this only for transformers'
        own tokenizer classes, and only where the fence ends the tokens a step accepted.)"""

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: object) -> torch.Tensor:
            answer = engine.tokenizer.decode(input_ids[0, len(prompt_ids) :].tolist(), skip_special_tokens=True)
            return torch.full((input_ids.shape[0],), closing in answer, dtype=torch.bool, device=input_ids.device)

    input_ids = torch.tensor([prompt_ids], device=engine.torch_target.device)
    with as_transformers_runs_it(engine) as stock:  # the peer as a user runs it
        assert isinstance(stock, GenerationMixin)
        output = stock.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=prepared.max_new_tokens,
            do_sample=False,
            prompt_lookup_num_tokens=lookup_tokens,
            stopping_criteria=StoppingCriteriaList([_ClosingFence()]),
            streamer=_Streamer(),
            pad_token_id=engine.tokenizer.pad_token_id or engine.tokenizer.eos_token_id,
        )
    wall, cpu, prefill, decode = timer.finish()
    tokens = [int(t) for t in output[0, len(prompt_ids) :].tolist()]
    text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
    code = prepared.region_text(extract_code(text))
    return MethodRun(tokens, code, wall, cpu, prefill, decode, forwards, extra={"lookup_tokens": lookup_tokens})
