"""`specedit bench`: the same model, prompt and greedy decoding under each method, side by side.

Methods:
- `plain`: our loop without a drafter: one target forward per token, with a KV cache, on the kernels the
  self-check chose (`model.exactness`): the arithmetic speculation keeps bit for bit, the reference of
  `identical`;
- `plain-stock`: the same loop on the model as transformers runs it (its attention, ATen's linear
  kernels, one row per step): what a user of transformers would decode at. Where it is faster than `plain`,
  it is the reference of `speedup_vs_fastest_plain` (the summary takes the faster of the two, case by case);
- `prompt-lookup`: transformers' own `generate(prompt_lookup_num_tokens=N)`, the peer a user would pick;
- `specedit`: our loop as configured by default: the copy drafter, then the fallback (a draft model or
  layer skip, when one is configured), under the cost governor;
- `specedit-copy`: the copy drafter alone; `specedit-fallback`: the fallback alone (both governed);
- `llama-cpp`: llama.cpp on the GGUF the default model is assembled from, plain and with its prompt
  lookup (optional: needs `llama-cpp-python`; its output is compared with its own plain decoding);
- `llama-server`: llama.cpp's own server, plain and with each of its n-gram speculation types, the
  fastest type per case reported as `llama-server` (optional: `scripts/build_llama_server.sh`; see
  `llama_server`): the peer as llama.cpp's users speculate.

Our methods run the product's own rewrite path (`loop.rewrite`: the request prepared once, then run with
the method's drafters); the peers get the same prepared prompt and budget, and their answers go through the
same rules (closing fence, line endings, final newline). Every method stops at the closing code fence.
Times are measured in one process, case by case, method after method, so that the ratios are pair by
pair and the machine's load hits all methods alike. `background_load` runs that many busy processes
beside them all (each spins on one core, as a compiler or a browser would): a busy machine, for every
method alike.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from specedit.engine.backends.local import LocalBackend
from specedit.engine.doors.bench.cases import BenchCase
from specedit.engine.doors.bench.cases import load_cases as load_cases  # (the CLI reads it here)
from specedit.engine.doors.bench.in_process import as_transformers_runs_it, run_ours, run_prompt_lookup
from specedit.engine.doors.bench.llama_server import LlamaServerRunner
from specedit.engine.doors.bench.merges import merge_record, summarise_merges
from specedit.engine.doors.bench.method_run import MethodRun
from specedit.engine.doors.bench.openai_door import OpenAIDoor
from specedit.engine.doors.bench.records import CaseRecord
from specedit.engine.doors.bench.summary import first_difference, summarise
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import prepare_rewrite
from specedit.engine.model.model_thread import on_model_thread
from specedit.engine.model.peak import forward_ops, integer_peak
from specedit.engine.records.errors import ContextLengthError
from specedit.engine.records.requests import DraftMethod

if TYPE_CHECKING:
    from specedit.engine.doors.bench.llama_cpp import LlamaCppRunner

log = logging.getLogger(__name__)

METHODS = (
    "plain",
    "plain-stock",
    "prompt-lookup",
    "specedit",
    "specedit-copy",
    "specedit-fallback",
    "llama-cpp",
    "llama-server",
    "openai-prediction",
)
# Our methods, and the draft method each asks the engine for.
DRAFT_OF: dict[str, DraftMethod] = {
    "plain": "none",
    "plain-stock": "none",
    "specedit": "auto",
    "specedit-copy": "copy",
    "specedit-fallback": "fallback",
}
DEFAULT_METHODS = ("plain", "plain-stock", "prompt-lookup", "specedit")


def run_bench(
    backend: LocalBackend,
    cases: list[BenchCase],
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    max_new_tokens: int | None = None,
    lookup_tokens: int = 32,
    llama_server: str | None = None,
    background_load: int = 0,
    on_case: Callable[[CaseRecord], None] | None = None,
) -> dict[str, object]:
    """Every method on every case (`llama_server`: the binary of that method, else where
    `llama_server.find_binary` looks), with `background_load` busy processes beside them."""
    engine = backend.load()
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods: {', '.join(sorted(unknown))}")
    if "specedit-fallback" in methods and engine.fallback is None:
        raise ValueError("specedit-fallback needs a fallback: --draft-model MODEL or --draft layers:LIST")
    ordered = ["plain", *[m for m in methods if m != "plain"]]  # plain is the reference of every pair
    peak = integer_peak_record(engine)  # the machine's, before any busy process starts
    load_before = os.getloadavg()
    llama = None
    if "llama-cpp" in ordered:
        from specedit.engine.doors.bench import llama_cpp

        llama = llama_cpp.LlamaCppRunner.create()
        if llama is None:
            ordered.remove("llama-cpp")
    with ExitStack() as servers:
        servers.enter_context(terminated_as_exit())  # (first: the processes below stop on `kill` too)
        servers.enter_context(busy_processes(background_load))
        server = _start_llama_server(engine, llama_server) if "llama-server" in ordered else None
        if server is not None:
            servers.enter_context(server)
        elif "llama-server" in ordered:
            ordered.remove("llama-server")
        door = servers.enter_context(OpenAIDoor(engine).running()) if "openai-prediction" in ordered else None
        results = _run_cases(engine, cases, ordered, max_new_tokens, lookup_tokens, llama, server, door, on_case)
    present = [m for m in METHODS if any(m in r["methods"] for r in results)]
    present += sorted({m for r in results for m in r["methods"]} - set(present))  # llama-server's each type
    summary = summarise(results, present, load_before, os.getloadavg(), peak)
    if any("merge" in r for r in results):
        summary["merges"] = summarise_merges([r for r in results if "merge" in r])
    return {
        "summary": summary,
        "cases": results,
        "settings": {
            "max_new_tokens": max_new_tokens,
            "prompt_lookup_num_tokens": lookup_tokens,
            "threads": torch.get_num_threads(),
            "background_load": background_load,
            "dtype": engine.loaded.dtype_name,
            "exactness": engine.loaded.exactness.to_dict() if engine.loaded.exactness is not None else None,
            "device": str(engine.device),
            "model": engine.loaded.name,
            "fallback": engine.fallback.describe() if engine.fallback is not None else None,
            "llama_cpp": "ran" if llama is not None else ("not installed" if "llama-cpp" in methods else "not asked"),
            "llama_server": (
                "ran" if "llama-server" in ordered else ("not built" if "llama-server" in methods else "not asked")
            ),
        },
    }


def integer_peak_record(engine: Engine) -> dict[str, Any] | None:
    """The machine's integer peak on the engine's threads (`model.peak`), with the model's ceiling for each
    phase: the peak for its prefill's products and for its verified rows', by their weights' bits. None
    where the peak's loop cannot run here (logged)."""
    loaded = engine.torch_target
    found = integer_peak(loaded.get_threads())
    if isinstance(found, str):
        log.warning("no integer peak: %s", found)
        return None
    ops = forward_ops(loaded.model)
    ceilings = {"prefill": found.ceiling(ops.layers), "decode": found.ceiling(ops.verified_row_products())}
    return {
        **found.to_dict(),
        **{f"{phase}_ceiling_gops": round(c, 1) if c else None for phase, c in ceilings.items()},
        "forward_ops": ops.to_dict(),
    }


