"""Which drafters a request gets: the copy drafter, then the fallback, under the cost governor.

Draft methods (`RewriteRequest.draft`):
- `auto` (the default): the chain. Copy from the original (and the edit sketch) while the copy has a
  proposal; then prompt lookup over what was written so far (the context drafter: new code repeats
  itself); then the engine's fallback (a draft model, or the target on some of its layers) when one is
  configured; else plain decoding.
- `copy`: the copy drafter alone; `fallback`: the fallback alone; `none`: plain decoding.
Every drafter runs under a `CostGovernor`, so speculation backs off wherever it stops paying.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specedit.drafters.base import Drafter, NoDrafter
from specedit.drafters.chain import ChainDrafter
from specedit.drafters.context_drafter import ContextDrafter, ContextDrafterConfig
from specedit.drafters.copy_drafter import CopyDrafter, CopyDrafterConfig
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.loop.governor import CostGovernor
from specedit.engine.model import kv_positions
from specedit.engine.model.kv_positions import Cache
from specedit.engine.records.errors import SpeceditError
from specedit.engine.records.events import Step
from specedit.engine.records.requests import DraftMethod, SamplingConfig


def build_drafter(
    engine: Engine,
    method: DraftMethod,
    *,
    source_ids: Sequence[int],
    output_start: int,
    sampling: SamplingConfig,
    cache: Cache,
) -> tuple[Drafter, CostGovernor | None]:
    """The drafter for one generation, and the governor that keeps it paying (None for plain decoding).

    `source_ids` is what the copy drafter copies from; `cache` the target's (empty) cache, which layer
    skip drafts on: pass the same one to `Engine.generate`.
    """
    if method == "none":
        return NoDrafter(), None
    fallback = engine.fallback
    if method == "fallback" and fallback is None:
        raise SpeceditError("no fallback drafter is configured: load a draft model or choose layers to skip")
    governor = CostGovernor()
    links: list[Drafter] = []
    if method in ("auto", "copy"):
        config = CopyDrafterConfig()
        copy = CopyDrafter(source_ids, output_start=output_start, config=config)
        links.append(governor.gate(copy, "copy", max_draft=config.max_draft, cheap=True))
    if method == "auto":
        context_config = ContextDrafterConfig()
        context = ContextDrafter(context_config)
        links.append(governor.gate(context, "context", max_draft=context_config.max_draft, cheap=True))
    if method in ("auto", "fallback") and fallback is not None:
        from specedit.drafters.model_drafter import LayerSkipDrafter, ModelDrafter  # (torch: with a fallback only)

        drafter: Drafter
        if fallback.draft_model is not None:
            drafter = ModelDrafter(
                fallback.draft_model, output_start=output_start, config=fallback.draft, sampling=sampling
            )
        else:
            assert fallback.layers is not None
            drafter = LayerSkipDrafter(
                engine.torch_target,
                cache,
                fallback.layers,
                output_start=output_start,
                config=fallback.draft,
                sampling=sampling,
            )
        links.append(governor.gate(drafter, fallback.name, max_draft=fallback.draft.max_draft, cheap=False))
    return (links[0] if len(links) == 1 else ChainDrafter(links)), governor


def generate_drafted(
    engine: Engine,
    prompt_ids: Sequence[int],
    *,
    method: DraftMethod,
    source_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    stop: Callable[[str], bool] | None = None,
    on_text: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_step: Callable[[Step], None] | None = None,
    pause: Callable[[], None] | None = None,
) -> Generation:
    """`Engine.generate` with the drafters `method` asks for (see `build_drafter`), their governor, and the
    target cache they share: from the engine's prefix cache when it keeps one that shares the prompt's
    start, and kept there afterwards (the prompt's part) for the next request on the same document."""
    sampling = sampling or SamplingConfig()
    prefix_cache = engine.prefix_cache
    cache = prefix_cache.take(prompt_ids)[0] if prefix_cache is not None else None
    cache = engine.loaded.new_cache() if cache is None else cache
    drafter, governor = build_drafter(
        engine, method, source_ids=source_ids, output_start=len(prompt_ids), sampling=sampling, cache=cache
    )
    generation = engine.generate(
        prompt_ids,
        max_new_tokens=max_new_tokens,
        drafter=drafter,
        sampling=sampling,
        stop=stop,
        on_text=on_text,
        cancel=cancel,
        on_step=on_step,
        governor=governor,
        cache=cache,
        pause=pause,
    )
    if prefix_cache is not None:  # (not after an exception: a forward cut short may leave the layers uneven)
        kv_positions.rollback(cache, min(kv_positions.length(cache), len(prompt_ids) - 1))
        prefix_cache.put(prompt_ids, cache)
    return generation
