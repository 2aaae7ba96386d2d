"""Loading a causal LM and its tokenizer: a local folder, a hub id, or a GGUF file; device and dtype."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specedit.engine import invariant, kv_cache
from specedit.engine.errors import ModelLoadError
from specedit.engine.requests import DTYPE_CHOICES

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def cpu_has_native_bf16() -> bool:
    """True on CPUs with bf16 arithmetic (AVX512-BF16 or AMX), where bf16 beats float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on CUDA and on CPUs with native bf16, float32 elsewhere."""
    if name == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
        return torch.bfloat16 if native else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}") from None


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    name: str
    row_invariant: bool = False  # see `engine.invariant`: set by `load_model` where it installed it
    _cache_argument: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # transformers 5.x renamed `past_key_values` to `cache` in the forward signatures.
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    @property
    def dtype_name(self) -> str:
        """The dtype as the command line spells it: `bfloat16`, `float32`, ..."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", None
        )
        return int(value) if value else None

    def forward(self, ids: Sequence[int], cache: Any, logits_to_keep: int = 0) -> torch.Tensor:
        """One forward over `ids` after what `cache` holds; the cache grows by len(ids) positions.

        Returns (T, V) logits, or only the last `logits_to_keep` rows. With `row_invariant`, a row's logits
        are the same whatever the number of rows; a linear layer takes another kernel for a single row, so
        one token after the prompt runs as two rows (the token twice) and the second is dropped.
        """
        if self.row_invariant and len(ids) == 1 and kv_cache.length(cache):
            logits = self._run([ids[0], ids[0]], cache, 0)[:1]
            kv_cache.rollback(cache, kv_cache.length(cache) - 1)
            return logits
        return self._run(ids, cache, logits_to_keep)

    def _run(self, ids: Sequence[int], cache: Any, logits_to_keep: int) -> torch.Tensor:
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, T)
        arguments = {self._cache_argument: cache, "use_cache": True, "logits_to_keep": logits_to_keep}
        logits: torch.Tensor = self.model(input_ids=input_ids, **arguments).logits[0]  # (T, V)
        return logits


def load_model(
    name_or_path: str, *, dtype: str = "auto", device: str | None = None, row_invariant: bool = True
) -> LoadedModel:
    """Load a model for inference. Any failure is a `ModelLoadError` that says what was tried.

    `row_invariant`: a target model's logits must not depend on the shape of the forward (see
    `engine.invariant`); a draft model's may.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_device = torch.device(device) if device else default_device()
    torch_dtype = resolve_dtype(dtype, torch_device)
    source, kwargs = _source(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except Exception as error:  # transformers raises many kinds; all mean "did not load"
        raise ModelLoadError(f"could not load model {name_or_path!r}: {error}") from error
    model.to(torch_device).eval()
    installed = row_invariant and invariant.install(model)
    log.info("loaded %s on %s as %s%s", name_or_path, torch_device, torch_dtype, ", row-invariant" * installed)
    return LoadedModel(model, tokenizer, torch_device, torch_dtype, name_or_path, installed)


def _source(name_or_path: str) -> tuple[str, dict[str, Any]]:
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder (no config.json)")
        return str(path), {}
    if (os.sep in name_or_path and name_or_path.count("/") != 1) or name_or_path.startswith("."):
        raise ModelLoadError(f"model folder not found: {path}")
    return name_or_path, {}  # a hub id: works where the machine has a network or a hub cache
