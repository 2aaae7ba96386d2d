"""Settings of the language server: defaults, then `initializationOptions`, then `workspace/configuration`
(section `specedit`), then the command line, each overriding the one before.

Keys as the editors spell them (camelCase): engine, engineTokenFile, model, dtype, device, draft,
draftModel, draftLayers, pMin, delivery, presets, maxNewTokens. `engine` is "inprocess", a daemon address, or
absent: the shared daemon, started if none runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specedit.engine.requests import DRAFT_METHODS, DTYPE_CHOICES, DraftMethod, FallbackOptions
from specedit.lsp.protocol import DELIVERIES, Delivery

log = logging.getLogger(__name__)

INPROCESS = "inprocess"


@dataclass(frozen=True)
class Preset:
    """A canned instruction offered as a code action."""

    title: str
    instruction: str


DEFAULT_PRESETS = (
    Preset("Add type hints", "Add type hints to the code. Change nothing else."),
    Preset("Add docstrings", "Add concise docstrings where they are missing. Change nothing else."),
    Preset("Fix bugs", "Fix the bugs in this code. Keep everything that is correct exactly as it is."),
)


@dataclass(frozen=True)
class Settings:
    engine: str | None = None  # None: the shared daemon; "inprocess"; or a daemon address
    engine_token_file: str | None = None  # for a tcp:// daemon address
    model: str | None = None
    dtype: str = "auto"
    device: str | None = None
    draft: DraftMethod = "auto"
    fallback: FallbackOptions = field(default_factory=FallbackOptions)  # for the engine this server starts
    delivery: Delivery = "live"
    presets: tuple[Preset, ...] = field(default=DEFAULT_PRESETS)
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {DTYPE_CHOICES}")
        if self.draft not in DRAFT_METHODS:
            raise ValueError(f"draft must be one of {DRAFT_METHODS}")
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("maxNewTokens must be >= 1")

    def merged(self, values: Mapping[str, Any] | None) -> Settings:
        """These settings with `values` (an editor's JSON) on top; a bad value is logged and skipped."""
        settings = self
        for key, value in (values or {}).items():
            if value is None:
                continue
            try:
                settings = settings._with(key, value)
            except (TypeError, ValueError) as error:
                log.warning("ignoring setting specedit.%s = %r: %s", key, value, error)
        return settings

    def _with(self, key: str, value: Any) -> Settings:
        if key == "engine" and isinstance(value, str):
            return replace(self, engine=value or None)
        if key == "engineTokenFile" and isinstance(value, str):
            return replace(self, engine_token_file=value or None)
        if key == "model" and isinstance(value, str):
            return replace(self, model=value or None)
        if key == "device" and isinstance(value, str):
            return replace(self, device=value or None)
        if key == "dtype" and isinstance(value, str):
            return replace(self, dtype=value)
        if key == "draft" and value in DRAFT_METHODS:
            return replace(self, draft=value)
        if key == "draftModel" and isinstance(value, str):
            return replace(self, fallback=replace(self.fallback, draft_model=value or None))
        if key == "draftLayers" and isinstance(value, str):
            return replace(self, fallback=replace(self.fallback, layers=value or None))
        if key == "pMin" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return replace(self, fallback=replace(self.fallback, p_min=float(value)))
        if key == "delivery" and value in DELIVERIES:
            return replace(self, delivery=value)
        if key == "maxNewTokens" and isinstance(value, int):
            return replace(self, max_new_tokens=value)
        if key == "presets":
            return replace(self, presets=_presets(value))
        if key in ("trace", "server", "serverCommand", "pythonPath"):
            return self  # settings of the editor plugins, not of the server
        raise ValueError("unknown setting, or a value of the wrong type")


def _presets(value: Any) -> tuple[Preset, ...]:
    """`[{"title", "instruction"}]` or `{"title": "instruction"}`."""
    if isinstance(value, Mapping):
        items = [{"title": title, "instruction": instruction} for title, instruction in value.items()]
    elif isinstance(value, list):
        items = value
    else:
        raise TypeError("presets must be a list of {title, instruction} or a {title: instruction} table")
    presets = []
    for item in items:
        if not (
            isinstance(item, Mapping)
            and isinstance(item.get("title"), str)
            and isinstance(item.get("instruction"), str)
        ):
            raise TypeError(f"not a preset: {item!r}")
        presets.append(Preset(item["title"], item["instruction"]))
    return tuple(presets)


def section(values: Any) -> Mapping[str, Any]:
    """The `specedit` table of an editor's settings, whether nested under that name or not."""
    if not isinstance(values, Mapping):
        return {}
    inner = values.get("specedit")
    return inner if isinstance(inner, Mapping) else values
