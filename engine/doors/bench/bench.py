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

import dataclasses
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specedit.engine.backends.local import LocalBackend
from specedit.engine.doors.bench.llama_server import LlamaServerRunner
from specedit.engine.doors.bench.method_run import MethodRun, Timer
from specedit.engine.doors.bench.openai_door import OpenAIDoor
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import PreparedRewrite, prepare_rewrite, run_rewrite
from specedit.engine.model.invariant import stock_kernels
from specedit.engine.model.model_thread import on_model_thread
from specedit.engine.records.errors import ContextLengthError
from specedit.engine.records.events import Step
from specedit.engine.records.prompts import extract_code
from specedit.engine.records.requests import DraftMethod, RewriteRequest
from specedit.engine.sketch.chat_answer import AnswerSketch, ChatAnswerError, sketch_from_answer
from specedit.engine.sketch.merge import SketchMerge, merge_sketch
from specedit.engine.sketch.merge_checks import check_merge, counts, is_elision, is_fence
from specedit.engine.sketch.patches import SYNTAX

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
PLAIN_METHODS = ("plain", "plain-stock")


@dataclass(frozen=True)
class BenchCase:
    """An edit: an instruction, or an edit sketch (`scripts/sketch_cases.py`) with the merge it should
    give (`after`)."""

    id: str
    language: str
    instruction: str | None
    before: str
    sketch: str | None = None
    after: str | None = None

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> BenchCase:
        sketch = record.get("sketch")
        return cls(
            record["id"],
            record.get("language", ""),
            None if sketch is not None else record["instruction"],
            record["before"],
            sketch,
            record.get("after") if sketch is not None else None,
        )

    def request(self, max_new_tokens: int | None) -> RewriteRequest:
        """The request every method answers; a sketch is merged by the model (its lines' merge is the
        draft), and the merge by lines alone is measured apart (`merge_record`)."""
        sketch = self.sketch
        if sketch is not None:  # a chat answer's code, as the session takes it (`chat_answer`)
            sketch = sketch_from_answer(sketch, self.before, language=self.language).sketch
        return RewriteRequest(
            self.before,
            self.instruction,
            sketch,
            language=self.language,
            max_new_tokens=max_new_tokens,
            merge="model",
        )


def load_cases(path: Path, *, limit: int | None = None, max_chars: int | None = None) -> list[BenchCase]:
    cases = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            case = BenchCase.from_json(json.loads(line))
            if max_chars is not None and len(case.before) >= max_chars:
                continue
            cases.append(case)
            if limit is not None and len(cases) >= limit:
                break
    return cases


def run_ours(engine: Engine, prepared: PreparedRewrite, *, draft: DraftMethod) -> MethodRun:
    """Our loop as the product runs it (`loop.rewrite.run_rewrite`, what the local backend calls)."""
    timer = Timer()

    def on_step(_: Step) -> None:
        timer.mark_first()

    result = run_rewrite(engine, prepared, draft=draft, on_step=on_step)
    wall, cpu, prefill, decode = timer.finish()
    stats = result.generation.stats
    return MethodRun(
        result.generation.tokens,
        result.text,
        wall,
        cpu,
        prefill,
        decode,
        stats.target_forwards,
        stats.drafted_tokens,
        stats.accepted_tokens,
        stats.joules,
        stats.to_dict()["drafters"],
    )


@contextmanager
def as_transformers_runs_it(engine: Engine) -> Iterator[None]:
    """The target on transformers' attention and ATen's linear kernels, one row per step, on the threads
    it is given however busy the cores (the self-check's fewer threads were found for other kernels),
    and with no kept prefix (computed on other kernels, and perhaps in another cache), while inside."""
    rows, verdict, model, kept = engine.loaded.step_rows, engine.loaded.exactness, engine.model, engine.prefix_cache
    engine.loaded.step_rows, engine.prefix_cache = 1, None
    if verdict is not None:
        engine.loaded.exactness = dataclasses.replace(verdict, fewer_threads=())
    try:
        with stock_kernels(model) as stock:
            engine.loaded.model = engine.model = stock
            yield
    finally:
        engine.loaded.step_rows, engine.loaded.exactness, engine.prefix_cache = rows, verdict, kept
        engine.loaded.model = engine.model = model


