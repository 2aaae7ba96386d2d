"""`specedit`: rewrite files with a language model, fast, from the command line.

Errors map to exit codes here, in one place: each `SpeceditError` carries its code (see engine.errors);
usage errors exit 2, Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specedit.cli.cluster_command import add_cluster_parser, cluster_command
from specedit.cli.files import (
    STDIN,
    Region,
    SourceText,
    keep_beside,
    parse_lines,
    read_source,
    replace_checked,
    select_lines,
    write_atomically,
)
from specedit.cli.progress import LoadingLine, Provisioning, RewriteProgress
from specedit.cli.serve_command import add_serve_parser, serve_command
from specedit.engine.errors import FileChangedError, InputError, SpeceditError
from specedit.engine.events import Event, Text
from specedit.engine.options import EngineOptions, add_engine_arguments
from specedit.engine.patches import SKETCH_FORMATS
from specedit.engine.requests import DRAFT_METHODS, MERGE_METHODS
from specedit.engine.serving.config import INPROCESS
from specedit.lsp.command import add_lsp_parser, lsp_command

if TYPE_CHECKING:
    from specedit.engine.serving.local import LocalBackend

log = logging.getLogger("specedit")
STARTED = time.monotonic()  # the command's start, for the time to its first text (`--stats`)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(SpeceditError):
    exit_code = EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specedit", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (to stderr)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rewrite = commands.add_parser("rewrite", help="rewrite files as instructed, streaming the result")
    rewrite.add_argument("paths", nargs="+", metavar="PATH", help="files to rewrite; - reads standard input")
    what = rewrite.add_mutually_exclusive_group(required=True)
    what.add_argument("-i", "--instruction", help="what to change, in plain language")
    what.add_argument(
        "--sketch",
        metavar="FILE",
        help="an edit to merge, as a chat model writes it: a sketch with '... existing code ...' elisions, a "
        "unified diff, SEARCH/REPLACE blocks or a V4A patch",
    )
    rewrite.add_argument(
        "--sketch-format",
        default="auto",
        choices=SKETCH_FORMATS,
        help="how the --sketch is written (default auto: found in its text): lazy (elided with comments), udiff, "
        "search-replace (aider's blocks), v4a (OpenAI's apply_patch)",
    )
    rewrite.add_argument(
        "--merge",
        default="auto",
        choices=MERGE_METHODS,
        help="how a --sketch is merged. auto (default): by its lines where every part of it says where it goes "
        "(milliseconds, no model), else by the model; model: by the model always",
    )
    rewrite.add_argument("--language", help="the code's language, for the prompt (default: from the file name)")
    rewrite.add_argument(
        "--lines", metavar="A:B", help="rewrite only lines A to B (1-based, inclusive); the rest stays byte for byte"
    )
    add_model_arguments(rewrite)
    rewrite.add_argument(
        "--draft",
        default="auto",
        metavar="METHOD",
        help="auto (default): copy from the original, then the context lookup, then the fallback (a draft "
        "model or layer skip) where the copy has nothing; copy: the copy alone; fallback: the fallback alone; "
        "none: plain decoding (the output is the same)",
    )
    rewrite.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily")
    rewrite.add_argument("--top-p", type=float, default=1.0)
    rewrite.add_argument("--seed", type=int, default=0)
    rewrite.add_argument(
        "--max-new-tokens", type=int, help="output budget (default: twice the region, within the context)"
    )
    where = rewrite.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE (atomically)")
    where.add_argument("--in-place", action="store_true", help="replace each file atomically, keeping PATH.orig")
    where.add_argument("--diff", action="store_true", help="print a unified diff instead of the new text")
    rewrite.add_argument("--no-backup", action="store_true", help="with --in-place: keep no PATH.orig")
    rewrite.add_argument(
        "--allow-empty",
        action="store_true",
        help="write an empty answer for code that has some (else it is refused, exit 12: a model that ends at once "
        "would empty the file)",
    )
    rewrite.add_argument("--stats", metavar="FILE.json", help="write the generation stats as JSON")
    rewrite.add_argument(
        "--engine",
        metavar="ADDR",
        help="use the engine at ADDR: a daemon's (socket path or tcp://HOST:PORT) or a cluster's "
        "(http(s)://HOST:PORT); 'inprocess': load the model here. Default: the shared daemon if one runs with "
        "these engine flags (an editor's, `specedit serve`'s), else in process",
    )
    rewrite.add_argument("--engine-token-file", metavar="FILE", help="the token file of a TCP daemon or a cluster")
    rewrite.add_argument("--no-progress", action="store_true", help="no live status line on stderr")

    bench = commands.add_parser("bench", help="compare specedit with plain decoding and prompt lookup, side by side")
    bench.add_argument(
        "--cases",
        required=True,
        type=Path,
        help="a JSONL file of edits (id, language, instruction, before), or of edit sketches (id, language, "
        "sketch, before, after: scripts/sketch_cases.py), whose merges are reported too",
    )
    bench.add_argument("--limit", type=int, help="run only the first N cases")
    bench.add_argument("--max-chars", type=int, help="skip cases whose `before` has this many characters or more")
    bench.add_argument("--max-new-tokens", type=int, help="output budget per case (default: twice the original)")
    bench.add_argument(
        "--methods",
        default="plain,plain-stock,prompt-lookup,specedit",
        help="comma-separated: plain (on the self-checked kernels), plain-stock (on transformers' own), "
        "prompt-lookup, specedit (the default chain), specedit-copy (the copy drafter alone), "
        "specedit-fallback (the fallback alone), llama-cpp (llama-cpp-python), llama-server (llama.cpp's "
        "server: plain and each n-gram speculation type)",
    )
    bench.add_argument(
        "--llama-server",
        metavar="PATH",
        help="the llama-server binary (default: $SPECEDIT_LLAMA_SERVER, build/llama-server/bin/llama-server as "
        "scripts/build_llama_server.sh leaves it, or the PATH's)",
    )
    bench.add_argument(
        "--prompt-lookup-tokens",
        type=int,
        default=32,
        help="transformers' prompt_lookup_num_tokens (default 32, its best here)",
    )
    bench.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy processes (one core each) beside the bench, for every method alike: a busy machine",
    )
    bench.add_argument(
        "--merges-only",
        action="store_true",
        help="sketch cases only: how their lines merge them (exact, whitespace only, left to the model, wrong), "
        "without loading a model",
    )
    bench.add_argument("--json", type=Path, help="write every figure as JSON")
    add_model_arguments(bench)

    calibrate = commands.add_parser(
        "calibrate",
        help="choose the layers the target drafts with (--draft layers:auto) and save them next to the model",
    )
    calibrate.add_argument(
        "--sample", nargs="+", type=Path, metavar="FILE", help="text to measure on (default: specedit's own source)"
    )
    calibrate.add_argument("--tokens", type=int, default=512, help="sample length in tokens (default: %(default)s)")
    add_model_arguments(calibrate)

    add_serve_parser(commands)
    add_cluster_parser(commands)
    add_lsp_parser(commands)

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
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser.add_argument_group("engine"))


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine the flags describe; a bad combination is a usage error (exit 2), before anything loads."""
    try:
        return EngineOptions.from_args(args)
    except ValueError as error:
        raise UsageError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * args.verbose, stream=sys.stderr, format="specedit: %(levelname)s: %(message)s"
    )
    # transformers draws its own progress bars while loading weights; ours say more, and only on a terminal.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        if args.command == "rewrite":
            return rewrite_command(args)
        if args.command == "model":
            return model_command(args)
        if args.command == "bench":
            return bench_command(args)
        if args.command == "calibrate":
            return calibrate_command(args)
        if args.command == "serve":
            return serve_command(args)
        if args.command == "cluster":
            return cluster_command(args)
        if args.command == "lsp":
            return lsp_command(args)
        if args.command == "doctor":
            return doctor_command(args)
        raise UsageError(f"unknown command {args.command!r}")
    except SpeceditError as error:
        print(f"specedit: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("specedit: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0  # the reader went away (e.g. `| head`): not an error of ours


# ------------------------------------------------------------------------------------------- rewrite


def rewrite_command(args: argparse.Namespace) -> int:
    from specedit.engine.prompts import language_for_path
    from specedit.engine.requests import RewriteRequest, SamplingConfig
    from specedit.engine.serving.remote import running_daemon
    from specedit.engine.session import Session, local_session, remote_session

    if args.output and len(args.paths) > 1:
        raise UsageError("--output takes one input file; use --in-place for several")
    if (args.in_place or args.output) and STDIN in args.paths and args.in_place:
        raise UsageError("--in-place cannot rewrite standard input")
    if args.no_backup and not args.in_place:
        raise UsageError("--no-backup only goes with --in-place")
    try:
        sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    except ValueError as error:
        raise UsageError(str(error)) from None
    options = engine_options(args)  # bad engine flags fail before anything is read or loaded
    if args.draft not in DRAFT_METHODS:
        raise UsageError(f"--draft must be one of {', '.join(DRAFT_METHODS)}, got {args.draft!r}")
    lines = parse_lines(args.lines) if args.lines else None
    sketch = read_source(args.sketch).text if args.sketch else None

    # Read and check every input before loading the model: a bad path fails in milliseconds.
    jobs: list[tuple[SourceText, Region]] = []
    for name in args.paths:
        source = read_source(name)
        region = select_lines(source.text, *lines) if lines else Region("", source.text, "")
        jobs.append((source, region))

    session: Session
    provisioning = Provisioning()
    running = None if args.engine else running_daemon(options)
    if running is not None:  # the model is loaded already: no start-up to wait for
        log.info("using the engine daemon at %s (--engine inprocess: load the model here instead)", running)
        session = remote_session(running, client_name="specedit rewrite")
    elif args.engine and args.engine != INPROCESS:
        cluster = args.engine.startswith(("http://", "https://"))  # its --model chooses among its models
        if (dataclasses.replace(options, model=None) if cluster else options) != EngineOptions():
            flags = "--draft-model, ..." if cluster else "--model, --draft-model, ..."
            log.warning("the engine flags (%s) are ignored with --engine: it serves its own", flags)
        session = remote_session(
            args.engine, token_file=args.engine_token_file, spawn=options, client_name="specedit rewrite"
        )
    else:
        # One process, one pass over the files: no prompt is kept for a later request (the start they all
        # share is: `keep_prompt_head`). The model is fetched and loaded only when a rewrite needs it (a
        # sketch its lines merge needs none), its progress on the status line.
        session = local_session(dataclasses.replace(options, prefix_cache_mb=0), progress=provisioning)
    all_stats: list[dict[str, Any]] = []
    results: list[tuple[SourceText, str]] = []
    stream_to_stdout = not (args.in_place or args.output or args.diff)
    for source, region in jobs:
        request = RewriteRequest(
            original=region.region,
            instruction=args.instruction,
            sketch=sketch,
            language=args.language or language_for_path(source.name if source.name != STDIN else None),
            draft=args.draft,
            sampling=sampling,
            max_new_tokens=args.max_new_tokens,
            merge=args.merge,
            sketch_format=args.sketch_format,
            allow_empty=args.allow_empty,
        )
        if stream_to_stdout and len(jobs) > 1:
            write_stdout(f"==> {source.name} <==\n")
        if stream_to_stdout:
            write_stdout(region.before)
        log.info("rewriting %s (%d characters)", source.name, len(region.region))
        # Text streamed to a terminal is its own progress: a status line would be drawn over it.
        quiet = args.no_progress or (stream_to_stdout and sys.stdout.isatty())
        on_text = FirstText(write_stdout if stream_to_stdout else None)
        with RewriteProgress(Path(source.name).name, enabled=False if quiet else None) as progress:
            provisioning.line = progress
            result = session.run(request, shown_by(progress.show, on_text.show))
        if stream_to_stdout:
            write_stdout(region.after)
        timing = {"first_text_from_start_seconds": round(on_text.at - STARTED, 3)} if on_text.at else {}
        engine = {"engine": f"daemon at {running}" if running else args.engine or INPROCESS}
        all_stats.append(
            {"path": source.name, "finish_reason": result.finish_reason, **result.stats, **timing, **engine}
        )
        if (error := result.error()) is not None:  # an answer not to write (the session judged it)
            if args.stats:  # what the failed rewrite cost is still reported
                write_stats(args.stats, all_stats)
            raise type(error)(f"{source.name}: {error}")
        new_text = region.before + result.text + region.after
        if new_text == source.text and not args.in_place:  # (--in-place says it when it writes nothing)
            print(f"specedit: {source.name}: no changes", file=sys.stderr)
        elif args.diff:
            print_diff(source.name, source.text, new_text)
        results.append((source, new_text))
    if args.stats:
        write_stats(args.stats, all_stats)
    # Every rewrite finished: only now is anything written (a failure above wrote nothing).
    if args.output:
        write_atomically(Path(args.output), results[0][1])
        print(f"specedit: wrote {args.output}", file=sys.stderr)
    elif args.in_place:
        write_in_place(results, backup_suffix=None if args.no_backup else ".orig")
    return 0


def write_in_place(results: list[tuple[SourceText, str]], *, backup_suffix: str | None) -> None:
    """Replace each file with its rewrite, if none changed since it was read (else none is replaced, and
    the results of those that changed are kept beside them); a failure says which were written before."""
    changed = [source for source, _ in results if _current_bytes(source.name) != source.data]
    if changed:
        kept = "; ".join(keep_beside(Path(source.name), text) for source, text in results if source in changed)
        names = ", ".join(source.name for source in changed)
        raise FileChangedError(f"{names} changed while being rewritten: no file was replaced; {kept}")
    written: list[str] = []
    for source, text in results:
        if text == source.text:
            print(f"specedit: {source.name}: no changes; not written", file=sys.stderr)
            continue
        try:
            replace_checked(Path(source.name), source.data, text, backup_suffix=backup_suffix)
        except SpeceditError as error:
            if written:
                error.args = (f"{error} (already replaced: {', '.join(written)})",)
            raise
        written.append(source.name)
        backup = f" (the original is in {source.name}{backup_suffix})" if backup_suffix else ""
        print(f"specedit: {source.name}: rewritten{backup}", file=sys.stderr)


def _current_bytes(name: str) -> bytes | None:
    try:
        return Path(name).read_bytes()
    except OSError:
        return None


def load_local(options: EngineOptions) -> LocalBackend:
    """The model in this process, loaded now, for the commands that use the engine itself (bench,
    calibrate); provisioning shows a progress bar on a terminal."""
    from specedit.engine.model.fetch import resolve_model
    from specedit.engine.serving.local import LocalBackend

    with fetch_progress() as progress:  # fetched now, with a bar; `load` then finds them
        resolve_model(options.model, progress=progress)
        if options.draft_model:
            resolve_model(options.draft_model, progress=progress)
    backend = LocalBackend(options)
    with LoadingLine("specedit"):
        backend.load()
    return backend


class FirstText:
    """Passes each text on, and notes when the first comes (`at`, monotonic)."""

    def __init__(self, then: Callable[[str], None] | None) -> None:
        self.then = then
        self.at: float | None = None

    def show(self, event: Event) -> None:
        if not isinstance(event, Text):
            return
        if self.at is None:
            self.at = time.monotonic()
        if self.then is not None:
            self.then(event.delta)


def shown_by(*hosts: Callable[[Event], None]) -> Callable[[Event], None]:
    """One event callback that shows each event to every one of `hosts`."""

    def show(event: Event) -> None:
        for host in hosts:
            host(event)

    return show


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def write_stats(path: str, stats: list[dict[str, Any]]) -> None:
    payload: Any = stats[0] if len(stats) == 1 else stats
    write_atomically(Path(path), json.dumps(payload, indent=2) + "\n")


def print_diff(name: str, before: str, after: str) -> None:
    label = name if name != STDIN else "stdin"
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{label}", f"b/{label}"
    )
    colour = sys.stdout.isatty()
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        if colour:
            code = (
                "1"
                if line.startswith(("---", "+++"))
                else "36"
                if line.startswith("@@")
                else "32"
                if line.startswith("+")
                else "31"
                if line.startswith("-")
                else ""
            )
            line = f"\x1b[{code}m{line.rstrip(chr(10))}\x1b[0m\n" if code else line
        sys.stdout.write(line)
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------- bench


