"""What loads derive from a model and keep in the cache for the next start: where, and written whole.

The tokenizer as built, the int8 weights as quantized (`loading`), the prompts' shared start prefilled
(`prefix_cache.PrefixCache.keep_head`): each is a file named after the model's files and everything that
derives it (`kept_file`), written under a temporary name and renamed (`write_atomically`), so a process
reading it meanwhile finds all of it or none, and sealed (`integrity`): a load reads it only where
`integrity.is_sealed` finds the bytes it was written with. The self-check's verdicts (`exactness`) are
written so too. Deleting any of them only costs the next start its time again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path

from specedit.engine.store.integrity import replace_sealed


def kept_file(folder: Path, kind: str, sources: list[Path], suffix: str, derived_by: bytes = b"") -> Path:
    """Where what is derived from the files `sources` of a model (its tokenizer, its int8 weights: `kind`)
    is kept in `folder`: named by those files (paths, sizes, times changed) and by what derives it (the
    versions of torch and transformers, and `derived_by`: the int8 weights' quantizing kernel), so that a
    change of any derives it again. Older ones of the same kind and model are removed as this one is
    named (and files named after it: `NAME.settings.json`, `NAME.seal`, `NAME.tmp-PID`)."""
    paths = sorted(str(source.resolve()) for source in sources)
    model = hashlib.sha256(f"{kind}\0{paths}".encode()).hexdigest()[:12]
    stats = [(stat.st_size, stat.st_mtime_ns) for stat in (source.stat() for source in sorted(sources))]
    key = hashlib.sha256(f"{stats}\0{versions()}".encode() + b"\0" + derived_by).hexdigest()[:16]
    chosen = folder / f"{kind}-{model}-{key}.{suffix}"
    for old in folder.glob(f"{kind}-{model}-*"):
        if not old.name.startswith(f"{kind}-{model}-{key}."):
            old.unlink(missing_ok=True)
    return chosen


def versions() -> list[str]:
    """The versions of the libraries whose code derives what is kept: torch's and transformers' (read from
    the installed packages' metadata, once a process: neither is imported, so that a one-off rewrite finds
    its kept tokenizer before torch's import, `aside`)."""
    return list(_installed("torch", "transformers"))


@functools.cache
def _installed(*packages: str) -> tuple[str, ...]:
    return tuple(importlib.metadata.version(package) for package in packages)


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(temporary)`, then the temporary file renamed to `path` (its folder made if missing) and sealed
    (`integrity.replace_sealed`): a process reading it meanwhile finds all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writing = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        write(writing)
        replace_sealed(writing, path)
    finally:
        writing.unlink(missing_ok=True)
