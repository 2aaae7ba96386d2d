"""Edits written as patches (unified diffs, SEARCH/REPLACE blocks, V4A patches): found in the text, placed
by their lines as models get them wrong, checked like sketches, and never written into the file verbatim."""

from __future__ import annotations

import doctest
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.engine.sketch import patches
from specedit.engine.sketch.merge import merge_sketch
from specedit.engine.sketch.merge_checks import check_merge
from specedit.engine.sketch.patches import apply_patch, detect, parse_patch

from conftest import handlers

ORIGINAL = """\
import os


def load(path):
    with open(path) as f:
        return f.read()


def save(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    print(load("a.txt"))
"""
# The edit every patch below makes: both `open` calls get an encoding, and main prints a second file.
EDITED = (
    ORIGINAL.replace("open(path)", "open(path, encoding='utf-8')")
    .replace('open(path, "w")', "open(path, \"w\", encoding='utf-8')")
    .replace('print(load("a.txt"))', 'print(load("a.txt"))\n    print(load("b.txt"))')
)

UDIFF_EXACT = """\
--- a/files.py
+++ b/files.py
@@ -4,3 +4,3 @@
 def load(path):
-    with open(path) as f:
+    with open(path, encoding='utf-8') as f:
         return f.read()
@@ -9,7 +9,8 @@
 def save(path, text):
-    with open(path, "w") as f:
+    with open(path, "w", encoding='utf-8') as f:
         f.write(text)
{space}

 def main():
     print(load("a.txt"))
+    print(load("b.txt"))
""".format(space=" ")  # a blank context line, with its space


def applied(sketch: str, original: str = ORIGINAL) -> str:
    merge = merge_sketch(original, sketch)
    assert merge.resolved, merge.unresolved
    assert check_merge(original, sketch, merge.text).ok
    return merge.text


def test_the_docstring_example() -> None:
    assert doctest.testmod(patches).failed == 0


def test_a_unified_diff_applies() -> None:
    assert detect(UDIFF_EXACT, ORIGINAL) == "udiff"
    assert applied(UDIFF_EXACT) == EDITED


@pytest.mark.parametrize(
    "header",
    ["@@ -40,3 +40,3 @@", "@@ -1,9 +1,2 @@", "@@ ... @@", "@@"],
    ids=["numbers-off", "counts-wrong", "no-numbers", "bare"],
)
def test_a_diff_with_wrong_or_no_numbers_applies_by_its_lines(header: str) -> None:
    """Models get the numbers and counts wrong, or leave them out: the lines say where a hunk goes. A blank
    context line written without its space is still context."""
    diff = UDIFF_EXACT.replace("@@ -4,3 +4,3 @@", header).replace("@@ -9,7 +9,8 @@", header).replace("\n \n", "\n\n")
    assert applied(diff) == EDITED


def test_a_diff_without_file_headers_in_a_chat_answer() -> None:
    """A chat answer's diff: a sentence before it, a fence around it, no `---`/`+++` lines."""
    diff = "Here is the change:\n\n```diff\n" + UDIFF_EXACT.split("\n", 2)[2] + "```\n\nThis adds encodings.\n"
    assert detect(diff, ORIGINAL) == "udiff"
    assert applied(diff) == EDITED


def test_search_replace_blocks_apply_in_any_order_with_trailing_spaces_stripped() -> None:
    original = ORIGINAL.replace("def save(path, text):", "def save(path, text):   ")  # trailing spaces
    blocks = """\
files.py
```python
<<<<<<< SEARCH
def main():
    print(load("a.txt"))
=======
def main():
    print(load("a.txt"))
    print(load("b.txt"))
>>>>>>> REPLACE
```

files.py
```python
<<<<<<< SEARCH
def save(path, text):
    with open(path, "w") as f:
=======
def save(path, text):
    with open(path, "w", encoding='utf-8') as f:
>>>>>>> REPLACE
```
"""
    assert detect(blocks, original) == "search-replace"
    expected = original.replace('open(path, "w")', "open(path, \"w\", encoding='utf-8')").replace(
        'print(load("a.txt"))', 'print(load("a.txt"))\n    print(load("b.txt"))'
    )
    # The block repeats `def save(...)` without its trailing spaces: the file keeps its own text there.
    assert applied(blocks, original) == expected


def test_a_v4a_patch_is_placed_by_its_scope_line() -> None:
    """The two `with open` contexts differ, but `f.read()`-style lines that repeat are told apart by the
    `@@ def ...` line the hunk comes after."""
    original = "def a():\n    x = 1\n    return x\n\n\ndef b():\n    x = 1\n    return x\n"
    patch = "*** Begin Patch\n*** Update File: m.py\n@@ def b():\n     x = 1\n-    return x\n+    return x + 1\n"
    patch += "*** End Patch\n"
    assert detect(patch, original) == "v4a"
    assert applied(patch, original) == original[: original.rindex("return x")] + "return x + 1\n"


