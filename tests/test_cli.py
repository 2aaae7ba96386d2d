"""`specedit rewrite` end to end: real command, real (tiny) models, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.cli.progress import RewriteProgress
from specedit.engine.records.errors import EmptyAnswerError
from specedit.engine.records.events import Phase, Step

from conftest import MEMORISED_REWRITES

ADD, ADD_INSTRUCTION, ADD_ANSWER = MEMORISED_REWRITES[0]
XY, XY_INSTRUCTION, XY_ANSWER = MEMORISED_REWRITES[1]
CRLF, CRLF_INSTRUCTION, _ = MEMORISED_REWRITES[2]


def specedit(*args: str | Path) -> int:
    return main([str(arg) for arg in args])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "specedit-tmp" in p.name)


# --- bad input: a clear message and an exit code, before any model is loaded -----------------------


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda d: d / "missing.py", 3, "no such file"),
        (lambda d: d, 3, "is a directory"),
        (lambda d: (d / "b.bin").write_bytes(b"\x7fELF\x00\x01") and d / "b.bin", 3, "binary"),
        (lambda d: (d / "u.py").write_bytes(b"x = '\xff'\n") and d / "u.py", 3, "not valid UTF-8 (byte 5, line 1)"),
    ],
)
def test_bad_input_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, code: int, message: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    assert specedit("rewrite", path, "-i", "x", "--model", tmp_path / "never-loaded") == code
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("lines", "message"), [("5:9", "outside the file"), ("3:1", "must not exceed"), ("a:b", "expected A:B")]
)
def test_region_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, message: str) -> None:
    source = tmp_path / "a.py"
    source.write_text("one\ntwo\nthree\n")
    assert specedit("rewrite", source, "-i", "x", "--lines", lines, "--model", tmp_path) == 4
    assert message in capsys.readouterr().err


def test_a_model_that_does_not_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    assert specedit("rewrite", source, "-i", "x", "--model", tmp_path / "no-such-model") == 6
    assert "model folder not found" in capsys.readouterr().err
    (tmp_path / "empty-model").mkdir()
    assert specedit("rewrite", source, "-i", "x", "--model", tmp_path / "empty-model") == 6
    assert "not a model folder" in capsys.readouterr().err


def test_input_longer_than_the_context(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "big.py"
    source.write_text("".join(f"value_{i} = {i} * {i}\n" for i in range(1500)))  # far over 2048 positions
    assert specedit("rewrite", source, "-i", "x", "--model", tiny_model_dir) == 5
    assert "too long for the model" in capsys.readouterr().err


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    assert specedit("rewrite", source, "-i", "x", "--no-backup") == 2
    assert specedit("rewrite", source, source, "-i", "x", "-o", tmp_path / "out.py") == 2
    assert specedit("rewrite", source, "-i", "x", "--temperature", "-1") == 2
    with pytest.raises(SystemExit):  # argparse: instruction or sketch is required
        specedit("rewrite", source)


# --- rewrites with a real model that finishes its answers -------------------------------------------


def test_a_rewrite_that_changes_nothing_says_so(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unchanged, instruction, answer = MEMORISED_REWRITES[3]
    assert answer == unchanged
    source = tmp_path / "xy.py"
    source.write_text(unchanged)
    assert specedit("rewrite", source, "-i", instruction, "--model", memorising_model_dir, "--diff") == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"specedit: {source}: no changes" in captured.err
    assert specedit("rewrite", source, "-i", instruction, "--model", memorising_model_dir, "--in-place") == 0
    assert "no changes; not written" in capsys.readouterr().err and not (tmp_path / "xy.py.orig").exists()


def test_rewrite_prints_the_new_text(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "add.py"
    source.write_text(ADD)
    for draft in ("auto", "copy", "none"):
        assert (
            specedit("rewrite", source, "-i", ADD_INSTRUCTION, "--model", memorising_model_dir, "--draft", draft) == 0
        )
        assert capsys.readouterr().out == ADD_ANSWER
    assert source.read_text() == ADD


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--draft", "bogus"], "--draft must be one of auto, copy, fallback, none, got 'bogus'"),
        (["--draft-layers", "0", "--draft-model", "x"], "not both"),
        (["--draft-layers", "0", "--p-min", "1.5"], "p_min must be in [0, 1)"),
    ],
)
def test_bad_draft_options_fail_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    assert specedit("rewrite", source, "-i", "x", "--model", tmp_path / "never-loaded", *flags) == 2
    assert message in capsys.readouterr().err


def test_layer_skip_bad_layers_and_a_missing_calibration(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    model = ["--model", memorising_model_dir]
    assert specedit("rewrite", source, "-i", "x", *model, "--draft-layers", "1") == 6
    assert "must keep layer 0" in capsys.readouterr().err
    assert specedit("rewrite", source, "-i", "x", *model, "--draft-layers", "0-7") == 6
    assert "layer numbers must be in 0..1" in capsys.readouterr().err
    assert specedit("rewrite", source, "-i", "x", "--model", tmp_path, "--draft-layers", "auto") == 6
    assert "not a model folder" in capsys.readouterr().err


def test_calibrate_then_rewrite_with_layer_skip(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(memorising_model_dir, model)
    sample = tmp_path / "sample.py"
    sample.write_text(ADD * 10)
    assert specedit("rewrite", sample, "-i", "x", "--model", model, "--draft-layers", "auto") == 6
    assert "run `specedit calibrate` first" in capsys.readouterr().err

    assert specedit("calibrate", "--model", model, "--sample", sample, "--tokens", "64", "--p-min", "0") == 0
    out = capsys.readouterr().out
    assert out.startswith("layers 0: agreement") and "saved to" in out
    saved = json.loads((model / "specedit-layers.json").read_text())
    assert saved["layers"] == [0] and saved["sample_tokens"] == 64 and 0.0 <= saved["acceptance"] <= 1.0
    assert saved["candidates"][0]["kept"] == "0"

    source, stats = tmp_path / "add.py", tmp_path / "stats.json"
    source.write_text(ADD)
    arguments = ["-i", ADD_INSTRUCTION, "--model", model, "--p-min", "0", "--stats", stats]
    assert specedit("rewrite", source, *arguments, "--draft-layers", "auto") == 0
    assert capsys.readouterr().out == ADD_ANSWER  # the same answer
    assert set(json.loads(stats.read_text())["drafters"]) == {"copy", "context", "layers"}


def test_model_fetch_names_the_known_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert specedit("model", "fetch", "no-such-model") == 3
    assert "known: qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct" in capsys.readouterr().err


def test_in_place_keeps_a_backup_and_stats_are_written(tmp_path: Path, memorising_model_dir: Path) -> None:
    source, stats = tmp_path / "add.py", tmp_path / "stats.json"
    source.write_text(ADD)
    source.chmod(0o640)
    assert (
        specedit(
            "rewrite", source, "-i", ADD_INSTRUCTION, "--model", memorising_model_dir, "--in-place", "--stats", stats
        )
        == 0
    )
    assert source.read_text() == ADD_ANSWER
    assert (tmp_path / "add.py.orig").read_text() == ADD
    assert source.stat().st_mode & 0o777 == 0o640
    figures = json.loads(stats.read_text())
    for key in (
        "generated_tokens",
        "target_forwards",
        "drafted_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "mean_accepted_length",
        "accepted_length_histogram",
        "prefill_seconds",
        "wall_seconds",
        "cpu_seconds",
        "tokens_per_second",
    ):
        assert key in figures
    assert figures["finish_reason"] == "stop"
    assert 0 < figures["prefill_seconds"] < figures["first_text_seconds"] <= figures["wall_seconds"]
    assert figures["target_forwards"] < figures["generated_tokens"]  # the copy drafter saved forwards
    assert figures["exactness"]["claim"] == "bitwise"  # what the self-check at load found
    assert leftovers(tmp_path) == []


def test_several_files_in_place_without_backup(tmp_path: Path, memorising_model_dir: Path) -> None:
    first, second = tmp_path / "xy.py", tmp_path / "xy2.py"
    first.write_text(XY)
    second.write_text(XY)
    assert (
        specedit(
            "rewrite", first, second, "-i", XY_INSTRUCTION, "--model", memorising_model_dir, "--in-place", "--no-backup"
        )
        == 0
    )
    assert first.read_text() == second.read_text() == XY_ANSWER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["xy.py", "xy2.py"]


def test_lines_rewrite_only_the_region(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head, tail = "#!/usr/bin/env python\r\n# keep\tthis\n", "\n\n# and this, with no final newline"
    source = tmp_path / "mixed.py"
    source.write_bytes((head + ADD + tail).encode())
    assert specedit("rewrite", source, "-i", ADD_INSTRUCTION, "--lines", "3:4", "--model", memorising_model_dir) == 0
    assert capsys.readouterr().out == head + ADD_ANSWER + tail
    assert (
        specedit(
            "rewrite",
            source,
            "-i",
            ADD_INSTRUCTION,
            "--lines",
            "3:4",
            "--model",
            memorising_model_dir,
            "-o",
            tmp_path / "out.py",
        )
        == 0
    )
    assert (tmp_path / "out.py").read_bytes() == (head + ADD_ANSWER + tail).encode()


def test_crlf_and_non_ascii_survive(tmp_path: Path, memorising_model_dir: Path) -> None:
    source = tmp_path / "crlf.py"
    source.write_bytes(CRLF.encode())
    assert specedit("rewrite", source, "-i", CRLF_INSTRUCTION, "--model", memorising_model_dir, "--in-place") == 0
    assert source.read_bytes() == "print('héllo 🙂')\r\nz = 5\r\n".encode()


def test_diff_and_stdin(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "xy.py"
    source.write_text(XY)
    assert specedit("rewrite", source, "-i", XY_INSTRUCTION, "--model", memorising_model_dir, "--diff") == 0
    diff = capsys.readouterr().out
    assert "-y = 2\n+y = 3\n" in diff and diff.startswith("--- a/")
    with (tmp_path / "stdin").open("w+b") as handle:
        handle.write(XY.encode())
        handle.seek(0)
        monkeypatch.setattr(sys, "stdin", os.fdopen(os.dup(handle.fileno()), "r"))
        assert (
            specedit("rewrite", "-", "-i", XY_INSTRUCTION, "--language", "python", "--model", memorising_model_dir) == 0
        )
    assert capsys.readouterr().out == XY_ANSWER


# --- failures never touch the file --------------------------------------------------------------------


def test_an_unfinished_answer_writes_nothing(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    code = specedit("rewrite", source, "-i", "x", "--model", tiny_model_dir, "--in-place", "--max-new-tokens", "5")
    assert code == 8
    assert "without finishing the code" in capsys.readouterr().err
    assert source.read_text() == ADD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_speculation_does_not_change_the_streamed_text(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD * 3)
    outputs = []
    for draft in ("copy", "none"):
        specedit(
            "rewrite",
            source,
            "-i",
            "x",
            "--model",
            tiny_model_dir,
            "--dtype",
            "float64",
            "--draft",
            draft,
            "--max-new-tokens",
            "40",
            "--temperature",
            "0.8",
            "--seed",
            "3",
        )
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0]


def test_interrupt_leaves_the_file_untouched(tmp_path: Path, tiny_model_dir: Path) -> None:
    source = tmp_path / "a.py"
    source.write_text(ADD)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specedit.cli.main",
            "-v",
            "rewrite",
            str(source),
            "-i",
            "x",
            "--model",
            str(tiny_model_dir),
            "--in-place",
            "--max-new-tokens",
            "100000",
            "--draft",
            "none",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a test run started in the background (`... &`) ignores SIGINT, and so would
        # the rewrite (Python leaves an ignored SIGINT ignored).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    for line in process.stderr:  # wait until the model is generating
        if "rewriting" in line:
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted; nothing was written" in err
    assert source.read_text() == ADD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_the_status_line_says_what_a_rewrite_waits_for_then_its_decoding_rate() -> None:
    progress = RewriteProgress("a.py", enabled=False)
    assert progress.describe(0.4) == "reading the file · 0.4 s"
    progress.show(Phase("loading"))
    assert progress.describe(3.2) == "loading the model · 3 s"
    progress.show(Phase("queued", 2))
    assert progress.describe(4.0) == "waiting for 2 other rewrite(s) · 4 s"
    progress.show(Phase("started"))

    def step(number: int, generated: int) -> Step:
        return Step(number, 100 + generated, 99 + generated, 4, 3, generated, 4 * number, 3 * number, 1.0)

    progress.show(step(1, 10))
    assert progress.describe(5.0) == "10 tokens, … tok/s, draft acceptance 75%, 5.0 s"
    progress._decoding.first = (time.perf_counter() - 2.0, 10)  # two seconds after the first step
    progress.show(step(2, 30))
    assert progress.describe(7.0).startswith("30 tokens, 10.0 tok/s, draft acceptance 75%")  # the load is not in it


def test_on_a_terminal_the_status_line_goes_to_stderr_and_the_rewrite_to_stdout(
    tmp_path: Path, memorising_model_dir: Path
) -> None:
    """stderr a terminal, stdout a pipe (`specedit rewrite f.py -i ... > new.py`): the status line says
    what happens, the model loading included, and the rewrite reaches stdout whole (the live line once
    swallowed it)."""
    import pty
    import re
    import select

    source = tmp_path / "add.py"
    source.write_text(ADD)
    terminal, child = pty.openpty()
    command = [sys.executable, "-m", "specedit.cli.main", "rewrite", str(source), "-i", ADD_INSTRUCTION]
    command += ["--model", str(memorising_model_dir), "--dtype", "float32", "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=child)
    os.close(child)
    shown = b""
    while True:
        ready, _, _ = select.select([terminal], [], [], 0.2)
        try:
            data = os.read(terminal, 65536) if ready else b""
        except OSError:  # the child closed the terminal
            break
        shown += data
        if not data and process.poll() is not None:
            break
    os.close(terminal)
    assert process.stdout is not None
    assert process.stdout.read().decode() == ADD_ANSWER
    assert process.wait(60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    assert re.search(r"loading the model · \d+ s", text) and re.search(r"\d+\s+tokens,", text), text[-2000:]


def test_an_empty_answer_is_never_written(tmp_path: Path, memorising_model_dir: Path) -> None:
    """A model that closes its answer at once would empty the file, exit 0: it is refused (exit 12, the file
    as it was, no backup left); asked for with --allow-empty, it is written."""
    from conftest import EMPTY_ANSWER

    original, instruction, _ = EMPTY_ANSWER
    source = tmp_path / "total.py"
    source.write_text(original)
    command = ["rewrite", str(source), "-i", instruction, "--model", str(memorising_model_dir), "--no-progress"]
    assert main([*command, "--in-place"]) == EmptyAnswerError.exit_code == 12
    assert source.read_text() == original and sorted(p.name for p in tmp_path.iterdir()) == ["total.py"]
    assert main([*command, "-o", str(tmp_path / "out.py")]) == 12 and not (tmp_path / "out.py").exists()
    assert main([*command, "--in-place", "--allow-empty"]) == 0
    assert source.read_text() == "" and (tmp_path / "total.py.orig").read_text() == original


def test_a_whole_chat_answer_applies_its_code_alone(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--sketch answer.md` holding a chat model's whole answer: its code is merged (by its lines here),
    no prose or fence reaches the file; an answer whose code is for another file is refused by name."""
    from conftest import LINES_SKETCH

    original, sketch, merged = LINES_SKETCH
    source, answer = tmp_path / "add.py", tmp_path / "answer.md"
    source.write_text(original)
    answer.write_text(f'Here\'s the refactor:\n\n```python title="add.py"\n{sketch}```\n\nThe rest is unchanged.\n')
    common = ["rewrite", str(source), "--sketch", str(answer), "--model", str(memorising_model_dir), "--no-progress"]
    assert main([*common, "--stats", str(tmp_path / "stats.json")]) == 0
    assert capsys.readouterr().out == merged
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["merge"] == "lines" and stats["sketch_from"] == "a chat answer: 1 fenced block"
    assert main([*common, "--in-place", "--no-backup"]) == 0 and source.read_text() == merged
    answer.write_text(f"**lib/other.py**\n```python\n{sketch}```\n")
    assert main([*common, "--in-place"]) == 3
    assert "the answer's code is for lib/other.py, not " in capsys.readouterr().err
    assert source.read_text() == merged and not (tmp_path / "add.py.orig").exists()


def test_serve_status_with_no_daemon_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime folder where no daemon ever started has no `specedit/` in it: that is "no daemon", not
    a folder to refuse."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert specedit("serve", "--status") == 7
    error = capsys.readouterr().err
    assert "no engine daemon answers" in error and "cannot use the socket folder" not in error, error
