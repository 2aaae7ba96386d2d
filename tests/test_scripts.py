"""The scripts stay in step with the code they import: every name they take from specedit exists.

The scripts are not type-checked with the package, and most need the real model to run, so a moved or
renamed module would show only when someone measures. This reads each script's imports and looks them up.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


def specedit_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each `from specedit... import name`, and (module, None) for `import specedit...`."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specedit"):
            found.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names if alias.name.startswith("specedit"))
    return found


def test_the_scripts_are_found_and_import_specedit() -> None:
    assert len(SCRIPTS) > 10
    assert any(specedit_imports(path) for path in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_name_a_script_imports_from_specedit_exists(script: Path) -> None:
    missing = []
    for module_name, name in specedit_imports(script):
        module = importlib.import_module(module_name)
        if name is not None and not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")  # a submodule
            except ModuleNotFoundError:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports what is not there: {missing}"
