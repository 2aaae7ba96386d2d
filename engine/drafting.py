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

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specedit.drafters.base import Drafter, NoDrafter
from specedit.drafters.chain import ChainDrafter
from specedit.drafters.context_drafter import ContextDrafter, ContextDrafterConfig
from specedit.drafters.copy_drafter import CopyDrafter, CopyDrafterConfig
from specedit.drafters.model_drafter import (
    LayerSkipDrafter,
    ModelDraftConfig,
    ModelDrafter,
    check_same_tokenizer,
    format_layers,
    parse_layers,
    skipped_layers,
)
from specedit.engine import kv_cache
from specedit.engine.errors import ModelLoadError, SpeceditError
from specedit.engine.governor import CostGovernor
from specedit.engine.loading import LoadedModel, load_model
from specedit.engine.requests import DraftMethod, FallbackOptions, SamplingConfig

if TYPE_CHECKING:
    from specedit.engine.generate import Engine, Generation, StepInfo

log = logging.getLogger(__name__)

CALIBRATION_FILE = "specedit-layers.json"  # written by `specedit calibrate`, next to the model


@dataclass(frozen=True)
class FallbackConfig:
    """What drafts where the copy has nothing: a draft model, or the target's own `layers` (kept)."""

    draft_model: LoadedModel | None = None
    layers: tuple[int, ...] | None = None
    draft: ModelDraftConfig = field(default_factory=ModelDraftConfig)

    def __post_init__(self) -> None:
        if (self.draft_model is None) == (self.layers is None):
            raise ValueError("a fallback is either a draft model or a layer list")

    @property
    def name(self) -> str:
        """The drafter's name in the stats."""
        return "draft-model" if self.draft_model is not None else "layers"

    def describe(self) -> str:
        if self.draft_model is not None:
            return f"draft model {self.draft_model.name} (p_min {self.draft.p_min})"
        assert self.layers is not None
        return f"layers {format_layers(self.layers)} (p_min {self.draft.p_min})"


def build_drafter(
    engine: Engine,
    method: DraftMethod,
    *,
    source_ids: Sequence[int],
    output_start: int,
    sampling: SamplingConfig,
    cache: Any,
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
        drafter: Drafter
        if fallback.draft_model is not None:
            drafter = ModelDrafter(
                fallback.draft_model, output_start=output_start, config=fallback.draft, sampling=sampling
            )
        else:
            assert fallback.layers is not None
            drafter = LayerSkipDrafter(
                engine.loaded,
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
    on_step: Callable[[StepInfo], None] | None = None,
) -> Generation:
    """`Engine.generate` with the drafters `method` asks for (see `build_drafter`), their governor, and the
    target cache they share."""
    sampling = sampling or SamplingConfig()
    cache = kv_cache.new_cache()
    drafter, governor = build_drafter(
        engine, method, source_ids=source_ids, output_start=len(prompt_ids), sampling=sampling, cache=cache
    )
    return engine.generate(
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
    )


def open_engine(
    model: str | None,
    *,
    dtype: str = "auto",
    device: str | None = None,
    fallback: FallbackOptions | None = None,
    progress: Any = None,
) -> Engine:
    """The engine the command line, the daemon and the language server run: the target (provisioned if
    it is a known model), and the fallback drafter the user configured."""
    from specedit.engine.generate import Engine
    from specedit.engine.model_store import cache_dir, resolve_model

    target = load_model(
        resolve_model(model, progress=progress), dtype=dtype, device=device, verdicts=cache_dir() / "exactness"
    )
    options = fallback or FallbackOptions()
    return Engine(
        target,
        load_fallback(
            target,
            draft_model=options.draft_model,
            layers=options.layers,
            config=ModelDraftConfig(p_min=options.p_min),
            progress=progress,
        ),
    )


def load_fallback(
    target: LoadedModel,
    *,
    draft_model: str | None = None,
    layers: str | None = None,
    config: ModelDraftConfig | None = None,
    progress: Any = None,
) -> FallbackConfig | None:
    """The fallback a user configured: `draft_model` (a path or a known name), or `layers` (a layer list
    such as `0-11,20-23`, or `auto` for the list `specedit calibrate` saved next to the model)."""
    config = config or ModelDraftConfig()
    if draft_model is not None and layers is not None:
        raise ModelLoadError("choose a draft model or layer skip, not both")
    if draft_model is not None:
        from specedit.engine.model_store import resolve_model

        loaded = load_model(
            resolve_model(draft_model, progress=progress),
            dtype=target.dtype_name,
            device=str(target.device),
            target=False,  # only the target's logits decide the output
        )
        check_same_tokenizer(target.tokenizer, loaded.tokenizer)
        log.info("drafting with %s where the copy has nothing", draft_model)
        return FallbackConfig(draft_model=loaded, draft=config)
    if layers is not None:
        kept = read_calibration(target.name)["layers"] if layers == "auto" else parse_layers(layers)
        try:
            skipped_layers(target.model, kept)
        except ValueError as error:
            raise ModelLoadError(f"layer skip: {error}") from None
        log.info("drafting with layers %s of the target where the copy has nothing", format_layers(kept))
        return FallbackConfig(layers=tuple(kept), draft=config)
    return None


def calibration_path(model_name: str) -> Path:
    """Where `specedit calibrate` saves its layer choice: inside the model's folder (or next to a GGUF)."""
    path = Path(model_name).expanduser()
    folder = path.parent if path.suffix.lower() == ".gguf" else path
    return folder / CALIBRATION_FILE


def read_calibration(model_name: str) -> dict[str, Any]:
    path = calibration_path(model_name)
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        record["layers"] = tuple(int(layer) for layer in record["layers"])
    except FileNotFoundError:
        raise ModelLoadError(
            f"no calibrated layer list for {model_name} ({path} is missing): run `specedit calibrate` first, "
            "or give the layers, e.g. --draft layers:0-11,20-23"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"cannot read the layer list in {path}: {error}") from None
    return record
