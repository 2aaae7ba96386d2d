"""`specedit model`: provision, list and verify the embedded models; `specedit doctor`: what this machine
runs, and whether speculation is bitwise exact on it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from specedit.cli.usage import add_model_arguments, engine_options
from specedit.engine.records.errors import InputError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from specedit.engine.store.fetch import ProgressCallback


def add_model_parsers(commands: Any) -> None:
    """Add `doctor` and `model` to the `specedit` subcommands."""
    doctor = commands.add_parser(
        "doctor", help="what this machine runs: the CPU class, the kernels, and whether speculation is bitwise exact"
    )
    add_model_arguments(doctor)
    doctor.add_argument("--json", action="store_true", help="print the verdict and the forward costs as JSON")

    model = commands.add_parser("model", help="provision and list the embedded models")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = model_commands.add_parser("fetch", help="download, verify and convert a model into the cache")
    fetch.add_argument("name", nargs="?", default=None, help="a known model name (default: the default model)")
    model_commands.add_parser("list", help="show the cached models, with sizes and hashes")
    verify = model_commands.add_parser("verify", help="hash a cached model again: the GGUF and every converted file")
    verify.add_argument("name", nargs="?", default=None, help="a known model name (default: the default model)")


def doctor_command(args: argparse.Namespace) -> int:
    """Load the model, run the self-check afresh (and remember its verdict), measure a few forwards."""
    import torch

    from specedit.engine.backends.local import load_target
    from specedit.engine.model import exactness
    from specedit.engine.model.loading import forward_costs
    from specedit.engine.store.store import verdicts_dir

    with fetch_progress() as progress:
        loaded = load_target(engine_options(args), progress=progress, remembered=False)
    assert loaded.exactness is not None
    exactness.remember(loaded, verdicts_dir())
    costs = forward_costs(loaded, sizes=(1, 8, 32))
    verdict = loaded.exactness
    if args.json:
        print(json.dumps({"model": loaded.name, "exactness": verdict.to_dict(), "forward_seconds": costs}, indent=2))
        return 0
    print(f"cpu: {exactness.cpu_description()}")
    print(f"torch {torch.__version__}; kernels {verdict.kernels}; {verdict.threads} threads")
    print(f"model: {loaded.name} ({verdict.dtype}, {verdict.linear} linear, on {verdict.device})")
    print(f"speculation: {verdict.describe()}; self-check {verdict.probe_seconds:.1f} s")
    print("one forward after 100 tokens: " + ", ".join(f"{k} tokens {s * 1000:.0f} ms" for k, s in costs.items()))
    return 0


def model_command(args: argparse.Namespace) -> int:
    import time

    from specedit.engine.store.fetch import ensure_model
    from specedit.engine.store.store import (
        DEFAULT_MODEL,
        KNOWN_MODELS,
        kept_dir,
        list_cached,
        verify_kept,
        verify_model,
    )

    if args.model_command in ("fetch", "verify"):
        spec = KNOWN_MODELS.get(args.name) if args.name else DEFAULT_MODEL
        if spec is None:
            raise InputError(f"unknown model {args.name!r}; known: {', '.join(KNOWN_MODELS)}")
        if args.model_command == "verify":
            started = time.monotonic()
            checked, kept = verify_model(spec), verify_kept()
            size = sum(path.stat().st_size for path in (*checked, *kept)) / 1e9
            seconds = time.monotonic() - started
            print(
                f"{spec.name}: {len(checked)} files, and {len(kept)} that loads keep ({size:.2f} GB), hashed again"
                f" in {seconds:.1f} s: as verified"
            )
            return 0
        with fetch_progress(always=True) as progress:
            path = ensure_model(spec, progress=progress)
        print(path)
        return 0
    cached_models = list_cached()
    if not cached_models:
        print(f"no models cached yet; `specedit model fetch` provisions {DEFAULT_MODEL.name}", file=sys.stderr)
    for cached in cached_models:
        state = f"converted ({cached.dtype})" if cached.converted else "not converted"
        print(f"{cached.name}  {cached.size_bytes / 1e9:.2f} GB  {state}")
        print(f"  sha256 {cached.source_sha256 or 'unknown'} (at fetch; `specedit model verify` hashes it again)")
        print(f"  {cached.converted_path or cached.path}")
    kept = [path for path in kept_dir().glob("*") if path.is_file()]
    if kept:
        size = sum(path.stat().st_size for path in kept) / 1e9
        print(f"kept by loads (tokenizers, int8 weights; derived again if removed): {size:.2f} GB")
        print(f"  {kept_dir()}")
    return 0


class fetch_progress:
    """A rich progress bar on stderr for provisioning stages (only on a terminal, unless `always`)."""

    def __init__(self, *, always: bool = False) -> None:
        self._enabled = sys.stderr.isatty() or always
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressCallback | None:
        if not self._enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=not sys.stderr.isatty(),
        )
        self._progress.__enter__()
        return self.update

    def update(self, stage: str, done: int, total: int | None) -> None:
        assert self._progress is not None, "handed out by __enter__, once the bar is drawn"
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(stage, total=total)
        self._progress.update(self._tasks[stage], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
