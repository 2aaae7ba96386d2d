#!/usr/bin/env python3
"""What the cache's checks cost a warm start (`store.integrity`): the engine opened as `specedit rewrite`
opens it (`backends.local.open_engine`: the model resolved and its folder checked, then loaded with its kept
tokenizer, int8 weights and verdict, and the prompts' start read back), with the checks and without them,
alternated in one process; then the checks alone, on every file of the cache they cover.

    .venv/bin/python scripts/cache_check_cost.py [--model NAME] [--rounds 5]

"Without" takes a kept file where it is (`Path.is_file` alone, no seal checked) and the converted folder
without looking at it. The kernels are loaded once a process, so their check is counted only in the
checks alone. Run it on a warm cache (one `specedit rewrite` first), or the first round makes what is kept.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specedit.engine.backends.local import open_engine
from specedit.engine.model import exactness, loading, prefix_cache
from specedit.engine.records.options import EngineOptions
from specedit.engine.store import fetch, integrity, store

CHECKING_MODULES = (loading, prefix_cache, exactness)  # where a load asks `is_sealed`


@contextmanager
def unchecked() -> Iterator[None]:
    """The checks replaced by what stood before them (see the module docstring)."""

    def no_check(*args: Any, **kwargs: Any) -> None:
        return None

    replacements = [(module, "is_sealed", Path.is_file) for module in CHECKING_MODULES]
    replacements.append((store, "_check_folder", no_check))
    saved = [(module, name, getattr(module, name)) for module, name, _ in replacements]
    for module, name, value in replacements:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def open_seconds(options: EngineOptions) -> float:
    started = time.perf_counter()
    open_engine(options)
    return time.perf_counter() - started


def checks_alone(model: str | None) -> float:
    sealed = [path for folder in store.derived_dirs() for path in folder.iterdir() if integrity.is_sealed(path)]
    started = time.perf_counter()
    fetch.resolve_model(model)
    for path in sealed:
        integrity.is_sealed(path)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    options = EngineOptions(model=args.model)
    open_seconds(options)  # warm: the page cache, the kernels loaded, what loads keep made
    with_checks, without = [], []
    for _ in range(args.rounds):
        with_checks.append(open_seconds(options))
        with unchecked():
            without.append(open_seconds(options))
    alone = [checks_alone(args.model) for _ in range(20)]
    print(f"load average {os.getloadavg()[0]:.2f}, {exactness.cpu_description()}")
    for name, seconds in (("with the checks:   ", with_checks), ("without the checks:", without)):
        each = ", ".join(f"{value:.3f}" for value in seconds)
        print(f"open_engine, {name} median {statistics.median(seconds):.3f} s ({each})")
    print(f"the checks alone (every file they cover): median {statistics.median(alone) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
