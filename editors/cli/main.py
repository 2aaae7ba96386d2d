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
from typing import Any

from specedit.cli.bench_command import add_bench_parsers, bench_command, calibrate_command
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
from specedit.cli.model_command import add_model_parsers, doctor_command, model_command
from specedit.cli.progress import Provisioning, RewriteProgress
from specedit.cli.serve_command import add_serve_parser, serve_command
from specedit.cli.usage import UsageError, add_model_arguments, engine_options
from specedit.engine.backends.config import INPROCESS
from specedit.engine.records.errors import FileChangedError, SpeceditError
from specedit.engine.records.events import Event, Text
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import DRAFT_METHODS, MERGE_METHODS
from specedit.engine.sketch.patches import SKETCH_FORMATS
from specedit.lsp.command import add_lsp_parser, lsp_command

log = logging.getLogger("specedit")
STARTED = time.monotonic()  # the command's start, for the time to its first text (`--stats`)

EXIT_INTERRUPTED = 130


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

    add_bench_parsers(commands)
    add_serve_parser(commands)
    add_cluster_parser(commands)
    add_lsp_parser(commands)
    add_model_parsers(commands)
    return parser


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
    from specedit.engine.backends.remote import running_daemon
    from specedit.engine.records.prompts import language_for_path
    from specedit.engine.records.requests import RewriteRequest, SamplingConfig
    from specedit.engine.session.session import Session, local_session, remote_session

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
        session = local_session(dataclasses.replace(options, prefix_cache_mb=0), progress=provisioning, one_off=True)
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
            path=source.name if source.name != STDIN else None,  # a chat answer's code for another file is refused
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
            {"path": source.name, "finish_reason": result.finish_reason, **result.stats.to_dict(), **timing, **engine}
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
    payload: dict[str, Any] | list[dict[str, Any]] = stats[0] if len(stats) == 1 else stats
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