def run_prompt_lookup(engine: Engine, prepared: PreparedRewrite, lookup_tokens: int) -> MethodRun:
    from transformers import StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    timer = Timer()
    forwards = 0

    class _Streamer(BaseStreamer):
        def __init__(self) -> None:
            self.calls = 0

        def put(self, value: torch.Tensor) -> None:
            nonlocal forwards
            self.calls += 1
            if self.calls > 1:  # the first call carries the prompt
                timer.mark_first()
                forwards += 1

        def end(self) -> None:
            pass

    prompt_ids = prepared.prompt_ids
    closing = f"\n{prepared.fence}\n"

    class _ClosingFence(StoppingCriteria):
        """Done once the answer holds the closing fence. (`stop_strings` does this only for transformers'
        own tokenizer classes, and only where the fence ends the tokens a step accepted.)"""

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
            answer = engine.tokenizer.decode(input_ids[0, len(prompt_ids) :].tolist(), skip_special_tokens=True)
            return torch.full((input_ids.shape[0],), closing in answer, dtype=torch.bool, device=input_ids.device)

    input_ids = torch.tensor([prompt_ids], device=engine.device)
    with as_transformers_runs_it(engine):  # the peer as a user runs it
        output = engine.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=prepared.max_new_tokens,
            do_sample=False,
            prompt_lookup_num_tokens=lookup_tokens,
            stopping_criteria=StoppingCriteriaList([_ClosingFence()]),
            streamer=_Streamer(),
            pad_token_id=engine.tokenizer.pad_token_id or engine.tokenizer.eos_token_id,
        )
    wall, cpu, prefill, decode = timer.finish()
    tokens = [int(t) for t in output[0, len(prompt_ids) :].tolist()]
    text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
    code = prepared.region_text(extract_code(text))
    return MethodRun(tokens, code, wall, cpu, prefill, decode, forwards, extra={"lookup_tokens": lookup_tokens})


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    for index, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(statistics.median(values), 3) if values else None


def _min(values: Iterable[float]) -> float | None:
    values = list(values)
    return round(min(values), 3) if values else None


def _geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v > 0]
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 3) if values else None


def merge_record(case: BenchCase, runs: dict[str, MethodRun]) -> dict[str, Any]:
    """How each answer to a sketch case fares: the merge by lines (where it places every chunk), each
    method's (the model's), and `auto`'s (what the product answers: the lines' merge, else the model's
    through `specedit`): exact (the real edit's `after`), differing in whitespace only, or else caught by
    the checks before writing (`merge_checks`) or let through."""
    assert case.sketch is not None and case.after is not None
    started = time.perf_counter()
    try:  # a chat answer's code, as the session takes it
        answer = sketch_from_answer(case.sketch, case.before, language=case.language)
        lines = merge_sketch(case.before, answer.sketch)
    except ChatAnswerError as error:
        answer, lines = AnswerSketch(case.sketch), SketchMerge(case.before, (str(error),))
    seconds = time.perf_counter() - started
    answers: dict[str, tuple[str, float]] = {m: (r.text, r.wall_seconds) for m, r in runs.items()}
    if lines.resolved:
        answers["lines"] = (lines.text, seconds)
    if lines.resolved or "specedit" in runs:
        answers["auto"] = answers["lines"] if lines.resolved else answers["specedit"]
    record: dict[str, Any] = {"resolved_by_lines": lines.resolved, "unresolved": list(lines.unresolved)}
    for name, (text, wall) in answers.items():
        check = check_merge(case.before, answer.sketch, text, left_out=answer.left_out)
        record[name] = {
            "exact": text == case.after,
            "whitespace_only": text != case.after and text.split() == case.after.split(),
            "loses_code": _loses_code(case.before, case.after, text),
            "writes_answer_lines": _writes_answer_lines(case, text),
            "check": "ok" if check.ok else check.describe(),
            "seconds": round(wall, 4),
        }
    return record