@contextmanager
def terminated_as_exit() -> Iterator[None]:
    """While inside, SIGTERM (`kill`, a CI's timeout) ends the bench through the `finally`s of what it
    started after entering this (without it Python exits at once and leaves its llama-servers and busy
    processes running), then the process at once, exit status 143: the model thread may still be inside a
    forward, which the interpreter's shutdown would abort (SIGABRT). Only where signals can be handled
    (the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_(signum: int, _: FrameType | None) -> None:
        raise _Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    except _Terminated as terminated:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(terminated.code or 1))
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Terminated(SystemExit):
    """SIGTERM, raised where the main thread is (`terminated_as_exit`)."""


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes spinning (one core each) while inside: a machine busy with something else."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def _start_llama_server(engine: Engine, given: str | None) -> LlamaServerRunner | None:
    """llama-server's processes for the bench's model, or None (a warning) when there is no llama-server."""
    from specedit.engine.doors.bench import llama_server  # its find_binary, as tests replace it
    from specedit.engine.store.fetch import ensure_gguf
    from specedit.engine.store.store import DEFAULT_MODEL, KNOWN_MODELS, converted_path

    binary = llama_server.find_binary(given)
    if binary is None:
        log.warning("no llama-server (scripts/build_llama_server.sh builds one): the bench runs without it")
        return None
    name = engine.loaded.name  # a known model's name, or the folder it was converted to
    spec = next((s for s in KNOWN_MODELS.values() if name in (s.name, str(converted_path(s)))), None)
    if spec is None:
        spec = DEFAULT_MODEL
        log.warning("llama-server runs %s: %s has no GGUF here", spec.name, name)
    log.info("llama-server: %s", binary)
    return LlamaServerRunner.create(binary, ensure_gguf(spec), threads=torch.get_num_threads())


def _run_cases(
    engine: Engine,
    cases: list[BenchCase],
    ordered: list[str],
    max_new_tokens: int | None,
    lookup_tokens: int,
    llama: LlamaCppRunner | None,
    server: LlamaServerRunner | None,
    door: OpenAIDoor | None,
    on_case: Callable[[CaseRecord], None] | None,
) -> list[CaseRecord]:
    results: list[CaseRecord] = []
    for case in cases:
        request = case.request(max_new_tokens)
        try:
            prepared = prepare_rewrite(engine, request)
        except ContextLengthError as error:
            log.warning("%s: skipped: %s", case.id, error)
            continue
        runs: dict[str, MethodRun] = {}
        for method in ordered:
            # Our methods run where the product runs the model (`model_thread`; the door's requests go there).
            if method == "plain-stock":
                with as_transformers_runs_it(engine):
                    runs[method] = on_model_thread(partial(run_ours, engine, prepared, draft="none"))
            elif method in DRAFT_OF:
                runs[method] = on_model_thread(partial(run_ours, engine, prepared, draft=DRAFT_OF[method]))
            elif method == "prompt-lookup":
                runs[method] = on_model_thread(partial(run_prompt_lookup, engine, prepared, lookup_tokens))
            elif method == "llama-cpp" and llama is not None:
                runs.update(llama.run(prepared))
            elif method == "llama-server" and server is not None:
                runs.update(server.run(prepared))
            elif method == "openai-prediction" and door is not None:
                runs[method] = door.run(prepared)
        for method, run in runs.items():
            # llama.cpp is compared with its own plain decoding: same weights, different arithmetic.
            peer = next((p for p in ("llama-cpp", "llama-server") if method.startswith(p)), None)
            reference = runs[f"{peer}-plain"] if peer else runs["plain"]
            run.identical_to_plain = run.text == reference.text
            run.first_difference = first_difference(run.tokens, reference.tokens)
            if peer:  # its arithmetic may tip a near-tie: an answer of another length is another race
                run.extra["same_answer_as_ours"] = run.text == runs["plain"].text
        record: CaseRecord = {
            "id": case.id,
            "prompt_tokens": len(prepared.prompt_ids),
            "original_tokens": len(engine.tokenize(prepared.prompt.original)),
            "methods": {m: r.to_dict() for m, r in runs.items()},
        }
        if case.sketch is not None:
            record["merge"] = merge_record(case, runs)
        results.append(record)
        if on_case is not None:
            on_case(record)
    return results
