"""The VS Code extension (editors/vscode): its names agree with the server's, it packages, and its own tests
pass in a real VS Code against the real language server.

The editor tests need what `scripts/vscode-setup.sh` installs (code-server's VS Code, chromium, the
extension's node packages). Without it they are skipped, saying so; with `SPECEDIT_REQUIRE_EDITORS=1`
(CI) a missing set-up fails them instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specedit.lsp.config import Settings
from specedit.lsp.protocol import NAMES

REPO = Path(__file__).resolve().parents[1]
EXTENSION = REPO / "editors" / "vscode"
CACHE = Path(os.environ.get("SPECEDIT_VSCODE_CACHE", REPO / "build" / "vscode-headless"))
CODE_SERVER = CACHE / "code-server-4.100.3" / "node_modules" / "code-server" / "out" / "node" / "entry.js"
RUN_TIMEOUT = 480  # s for the whole run in VS Code (measured: ~100 s on 2 idle cores, ~190 s at load 8)


@pytest.fixture(scope="session")
def vscode_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest's memorising model, with GUARDED_REWRITE memorised too (for the guard's test)."""
    from conftest import GUARDED_REWRITE, build_tokenizer, train_memorising_model

    path = tmp_path_factory.mktemp("memorising-gpt2-vscode")
    tokenizer = build_tokenizer()
    train_memorising_model(tokenizer, extra=[GUARDED_REWRITE]).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def typescript_names() -> dict[str, object]:
    """`NAMES` of src/protocol.ts, read as JSON (the object literal is written JSON-like on purpose)."""
    source = (EXTENSION / "src" / "protocol.ts").read_text(encoding="utf-8")
    match = re.search(r"export const NAMES = (\{.*?\}) as const;", source, re.DOTALL)
    assert match, "src/protocol.ts declares `export const NAMES = {...} as const;`"
    literal = re.sub(r"^(\s*)(\w+):", r'\1"\2":', match.group(1), flags=re.MULTILINE)  # quote the keys
    literal = re.sub(r",(\s*[\]}])", r"\1", literal.replace("'", '"'))  # JSON strings, no trailing commas
    return json.loads(literal)


def test_typescript_protocol_names_are_the_servers() -> None:
    assert typescript_names() == NAMES


def _missing(*paths: Path) -> str | None:
    if shutil.which("node") is None:
        return "node"
    return next((str(path) for path in paths if not path.exists()), None)


def _require(*paths: Path) -> None:
    missing = _missing(*paths)
    if missing is None:
        return
    reason = f"the VS Code tests need scripts/vscode-setup.sh to have run ({missing} is missing)"
    if os.environ.get("SPECEDIT_REQUIRE_EDITORS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run `command` in its own process group; on timeout, TERM it (its traps end code-server), then KILL."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        return 124, output
    return process.returncode, output


def test_the_server_takes_every_setting_the_extension_declares(caplog: pytest.LogCaptureFixture) -> None:
    """The extension sends its whole `specedit` section (package.json's settings, at their defaults) as
    initializationOptions: the server takes each, its own or the editor's, and warns of none."""
    declared = json.loads((EXTENSION / "package.json").read_text(encoding="utf-8"))["contributes"]["configuration"]
    section: dict[str, object] = {}
    for name, schema in declared["properties"].items():
        *parents, key = name.removeprefix("specedit.").split(".")
        nested = section
        for parent in parents:
            nested = nested.setdefault(parent, {})  # type: ignore[assignment]
        nested[key] = schema.get("default")
    with caplog.at_level(logging.WARNING, logger="specedit.lsp.config"):
        settings = Settings().merged(section)
    assert caplog.messages == []
    assert settings == Settings()  # the defaults are the server's own


def test_the_extension_in_vscode(vscode_model_dir: Path, endless_model_dir: Path) -> None:
    """editors/vscode/src/test/*.test.ts: live, preview accepted and rejected, cancel, in VS Code 1.100."""
    _require(CODE_SERVER, EXTENSION / "node_modules" / "vscode-languageclient")
    env = {
        **os.environ,
        "SPECEDIT_VSCODE_PYTHON": sys.executable,
        "SPECEDIT_VSCODE_MODEL": str(vscode_model_dir),
        "SPECEDIT_VSCODE_ENDLESS_MODEL": str(endless_model_dir),
        "SPECEDIT_VSCODE_TIMEOUT": str(RUN_TIMEOUT),
        "SPECEDIT_VSCODE_CACHE": str(CACHE),
    }
    returncode, output = _run([str(REPO / "scripts" / "vscode-test.sh")], cwd=REPO, env=env, timeout=RUN_TIMEOUT + 60)
    assert returncode == 0, output[-12000:]
    assert re.search(r"\d+ passing", output) and "failing" not in output and "pending" not in output, output[-12000:]


def test_the_extensions_sketch_cases_are_conftests() -> None:
    """rewrite.test.ts carries copies of ECHOED_SKETCH (the memorising model's echoed sketch), LINES_SKETCH
    (merged by its lines) and GUARDED_REWRITE."""
    from conftest import ECHOED_SKETCH, GUARDED_REWRITE, LINES_SKETCH

    source = (EXTENSION / "src" / "test" / "rewrite.test.ts").read_text(encoding="utf-8")
    for text in (*ECHOED_SKETCH[:2], *LINES_SKETCH, *GUARDED_REWRITE):
        assert f"'{text.encode('unicode_escape').decode()}'" in source


def test_the_extension_packages_as_a_vsix() -> None:
    _require(EXTENSION / "node_modules" / ".bin" / "vsce")
    returncode, output = _run(["npm", "run", "package"], cwd=EXTENSION, env=dict(os.environ), timeout=180)
    assert returncode == 0, output[-6000:]
    with zipfile.ZipFile(EXTENSION / "dist" / "specedit.vsix") as vsix:
        names = set(vsix.namelist())
        manifest = json.loads(vsix.read("extension/package.json"))
    assert {"extension/package.json", "extension/dist/extension.js"} <= names
    assert not any("node_modules" in name or "/src/" in name for name in names), sorted(names)
    assert manifest["engines"]["vscode"] == "^1.100.0"
    assert "*" not in manifest["activationEvents"]
