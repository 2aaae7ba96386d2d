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
    doctor.add_argument(
        "--json", action="store_true", help="print the verdict, the forward costs, the peak and its shares as JSON"
    )

    model = commands.add_parser("model", help="provision and list the embedded models")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fetch = model_commands.add_parser("fetch", help="download, verify and convert a model into the cache")
    fetch.add_argument("name", nargs="?", default=None, help="a known model name (default: the default model)")
    model_commands.add_parser("list", help="show the cached models, with sizes and hashes")
    verify = model_commands.add_parser("verify", help="hash a cached model again: the GGUF and every converted file")
    verify.add_argument("name", nargs="?", default=None, help="a known model name (default: the default model)")


# What `doctor` measures of the phases: a prefill of a short file's prompt, a verification of a long draft.
PREFILL_TOKENS, VERIFIED_ROWS = 256, 32


def doctor_command(args: argparse.Namespace) -> int:
    """Load the model, run the self-check afresh (and remember its verdict), measure a few forwards, and
    what prefill and verification reach beside the machine's integer peak."""
    import torch

    from specedit.engine.backends.local import load_target
    from specedit.engine.model import exactness
    from specedit.engine.model.loading import forward_costs
    from specedit.engine.model.peak import Peak, forward_ops, integer_peak, phase_rate
    from specedit.engine.store.store import verdicts_dir

    with fetch_progress() as progress:
        loaded = load_target(engine_options(args), progress=progress, remembered=False)
    assert loaded.exactness is not None
    exactness.remember(loaded, verdicts_dir())
    costs = forward_costs(loaded, sizes=(1, 8, VERIFIED_ROWS))
    prefill = forward_costs(loaded, sizes=(PREFILL_TOKENS,), context=0, logits_to_keep=1)[PREFILL_TOKENS]
    ops = forward_ops(loaded.model)
    found = integer_peak(loaded.get_threads())
    peak = found if isinstance(found, Peak) else None
    prefill_ceiling = peak.ceiling(ops.layers) if peak else None
    verify_ceiling = peak.ceiling(ops.verified_row_products()) if peak else None
    phases = {
        "prefill": {
            **phase_rate(PREFILL_TOKENS, ops.per_prompt_token, prefill, prefill_ceiling), "context": 0,
            "ceiling_gops": round(prefill_ceiling, 1) if prefill_ceiling else None,
        },
        "verification": {
            **phase_rate(VERIFIED_ROWS, ops.per_verified_row, costs[VERIFIED_ROWS], verify_ceiling), "context": 100,
            "ceiling_gops": round(verify_ceiling, 1) if verify_ceiling else None,
        },
    }  # fmt: skip
    verdict = loaded.exactness
    if args.json:
        report: dict[str, object] = {
            "model": loaded.name,
            "exactness": verdict.to_dict(),
            "forward_seconds": costs,
            "integer_peak": peak.to_dict() if peak else None,
            "forward_ops": ops.to_dict(),
            "phases": phases,
        }
        if peak is None:
            report["integer_peak_unavailable"] = found
        print(json.dumps(report, indent=2))
        return 0
    print(f"cpu: {exactness.cpu_description()}")
    print(f"torch {torch.__version__}; kernels {verdict.kernels}; {verdict.threads} threads")
    print(f"model: {loaded.name} ({verdict.dtype}, {verdict.linear} linear, on {verdict.device})")
    print(f"speculation: {verdict.describe()}; self-check {verdict.probe_seconds:.1f} s")
    print("one forward after 100 tokens: " + ", ".join(f"{k} tokens {s * 1000:.0f} ms" for k, s in costs.items()))
    if peak is None:
        print(f"integer peak: not measured ({found})")
    else:
        narrow = f"; 4- and 5-bit levels on vpmaddubsw: {peak.narrow_gops:.0f}" if peak.narrow_gops != peak.gops else ""
        print(f"integer peak: {peak.gops:.0f} GOPS on {peak.threads} threads ({peak.instructions}{narrow})")
    print(
        f"products: {ops.per_prompt_token:.3g} GOP a prompt token, {ops.per_verified_row:.3g} GOP a verified row"
        f" (attention apart: {ops.attention_per_position * 1e9:,.0f} ops a row per position before it)"
    )
    for name, what in (("prefill", f"of {PREFILL_TOKENS} tokens"), ("verification", f"of {VERIFIED_ROWS} rows")):
        phase = phases[name]
        seconds, gops, part = phase["seconds"], phase["gops"], phase["share"]
        line = f"{name} {what}: {float(seconds or 0) * 1000:.0f} ms, {float(gops or 0):.3g} GOPS"
        if part is not None:
            ceiling = phase["ceiling_gops"]
            mixed = f" (its weights' peak: {ceiling} GOPS)" if peak and ceiling != round(peak.gops, 1) else ""
            line += f", {float(part):.0%} of the peak{mixed}"
        print(line)
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