def bench_command(args: argparse.Namespace) -> int:
    from specedit.engine.ops.bench import METHODS, load_cases, run_bench

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if not args.cases.is_file():
        raise InputError(f"{args.cases}: no such file")
    cases = load_cases(args.cases, limit=args.limit, max_chars=args.max_chars)
    if args.merges_only:
        return merges_only(cases, args.json)
    if args.background_load < 0:
        raise UsageError("--background-load takes a number of processes, 0 or more")
    # Every method prefills its whole prompt, as llama-server does without its prompt cache: a cache kept
    # from the method before, or the prompts' shared start kept from an earlier start, would be a head start.
    backend = load_local(engine_options(args))
    engine = backend.load()
    engine.prefix_cache = None
    print(
        f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {len(cases)} cases; "
        f"model {engine.loaded.name} ({engine.loaded.dtype}, {engine.device}, {torch_threads()} threads)"
    )
    if engine.loaded.exactness is not None:
        print(f"speculation: {engine.loaded.exactness.describe()}")
    columns = ("case", 32), ("method", 16), ("tokens", -6), ("wall s", -8), ("cpu s", -8), ("tok/s", -7), ("fwd", -5)
    header = " ".join(f"{name:<{width}}" if width > 0 else f"{name:>{-width}}" for name, width in columns)
    header += f" {'acc':>6} identical"
    print(header)
    print("-" * len(header))

    def on_case(record: dict[str, Any]) -> None:
        for method, run in record["methods"].items():
            acceptance = "" if run["acceptance_rate"] is None else f"{run['acceptance_rate']:.0%}"
            identical = "yes" if run["identical_to_plain"] else f"NO at token {run['first_difference']}"
            print(
                f"{record['id'][:32]:<32} {method:<16} {run['generated_tokens']:>6} {run['wall_seconds']:>8.2f} "
                f"{run['cpu_seconds']:>8.2f} {run['tokens_per_second']:>7.1f} {run['target_forwards']:>5} "
                f"{acceptance:>6} {identical}",
                flush=True,
            )

    if "specedit-fallback" in methods and engine.fallback is None:
        raise UsageError("specedit-fallback needs a fallback: --draft-model MODEL or --draft-layers LIST")
    report = run_bench(
        backend,
        cases,
        methods=methods,
        max_new_tokens=args.max_new_tokens,
        lookup_tokens=args.prompt_lookup_tokens,
        llama_server=args.llama_server,
        background_load=args.background_load,
        on_case=on_case,
    )
    summary = report["summary"]
    print()
    print(
        "speed-up over plain, end to end (median / geometric mean): "
        + ", ".join(
            f"{m} {v}x / {summary['speedup_vs_plain_geomean'][m]}x" for m, v in summary["speedup_vs_plain"].items()
        )
    )
    print(
        "speed-up over plain, decode phase (median): "
        + ", ".join(f"{m} {v}x" for m, v in summary["decode_speedup_vs_plain"].items())
    )
    if any(v is not None for v in summary["speedup_vs_fastest_plain"].values()) and "plain-stock" in methods:
        print(
            "speed-up over the faster of plain and plain-stock, case by case (end to end / decode phase): "
            + ", ".join(
                f"{m} {v}x / {summary['decode_speedup_vs_fastest_plain'][m]}x"
                for m, v in summary["speedup_vs_fastest_plain"].items()
                if m != "plain-stock"
            )
        )
    print(
        "cases slower than plain (slowest ratio): "
        + ", ".join(f"{m} {n} ({summary['slowest_vs_plain'][m]}x)" for m, n in summary["slower_than_plain"].items())
    )
    for variant, ratio in summary.get("speedup_vs_variant", {}).items():
        print(f"specedit over {variant} (median): {ratio}x")
    if "speedup_vs_prompt_lookup" in summary:
        print(f"specedit over prompt-lookup (median): {summary['speedup_vs_prompt_lookup']}x")
    if "speedup_vs_llama_cpp" in summary:
        print(f"specedit over llama.cpp prompt lookup (median): {summary['speedup_vs_llama_cpp']}x")
    if "speedup_vs_llama_server" in summary:
        same = summary["llama_server_same_answer"]
        alike = f"on the {same} it answers as we do: {summary['speedup_vs_llama_server_same_answer']}x; "
        print(
            f"specedit over llama-server's best n-gram type per case (median / geometric mean): "
            f"{summary['speedup_vs_llama_server']}x / {summary['speedup_vs_llama_server_geomean']}x, "
            f"decode phase {summary['decode_speedup_vs_llama_server']}x; slower on "
            f"{summary['slower_than_llama_server']} of {summary['cases']} cases; "
            + (alike if same else "")
            + "best type "
            + ", ".join(f"{t} {n}" for t, n in summary["llama_server_best_type"].items())
        )
    print(
        "identical to plain: "
        + ", ".join(f"{m} {v:.0%}" for m, v in summary["identical_rate"].items() if v is not None)
    )
    print("CPU seconds per token: " + ", ".join(f"{m} {v}" for m, v in summary["cpu_seconds_per_token"].items()))
    if summary["joules_per_token"]:
        print("GPU joules per token: " + ", ".join(f"{m} {v}" for m, v in summary["joules_per_token"].items()))
    if "merges" in summary:
        print_merges(summary["merges"])
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    settings = report["settings"]
    print(
        f"load average after: {load}; busy processes beside it: {settings['background_load']}; "
        f"llama.cpp: {settings['llama_cpp']}; llama-server: {settings['llama_server']}"
    )
    if args.json:
        write_atomically(args.json, json.dumps(report, indent=2) + "\n")
    return 0


