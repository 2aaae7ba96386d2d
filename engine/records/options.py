"""What an engine is made of, as a user configures it: one dataclass, and everything derived from it.

Each field of `EngineOptions` is one option everywhere: the flag `--draft-layers` of `specedit rewrite`,
`bench`, `calibrate`, `doctor`, `serve` and `lsp` (`add_engine_arguments`, read back by `from_args`), the
editors' setting `specedit.draftLayers` (`setting_names`), and a key of the daemon's config, which travels
as data (`to_dict` / `from_dict`). Adding an option is adding a field here, with its help text. No torch
import: the command line's parser and the language server use this.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import TypeVar

from specedit.engine.records.wire import conforms

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16", "float64")
WEIGHTS_CHOICES = ("auto", "int8", "int5", "int4", "float")
KV_CACHE_CHOICES = ("float32", "float16")


T = TypeVar("T")


def _option(default: T, help_text: str, *, metavar: str | None = None, choices: tuple[str, ...] | None = None) -> T:
    return field(default=default, metadata={"help": help_text, "metavar": metavar, "choices": choices})


@dataclass(frozen=True)
class EngineOptions:
    """The target model and how it runs, and what drafts where the copy has nothing (at most one of a
    draft model and the target's own layers). Built by keyword; validated here, once."""

    model: str | None = _option(
        None,
        "a model folder, a .gguf file, a hub id or a known name (default: Qwen2.5-Coder-0.5B-Instruct, embedded)",
    )
    dtype: str = _option(
        "auto",
        "auto (default): float32 where the weights are int8, else bf16 on CUDA and on CPUs with native bf16, "
        "else float32",
        choices=DTYPE_CHOICES,
    )
    weights: str = _option(
        "auto",
        "the linear layers' weights on the CPU: int8 (a quarter of float32's bytes to read a step; its kernel is "
        "compiled once), int4 (16 levels a group of 32: 0.6 of int8's bytes, for bigger models; the answers "
        "differ from int8's), int5 (a model's GGUF's Q5_0 layers on their own levels, int8 for its other layers: "
        "on AVX2 without VNNI a forward of 8-256 tokens 0.87-0.95x int8's time; answers differ from int8's at "
        "near-ties), float (the dtype's), auto (default): on the CPU (AVX2, AVX-512, AVX512-BF16, AMX; not with "
        "another dtype asked for) int4 for a model whose own weights are 4-bit (the 1.5B's Q4_K), int5 for one "
        "mostly Q5_0 (the 0.5B) on AVX2 without VNNI, else int8",
        choices=WEIGHTS_CHOICES,
    )
    # float16 on specedit's kernels (`kv_cache.KVCache`, measured in docs/kernels.md) is not the default: it
    # flips near-ties of the default model's answers, as any change of arithmetic does.
    kv_cache: str = _option(
        "float32",
        "the keys and values the model keeps of the text it has read, on specedit's CPU kernels: float32 "
        "(default) or float16 (half the memory and the bytes a step reads: the 1.5B's one-token step after "
        "2,000 tokens 0.87-0.91x the time; the answers differ from float32's at near-ties)",
        choices=KV_CACHE_CHOICES,
    )
    device: str | None = _option(None, "cpu, cuda, cuda:1, ... (default: CUDA when available)")
    threads: int | None = _option(None, "CPU threads for torch (default: torch's choice)")
    draft_model: str | None = _option(
        None, "a small model with the target's tokenizer that drafts where the copy has nothing", metavar="MODEL"
    )
    draft_layers: str | None = _option(
        None,
        "draft where the copy has nothing with these layers of the target, e.g. 0-11,20-23, or auto for the list "
        "`specedit calibrate` saved",
        metavar="LIST|auto",
    )
    # About 0.5 removed the energy penalty of long drafts on every task in the seed measurements.
    p_min: float = _option(0.5, "the fallback stops drafting at the first token below this probability (default 0.5)")
    # 0.5B, float32: 171 MB for a 1,000-line file (7,300 tokens, `model.prefix_cache`); the default keeps a
    # few recent ones. A one-shot `specedit rewrite` keeps none: nothing after it could reuse them (the start
    # every prompt shares is kept apart from these: `PrefixCache.keep_head`).
    prefix_cache_mb: int = _option(
        1024,
        "memory (MB) for the KV caches of recent prompts, reused by later requests on the same file "
        "(a daemon's, a language server's; 0: none)",
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.weights not in WEIGHTS_CHOICES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS_CHOICES)}, got {self.weights!r}")
        if self.kv_cache not in KV_CACHE_CHOICES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHE_CHOICES)}, got {self.kv_cache!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.draft_model is not None and self.draft_layers is not None:
            raise ValueError("choose a draft model or layer skip, not both")
        if not 0.0 <= self.p_min < 1.0:
            raise ValueError(f"p_min must be in [0, 1), got {self.p_min}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")

    @property
    def has_fallback(self) -> bool:
        """A draft model or layer skip drafts where the copy has nothing."""
        return self.draft_model is not None or self.draft_layers is not None

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: object) -> EngineOptions:
        """The inverse of `to_dict`. A ValueError for anything else: unknown keys (a daemon of another
        version), a value of another type."""
        if not isinstance(values, dict):
            raise ValueError("engine options are a map")
        unknown = set(values) - {option.name for option in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown engine options: {', '.join(sorted(map(str, unknown)))}")
        hints = typing.get_type_hints(cls)
        wrong = sorted(name for name, value in values.items() if not conforms(value, hints[name]))
        if wrong:
            raise ValueError(f"engine options of the wrong type: {', '.join(wrong)}")
        return cls(**values)

    @classmethod
    def from_args(cls, args: argparse.Namespace, base: EngineOptions | None = None) -> EngineOptions:
        """The options the flags of `add_engine_arguments` give, over `base` (default: the defaults); a
        flag left out keeps `base`'s value. ValueError when they do not fit together."""
        given = {name: getattr(args, name) for name in _names() if getattr(args, name, None) is not None}
        return dataclasses.replace(base or cls(), **given)


def add_engine_arguments(parser: argparse._ActionsContainer) -> None:
    """The engine's flags, one per `EngineOptions` field (`--draft-layers` for `draft_layers`), on a parser
    or an argument group. Every flag defaults to None, "not given", so that `from_args` can layer them."""
    hints = typing.get_type_hints(EngineOptions)
    for option in dataclasses.fields(EngineOptions):
        kind = next(
            arm for arm in (int, float, str) if arm in (hints[option.name], *typing.get_args(hints[option.name]))
        )
        parser.add_argument(
            "--" + option.name.replace("_", "-"),
            dest=option.name,
            type=kind,
            choices=option.metadata["choices"],
            metavar=option.metadata["metavar"],
            help=option.metadata["help"],
        )


def setting_names() -> dict[str, str]:
    """The editors' names of the options (`draftLayers` for `draft_layers`) -> the fields."""
    return {_camel(name): name for name in _names()}


def _names() -> list[str]:
    return [option.name for option in dataclasses.fields(EngineOptions)]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)
