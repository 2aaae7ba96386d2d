"""Prompts that share a prefix share its KV cache: recent prompts' caches, kept for the next request.

An editor asks again and again about the same file, and the prompt puts the file first (`prompts`), so
requests on one document share its tokens up to the instruction. `PrefixCache` keeps the caches of recent
prompts (least recently used out, within a byte budget) and hands a request the one that shares the
longest token prefix with its prompt, cropped to it through `kv_cache` (the one module that crops; a copy
of the shared part when that is only a part of the kept prompt, which stays for its own document). The
prefill is row-invariant (`invariant`), so a cache built in pieces is bit for bit the cache built at once,
and the answer with a reused prefix is the answer without it. `warm` extends a kept cache in idle time, in
chunks, stopping as soon as it is told to (a real request is waiting).

Every prompt starts alike: the system prompt, up to the user's code (`loop.rewrite.keep_prompt_head`).
`keep_head` holds that start's cache for good, outside the budget (lent to requests as a copy), read from
a file that an earlier start of the same model on the same kernels wrote (`store.kept`), so even a
process's first request, a one-off `specedit rewrite`'s, prefills only its own part: 61 tokens of the
default model's prompt, 0.3 s of a cold start steered to AVX2 (0.1 s with AVX-512 VNNI).

Memory per token of context: 2 (keys, values) x layers x KV heads x head dim x the dtype's bytes: 24.6 KB
for Qwen2.5-Coder-0.5B in float32 (24 layers, 2 KV heads of 64), so about 250 MB for a 1,000-line file.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from specedit.engine.model import kv_cache
from specedit.engine.model.kv_cache import Cache
from specedit.engine.model.kv_positions import common_prefix as common_prefix
from specedit.engine.model.loading import Interrupted, LoadedModel
from specedit.engine.store.integrity import is_sealed
from specedit.engine.store.kept import write_atomically

log = logging.getLogger(__name__)

MIN_SHARED = 16  # a shorter common prefix is not worth taking a kept cache apart for
# Tokens per warming forward. A real request does not wait for it: the forward gives way between two
# layers (`LoadedModel.interruptible`). Chunks this long prefill at nearly the speed of one forward.
WARM_CHUNK = 256


@dataclass
class _Entry:
    ids: tuple[int, ...]  # what the cache holds, position by position
    cache: Cache
    nbytes: int
    used: int  # when it was last put back: the least recently used goes first


class PrefixCache:
    """Kept KV caches, at most `budget_bytes` of them. Not thread-safe: the engine's one worker uses it."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the prefix cache's budget must be >= 0")
        self.budget_bytes = budget_bytes
        self._entries: list[_Entry] = []
        self._head: _Entry | None = None  # the start every prompt shares (`keep_head`)
        self.head_file: Path | None = None  # where that start is kept, sealed (`keep_head`'s `file`)
        self._clock = itertools.count()

    @property
    def nbytes(self) -> int:
        """The memory of the kept prompts' caches (the head's is not counted: it is held for good)."""
        return sum(entry.nbytes for entry in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, ids: Sequence[int]) -> tuple[Cache | None, int]:
        """A cache holding the longest prefix of `ids` that a kept cache shares (never all of `ids`: the
        loop's first forward needs the last one), for the caller to extend, and how many tokens it holds: the
        kept cache itself, taken out of the store, when it holds nothing else; else a copy of the shared
        part. None (and 0) when none shares `MIN_SHARED` tokens: the caller starts a cache of its model's."""
        return self._take(ids, len(ids) - 1)

    def _best(self, ids: Sequence[int], limit: int) -> tuple[_Entry | None, int]:
        """The kept cache sharing the longest prefix with `ids` (at most `limit` tokens), and its length."""
        best, shared = None, 0
        for entry in [*self._entries, *([self._head] if self._head is not None else [])]:
            common = common_prefix(entry.ids, ids, limit)
            if common > shared:
                best, shared = entry, common
        return best, shared

    def _take(self, ids: Sequence[int], limit: int) -> tuple[Cache | None, int]:
        return self._taken(*self._best(ids, limit))

    def _taken(self, best: _Entry | None, shared: int) -> tuple[Cache | None, int]:
        """`best`'s first `shared` tokens for a caller to extend (see `take`)."""
        if best is None or shared < MIN_SHARED:
            return None, 0
        if shared < len(best.ids) or best is self._head:  # a part of another prompt, or the head
            return kv_cache.copy_prefix(best.cache, shared), shared
        self._entries.remove(best)
        return best.cache, shared

    def put(self, ids: Sequence[int], cache: Cache) -> None:
        """Keep `cache`, which holds `ids` (at least), cropped to them; a kept cache that holds a prefix of
        them is dropped (this one holds it too), as is this one when a kept cache holds all of it; the least
        recently used go until the budget holds.
        (Older texts of a document being edited stay until then: an undo may bring one back.)"""
        held = min(kv_cache.length(cache), len(ids))
        if held < MIN_SHARED or self.budget_bytes == 0:
            return
        key = tuple(ids[:held])
        covering, shared = self._best(key, held)
        if covering is not None and shared == held:  # a kept cache holds all of these already
            covering.used = next(self._clock)
            return
        kv_cache.rollback(cache, held)
        kv_cache.compact(cache)
        self._entries = [entry for entry in self._entries if entry.ids != key[: len(entry.ids)]]
        self._entries.append(_Entry(key, cache, kv_cache.nbytes(cache), next(self._clock)))
        while self._entries and self.nbytes > self.budget_bytes:
            oldest = min(self._entries, key=lambda entry: entry.used)
            self._entries.remove(oldest)
            log.info(
                "prefix cache: dropped %d tokens (%.0f MB) over the budget", len(oldest.ids), oldest.nbytes / 2**20
            )

    def warm(self, loaded: LoadedModel, ids: Sequence[int], should_stop: Callable[[], bool] = lambda: False) -> int:
        """Extend the kept cache that shares most of `ids` to all of them, `WARM_CHUNK` tokens per forward,
        giving way as soon as `should_stop()` is true (between two layers); what was done is kept. Returns
        how many of the tokens are cached now. An error other than giving way drops the cache."""
        best, shared = self._best(ids, len(ids))
        if best is not None and shared == len(ids):  # warm already
            best.used = next(self._clock)
            return shared
        cache, held = self._taken(best, shared)
        cache = loaded.new_cache() if cache is None else cache
        try:
            with torch.inference_mode(), loaded.interruptible(should_stop):
                while held < len(ids) and not should_stop():
                    chunk = list(ids[held : held + WARM_CHUNK])
                    loaded.forward(chunk, cache, logits_to_keep=1)
                    held += len(chunk)
        except Interrupted:
            kv_cache.rollback(cache, held)  # the layers the cut-short forward reached
        self.put(ids[:held], cache)
        return held

    def keep_head(self, loaded: LoadedModel, ids: Sequence[int], file: Path | None = None) -> bool:
        """Hold the cache of `ids`, the start every prompt shares, for good: read from `file` where an
        earlier start wrote it for the same ids, else prefilled now and written there (a failure to write
        is logged). Returns whether it was read. `file` must be named after everything the cache depends
        on (the model's files, the kernels: `exactness.fingerprint`), as `loop.rewrite.keep_prompt_head`
        names it."""
        read = False
        if file is not None and is_sealed(file):
            cache = loaded.new_cache()
            try:
                read = kv_cache.read(file, cache) == list(ids)
            except (OSError, ValueError, SafetensorError) as error:  # sealed, yet not a cache: prefilled again
                log.info("the prompts' start kept in %s not read (%s)", file, error)
        if not read:
            cache = loaded.new_cache()
            with torch.inference_mode():
                loaded.forward(list(ids), cache, logits_to_keep=1)
            if file is not None:
                try:
                    write_atomically(file, lambda path: kv_cache.write(cache, ids, path))
                except (OSError, SafetensorError) as error:  # no room, no right to write: prefilled next time
                    log.info("the prompts' start not kept in %s: %s", file, error)
        kv_cache.compact(cache)
        self._head = _Entry(tuple(ids), cache, kv_cache.nbytes(cache), 0)
        self.head_file = file if file is not None and is_sealed(file) else None
        return read

    @property
    def head_ids(self) -> tuple[int, ...]:
        """The ids of the start every prompt shares (`keep_head`; none before)."""
        return self._head.ids if self._head is not None else ()

    @property
    def keeps_prompts(self) -> bool:
        """Whether requests' prompts are kept (a budget above 0), beside the head."""
        return self.budget_bytes > 0

    def describe(self) -> dict[str, object]:
        return {
            "head_tokens": len(self._head.ids) if self._head is not None else 0,
            "documents": len(self._entries),
            "tokens": [len(entry.ids) for entry in self._entries],
            "megabytes": round(self.nbytes / 2**20, 1),
            "budget_megabytes": round(self.budget_bytes / 2**20, 1),
        }