def merges_only(cases: list[Any], json_path: Path | None) -> int:
    """`bench --merges-only`: each sketch case merged by its lines, no model: the verdict, per case."""
    from specedit.engine.ops.bench import merge_record, summarise_merges

    sketches = [case for case in cases if case.sketch is not None and case.after is not None]
    if not sketches:
        raise InputError("--merges-only: no sketch cases (id, language, sketch, before, after) in --cases")
    records = []
    for case in sketches:
        merge = merge_record(case, {})
        lines = merge.get("lines")
        if lines is None:
            said = "left to the model: " + "; ".join(merge["unresolved"])
        else:
            said = "exact" if lines["exact"] else "whitespace only" if lines["whitespace_only"] else "wrong"
            said += ", loses code the edit kept" if lines["loses_code"] else ""
        print(f"{case.id[:48]:<48} {said[:160]}", flush=True)
        records.append({"id": case.id, "language": case.language, "methods": {}, "merge": merge})
    merges = summarise_merges(records)
    print_merges(merges)
    if json_path:
        write_atomically(json_path, json.dumps({"summary": {"merges": merges}, "cases": records}, indent=2) + "\n")
    return 0


def print_merges(merges: dict[str, Any]) -> None:
    """The sketch cases' merges, per answer (see `ops.bench.summarise_merges`)."""
    print(f"sketches: {merges['cases']}, merged by their lines: {merges['resolved_by_lines']}")
    for name, figures in merges.items():
        if isinstance(figures, dict) and "exact" in figures:
            print(
                f"  {name:<16} answered {figures['answered']:>3}: exact {figures['exact']}, whitespace only "
                f"{figures['whitespace_only']}, caught by the checks {figures['caught']}, wrong and let through "
                f"{figures['let_through']} ({figures['let_through_losing_code']} of them losing code the edit kept); "
                f"median {figures['median_seconds']} s"
            )
    if "specedit_on_resolved" in merges:
        resolved = merges["specedit_on_resolved"]
        print(
            f"  the model verifying the lines' merge (specedit): {resolved['tokens_per_forward']} tokens per forward, "
            f"{resolved['tokens_per_second']} tokens/s (medians)"
        )


