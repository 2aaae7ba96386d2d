"""An answer to an edit sketch is written only when it is a merge: the failure modes users met, caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.engine.merge_checks import check_merge, is_elision

from conftest import ECHOED_SKETCH

ORIGINAL = """\
import os


def load(path):
    with open(path) as handle:
        return handle.read()


def display_output(text):
    for line in text.splitlines():
        print(line)


def main():
    display_output(load(os.environ["FILE"]))
"""

SKETCH = """\
# ... existing code ...

def load(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()

# ... existing code ...
"""

MERGED = ORIGINAL.replace("open(path)", 'open(path, encoding="utf-8")')


def test_a_merge_passes() -> None:
    assert check_merge(ORIGINAL, SKETCH, MERGED).ok


def test_an_echoed_sketch_is_caught() -> None:
    check = check_merge(ORIGINAL, SKETCH, SKETCH)
    assert check.markers == ["# ... existing code ...", "# ... existing code ..."]
    assert "display_output(text):" in " ".join(check.dropped)


def test_code_the_sketch_did_not_touch_must_survive() -> None:
    answer = MERGED.replace("def display_output(text):\n    for line in text.splitlines():\n        print(line)\n", "")
    check = check_merge(ORIGINAL, SKETCH, answer)
    assert check.dropped == ["def display_output(text):", "for line in text.splitlines():", "print(line)"]
    assert not check.markers and not check.missing


def test_an_ignored_change_is_caught() -> None:
    check = check_merge(ORIGINAL, SKETCH, ORIGINAL)
    assert check.missing == ['with open(path, encoding="utf-8") as handle:']
    assert "leaves out lines the sketch adds" in check.describe()


def test_a_chunk_may_change_and_delete_what_it_spans() -> None:
    """The chunk spans `load` (its first and last lines match): the body it replaces is not 'dropped'."""
    sketch = "# ...\n\ndef load(path):\n    return Path(path).read_text()\n\n# ...\n"
    answer = ORIGINAL.replace(
        "    with open(path) as handle:\n        return handle.read()\n", "    return Path(path).read_text()\n"
    )
    assert check_merge(ORIGINAL, sketch, answer).ok


def test_a_changed_line_is_located_by_likeness() -> None:
    """The sketch's first chunk changes the import line (no exact match): it still stands at the top, and
    the chunk after the last marker covers the file's end."""
    original = 'from api import App\n\napp = App()\n\n@app.get("/")\ndef root():\n    return {"hello": "world"}\n'
    sketch = (
        'from api import App, HTTPError\n\n# ... same ...\n\n@app.get("/")\ndef root():\n    raise HTTPError(404)\n'
    )
    answer = original.replace("App\n", "App, HTTPError\n", 1).replace(
        'return {"hello": "world"}', "raise HTTPError(404)"
    )
    assert check_merge(original, sketch, answer).ok


def test_a_sketch_without_markers_covers_what_it_spans() -> None:
    original = "class Hello:\n    def hello(self):\n        return 'hi'\n\n\n"
    original += "class Bye:\n    def bye(self):\n        return 'bye'\n"
    sketch = "class Bye:\n    def bye(self):\n        return 'au revoir'\n"
    assert check_merge(original, sketch, original.replace("'bye'", "'au revoir'")).ok
    assert not check_merge(original, sketch, sketch).ok  # the answer lost class Hello


def test_a_sketch_that_is_one_block_covers_its_last_lines() -> None:
    """A sketch with no markers that is one method whole ("the method, changed") may delete the last lines
    of that method past its own lines, up to `BLOCK_DROPS` (a line the edit deleted there); more, or past
    the method, is code it does not show."""
    tail = '        log("done")\n'
    original = "class A:\n    def run(self):\n        self.start()\n        self.wait()\n{}\n    def stop(self):\n"
    original += "        self.halt()\n"
    sketch = "    def run(self):\n        self.start()\n        self.wait(5)\n"
    answer = original.format("").replace("self.wait()", "self.wait(5)")
    assert check_merge(original.format(tail), sketch, answer).ok
    assert not check_merge(original.format(tail * 4), sketch, answer).ok
    assert not check_merge(original.format(tail), sketch, answer.replace("        self.halt()\n", "")).ok


def test_a_chunk_without_a_marker_after_it_does_not_cover_the_files_end() -> None:
    """A chat model leaves the last marker out ("here is the updated method:"): a merge that deletes what
    follows the chunk was never asked for. Up to `EDGE_DROPS` lines past it may go (a sketch's new last
    line replacing the file's)."""
    original = "def a():\n    return 1\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 3\n"
    sketch = "# ... existing code ...\ndef b():\n    return 20\n"
    assert check_merge(original, sketch, original.replace("return 2", "return 20")).ok
    answer = "def a():\n    return 1\n\n\ndef b():\n    return 20\n"  # def c() deleted
    check = check_merge(original, sketch, answer)
    assert not check.ok and check.dropped == ["def c():", "return 3"] and "drops code" in check.describe()
    longer = original + "\n\ndef d():\n    return 4\n"
    assert not check_merge(longer, sketch, answer).ok


def test_a_method_shown_whole_covers_nothing_past_it() -> None:
    """aider's commands (commit cbb3d4f15f17): `cmd_add` shown whole with a new loop, no marker after it.
    Its new lines are like `cmd_ls`'s after it (`abs_file_path = ...`, `self.console.print(...)`), and the
    chunk's span, stretched to the lines most alike, took `cmd_ls` in: a merge deleting it passed. A chunk
    that shows a block whole changes nothing outside that block."""
    loop = (
        "        for name in {0}:\n            abs_file_path = os.path.abspath(os.path.join(self.root, name))\n"
        '            if abs_file_path in self.fnames:\n                self.console.print(f"{1} {{name}}")\n'
    )
    original = (
        "class Commands:\n    def cmd_add(self, args):\n        files = self.get_active_files()\n\n"
        "    def cmd_ls(self, args):\n        files = self.get_active_files()\n" + loop.format("files", "*")
    )
    sketch = (
        "    # ... same ...\n    def cmd_add(self, args):\n        files = self.get_active_files()\n"
        + loop.format("args", "[red]Added")
    )
    answer = original.replace("        files = self.get_active_files()\n\n", sketch.split("\n", 2)[2] + "\n", 1)
    assert check_merge(original, sketch, answer).ok
    cut = answer[: answer.index("    def cmd_ls")]  # the file ending where the sketch does
    check = check_merge(original, sketch, cut)
    assert not check.ok and "def cmd_ls(self, args):" in check.dropped


@pytest.mark.parametrize(
    "line",
    [
        "// ... existing code ...",
        "# ... (same as before)",
        "...",
        "  /* rest of the file unchanged */",
        "-- ...",
        "<!-- ... -->",
        "# ... other methods ...",
        "// rest of code unchanged",
        "// (unchanged)",
        "/* ... */",
        "// ... keep existing code ...",
        "# ... rest of the file unchanged ...",
        "    // ...",
    ],
)
def test_elision_markers(line: str) -> None:
    assert is_elision(line)


@pytest.mark.parametrize(
    "line",
    [
        "print(*args, ...)",
        "return [...items]",
        "# a comment",
        "x = ...  # default",
        " * @param {...number} values - the numbers",
        "# keep the header unchanged",
        "// TODO: retry ... then give up",
    ],
)
def test_code_is_not_a_marker(line: str) -> None:
    assert not is_elision(line)


def test_the_command_line_writes_no_echoed_sketch(tmp_path: Path, memorising_model_dir: Path) -> None:
    original, sketch, _ = ECHOED_SKETCH
    source, sketch_file, output = tmp_path / "add.py", tmp_path / "sketch.py", tmp_path / "out.py"
    source.write_text(original)
    sketch_file.write_text(sketch)
    common = ["rewrite", str(source), "--sketch", str(sketch_file), "--model", str(memorising_model_dir)]
    assert main([*common, "--no-progress", "-o", str(output)]) == 11
    assert not output.exists()
    assert main([*common, "--no-progress", "--in-place"]) == 11
    assert source.read_text() == original and not (tmp_path / "add.py.orig").exists()
