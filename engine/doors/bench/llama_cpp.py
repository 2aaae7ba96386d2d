"""llama.cpp in `specedit bench`, on the very GGUF the default model is assembled from (optional).

Needs `llama-cpp-python` (`pip install 'specedit[bench-llama]'`; it builds llama.cpp from source, about
5 minutes here with CMAKE_ARGS="-DGGML_NATIVE=ON"). Runs plain decoding and prompt lookup
(`LlamaPromptLookupDecoding`); in 0.3.36, prompt lookup needs `logits_all=True` or it crashes past 512
positions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Protocol

from specedit.engine.doors.bench.method_run import MethodRun, Timer
from specedit.engine.loop.rewrite import PreparedRewrite
from specedit.engine.records.prompts import extract_code

log = logging.getLogger(__name__)

# llama.cpp's prompt lookup: best of 2, 4, 8 and 10 on held-out edits here (the library's default is 10).
NUM_PRED_TOKENS = 10


class Llama(Protocol):
    """What the bench calls of llama-cpp-python's `Llama`."""

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]: ...
    def reset(self) -> None: ...
    def generate(self, tokens: Sequence[int], top_k: int, temp: float, reset: bool) -> Iterator[int]: ...
    def token_eos(self) -> int: ...
    def detokenize(self, tokens: list[int]) -> bytes: ...


class LlamaCppRunner:
    def __init__(self, plain: Llama, lookup: Llama) -> None:
        self._plain = plain
        self._lookup = lookup

    @classmethod
    def create(cls, threads: int | None = None) -> LlamaCppRunner | None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError:
            log.warning("llama-cpp-python is not installed: the bench runs without llama.cpp")
            return None
        from specedit.engine.store.fetch import ensure_gguf

        gguf = str(ensure_gguf())
        n_threads = threads or os.cpu_count() or 1
        plain = Llama(model_path=gguf, n_ctx=32768, n_threads=n_threads, verbose=False)
        lookup = Llama(
            model_path=gguf,
            logits_all=True,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=NUM_PRED_TOKENS),
            n_ctx=32768,
            n_threads=n_threads,
            verbose=False,
        )
        return cls(plain, lookup)

    def run(self, prepared: PreparedRewrite) -> dict[str, MethodRun]:
        """llama.cpp's plain decoding and its prompt lookup on the prompt our methods get."""
        return {"llama-cpp-plain": self._run(self._plain, prepared), "llama-cpp": self._run(self._lookup, prepared)}

    @staticmethod
    def _run(llama: Llama, prepared: PreparedRewrite) -> MethodRun:
        fence, max_new_tokens = prepared.fence, prepared.max_new_tokens
        prompt = llama.tokenize(prepared.prompt_text.encode(), add_bos=False, special=True)
        llama.reset()
        timer = Timer()
        tokens: list[int] = []
        text = b""
        closing = f"\n{fence}\n".encode()
        for token in llama.generate(prompt, top_k=1, temp=0.0, reset=True):
            timer.mark_first()
            if token == llama.token_eos() or len(tokens) >= max_new_tokens:
                break
            tokens.append(int(token))
            text += llama.detokenize([token])
            if closing in b"\n" + text:
                break
        wall, cpu, prefill, decode = timer.finish()
        decoded = text.decode("utf-8", errors="replace")
        return MethodRun(tokens, prepared.region_text(extract_code(decoded)), wall, cpu, prefill, decode, 0)