def _loses_code(before: str, after: str, answer: str) -> bool:
    """Whether `answer` lacks a line of the original that the real edit kept (lines that say something,
    compared stripped, counted): the worst wrong merge, code deleted that nobody asked to delete."""

    def said(text: str) -> Counter[str]:
        return Counter(line.strip() for line in text.splitlines() if counts(line))

    return bool((said(before) & said(after)) - said(answer))


def _writes_answer_lines(case: BenchCase, answer: str) -> bool:
    """Whether `answer` holds a line of the case's sketch that neither the original nor the real edit has
    (a fence, or one that says something; no marker or patch syntax): a chat answer's prose or fence
    written into the file. Told from the case alone, whatever the extraction took."""
    assert case.sketch is not None and case.after is not None
    kept = {line.strip() for line in (case.before + "\n" + case.after).splitlines()}
    wrapping = {
        line.strip()
        for line in case.sketch.splitlines()
        if (counts(line) or is_fence(line)) and not is_elision(line) and not SYNTAX.match(line)
    } - kept
    return any(line.strip() in wrapping for line in answer.splitlines())


def summarise_merges(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per answer (`lines`, each method, `auto`): how many cases it answered, exact, whitespace only,
    caught by the checks, and wrong but let through; its median seconds; and for the cases the lines
    resolve, how fast `specedit` verifies their merge (tokens per target forward)."""
    names = sorted({name for c in cases for name, value in c["merge"].items() if isinstance(value, dict)})
    summary: dict[str, Any] = {
        "cases": len(cases),
        "resolved_by_lines": sum(c["merge"]["resolved_by_lines"] for c in cases),
    }
    for name in names:
        verdicts = [c["merge"][name] for c in cases if name in c["merge"]]
        summary[name] = {
            "answered": len(verdicts),
            "exact": sum(v["exact"] for v in verdicts),
            "whitespace_only": sum(v["whitespace_only"] for v in verdicts),
            "caught": sum(v["check"] != "ok" for v in verdicts),
            "let_through": sum(v["check"] == "ok" and not v["exact"] and not v["whitespace_only"] for v in verdicts),
            "let_through_losing_code": sum(v["check"] == "ok" and v.get("loses_code", False) for v in verdicts),
            "writes_answer_lines": sum(v.get("writes_answer_lines", False) for v in verdicts),
            "median_seconds": _median(v["seconds"] for v in verdicts),
        }
    resolved = [
        c["methods"]["specedit"] for c in cases if c["merge"]["resolved_by_lines"] and "specedit" in c["methods"]
    ]
    if resolved:
        summary["specedit_on_resolved"] = {
            "tokens_per_forward": _median(r["generated_tokens"] / max(1, r["target_forwards"]) for r in resolved),
            "tokens_per_second": _median(r["tokens_per_second"] for r in resolved),
        }
    return summary


def summarise(
    cases: list[dict[str, Any]], methods: Sequence[str], load_before: tuple[float, ...], load_after: tuple[float, ...]
) -> dict[str, Any]:
    def ratios(method: str, over: str, key: str) -> list[float]:
        pairs = [c["methods"] for c in cases if method in c["methods"] and over in c["methods"]]
        return [p[over][key] / p[method][key] for p in pairs if p[method][key] > 0]

    def fastest_plain_ratios(method: str, key: str) -> list[float]:
        """Over the faster of `plain` and `plain-stock`, case by case."""
        pairs = [c["methods"] for c in cases if method in c["methods"] and "plain" in c["methods"]]
        return [
            min(p[plain][key] for plain in PLAIN_METHODS if plain in p) / p[method][key]
            for p in pairs
            if p[method][key] > 0
        ]

    others = [m for m in methods if m != "plain"]
    summary: dict[str, Any] = {
        "cases": len(cases),
        "speedup_vs_plain": {m: _median(ratios(m, "plain", "wall_seconds")) for m in others},
        "speedup_vs_plain_geomean": {m: _geomean(ratios(m, "plain", "wall_seconds")) for m in others},
        "decode_speedup_vs_plain": {m: _median(ratios(m, "plain", "decode_seconds")) for m in others},
        "speedup_vs_fastest_plain": {m: _median(fastest_plain_ratios(m, "wall_seconds")) for m in others},
        "decode_speedup_vs_fastest_plain": {m: _median(fastest_plain_ratios(m, "decode_seconds")) for m in others},
        "slower_than_plain": {m: sum(r < 1.0 for r in ratios(m, "plain", "wall_seconds")) for m in others},
        "slower_than_fastest_plain": {m: sum(r < 1.0 for r in fastest_plain_ratios(m, "wall_seconds")) for m in others},
        "slowest_vs_plain": {m: _min(ratios(m, "plain", "wall_seconds")) for m in others},
        "identical_rate": {},
        "cpu_seconds_per_token": {},
        "joules_per_token": {},
        "tokens_per_second_median": {},
        "load_average": {"before": list(load_before), "after": list(load_after)},
    }
    for method in methods:
        runs = [c["methods"][method] for c in cases if method in c["methods"]]
        if not runs:
            continue
        flags = [r["identical_to_plain"] for r in runs if r["identical_to_plain"] is not None]
        summary["identical_rate"][method] = round(sum(flags) / len(flags), 4) if flags else None
        tokens = sum(r["generated_tokens"] for r in runs)
        summary["cpu_seconds_per_token"][method] = (
            round(sum(r["cpu_seconds"] for r in runs) / tokens, 5) if tokens else None
        )
        joules = [r["joules"] for r in runs if r.get("joules") is not None]
        if tokens and len(joules) == len(runs):
            summary["joules_per_token"][method] = round(sum(joules) / tokens, 5)
        summary["tokens_per_second_median"][method] = _median(r["tokens_per_second"] for r in runs)
    if "specedit" in methods and "prompt-lookup" in methods:
        summary["speedup_vs_prompt_lookup"] = _median(ratios("specedit", "prompt-lookup", "wall_seconds"))
        summary["speedup_vs_prompt_lookup_geomean"] = _geomean(ratios("specedit", "prompt-lookup", "wall_seconds"))
    for variant in ("specedit-copy", "specedit-fallback"):
        if "specedit" in methods and variant in methods:
            summary.setdefault("speedup_vs_variant", {})[variant] = _median(ratios("specedit", variant, "wall_seconds"))
    if "specedit" in methods and "llama-cpp" in methods:
        summary["speedup_vs_llama_cpp"] = _median(ratios("specedit", "llama-cpp", "wall_seconds"))
    if "specedit" in methods and "llama-server" in methods:
        versus = ratios("specedit", "llama-server", "wall_seconds")
        summary["speedup_vs_llama_server"] = _median(versus)
        summary["speedup_vs_llama_server_geomean"] = _geomean(versus)
        summary["slower_than_llama_server"] = sum(r < 1.0 for r in versus)
        summary["decode_speedup_vs_llama_server"] = _median(ratios("specedit", "llama-server", "decode_seconds"))
        same = [c for c in cases if c["methods"].get("llama-server", {}).get("extra", {}).get("same_answer_as_ours")]
        summary["llama_server_same_answer"] = len(same)
        summary["speedup_vs_llama_server_same_answer"] = _median(
            c["methods"]["llama-server"]["wall_seconds"] / c["methods"]["specedit"]["wall_seconds"] for c in same
        )
        summary["llama_server_best_type"] = dict(
            Counter(c["methods"]["llama-server"]["extra"]["best_of"] for c in cases if "llama-server" in c["methods"])
        )
        # Its speculation may change its answer (its batched arithmetic tips near-ties), and a shorter answer ends
        # sooner: held to the rule specedit keeps, only its ways of decoding that answered as its plain one did.
        versus_exact = [
            exact_wall / c["methods"]["specedit"]["wall_seconds"]
            for c in cases
            if (exact_wall := _llama_server_exact_wall(c["methods"])) is not None
        ]
        summary["speedup_vs_llama_server_exact"] = _median(versus_exact)
        summary["speedup_vs_llama_server_exact_geomean"] = _geomean(versus_exact)
        summary["slower_than_llama_server_exact"] = sum(r < 1.0 for r in versus_exact)
        summary["slower_than_llama_server_cases"] = {
            c["id"]: round(m["llama-server"]["wall_seconds"] / m["specedit"]["wall_seconds"], 3)
            for c in cases
            if {"specedit", "llama-server"} <= set(m := c["methods"])
            and m["llama-server"]["wall_seconds"] < m["specedit"]["wall_seconds"]
        }
    if "specedit" in methods and "openai-prediction" in methods:
        summary["http_door"] = http_door_overhead(cases)
        if "llama-server" in methods:
            versus = ratios("openai-prediction", "llama-server", "wall_seconds")
            summary["openai_prediction_vs_llama_server"] = _median(versus)
            summary["openai_prediction_slower_than_llama_server"] = sum(r < 1.0 for r in versus)
    return summary


def _llama_server_exact_wall(runs: dict[str, Any]) -> float | None:
    """The fastest of llama-server's ways of decoding a case that answered as its own plain decoding did,
    its plain decoding included; None without them or without specedit's run."""
    walls = [
        run["wall_seconds"]
        for name, run in runs.items()
        if name.startswith("llama-server-") and run.get("identical_to_plain")
    ]
    return min(walls) if walls and runs.get("specedit", {}).get("wall_seconds") else None


def http_door_overhead(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """What the HTTP door (`openai-prediction`) costs beside `specedit` on the same cases: the median ratio
    of their times, the time it adds per request and per token, and the prediction tokens it reports."""
    pairs = [(c["methods"]["openai-prediction"], c["methods"]["specedit"]) for c in cases if {
        "openai-prediction", "specedit"} <= set(c["methods"])]  # fmt: skip
    added = [door["wall_seconds"] - ours["wall_seconds"] for door, ours in pairs]
    tokens = [max(1, ours["generated_tokens"]) for _, ours in pairs]
    return {
        "wall_ratio_median": _median(door["wall_seconds"] / ours["wall_seconds"] for door, ours in pairs),
        "added_seconds_median": _median(added),
        "added_ms_per_token_median": _median(1000 * a / t for a, t in zip(added, tokens, strict=True)),
        "accepted_prediction_tokens": sum(door["extra"]["accepted_prediction_tokens"] or 0 for door, _ in pairs),
        "rejected_prediction_tokens": sum(door["extra"]["rejected_prediction_tokens"] or 0 for door, _ in pairs),
    }


def run_bench(
    backend: LocalBackend,
    cases: list[BenchCase],
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    max_new_tokens: int | None = None,
    lookup_tokens: int = 32,
    llama_server: str | None = None,
    background_load: int = 0,
    on_case: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every method on every case (`llama_server`: the binary of that method, else where
    `llama_server.find_binary` looks), with `background_load` busy processes beside them."""
    engine = backend.load()
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods: {', '.join(sorted(unknown))}")
    if "specedit-fallback" in methods and engine.fallback is None:
        raise ValueError("specedit-fallback needs a fallback: --draft-model MODEL or --draft layers:LIST")
    ordered = ["plain", *[m for m in methods if m != "plain"]]  # plain is the reference of every pair
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
    summary = summarise(results, present, load_before, os.getloadavg())
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

    def exit_(signum: int, _: Any) -> None:
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
    llama: Any,
    server: LlamaServerRunner | None,
    door: OpenAIDoor | None,
    on_case: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
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
        record = {
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
