"""Token ids to text, incrementally, safe across tokens that end in the middle of a UTF-8 character.

Byte-level tokenizers split a character like "é" or "🙂" over several tokens; decoding one of those tokens
alone gives U+FFFD. So text is released only once it decodes cleanly, decoding a short window of recent
tokens (the prefix/read offsets of vLLM's and TGI's detokenizers), never the whole output again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHARACTER = "\ufffd"


class Decodes(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decodes, context: Sequence[int] = ()) -> None:
        """`context`: a few token ids that precede the output, so that decoding starts in the right state
        (sentencepiece tokenizers drop a leading space at the start of a decode)."""
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context[-4:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became complete (possibly empty)."""
        self._ids.append(token_id)
        return self._release(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end decodes as U+FFFD)."""
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=True)
        new_text = decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        if len(new_text) <= len(prefix_text) or (new_text.endswith(REPLACEMENT_CHARACTER) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Keep the window short: only the ids since the last release need decoding again.
        if self._prefix_offset > 64:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return new_text[len(prefix_text) :]
