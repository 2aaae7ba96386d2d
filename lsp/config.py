"""Settings of the language server: defaults, then `initializationOptions`, then `workspace/configuration`
(section `specedit`), then the command line, each overriding the one before.

Keys as the editors spell them (camelCase): engine, engineTokenFile, model, dtype, weights, kvCache, device,
threads, draft, draftModel, draftLayers, pMin, prefixCacheMb, delivery, presets, maxNewTokens, warm,
loadOnStart. `engine` is "inprocess", a daemon address, or absent: the shared daemon, started if none runs.
The engine's own settings are an `EngineOptions` (`ENGINE_KEYS`: the editors' names of its fields).
"""

from __future__ import annotations

import logging
import os
import time
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from specedit.engine.backends.config import INPROCESS
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.options import EngineOptions, setting_names
from specedit.engine.records.requests import DRAFT_METHODS, DraftMethod
from specedit.engine.session.session import Session, local_session, remote_session
from specedit.engine.store.fetch import ProgressCallback
from specedit.lsp.protocol import DELIVERIES, Delivery

log = logging.getLogger(__name__)

# The editors' names of the engine's settings (`draftLayers`) -> the `EngineOptions` fields (`draft_layers`).
ENGINE_KEYS = setting_names()


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
    engine_token_file: str | None = None  # for a tcp:// daemon or an http(s):// cluster
    engine_options: EngineOptions = field(default_factory=EngineOptions)  # for the engine this server starts
    draft: DraftMethod = "auto"
    delivery: Delivery = "live"
    presets: tuple[Preset, ...] = field(default=DEFAULT_PRESETS)
    max_new_tokens: int | None = None
    warm: bool = True  # offer open documents to the engine to prefill while it is idle (`warming`)
    load_on_start: bool = True  # start the engine with the editor, not on the first rewrite (False: memory)

    def __post_init__(self) -> None:
        if self.draft not in DRAFT_METHODS:
            raise ValueError(f"draft must be one of {DRAFT_METHODS}")
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {DELIVERIES}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError("maxNewTokens must be >= 1")

    def merged(self, values: Mapping[str, object] | None) -> Settings:
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

    def _with(self, key: str, value: object) -> Settings:
        if key == "engine" and isinstance(value, str):
            return replace(self, engine=value or None)
        if key == "engineTokenFile" and isinstance(value, str):
            return replace(self, engine_token_file=value or None)
        if key in ENGINE_KEYS:
            return replace(self, engine_options=_engine_option(self.engine_options, ENGINE_KEYS[key], value))
        if key == "draft" and value in DRAFT_METHODS:
            return replace(self, draft=value)
        if key == "delivery" and value in DELIVERIES:
            return replace(self, delivery=value)
        if key == "maxNewTokens" and isinstance(value, int):
            return replace(self, max_new_tokens=value)
        if key == "warm" and isinstance(value, bool):
            return replace(self, warm=value)
        if key == "loadOnStart" and isinstance(value, bool):
            return replace(self, load_on_start=value)
        if key == "presets":
            return replace(self, presets=_presets(value))
        if key in ("trace", "server", "serverCommand", "pythonPath", "previewDiff"):
            return self  # settings of the editor plugins, not of the server
        raise ValueError("unknown setting, or a value of the wrong type")


def _engine_option(options: EngineOptions, name: str, value: object) -> EngineOptions:
    """`options` with the field `name` set from an editor's JSON value, checked against the field's type
    ("" sets a text field back to its default); `EngineOptions` validates the result."""
    hint = typing.get_type_hints(EngineOptions)[name]
    if float in (hint, *typing.get_args(hint)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError("a number")
        value = float(value)
    elif int in (hint, *typing.get_args(hint)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("a whole number")
    elif not isinstance(value, str):
        raise TypeError("a string")
    elif not value:
        value = getattr(EngineOptions(), name)
    return EngineOptions.from_dict({**options.to_dict(), name: value})


def _presets(value: object) -> tuple[Preset, ...]:
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


def section(values: object) -> Mapping[str, object]:
    """The `specedit` table of an editor's settings, whether nested under that name or not."""
    if not isinstance(values, Mapping):
        return {}
    inner = values.get("specedit")
    return inner if isinstance(inner, Mapping) else values


def open_session(settings: Settings, progress: ProgressCallback | None = None) -> Session:
    """Where this server's rewrites run: in process, in the daemon at `settings.engine`, or in the shared
    daemon (started with this server's engine options when none runs; it exits by itself once idle).
    `progress` hears how the model's fetch goes, where it is fetched here (in process)."""
    if settings.engine == INPROCESS:
        return local_session(settings.engine_options, progress=progress)
    return remote_session(
        settings.engine,
        token_file=settings.engine_token_file,
        spawn=settings.engine_options,
        client_name=f"specedit lsp pid {os.getpid()}",
    )


LOAD_POLL_INTERVAL = 0.5  # s between two looks at a loading daemon's state
LOAD_WAIT_LIMIT = 1800.0  # s: a first fetch of the 1.5B on a slow link, and more


def wait_until_loaded(
    session: Session, *, interval: float = LOAD_POLL_INTERVAL, limit: float = LOAD_WAIT_LIMIT
) -> None:
    """Block until the session's model is loaded. `Session.start` returns once a daemon answers, which is
    before its model has loaded: the daemon's status says when it has. Other backends are loaded by then.
    Raises `EngineUnavailableError` when the daemon's model did not load."""
    from specedit.engine.backends.remote import DaemonBackend

    backend = getattr(session, "backend", None)  # (a test's stand-in session may have none)
    if not isinstance(backend, DaemonBackend):
        return
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with backend.connect() as daemon:
            state = daemon.status().get("state")
        if state == "failed":
            raise EngineUnavailableError("the engine's model did not load (see the daemon's log)")
        if state != "loading":
            return
        time.sleep(interval)
