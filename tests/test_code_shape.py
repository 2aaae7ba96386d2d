"""The code stays readable: no source file a reader cannot finish, and no run log in its comments.

A source file holds at most `MAX_LINES` lines; past that it is split by topic. A comment says why, and a
constant may name where it was measured, but no line of code holds a date: history lives in git.
"""

from __future__ import annotations

from pathlib import Path

from test_docs import FULL_DATE, SHORT_DATE

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 600
# The source the project writes, by folder and kind (vendored and generated files are not in these).
SOURCES = {
    "engine": ("*.py", "*.cpp", "*.h"),
    "drafters": ("*.py",),
    "lsp": ("*.py",),
    "editors/cli": ("*.py",),
    "editors/nvim/lua": ("*.lua",),
    "editors/nvim/plugin": ("*.lua", "*.vim"),
    "editors/vscode/src": ("*.ts",),
    "scripts": ("*.py", "*.sh"),
    "tests": ("*.py",),
}
# This file's sibling defines the date patterns with examples of them.
DATE_EXAMPLES = REPO / "tests" / "test_docs.py"


def source_files() -> list[Path]:
    found: set[Path] = set()
    for folder, patterns in SOURCES.items():
        for pattern in patterns:
            found.update(path for path in (REPO / folder).rglob(pattern) if "node_modules" not in path.parts)
    return sorted(found)


def test_the_sources_are_found() -> None:
    names = {path.name for path in source_files()}
    assert {"kernels.cpp", "kernels.h", "daemon.py", "init.lua", "extension.ts", "test_code_shape.py"} <= names


def test_no_source_file_is_over_the_limit() -> None:
    long = {
        str(path.relative_to(REPO)): lines
        for path in source_files()
        if not path.is_relative_to(REPO / "tests")  # a test file holds its cases, however many
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_line_of_code_holds_a_date() -> None:
    dated = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in source_files()
        if path != DATE_EXAMPLES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if FULL_DATE.search(line) or SHORT_DATE.search(line)
    ]
    assert dated == []
