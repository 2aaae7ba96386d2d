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

import itertools
import json
from array import array
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specedit.engine.store.kept import kept_file

if TYPE_CHECKING:
    from jinja2 import Template

# A byte-level vocabulary's alphabet (GPT-2's `bytes_to_unicode`): the bytes that print stand for themselves,
# the others for the characters from U+0100 on, in order. To each of its characters, the byte it stands for;
# to a character that is no stand-in, one that is not a byte either (a token holding it is its UTF-8).
_PRINTED = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_UNPRINTED = [byte for byte in range(0x100) if byte not in _PRINTED]
_BYTE_OF = {chr(byte): chr(byte) for byte in _PRINTED} | {chr(byte): "\ufffd" for byte in _UNPRINTED}
_BYTE_OF |= {chr(0x100 + n): chr(byte) for n, byte in enumerate(_UNPRINTED)}
_BYTES = str.maketrans(_BYTE_OF)
# Text whose ids the byte table is checked on, cut after every token: characters of 1-4 bytes, a combining
# accent, a ligature the NFC normalizer keeps, line and paragraph separators (and the added tokens, after).
_DECODE_PROBE = "def f(x):\n    return x  # \u00e9 e\u0301 \ufb01 \U0001f642 \u4f60\u597d\r\n\t\u2028 A\uff21"

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


def kept_files(source: str, kept_folder: Path) -> tuple[Path, Path] | None:
    """Where the tokenizer of the model folder `source` is kept in `kept_folder`: its pipeline and its
    settings, named after the files it is built from and this module (`kept.kept_file`); None where the
    folder lacks those files (`tokenizer.json`, `tokenizer_config.json`)."""
    files = [Path(source) / "tokenizer.json", Path(source) / "tokenizer_config.json"]
    if not all(file.is_file() for file in files):
        return None
    pipeline = kept_file(kept_folder, "tokenizer", files, "json", Path(__file__).read_bytes())
    return pipeline, pipeline.with_suffix(".settings.json")


class ByteTable:
    """Each token's bytes, for a tokenizer that decodes by bytes (a byte-level BPE: GPT-2's, Qwen's, Llama
    3's): text for ids as that tokenizer gives it, without it (`KeptTokenizer.byte_table` checks every
    token). A one-off rewrite decodes with it while its tokenizer runs in a second process (`aside`)."""

    def __init__(self, pieces: Sequence[bytes], special: frozenset[int]) -> None:
        self._bytes = b"".join(pieces)
        self._ends = array("L", [0, *itertools.accumulate(map(len, pieces))])
        self._special = special

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        skipped = self._special if skip_special_tokens else frozenset()
        ends, known = self._ends, len(self._ends) - 1  # an id the vocabulary lacks decodes to nothing, as there
        pieces = (self._bytes[ends[i] : ends[i + 1]] for i in ids if 0 <= i < known and i not in skipped)
        return b"".join(pieces).decode("utf-8", errors="replace")


class KeptTokenizer:
    """A `tokenizers` pipeline (`tokenizer.json`) and the settings its class adds: special tokens by name,
    the chat template, the maximum length."""

    def __init__(self, pipeline: Path, settings: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self._backend = Tokenizer.from_file(str(pipeline))
        self.special_tokens_map = {name: settings[name] for name in SPECIAL_TOKENS if settings.get(name)}
        self.chat_template: str | None = settings.get("chat_template")
        self.model_max_length = settings.get("model_max_length")

    @classmethod
    def read(cls, pipeline: Path, settings: Path) -> KeptTokenizer:
        """The tokenizer kept in the files `kept_files` names."""
        return cls(pipeline, json.loads(settings.read_text()))

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

    def byte_table(self) -> ByteTable | None:
        """Each token's bytes (`ByteTable`), where this tokenizer's decoder is byte-level and the table gives
        its text for every token alone and for every start of a probe (ids that split characters, special
        tokens kept and skipped); None otherwise. 0.4 s for the default model's 151,936 ids."""
        from tokenizers.decoders import ByteLevel

        if not isinstance(self._backend.decoder, ByteLevel):
            return None
        size = len(self)
        tokens = [self._backend.id_to_token(i) or "" for i in range(size)]
        pieces = []
        for token in tokens:  # the decoder's rule: a token all of stand-ins is their bytes, another its UTF-8
            try:
                pieces.append(token.translate(_BYTES).encode("latin-1"))
            except UnicodeEncodeError:
                pieces.append(token.encode())
        added = self._backend.get_added_tokens_decoder()
        table = ByteTable(pieces, frozenset(i for i, token in added.items() if token.special))
        alone = self._backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        if [piece.decode("utf-8", errors="replace") for piece in pieces] != alone:  # `table.decode` of each
            return None
        probe = self.encode(_DECODE_PROBE + "".join(token.content for token in added.values()))
        for end in range(len(probe) + 1):
            for skip in (False, True):
                if table.decode(probe[:end], skip) != self.decode(probe[:end], skip_special_tokens=skip):
                    return None
        return table

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