def test_a_hunk_that_fits_twice_is_left_to_the_model() -> None:
    original = "def a():\n    x = 1\n    return x\n\n\ndef b():\n    x = 1\n    return x\n"
    diff = "@@ ... @@\n     x = 1\n-    return x\n+    return x + 1\n"
    merge = merge_sketch(original, diff)
    assert not merge.resolved
    assert "2 times" in merge.unresolved[0]


@pytest.mark.parametrize("format", ["udiff", "search-replace", "v4a"])
def test_hunks_alike_as_many_as_their_places_edit_each_place_in_order(format: str) -> None:
    """Three doc comments say the same line and the patch has three hunks of it, one new line each: the
    patch edits every place, the first hunk the first. Two hunks for three places stay a doubt."""
    original = "".join(f"/// - returns: The request.\nfunc make{n}() {{}}\n\n" for n in (1, 2, 3))

    def patch(count: int) -> str:
        hunks = [(["/// - returns: The request."], [f"/// - returns: The request ({n})."]) for n in range(count)]
        if format == "udiff":
            return "".join(f"@@ ... @@\n-{old[0]}\n+{new[0]}\n" for old, new in hunks)
        if format == "search-replace":
            return "".join(f"<<<<<<< SEARCH\n{old[0]}\n=======\n{new[0]}\n>>>>>>> REPLACE\n" for old, new in hunks)
        body = "".join(f"@@\n-{old[0]}\n+{new[0]}\n" for old, new in hunks)
        return f"*** Begin Patch\n*** Update File: m.swift\n{body}*** End Patch\n"

    expected = original
    for n in range(3):
        expected = expected.replace("The request.\n", f"The request ({n}).\n", 1)
    assert applied(patch(3), original) == expected
    merge = merge_sketch(original, patch(2))
    assert not merge.resolved and "3 times" in merge.unresolved[0]


def test_a_diff_line_number_picks_among_equal_places() -> None:
    original = "def a():\n    x = 1\n    return x\n\n\ndef b():\n    x = 1\n    return x\n"
    diff = "@@ -7,2 +7,2 @@\n     x = 1\n-    return x\n+    return x + 1\n"
    assert applied(diff, original).endswith("def b():\n    x = 1\n    return x + 1\n")


def test_a_hunk_whose_lines_are_not_in_the_file_is_left_to_the_model() -> None:
    merge = merge_sketch(ORIGINAL, "@@ -1,2 +1,2 @@\n def nowhere():\n-    pass\n+    return 1\n")
    assert not merge.resolved and "not in the file" in merge.unresolved[0]


def test_a_diff_file_being_edited_is_a_lazy_sketch() -> None:
    """Editing a patch file is not applying a patch: syntax the original has itself is code."""
    original = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    sketch = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+c\n"
    assert detect(sketch, original) == "lazy"


def test_search_replace_blocks_editing_a_file_that_holds_the_markers() -> None:
    """aider's own parser holds `<<<<<<< SEARCH` in its source: a sketch that opens with a block whose
    SEARCH lines the file has is that patch, not code to place (it was merged as a lazy sketch, the
    markers and the fence written into the file over the parser's lines)."""
    original = (
        'HELP = """\n<<<<<<< SEARCH\n{original}\n=======\n{updated}\n>>>>>>> REPLACE\n"""\n\n\ndef parse():\n    pass\n'
    )
    sketch = (
        "parser.py\n```\n<<<<<<< SEARCH\ndef parse():\n    pass\n=======\n"
        "def parse():\n    return []\n>>>>>>> REPLACE\n```\n"
    )
    assert detect(sketch, original) == "search-replace"
    merge = merge_sketch(original, sketch)
    assert merge.resolved and merge.text == original.replace("    pass", "    return []")


def test_a_patch_written_into_the_file_is_not_a_merge() -> None:
    """The worst answer to a diff is the diff itself, pasted over the code: the checks refuse it."""
    answer = ORIGINAL.replace("import os\n", UDIFF_EXACT)
    check = check_merge(ORIGINAL, UDIFF_EXACT, answer)
    assert not check.ok and "--- a/files.py" in check.markers


