"""A model's tokenizer as the engine uses it, on `tokenizers` and jinja2 alone (no transformers to import).

transformers' tokenizer classes cost 0.5 s to import (transformers itself) before any work; the engine
asks little of a tokenizer: ids for text and text for ids, the vocabulary, the end and padding tokens, and
the chat template rendered to text. `KeptTokenizer` does that on the pipeline `tokenizers` runs anyway
(what `PreTrainedTokenizerFast` calls) and renders the template in the environment transformers renders it
in (jinja2's sandbox, `trim_blocks`, `lstrip_blocks`, loop controls, its `tojson` and `raise_exception`).
A kept tokenizer is used only where, read back, it gives transformers' ids, text, tokens and prompt for
probes (`loading.load_tokenizer`); a template needing more than that environment fails to compile here,
and the tokenizer is then not kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import Template

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def compact_pipeline(pipeline: str) -> str:
    """A `tokenizers` pipeline (its JSON) with its BPE merges written as `"a b"` strings, not `["a", "b"]`
    pairs, where no token of them holds a space (a byte-level vocabulary writes a space as `Ġ`): the same
    tokenizer, read back sooner (the default model's 151,387 merges: 0.39 s against 0.48 s). As it is
    otherwise."""
    data = json.loads(pipeline)
    merges = data.get("model", {}).get("merges")
    if not merges or not all(isinstance(pair, list) and len(pair) == 2 and " " not in "".join(pair) for pair in merges):
        return pipeline
    data["model"]["merges"] = [" ".join(pair) for pair in merges]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


class KeptTokenizer:
    """A `tokenizers` pipeline (`tokenizer.json`) and the settings its class adds: special tokens by name,
    the chat template, the maximum length."""

    def __init__(self, pipeline: Path, settings: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self._backend = Tokenizer.from_file(str(pipeline))
        self.special_tokens_map = {name: settings[name] for name in SPECIAL_TOKENS if settings.get(name)}
        self.chat_template: str | None = settings.get("chat_template")
        self.model_max_length = settings.get("model_max_length")

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._backend.get_vocab(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    def _id(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        if tokenize or self.chat_template is None:
            raise ValueError("a kept tokenizer renders a chat template to text only, and has one")
        rendered: str = self._template.render(
            messages=messages,
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map,
        )
        return rendered

    @cached_property
    def _template(self) -> Template:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, **options: Any) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **options)  # HTML left unescaped

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        return environment.from_string(self.chat_template or "")
