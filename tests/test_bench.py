"""`specedit bench` on a few short cases with a tiny real model: the JSON's fields, pair-by-pair ratios."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.engine.ops import llama_cpp
from specedit.engine.ops.bench import first_difference, summarise

from conftest import ECHOED_SKETCH, LINES_SKETCH, MEMORISED_REWRITES


def write_cases(path: Path) -> Path:
    with path.open("w") as handle:
        for index, (before, instruction, after) in enumerate(MEMORISED_REWRITES):
            record = {
                "id": f"memorised/{index}",
                "language": "python",
                "instruction": instruction,
                "before": before,
                "after": after,
                "source": "tests",
            }
            handle.write(json.dumps(record) + "\n")
    return path


def test_bench_runs_every_method_on_every_case(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama.cpp is an optional extra (and runs on the real default GGUF): here it is missing, as in CI.
    monkeypatch.setattr(llama_cpp.LlamaCppRunner, "create", classmethod(lambda cls, threads=None: None))
    cases = write_cases(tmp_path / "cases.jsonl")
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--cases",
            str(cases),
            "--model",
            str(memorising_model_dir),
            "--json",
            str(out),
            "--methods",
            "plain,plain-stock,prompt-lookup,specedit,llama-cpp",
            "--prompt-lookup-tokens",
            "8",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    table = capsys.readouterr().out
    assert "load average before" in table and "speed-up over plain" in table

    summary = report["summary"]
    for key in (
        "speedup_vs_plain",
        "speedup_vs_prompt_lookup",
        "identical_rate",
        "cpu_seconds_per_token",
        "load_average",
        "decode_speedup_vs_plain",
        "speedup_vs_fastest_plain",
        "decode_speedup_vs_fastest_plain",
    ):
        assert key in summary, key
    assert set(summary["speedup_vs_plain"]) >= {"plain-stock", "prompt-lookup", "specedit"}
    assert summary["identical_rate"] == {"plain": 1.0, "plain-stock": 1.0, "prompt-lookup": 1.0, "specedit": 1.0}
    assert report["settings"]["exactness"]["claim"] == "bitwise"
    assert "speculation: identical to plain decoding bit for bit" in table
    assert report["settings"]["llama_cpp"] == "not installed"
    assert "llama.cpp: not installed" in table

    assert [case["id"] for case in report["cases"]] == [f"memorised/{i}" for i in range(len(MEMORISED_REWRITES))]
    for case in report["cases"]:
        plain, ours = case["methods"]["plain"], case["methods"]["specedit"]
        for run in case["methods"].values():
            for key in (
                "wall_seconds",
                "cpu_seconds",
                "generated_tokens",
                "tokens_per_second",
                "target_forwards",
                "prefill_seconds",
                "decode_seconds",
                "identical_to_plain",
            ):
                assert key in run, key
        assert ours["generated_tokens"] == plain["generated_tokens"]
        assert ours["target_forwards"] < plain["target_forwards"] == plain["generated_tokens"]
    # The median speed-up is the median of per-case ratios, not a ratio of totals.
    ratios = sorted(
        c["methods"]["plain"]["wall_seconds"] / c["methods"]["specedit"]["wall_seconds"] for c in report["cases"]
    )
    assert summary["speedup_vs_plain"]["specedit"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    # Over the faster plain reference, case by case: never more than over either one.
    fastest = sorted(
        min(c["methods"][plain]["wall_seconds"] for plain in ("plain", "plain-stock"))
        / c["methods"]["specedit"]["wall_seconds"]
        for c in report["cases"]
    )
    assert summary["speedup_vs_fastest_plain"]["specedit"] == pytest.approx(statistics.median(fastest), abs=1e-3)


def test_bench_compares_the_chain_with_each_of_its_drafters(tmp_path: Path, memorising_model_dir: Path) -> None:
    """Layer skip as the fallback (the memorising model has two layers; the target drafts with the first)."""
    out = tmp_path / "bench.json"
    arguments = ["bench", "--cases", str(write_cases(tmp_path / "cases.jsonl")), "--model", str(memorising_model_dir)]
    methods = "plain,specedit,specedit-copy,specedit-fallback"
    code = main([*arguments, "--methods", methods, "--draft-layers", "0", "--p-min", "0", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["identical_rate"] == dict.fromkeys(methods.split(","), 1.0)
    assert set(summary["speedup_vs_variant"]) == {"specedit-copy", "specedit-fallback"}
    assert set(summary["slower_than_plain"]) == {"specedit", "specedit-copy", "specedit-fallback"}
    assert report["settings"]["fallback"] == "layers 0 (p_min 0.0)"
    for case in report["cases"]:
        runs = case["methods"]
        assert set(runs["specedit"]["drafters"]) == {"copy", "context", "layers"}
        assert set(runs["specedit-copy"]["drafters"]) == {"copy"}
        assert set(runs["specedit-fallback"]["drafters"]) == {"layers"}
        assert runs["specedit-fallback"]["drafters"]["layers"]["proposals"] > 0
        assert runs["plain"]["drafters"] == {} and runs["plain"]["joules"] is None  # no GPU here
    # The fallback alone needs a fallback.
    assert main([*arguments, "--methods", "plain,specedit-fallback"]) == 2


def test_a_sketch_set_reports_each_answers_merges(tmp_path: Path, memorising_model_dir: Path) -> None:
    """Sketch cases (`scripts/sketch_cases.py`): the lines' merge, each method's and what the product
    answers (`auto`) are counted as exact, whitespace only, caught by the checks or let through."""
    cases = tmp_path / "sketches.jsonl"
    records = [
        {
            "id": "lines",
            "language": "python",
            "before": LINES_SKETCH[0],
            "sketch": LINES_SKETCH[1],
            "after": LINES_SKETCH[2],
        },
        {"id": "echo", "language": "python", "before": ECHOED_SKETCH[0], "sketch": ECHOED_SKETCH[1], "after": "x\n"},
    ]
    cases.write_text("".join(json.dumps(record) + "\n" for record in records))
    out = tmp_path / "bench.json"
    arguments = ["bench", "--cases", str(cases), "--model", str(memorising_model_dir), "--methods", "plain,specedit"]
    assert main([*arguments, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    merges = report["summary"]["merges"]
    assert merges["cases"] == 2 and merges["resolved_by_lines"] == 1
    assert merges["lines"] == {**merges["lines"], "answered": 1, "exact": 1, "caught": 0, "let_through": 0}
    # The model echoes the sketch it cannot place: the checks catch it, for both methods and for auto.
    for name in ("plain", "specedit", "auto"):
        assert merges[name]["answered"] == 2 and merges[name]["caught"] >= 1, (name, merges[name])
    assert merges["auto"]["exact"] == 1
    echo = next(c for c in report["cases"] if c["id"] == "echo")
    assert not echo["merge"]["resolved_by_lines"] and "elision markers" in echo["merge"]["specedit"]["check"]


def test_summary_pairs_cases_not_totals() -> None:
    def run(wall: float) -> dict[str, object]:
        return {
            "wall_seconds": wall,
            "decode_seconds": wall,
            "cpu_seconds": wall,
            "generated_tokens": 10,
            "tokens_per_second": 10 / wall,
            "identical_to_plain": True,
        }

    # One long case where specedit is slow and two short ones where it is 4x faster: totals would say
    # 0.6x, pair by pair the median is 4x.
    cases = [
        {"methods": {"plain": run(10.0), "specedit": run(20.0)}},
        {"methods": {"plain": run(1.0), "specedit": run(0.25)}},
        {"methods": {"plain": run(2.0), "specedit": run(0.5)}},
    ]
    summary = summarise(cases, ["plain", "specedit"], (0.0,), (0.0,))
    assert summary["speedup_vs_plain"]["specedit"] == 4.0


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4], [1, 2, 3]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2
