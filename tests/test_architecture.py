"""The package's shape: no import cycles among specedit's modules, and the light modules stay light.

Imports are read from the installed package's source (every `import` statement, at the top, under
`TYPE_CHECKING` or inside a function: a cycle through a lazy import is still a cycle a reader has to
untangle), not by importing it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import specedit.cli
import specedit.drafters
import specedit.engine
import specedit.lsp

PACKAGES = {
    package.__name__: Path(package.__file__).parent
    for package in (specedit.engine, specedit.drafters, specedit.lsp, specedit.cli)
    if package.__file__
}


def modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name -> source file."""
    found = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            dotted = ".".join((name, *parts))
            found[dotted.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The specedit modules `path` (module `name`) imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from package import module`
    return {target for target in targets if target in known and target != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in `graph` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    found = modules()
    graph = {name: imports_of(path, name, set(found)) for name, path in found.items()}
    assert {"specedit.engine.loop.generate", "specedit.lsp.server"} <= set(graph)  # the walk sees the tree
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_clients_start_without_torch() -> None:
    """The command line's parser, the language server and the daemon's client import neither torch nor
    transformers: an editor's language server starts in a fraction of a second."""
    light = [
        "specedit.cli.main",
        "specedit.lsp.server",
        "specedit.engine.session",
        "specedit.engine.serving.client",
        "specedit.engine.serving.protocol",
    ]
    code = "import sys\n" + "".join(f"import {name}\n" for name in light)
    code += "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