def test_a_patch_may_delete_the_lines_it_takes_out() -> None:
    """A `-` line is shown, so deleting it is what the patch says; a line it neither shows nor brackets is
    not the patch's to delete."""
    diff = '@@ -9,3 +9,1 @@\n-def save(path, text):\n-    with open(path, "w") as f:\n-        f.write(text)\n'
    text, unresolved = apply_patch(ORIGINAL, parse_patch(diff, "udiff"))
    assert not unresolved and "def save" not in text
    assert check_merge(ORIGINAL, diff, text).ok
    unshown = "def load(path):\n    with open(path) as f:\n        return f.read()\n"
    assert not check_merge(ORIGINAL, diff, text.replace(unshown, "")).ok


def test_the_command_line_applies_a_diff_without_a_model(tmp_path: Path) -> None:
    """A patch its lines place needs no model (one that cannot load is never touched); `--sketch-format`
    names the format, and a wrong name is refused before anything is read."""
    source, patch, stats = tmp_path / "files.py", tmp_path / "change.diff", tmp_path / "stats.json"
    source.write_text(ORIGINAL)
    patch.write_text(UDIFF_EXACT)
    common = ["rewrite", str(source), "--sketch", str(patch), "--model", str(tmp_path / "no-such-model")]
    assert main([*common, "--sketch-format", "udiff", "--no-progress", "--in-place", "--stats", str(stats)]) == 0
    assert source.read_text() == EDITED
    assert json.loads(stats.read_text())["merge"] == "lines"
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--sketch-format", "git"])
    assert exit_info.value.code == 2


def test_the_model_is_asked_to_apply_a_patch_as_a_patch() -> None:
    """Where the lines cannot place a patch, the model gets it with what its syntax means (not as a sketch
    whose `-` lines would be code), and the request names or finds the format."""
    from specedit.engine.records.requests import RewriteRequest
    from specedit.engine.sketch.sketch import Sketch

    request = RewriteRequest(ORIGINAL, sketch=UDIFF_EXACT)
    asked = request.prompt(Sketch.of(request).format)  # the format as the session's reading found it
    assert asked.sketch_format == "udiff" and "unified diff" in asked.user_message()
    named = RewriteRequest(ORIGINAL, sketch=UDIFF_EXACT, sketch_format="lazy").prompt()
    assert "Merge this edit sketch" in named.user_message()
    with pytest.raises(ValueError, match="sketch_format"):
        RewriteRequest(ORIGINAL, sketch=UDIFF_EXACT, sketch_format="git")  # type: ignore[arg-type]


# --- Large patches: the work grows with the patch and the file, not with their product -------------------


def patch_of_every_handler(count: int, format: str) -> str:
    """A patch in `format` changing the log line of each of `count` handlers (`handlers`)."""
    hunks = []
    for n in range(count):
        before = [f"        total += item.price * {n % 7 + 1}", "    if total > 100:"]
        old, new = f"        log.info('big order %s', {n})", f"        log.info('large order %s', {n})"
        if format == "udiff":
            hunks.append(f"@@ -{10 * n + 5},4 +{10 * n + 5},4 @@\n" + "".join(f" {line}\n" for line in before))
            hunks.append(f"-{old}\n+{new}\n     return total\n")
        elif format == "search-replace":
            hunks.append("<<<<<<< SEARCH\n{0}\n{1}\n=======\n{0}\n{2}\n>>>>>>> REPLACE\n".format(before[1], old, new))
        else:
            hunks.append(f"@@ def handler_{n}(request, items):\n {before[1]}\n-{old}\n+{new}\n     return total\n")
    if format == "udiff":
        return "--- a/handlers.py\n+++ b/handlers.py\n" + "".join(hunks)
    if format == "search-replace":
        return "handlers.py\n" + "".join(hunks)
    return "*** Begin Patch\n*** Update File: handlers.py\n" + "".join(hunks) + "*** End Patch\n"


def best_seconds(run: Callable[[], object], tries: int = 3) -> float:
    """The least wall time of `tries` runs of `run`: the machine is shared."""
    best = math.inf
    for _ in range(tries):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("format", ["udiff", "search-replace", "v4a"])
def test_ten_times_the_hunks_on_ten_times_the_file_take_about_ten_times_as_long(format: str) -> None:
    """A 1,600-hunk diff took 14.6 s to apply and check, 3,200 hunks 60 s: each hunk compared the whole file
    at every place, and the checks diffed it whole. A hunk is now looked for by its rarest line, from where
    the one before it ended, and the checks read each line's places from an index."""
    seconds = []
    for count in (200, 2000):
        original, patch = handlers(count), patch_of_every_handler(count, format)
        expected = original.replace("'big order", "'large order")
        assert apply_patch(original, parse_patch(patch, detect(patch, original))) == (expected, ())
        seconds.append(best_seconds(lambda original=original, patch=patch: merge_sketch(original, patch)))
        assert merge_sketch(original, patch).text == expected
    assert seconds[1] < 30 * seconds[0], seconds
