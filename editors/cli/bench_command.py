"""`specedit bench`: specedit against plain decoding and prompt lookup, side by side, on a file of cases
(and how edit sketches merge, `--merges-only` without a model); `specedit calibrate`: the layers the
target drafts with."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specedit.cli.files import read_source, write_atomically
from specedit.cli.model_command import fetch_progress
from specedit.cli.progress import LoadingLine
from specedit.cli.usage import UsageError, add_model_arguments, engine_options
from specedit.engine.records.errors import InputError
from specedit.engine.records.options import EngineOptions

if TYPE_CHECKING:
    from specedit.engine.backends.local import LocalBackend
    from specedit.engine.doors.bench.bench import BenchCase


def add_bench_parsers(commands: Any) -> None:
    """Add `bench` and `calibrate` to the `specedit` subcommands."""
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
        "server: plain and each n-gram speculation type), openai-prediction (through the HTTP door, OpenAI's API, "
        "with the original as the prediction)",
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


def bench_command(args: argparse.Namespace) -> int:
    from specedit.engine.doors.bench.bench import METHODS, load_cases, run_bench
    from specedit.engine.doors.bench.summary import gops_line

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
        slower = summary["slower_than_llama_server_cases"]
        if slower:
            print("slower than llama-server on: " + ", ".join(f"{case} {ratio}x" for case, ratio in slower.items()))
        if summary["speedup_vs_llama_server_exact"] is not None:
            print(
                "specedit over llama-server's best type that answered as its own plain decoding (median / "
                f"geometric mean): {summary['speedup_vs_llama_server_exact']}x / "
                f"{summary['speedup_vs_llama_server_exact_geomean']}x; slower on "
                f"{summary['slower_than_llama_server_exact']}"
            )
    if "http_door" in summary:
        door = summary["http_door"]
        print(
            f"openai-prediction (the HTTP door) beside specedit: {door['wall_ratio_median']}x its time (median), "
            f"{door['added_seconds_median']} s more a request, {door['added_ms_per_token_median']} ms a token; "
            f"prediction tokens accepted {door['accepted_prediction_tokens']}, rejected "
            f"{door['rejected_prediction_tokens']}"
            + (
                f"; over llama-server's best type: {summary['openai_prediction_vs_llama_server']}x (median)"
                if "openai_prediction_vs_llama_server" in summary
                else ""
            )
        )
    print(
        "identical to plain: "
        + ", ".join(f"{m} {v:.0%}" for m, v in summary["identical_rate"].items() if v is not None)
    )
    print("CPU seconds per token: " + ", ".join(f"{m} {v}" for m, v in summary["cpu_seconds_per_token"].items()))
    if (rates := gops_line(summary)) is not None:
        print(rates)
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


def merges_only(cases: list[BenchCase], json_path: Path | None) -> int:
    """`bench --merges-only`: each sketch case merged by its lines, no model: the verdict, per case."""
    from specedit.engine.doors.bench.bench import merge_record, summarise_merges

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
    """The sketch cases' merges, per answer (see `doors.bench.bench.summarise_merges`)."""
    print(f"sketches: {merges['cases']}, merged by their lines: {merges['resolved_by_lines']}")
    for name, figures in merges.items():
        if isinstance(figures, dict) and "exact" in figures:
            print(
                f"  {name:<16} answered {figures['answered']:>3}: exact {figures['exact']}, whitespace only "
                f"{figures['whitespace_only']}, caught by the checks {figures['caught']}, wrong and let through "
                f"{figures['let_through']} ({figures['let_through_losing_code']} of them losing code the edit kept), "
                f"writing prose or fence lines {figures.get('writes_answer_lines', 0)}; "
                f"median {figures['median_seconds']} s"
            )
    if "specedit_on_resolved" in merges:
        resolved = merges["specedit_on_resolved"]
        print(
            f"  the model verifying the lines' merge (specedit): {resolved['tokens_per_forward']} tokens per forward, "
            f"{resolved['tokens_per_second']} tokens/s (medians)"
        )


def calibrate_command(args: argparse.Namespace) -> int:
    import specedit.drafters
    import specedit.engine
    from specedit.drafters.fallback import calibration_path
    from specedit.engine.doors.bench.calibrate import calibrate, calibration_record
    from specedit.engine.model.model_thread import on_model_thread

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
        candidates = on_model_thread(
            lambda: calibrate(
                target, sample_ids, p_min=options.p_min, on_progress=lambda line: print(line, file=sys.stderr)
            )
        )  # where the model loaded: its costs are those a rewrite pays
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


def load_local(options: EngineOptions) -> LocalBackend:
    """The model in this process, loaded now, for the commands that use the engine itself (bench,
    calibrate); provisioning shows a progress bar on a terminal."""
    from specedit.engine.backends.local import LocalBackend
    from specedit.engine.store.fetch import resolve_model

    with fetch_progress() as progress:  # fetched now, with a bar; `load` then finds them
        resolve_model(options.model, progress=progress)
        if options.draft_model:
            resolve_model(options.draft_model, progress=progress)
    backend = LocalBackend(options)
    with LoadingLine("specedit"):
        backend.load()
    return backend


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
