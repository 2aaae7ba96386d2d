"""What the loop, the drafters and the backends read of a loaded model: `Target`, its `Tokenizer`, and its
KV cache (`kv_positions.Cache`). The model on torch (`loading.LoadedModel`) and the one without it
(`torchless_model.TorchlessModel`) are both a `Target`; the type checker holds them to it. This module
imports no torch: a target without it goes through the same loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

from specedit.engine.model.kv_positions import Cache
from specedit.engine.records.prompts import ChatTemplate

if TYPE_CHECKING:
    import numpy as np
    import torch

# (T, V) scores a forward returns: torch's, or numpy's on the path without torch (`torchless_model`).
Logits: TypeAlias = "torch.Tensor | np.ndarray"


class Tokenizer(ChatTemplate, Protocol):
    """What the engine asks of a tokenizer: transformers' own, a `KeptTokenizer`, an `AsideTokenizer`."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    def __len__(self) -> int: ...

    def get_vocab(self) -> dict[str, int]: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class ModelConfig(Protocol):
    """What the engine reads of a model's config (`config.json`): transformers' own, or `DecoderConfig`."""

    @property
    def vocab_size(self) -> int: ...

    def to_dict(self) -> dict[str, object]: ...


class Verdict(Protocol):
    """The self-check's verdict on a target (`exactness.Exactness`, or as kept: `KeptVerdict`)."""

    @property
    def bitwise(self) -> bool: ...

    @property
    def fewer_threads(self) -> tuple[int, ...]: ...

    def to_dict(self) -> dict[str, object]: ...


class Device(Protocol):
    @property
    def type(self) -> str: ...  # "cpu", "cuda"


class Target(Protocol):
    """A loaded target model, as the loop runs it (`loop.generate.Engine`)."""

    @property
    def name(self) -> str: ...

    @property
    def device(self) -> Device: ...

    @property
    def dtype_name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def model(self) -> object: ...  # what says which tokens end an answer (its `generation_config`)

    @property
    def exactness(self) -> Verdict | None: ...

    @property
    def row_invariant(self) -> bool: ...

    @property
    def max_positions(self) -> int | None: ...

    def forward(self, ids: Sequence[int], cache: Cache, logits_to_keep: int = 0) -> Logits:
        """One forward over `ids` after what `cache` holds; the cache grows by len(ids) positions."""
        ...

    def new_cache(self) -> Cache: ...

    def inference(self) -> contextlib.AbstractContextManager[None]: ...

    def get_threads(self) -> int: ...

    def set_threads(self, count: int) -> None: ...
