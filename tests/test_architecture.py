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


# The rooms, highest first (STYLE.md, 9): a module imports only from its own room and the rooms below it.
# A module is in the room of the longest prefix that names it.
ROOMS = (
    (
        "front ends",
        (
            "specedit.cli",
            "specedit.lsp",
            "specedit.engine.ops",
            "specedit.engine.serving.daemon",
            "specedit.engine.serving.cluster_deploy",
            "specedit.engine.http",
        ),
    ),
    ("the session", ("specedit.engine.session",)),
    ("backends and their transports", ("specedit.engine.serving",)),
    (
        "the loop and the merge",
        (
            "specedit.engine.loop",
            "specedit.engine.merge",
            "specedit.engine.merge_checks",
            "specedit.engine.chat_answer",
            "specedit.engine.placement",
            "specedit.engine.anchors",
            "specedit.engine.edges",
        ),
    ),
    ("drafters", ("specedit.drafters",)),
    ("the model", ("specedit.engine.model", "specedit.engine.loop.sampling")),
    ("records", ("specedit.engine",)),  # requests, events, the wire, errors, options, prompts, patches
)


def room_of(module: str) -> int:
    """The index of `module`'s room in ROOMS (0 is the highest)."""
    matches = [
        (len(prefix), number)
        for number, (_, prefixes) in enumerate(ROOMS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no room"
    return max(matches)[1]


def test_room_of() -> None:
    assert ROOMS[room_of("specedit.engine.serving.daemon")][0] == "front ends"
    assert ROOMS[room_of("specedit.engine.serving.local")][0] == "backends and their transports"
    assert ROOMS[room_of("specedit.engine.loop.sampling")][0] == "the model"
    assert ROOMS[room_of("specedit.engine.events")][0] == "records"


def test_rooms_read_in_one_direction() -> None:
    """Front ends above the session, the session above the backends and the loop, the loop above the
    drafters and the model: a module that imports from a room above its own is in the wrong room."""
    found = modules()
    upward = [
        f"{name} ({ROOMS[room_of(name)][0]}) imports {target} ({ROOMS[room_of(target)][0]})"
        for name, path in found.items()
        for target in imports_of(path, name, set(found))
        if room_of(target) < room_of(name)
    ]
    assert not upward, "\n".join(upward)
