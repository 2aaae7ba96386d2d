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

import pytest

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
        "specedit.engine.session.session",
        "specedit.engine.backends.client",
        "specedit.engine.backends.protocol",
    ]
    code = "import sys\n" + "".join(f"import {name}\n" for name in light)
    code += "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


# The rooms, highest first (STYLE.md, 9): a module imports only from its own room and the rooms below it.
# Each room is one folder or more; a module is in the room of the folder that holds it.
ROOMS = (
    ("the command line and the language server", ("specedit.cli", "specedit.lsp")),
    ("the doors", ("specedit.engine.doors",)),
    ("the session", ("specedit.engine.session",)),
    ("backends", ("specedit.engine.backends",)),
    ("the loop", ("specedit.engine.loop",)),
    ("drafters", ("specedit.drafters",)),
    ("the model", ("specedit.engine.model",)),
    ("the store", ("specedit.engine.store",)),
    # The session reads a request's sketch (`sketch.Sketch`); the sketch reads the records' requests and
    # raises their errors.
    ("sketches", ("specedit.engine.sketch",)),
    ("records", ("specedit.engine.records",)),
)
# engine/ holds the rooms and no module of its own: its `__init__` is their map and imports none of them,
# so any room may import it.
ENGINE = "specedit.engine"


def room_of(module: str) -> int:
    """The index of `module`'s room in ROOMS (0 is the highest)."""
    matches = [
        number
        for number, (_, folders) in enumerate(ROOMS)
        for folder in folders
        if module == folder or module.startswith(folder + ".")
    ]
    assert len(matches) == 1, f"{module} is in no room"
    return matches[0]


def test_room_of() -> None:
    assert ROOMS[room_of("specedit.engine.doors.daemon")][0] == "the doors"
    assert ROOMS[room_of("specedit.engine.doors.http.door")][0] == "the doors"
    assert ROOMS[room_of("specedit.engine.backends.local")][0] == "backends"
    assert ROOMS[room_of("specedit.engine.model.sampling")][0] == "the model"
    assert ROOMS[room_of("specedit.engine.store.fetch")][0] == "the store"
    assert ROOMS[room_of("specedit.engine.sketch.merge")][0] == "sketches"
    assert ROOMS[room_of("specedit.engine.records.events")][0] == "records"
    with pytest.raises(AssertionError, match="in no room"):
        room_of("specedit.engine.loose")  # a module beside the rooms, not in one


def test_every_module_is_in_a_room() -> None:
    """engine/ holds nothing beside its rooms' folders: each module is in one room, each room holds some,
    and the engine's `__init__` imports none of them."""
    found = modules()
    assert imports_of(found[ENGINE], ENGINE, set(found)) == set()
    rooms = {name: room_of(name) for name in found if name != ENGINE}  # room_of fails on a module in none
    assert {ROOMS[number][0] for number in rooms.values()} == {name for name, _ in ROOMS}


def test_rooms_read_in_one_direction() -> None:
    """Front ends above the session, the session above the backends, the backends above the loop, the
    loop above the drafters and the model, the model above the store, the sketches below them, and the
    records below them all: a module that imports from a room above its own is in the wrong room."""
    found = modules()
    upward = [
        f"{name} ({ROOMS[room_of(name)][0]}) imports {target} ({ROOMS[room_of(target)][0]})"
        for name, path in found.items()
        if name != ENGINE
        for target in imports_of(path, name, set(found)) - {ENGINE}  # (`bench_command` reads its folder)
        if room_of(target) < room_of(name)
    ]
    assert not upward, "\n".join(upward)


def test_kept_descriptions_name_sources_that_exist() -> None:
    """A kept description is named after the sources that could change its meaning (`torchless.SOURCES`,
    read beside `torchless.py`): a module moved out of the model's folder must leave the list, or every
    load would fail to find it."""
    from specedit.engine.model import torchless

    folder = Path(torchless.__file__).parent
    assert [name for name in torchless.SOURCES if not (folder / name).is_file()] == []
    # The kernels' C++ is compiled into the library a description names: every file of it counts.
    kernel_sources = sorted(path.name for path in folder.iterdir() if path.suffix in {".cpp", ".h"})
    assert sorted(name for name in torchless.SOURCES if name.endswith((".cpp", ".h"))) == kernel_sources


def test_kernels_are_keyed_by_and_ship_every_source() -> None:
    """The kernels' library is keyed by every C++ file it is compiled from (`kernels.SOURCES`), and the
    package ships each of them: a file left out would compile stale, or not at all once installed."""
    import re

    from specedit.engine.model import kernels

    folder = Path(kernels.__file__).parent
    on_disk = sorted(path.name for path in folder.iterdir() if path.suffix in {".cpp", ".h"})
    assert sorted(path.name for path in kernels.SOURCES) == on_disk
    assert kernels.UNIT in kernels.SOURCES
    project = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    package_data = re.search(r'^"specedit\.engine\.model" = \[(.*)\]', project, re.MULTILINE)
    assert package_data is not None, "pyproject.toml ships no package data for specedit.engine.model"
    shipped = re.findall(r'"([^"]+)"', package_data.group(1))
    assert [name for name in on_disk if not any(Path(name).match(pattern) for pattern in shipped)] == []