# ----------------------------------------------------------------------------------------- calibrate


def calibrate_command(args: argparse.Namespace) -> int:
    import specedit.drafters
    import specedit.engine
    from specedit.drafters.fallback import calibration_path
    from specedit.engine.ops.calibrate import calibrate, calibration_record

    if args.tokens < 16:
        raise UsageError("--tokens must be at least 16")
    options = engine_options(args)
    if options.has_fallback:
        raise UsageError("calibrate chooses the layers to draft with: --draft-model and --draft-layers do not apply")
    own_source = [Path(package.__file__).parent for package in (specedit.engine, specedit.drafters)]
    paths = args.sample or sorted(path for folder in own_source for path in folder.rglob("*.py"))
    sample = "\n".join(read_source(str(path)).text for path in paths)
    target = load_local(options).load().loaded
    sample_ids = target.tokenizer.encode(sample, add_special_tokens=False)[: args.tokens]
    if len(sample_ids) < 16:
        raise InputError("the sample is too short: give at least 16 tokens of text")
    print(f"calibrating layer skip for {target.name} on {len(sample_ids)} tokens", file=sys.stderr)
    try:
        candidates = calibrate(
            target, sample_ids, p_min=options.p_min, on_progress=lambda line: print(line, file=sys.stderr)
        )
    except ValueError as error:
        raise InputError(str(error)) from None
    best = candidates[0]
    record = calibration_record(target, candidates, sample_tokens=len(sample_ids), p_min=options.p_min)
    path = calibration_path(target.name)
    write_atomically(path, json.dumps(record, indent=2) + "\n")
    print(
        f"layers {best.kept}: agreement {best.acceptance:.0%}, cost {best.cost:.2f} of a full forward, "
        f"expected {best.expected_speedup:.2f}x with {best.draft_length}-token drafts; saved to {path}"
    )
    if best.expected_speedup < 1.0:
        print(
            "specedit: note: layer skip is not expected to pay on this device; the cost governor will "
            "switch it off where it does not",
            file=sys.stderr,
        )
    return 0


# -------------------------------------------------------------------------------------------- doctor


def doctor_command(args: argparse.Namespace) -> int:
    """Load the model, run the self-check afresh (and remember its verdict), measure a few forwards."""
    import torch

    from specedit.engine.model import exactness
    from specedit.engine.model.loading import forward_costs
    from specedit.engine.model.store import verdicts_dir
    from specedit.engine.serving.local import load_target

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


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


# --------------------------------------------------------------------------------------------- model


def model_command(args: argparse.Namespace) -> int:
    import time

    from specedit.engine.model.fetch import ensure_model
    from specedit.engine.model.store import (
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
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Any:
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
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(stage, total=total)
        self._progress.update(self._tasks[stage], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)


def entry() -> None:
    """The `specedit` command: `main`, then its exit status. Interrupted, the process ends at once: an import
    the interrupt cut short (torch's, while the model loads) can leave finalizers that would end it by the
    signal after all (-2, not 130), and every file write has finished or been undone by then (they are
    atomic): there is nothing left to clean."""
    status = main()
    if status == EXIT_INTERRUPTED:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
