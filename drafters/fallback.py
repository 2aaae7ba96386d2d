"""The fallback drafter's model side: what drafts where the copy has nothing, as loaded for an engine.

A small draft model with the target's tokenizer (checked at load; where its tokenizer files are the
target's, byte for byte, the target's tokenizer itself), or a list of the target's own layers (given, or
what `specedit calibrate` saved next to the model). The drafters themselves are in
`drafters.model_drafter`; `loop.drafting` puts them in the chain.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from specedit.drafters.model_drafter import (
    ModelDraftConfig,
    check_same_tokenizer,
    format_layers,
    parse_layers,
    skipped_layers,
)
from specedit.engine.model import quantized
from specedit.engine.model.loading import LoadedModel, load_model
from specedit.engine.records.errors import ModelLoadError

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


def load_fallback(
    target: LoadedModel,
    *,
    draft_model: str | None = None,
    layers: str | None = None,
    config: ModelDraftConfig | None = None,
    kernel_folder: Path | None = None,
    kept_folder: Path | None = None,
) -> FallbackConfig | None:
    """The fallback a user configured: `draft_model` (a model folder or .gguf file), or `layers` (a layer
    list such as `0-11,20-23`, or `auto` for the list `specedit calibrate` saved next to the model).
    `kernel_folder`, `kept_folder`: as the target's (`loading.load_model`): a draft model's int8 or int4
    weights and tokenizer are kept for the next start as the target's are."""
    config = config or ModelDraftConfig()
    if draft_model is not None and layers is not None:
        raise ModelLoadError("choose a draft model or layer skip, not both")
    if draft_model is not None:
        shared = target.tokenizer if _same_tokenizer_files(target.name, draft_model) else None
        loaded = load_model(
            draft_model,
            dtype=target.dtype_name,
            # the target's integer width where it has one (a draft on int4 weights drafts for an int4 target
            # at 0.6 of int8's bytes a step), else `auto`
            weights="int4" if quantized.weight_bits(target.model) == 4 else "auto",
            device=str(target.device),
            target=False,  # only the target's logits decide the output
            kernel_folder=kernel_folder,
            kept_folder=kept_folder,
            tokenizer=shared,
        )
        if shared is None:
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


def _same_tokenizer_files(target: str, draft: str) -> bool:
    """Whether two model folders hold the same tokenizer files, byte for byte (Qwen2.5-Coder's 0.5B and
    1.5B do): then they tokenize alike without a check, and the draft needs no tokenizer of its own."""
    names = ("tokenizer.json", "tokenizer_config.json")
    pairs = [(Path(target) / name, Path(draft) / name) for name in names]
    if not all(ours.is_file() and theirs.is_file() for ours, theirs in pairs):
        return False
    return all(ours.read_bytes() == theirs.read_bytes() for ours, theirs in pairs)


def calibration_path(model_name: str) -> Path:
    """Where `specedit calibrate` saves its layer choice: inside the model's folder (or next to a GGUF)."""
    path = Path(model_name).expanduser()
    folder = path.parent if path.suffix.lower() == ".gguf" else path
    return folder / CALIBRATION_FILE


class Calibration(TypedDict):
    """What `specedit calibrate` saved (`calibration_path`): the layers that draft, and how it found them."""

    layers: tuple[int, ...]


def read_calibration(model_name: str) -> Calibration:
    path = calibration_path(model_name)
    try:
        record: Calibration = json.loads(path.read_text(encoding="utf-8"))
        record["layers"] = tuple(int(layer) for layer in record["layers"])
    except FileNotFoundError:
        raise ModelLoadError(
            f"no calibrated layer list for {model_name} ({path} is missing): run `specedit calibrate` first, "
            "or give the layers, e.g. --draft-layers 0-11,20-23"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelLoadError(f"cannot read the layer list in {path}: {error}") from None
    return record
