"""`specedit bench` on a few short cases with a tiny real model: the JSON's fields, pair-by-pair ratios."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.engine.doors.bench import llama_cpp, llama_server
from specedit.engine.doors.bench.bench import first_difference, summarise
from specedit.engine.model.loading import load_tokenizer
from specedit.engine.model.tokenizer import KeptTokenizer
from specedit.engine.store import fetch
from specedit.engine.store.store import kept_dir

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
    monkeypatch.setattr(llama_server, "find_binary", lambda given=None: None)  # none built (as in CI)
    cases = write_cases(tmp_path / "cases.jsonl")
    out = tmp_path / "bench.json"
    # As after a first load, the bench reads the tokenizer back without transformers (`KeptTokenizer`): the
    # transformers baselines must run on it too.
    load_tokenizer(str(memorising_model_dir), {}, kept_dir())  # kept, if no test loaded it before
    assert isinstance(load_tokenizer(str(memorising_model_dir), {}, kept_dir()), KeptTokenizer)
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
            "plain,plain-stock,prompt-lookup,specedit,llama-cpp,llama-server",
            "--prompt-lookup-tokens",
            "8",
            "--background-load",
            "1",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    table = capsys.readouterr().out
    assert "load average before" in table and "speed-up over plain" in table
    assert report["settings"]["background_load"] == 1 and "busy processes beside it: 1" in table

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
    assert report["settings"]["llama_server"] == "not built" and "llama-server: not built" in table

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
        # each phase's GOPS beside its time: our methods' (the engine's own phases), not the peers'
        for run in (plain, ours, case["methods"]["plain-stock"]):
            assert run["prefill_gops"] > 0 and run["decode_gops"] > 0
        assert case["methods"]["prompt-lookup"]["prefill_gops"] is None
    # the integer peak once per run, and the phases' medians as shares of it
    peak = summary["integer_peak"]
    assert peak is None or (peak["gops"] > 0 and peak["decode_ceiling_gops"] > 0)
    assert summary["gops"]["specedit"]["decode"] > 0 and "prompt-lookup" not in summary["gops"]
    if peak is not None:
        assert summary["gops"]["specedit"]["decode_share"] > 0
    assert "GOPS, prefill / decoding" in table
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


def test_merges_only_needs_no_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench --merges-only`: the lines' verdict per sketch case and the counts, with a model that cannot
    load (it is never touched); a set without sketches is a usage error."""
    cases = tmp_path / "sketches.jsonl"
    wrong = {"id": "wrong", "language": "python", "before": LINES_SKETCH[0], "sketch": LINES_SKETCH[1]}
    records = [
        {**wrong, "id": "lines", "after": LINES_SKETCH[2]},
        {**wrong, "after": LINES_SKETCH[2] + "# not what the lines give\n"},
        {"id": "echo", "language": "python", "before": ECHOED_SKETCH[0], "sketch": ECHOED_SKETCH[1], "after": "x\n"},
    ]
    cases.write_text("".join(json.dumps(record) + "\n" for record in records))
    out = tmp_path / "merges.json"
    arguments = ["bench", "--cases", str(cases), "--model", str(tmp_path / "no-such-model"), "--merges-only"]
    assert main([*arguments, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lines " in printed and " exact" in printed and "left to the model: " in printed
    merges = json.loads(out.read_text())["summary"]["merges"]
    assert merges["cases"] == 3 and merges["resolved_by_lines"] == 2
    assert merges["lines"] == {**merges["lines"], "answered": 2, "exact": 1, "let_through": 1}
    instructions = tmp_path / "instructions.jsonl"
    instructions.write_text(json.dumps({"id": "i", "language": "python", "instruction": "x", "before": "y"}) + "\n")
    assert main(["bench", "--cases", str(instructions), "--merges-only"]) != 0


def test_background_load_spins_beside_the_bench_and_stops() -> None:
    """`--background-load N`: N processes of this machine's Python, each busy, while inside; none after."""
    from specedit.engine.doors.bench.bench import busy_processes

    with busy_processes(2):
        deadline = time.monotonic() + 10  # a loaded machine may show a child's /proc entry late (CI saw 1)
        while len(_spinning(os.getpid())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_spinning(os.getpid())) == 2
    assert _spinning(os.getpid()) == []


def _spinning(parent: int) -> list[int]:
    """The busy processes (`busy_processes`) whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
            ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        if int(ppid) == parent and b"while True: pass" in command:
            found.append(int(entry.name))
    return found


def test_a_terminated_bench_stops_what_it_started(tmp_path: Path, memorising_model_dir: Path) -> None:
    """SIGTERM (`kill`, a CI's timeout) mid-run ends the bench through its cleanup: its busy processes (and
    llama-servers, stopped by the same `finally`s) do not outlive it."""
    cases = write_cases(tmp_path / "one.jsonl").read_text()
    (tmp_path / "many.jsonl").write_text(cases * 200)  # far more than the seconds this test waits
    command = [sys.executable, "-m", "specedit.cli.main", "bench", "--cases", str(tmp_path / "many.jsonl")]
    command += ["--model", str(memorising_model_dir), "--methods", "plain,specedit", "--background-load", "1"]
    bench = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (started := _spinning(bench.pid)) and bench.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started, bench.stderr.read().decode() if bench.poll() is not None else "no busy process started"
        time.sleep(1)  # into the cases
        bench.terminate()
        assert bench.wait(60) == 128 + signal.SIGTERM  # left after its cleanup, not killed by the signal (-15)
        assert [pid for pid in started if _running(pid)] == []
    finally:
        bench.kill()
        for pid in started:  # (a failed test leaves no spinning process behind)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


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


def test_summary_holds_llama_server_to_its_own_answer_too() -> None:
    """Beside llama-server's fastest n-gram type, the fastest of its ways of decoding that answered as its
    plain decoding did (plain included): a type whose speculation changed the answer wins no case there."""

    def run(wall: float, identical: bool = True) -> dict[str, object]:
        return {"wall_seconds": wall, "decode_seconds": wall, "cpu_seconds": wall, "generated_tokens": 10,
                "tokens_per_second": 10 / wall, "identical_to_plain": identical, "extra": {}}  # fmt: skip

    def case(name: str, ours: float, plain: float, mod: tuple[float, bool], simple: tuple[float, bool]) -> dict:
        runs = {"plain": run(2 * ours), "specedit": run(ours), "llama-server-plain": run(plain)}
        runs["llama-server-ngram-mod"], runs["llama-server-ngram-simple"] = run(*mod), run(*simple)
        best = min(("llama-server-ngram-mod", "llama-server-ngram-simple"), key=lambda t: runs[t]["wall_seconds"])
        runs["llama-server"] = {**runs[best], "extra": {"best_of": best}}
        return {"id": name, "methods": runs}

    cases = [
        case("shorter answer", 1.0, 3.0, (0.5, False), (2.0, True)),  # 2.0x held to its answer, 0.5x not
        case("plain fastest", 1.0, 0.8, (1.5, True), (1.2, True)),  # its plain beat its speculation
        case("alike", 1.0, 4.0, (2.0, True), (3.0, True)),
    ]
    summary = summarise(cases, ["plain", "specedit", "llama-server"], (0.0,), (0.0,))
    assert summary["speedup_vs_llama_server"] == 1.2 and summary["slower_than_llama_server"] == 1
    assert summary["slower_than_llama_server_cases"] == {"shorter answer": 0.5}
    assert summary["speedup_vs_llama_server_exact"] == 2.0
    assert summary["slower_than_llama_server_exact"] == 1  # "plain fastest": 0.8x


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 4], [1, 2, 3]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2


# A stand-in for llama.cpp's server (the real one is built by scripts/build_llama_server.sh, 17 minutes:
# not in CI): it speaks the part of its HTTP API the bench uses, streams a fixed answer as server-sent
# events, and logs what it was started with and asked.
FAKE_LLAMA_SERVER = """\
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
log = open(sys.argv[0] + ".log", "a")
log.write(json.dumps({"args": args}) + "\\n")
log.flush()

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log.write(json.dumps({"args": args, "body": body}) + "\\n")
        log.flush()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        speculating = "--spec-type" in args
        final = {"content": "", "stop": True, "stopping_word": body["stop"][0],
                 "timings": {"draft_n": 4 if speculating else 0, "draft_n_accepted": 3 if speculating else 0}}
        for event in ({"content": "```python\\n", "tokens": [1, 2]}, {"content": "x = 1", "tokens": [3]}, final):
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
            self.wfile.flush()

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_bench_runs_llama_server_per_speculation_type_and_reports_the_best(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server: one process per way of decoding (plain, each n-gram type at draft max 64), the prompt
    as token ids, greedy, no prompt cache, stopping at the closing fence; `llama-server` is each case's
    fastest type, compared with llama-server's own plain decoding, and the servers are gone after."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n" + FAKE_LLAMA_SERVER)
    binary.chmod(0o755)
    monkeypatch.setattr(fetch, "ensure_gguf", lambda spec=None: tmp_path / "model.gguf")
    out = tmp_path / "bench.json"
    cases = write_cases(tmp_path / "cases.jsonl")
    arguments = ["bench", "--cases", str(cases), "--model", str(memorising_model_dir), "--limit", "2"]
    arguments += ["--llama-server", str(binary)]
    code = main([*arguments, "--methods", "plain,specedit,llama-server", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["llama_server"] == "ran"
    summary = report["summary"]
    types = {"llama-server-plain", "llama-server-ngram-mod", "llama-server-ngram-simple"}
    for case in report["cases"]:
        runs = case["methods"]
        assert set(runs) == {"plain", "specedit", "llama-server", *types}
        best = runs["llama-server"]["extra"]["best_of"]
        assert best in types - {"llama-server-plain"}
        assert runs["llama-server"]["wall_seconds"] == runs[best]["wall_seconds"]
        assert runs["llama-server"]["identical_to_plain"]  # its own plain decoding's answer
        assert runs["llama-server-ngram-mod"]["accepted_tokens"] == 3
        assert runs["llama-server"]["generated_tokens"] == 3
    assert summary["identical_rate"]["llama-server"] == 1.0
    assert summary["speedup_vs_llama_server"] > 0 and 0 <= summary["slower_than_llama_server"] <= 2
    assert sum(summary["llama_server_best_type"].values()) == 2
    assert summary["llama_server_same_answer"] == 0  # its "x = 1" is not the memorised answer
    assert summary["speedup_vs_llama_server_exact"] > 0  # every type answered alike: the fastest of all three
    printed = capsys.readouterr().out
    assert "specedit over llama-server's best n-gram type per case" in printed
    assert "best type that answered as its own plain decoding" in printed

    logged = [json.loads(line) for line in (tmp_path / "llama-server.log").read_text().splitlines()]
    started = [entry["args"] for entry in logged if "body" not in entry]
    assert len(started) == 3
    assert sorted(args[args.index("--spec-type") + 1] for args in started if "--spec-type" in args) == [
        "ngram-mod",
        "ngram-simple",
    ]
    assert all(args[args.index("--spec-draft-n-max") + 1] == "64" for args in started if "--spec-type" in args)
    assert all(args[args.index("-np") + 1] == "1" for args in started)
    asked = [entry["body"] for entry in logged if "body" in entry]
    assert len(asked) == 6  # 2 cases x 3 servers
    for body in asked:
        assert all(isinstance(token, int) for token in body["prompt"])
        assert body["temperature"] == 0 and body["top_k"] == 1 and body["cache_prompt"] is False
        assert body["stop"] == ["\n```\n"] and body["stream"] is True
    # The servers are stopped with the bench.
    ports = {args[args.index("--port") + 1] for args in started}
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()


def test_a_llama_server_whose_port_was_taken_is_started_again_on_another(tmp_path: Path) -> None:
    """Between the probe that finds a free port and the server's bind, another program may take it (an
    ephemeral port of a connection to the server started before): that server says so and exits, and is
    started again on a new port, instead of failing the bench."""
    binary = tmp_path / "llama-server"
    refuse_once = (
        "import os, sys\n"
        "first = sys.argv[0] + '.refused'\n"
        "if '--spec-type' in sys.argv and not os.path.exists(first):\n"
        "    open(first, 'w').close()\n"
        '    print("start: couldn\'t bind HTTP server socket, hostname: 127.0.0.1", file=sys.stderr, flush=True)\n'
        "    sys.exit(1)\n"
    )
    binary.write_text(f"#!{sys.executable}\n{refuse_once}{FAKE_LLAMA_SERVER}")
    binary.chmod(0o755)
    with llama_server.LlamaServerRunner.create(binary, tmp_path / "model.gguf", threads=1, spec_types=("ngram-mod",)):
        pass
    assert (tmp_path / "llama-server.refused").exists()
    started = [json.loads(line)["args"] for line in (tmp_path / "llama-server.log").read_text().splitlines()]
    assert sorted("--spec-type" in args for args in started) == [False, True]  # both up, the refused one again


BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_llama_server.sh"


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_the_llama_server_build_script_knows_what_it_built(tmp_path: Path, isa: str) -> None:
    """Built already (its version recorded): the script only says so; an unknown instruction set is refused
    before anything is downloaded."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "llama-server").chmod(0o755)
    (tmp_path / "VERSION").write_text("11434.0.0\n")
    env = {**os.environ, "SPECEDIT_LLAMA_SERVER_DIR": str(tmp_path), "SPECEDIT_LLAMA_ISA": isa}
    built = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert built.returncode == 0 and "is built" in built.stderr, built.stderr
    env["SPECEDIT_LLAMA_ISA"] = "avx9000"
    refused = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "native or avx2" in refused.stderr, refused.stderr


def test_the_decode_ceiling_script_sets_a_run_against_its_forward_costs(tmp_path: Path) -> None:
    """`scripts/decode_ceiling.py`: forwards costing 50 ms + 5 ms a row; a case of 4 forwards over 400 rows
    after a 1 s prefill could take 3.2 s at best: run in 4 s it is at 80% of its ceiling."""
    curve = tmp_path / "curve.txt"
    rows = [f"{context:7d} {k:7d} {0.05 + 0.005 * k:12.4f} 1.0 1.0 no" for context in (300, 800) for k in (1, 8, 64)]
    curve.write_text("context  tokens   checked s  transformers s  ratio  same last row\n" + "\n".join(rows) + "\n")
    case = {
        "id": "a",
        "methods": {
            "plain": {"wall_seconds": 20.0, "prefill_seconds": 1.0},
            "specedit": {"wall_seconds": 4.0, "target_forwards": 4, "drafted_tokens": 396, "accepted_tokens": 380},
        },
    }
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"cases": [case]}))
    script = Path(__file__).parents[1] / "scripts" / "decode_ceiling.py"
    done = subprocess.run([sys.executable, str(script), str(curve), str(bench)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "50.0 ms + 5.00 ms a row" in done.stdout
    assert "5.00x, ceiling  6.25x =  80%" in done.stdout and "median 80%" in done.stdout


def test_the_first_byte_script_times_a_rewrite_to_its_first_streamed_byte(
    tmp_path: Path, memorising_model_dir: Path
) -> None:
    """`scripts/first_byte.py`: a rewrite run once to warm, then timed from its start to its first byte on
    stdout, the figures written; a rewrite that fails stops it, saying so."""
    original, instruction, _ = MEMORISED_REWRITES[0]
    source = tmp_path / "add.py"
    source.write_text(original)
    out = tmp_path / "first-byte.json"
    script = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "first_byte.py"), "--runs", "1"]
    rewrite = ["-i", instruction, "--model", str(memorising_model_dir), "--no-progress"]
    done = subprocess.run([*script, "--json", str(out), "--", str(source), *rewrite], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["runs"] == 1 and 0 < figures["median_seconds"] == figures["seconds"][0] < 60
    assert "first byte: median" in done.stderr and figures["cpu_class"] in done.stderr
    assert source.read_text() == original  # the rewrite went to stdout
    failed = subprocess.run([*script, "--", str(tmp_path / "missing.py"), *rewrite], capture_output=True, text=True)
    assert failed.returncode == 1 and "failed (exit" in failed.stderr and "missing.py" in failed.stderr


def test_the_http_door_answers_the_bench_cases_as_specedit_does(tmp_path: Path, memorising_model_dir: Path) -> None:
    """`openai-prediction`: each case through the HTTP door (OpenAI's API, the original as the prediction,
    the code block primed), the same answer as `specedit`'s, and what the door adds to it reported."""
    cases = write_cases(tmp_path / "cases.jsonl")
    out = tmp_path / "bench.json"
    command = ["bench", "--cases", str(cases), "--model", str(memorising_model_dir), "--json", str(out)]
    assert main([*command, "--methods", "plain,specedit,openai-prediction"]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["identical_rate"]["openai-prediction"] == 1.0
    door = report["summary"]["http_door"]
    assert door["wall_ratio_median"] > 0 and door["accepted_prediction_tokens"] > 0
    for case in report["cases"]:  # (its token count is the code's: the API gives text, not the fence's tokens)
        run = case["methods"]["openai-prediction"]
        assert run["generated_tokens"] <= case["methods"]["specedit"]["generated_tokens"]
        assert run["extra"]["completion_tokens"] >= run["generated_tokens"]
