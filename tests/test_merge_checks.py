"""An answer to an edit sketch is written only when it is a merge: the failure modes users met, caught."""

from __future__ import annotations

import difflib
import math
import random
import time
from pathlib import Path

import pytest

from specedit.cli.main import main
from specedit.engine.sketch.blocks import lines_above
from specedit.engine.sketch.line_index import LineIndex, matching_blocks
from specedit.engine.sketch.merge_checks import check_merge, is_elision
from specedit.engine.sketch.sketch import Sketch

from conftest import ECHOED_SKETCH, handlers

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


def test_a_chat_answers_prose_or_fence_written_into_the_file_is_no_merge() -> None:
    """The lines of a chat answer around its sketch (`chat_answer`: prose, fences) are refused in the file
    like an elision marker; a fence the original or the sketch has is code (a Markdown file's)."""
    left_out = ("Here's the fix:", "```python", "```", "The rest of the file is unchanged.")
    assert check_merge(ORIGINAL, SKETCH, MERGED, left_out=left_out).ok
    for written in ("Here's the fix:\n```python\n", "```\n", "~~~\n", "The rest of the file is unchanged.\n"):
        check = check_merge(ORIGINAL, SKETCH, written + MERGED, left_out=left_out)
        assert check.prose == written.splitlines() and not check.ok, written
        assert "writes the chat answer's prose or code fences into the file" in check.describe()
    assert check_merge(ORIGINAL + "```\n", SKETCH, MERGED + "```\n").ok  # the file's own fence
    fenced = SKETCH.replace("handle.read()", "handle.read()\n```")
    assert check_merge(ORIGINAL, fenced, MERGED.replace("handle.read()", "handle.read()\n```", 1)).ok


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


# --- Large sketches, and what difflib would say of them ---------------------------------------------------


def test_a_chunk_is_matched_as_difflib_matches_it() -> None:
    """`_span` reads each chunk's matching blocks from the places of its lines (`line_index`), not by
    reading the whole file as difflib does: the blocks are difflib's own, junk or none, on lines drawn from
    a few (most of them found many times) and on changed copies of a stretch."""
    chosen = random.Random(11)
    for _ in range(3000):
        pool = [f"line {n}" for n in range(chosen.randint(1, 30))]
        weights = [chosen.random() ** 3 for _ in pool]
        original = chosen.choices(pool, weights, k=chosen.randint(0, 80))
        chunk = chosen.choices([*pool, "new 1", "new 2"], k=chosen.randint(0, 15))
        if original and chosen.random() < 0.3:
            start = chosen.randrange(len(original))
            chunk = [line if chosen.random() < 0.8 else "new" for line in original[start : start + 15]]
        low = chosen.randint(0, len(original)) if chosen.random() < 0.5 else 0
        rest = original[low:]
        isjunk = None if chosen.random() < 0.5 else (lambda line, rest=rest: rest.count(line) != 1)
        matcher = difflib.SequenceMatcher(isjunk, rest, chunk, autojunk=False)
        expected = [(low + a, b, size) for a, b, size in matcher.get_matching_blocks() if size]
        found = matching_blocks(LineIndex(original), chunk, low, isjunk)
        assert {(a + k, b + k) for a, b, size in found for k in range(size)} == {
            (a + k, b + k) for a, b, size in expected for k in range(size)
        }


def test_ten_times_the_chunks_on_ten_times_the_file_take_about_ten_times_as_long_to_check() -> None:
    """Checking a merge grows with the file, not with its square: a chunk is matched from its lines' places
    (not by difflib in the whole file), its edge lines are looked for within `FUZZY_REACH` lines (not in
    every line after it), and a line the answer lacks anywhere is all a diff of the whole would say."""
    seconds = []
    for count in (40, 400):
        original = handlers(count)
        answer = original.replace("'big order", "'large order")
        functions = answer.split("\n\n\n")[:-1]
        sketch = "".join(f"# ... existing code ...\n{function}\n\n\n" for function in functions)
        sketch += "# ... existing code ...\n"
        assert check_merge(original, sketch, answer).ok
        # One left out with the markers around it: its neighbours stand one after the other.
        middle = functions[count // 2] + "\n\n\n"
        left_out = sketch.replace(f"# ... existing code ...\n{middle}# ... existing code ...\n", "")
        assert not check_merge(original, left_out, answer.replace(middle, "")).ok
        best = math.inf
        for _ in range(3):
            started = time.perf_counter()
            check_merge(original, sketch, answer)
            best = min(best, time.perf_counter() - started)
        seconds.append(best)
    assert seconds[1] < 30 * seconds[0], seconds


# --- Code between two shown blocks that the sketch neither shows nor marks --------------------------------

FILES = ORIGINAL.replace(
    "\n\ndef display_output(text):",
    "\n\ndef parse(text):\n    rows = []\n    for line in text.splitlines():\n"
    '        key, _, value = line.partition("=")\n        rows.append((key, value))\n    return rows\n\n\n'
    "def display_output(text):",
)
# `load` and `display_output` shown whole, one after the other: no marker stands for `parse` between them.
TWO_SHOWN = """\
# ... existing code ...

def load(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def display_output(text):
    for line in text.splitlines():
        print(line.rstrip())

# ... existing code ...
"""


def test_an_answer_that_drops_a_function_between_two_shown_ones_is_no_merge() -> None:
    """A chat model showed two functions it changed and left out the one between them, and the marker for
    it: an answer without that function is no merge. The chunk spans from `load` to `display_output`, and
    so covered `parse` before; a chunk that shows a deletion by the lines around it still does."""
    both = FILES.replace("open(path)", 'open(path, encoding="utf-8")').replace("print(line)", "print(line.rstrip())")
    assert check_merge(FILES, TWO_SHOWN, both).ok
    parse = both[both.index("def parse") : both.index("def display_output")]
    check = check_merge(FILES, TWO_SHOWN, both.replace(parse, ""))
    assert check.dropped == [
        "def parse(text):",
        "rows = []",
        'key, _, value = line.partition("=")',
        "rows.append((key, value))",
        "return rows",
    ]
    by_context = "# ...\n        return handle.read()\n\n\ndef display_output(text):\n# ...\n"  # `parse` deleted
    assert check_merge(FILES, by_context, FILES.replace(parse, "")).ok


# A C++ file's preprocessor lines are code, not comments above a block (fmt's base-test.cc, cut down).
PREPROCESSED_BEFORE = """\
  EXPECT_EQ(s, "test");
}

struct implicitly_convertible_to_string_view {
  operator fmt::string_view() const { return "foo"; }
};

TEST(base_test, no_implicit_conversion_to_string_view) {
  EXPECT_FALSE(
      fmt::is_formattable<implicitly_convertible_to_string_view>::value);
}

#ifdef FMT_USE_STRING_VIEW
struct implicitly_convertible_to_std_string_view {
  operator std::string_view() const { return "foo"; }
};

TEST(base_test, no_implicit_conversion_to_std_string_view) {
  EXPECT_FALSE(
      fmt::is_formattable<implicitly_convertible_to_std_string_view>::value);
}
#endif

// std::is_constructible is broken in MSVC until version 2015.
#if !FMT_MSC_VERSION || FMT_MSC_VERSION >= 1900
struct explicitly_convertible_to_string_view {
  explicit operator fmt::string_view() const { return "foo"; }
};

TEST(base_test, format_explicitly_convertible_to_string_view) {
  // Types explicitly convertible to string_view are not formattable by
  // default because it may introduce ODR violations.
  static_assert(
      !fmt::is_formattable<explicitly_convertible_to_string_view>::value, "");
}

#  ifdef FMT_USE_STRING_VIEW
struct explicitly_convertible_to_std_string_view {
  explicit operator std::string_view() const { return "foo"; }
};

TEST(base_test, format_explicitly_convertible_to_std_string_view) {
  // Types explicitly convertible to string_view are not formattable by
  // default because it may introduce ODR violations.
  static_assert(
      !fmt::is_formattable<explicitly_convertible_to_std_string_view>::value,
      "");
}
#  endif
#endif

TEST(base_test, has_formatter) {
  EXPECT_TRUE((fmt::detail::has_formatter<const const_formattable, char>()));
  EXPECT_FALSE(
      (fmt::detail::has_formatter<const nonconst_formattable, char>()));
"""
PREPROCESSED_SKETCH = """\
// ... existing code ...
      fmt::is_formattable<implicitly_convertible_to_string_view>::value);
}

struct explicitly_convertible_to_string_view {
  explicit operator fmt::string_view() const { return "foo"; }
// ... existing code ...
      !fmt::is_formattable<explicitly_convertible_to_string_view>::value, "");
}

#if FMT_CPLUSPLUS >= 201703L
struct implicitly_convertible_to_std_string_view {
  operator std::string_view() const { return "foo"; }
};

TEST(base_test, no_implicit_conversion_to_std_string_view) {
  EXPECT_FALSE(
      fmt::is_formattable<implicitly_convertible_to_std_string_view>::value);
}

struct explicitly_convertible_to_std_string_view {
  explicit operator std::string_view() const { return "foo"; }
// ... existing code ...
      !fmt::is_formattable<explicitly_convertible_to_std_string_view>::value,
      "");
}
#endif  // FMT_CPLUSPLUS >= 201703L

TEST(base_test, has_formatter) {
// ... existing code ...
"""
PREPROCESSED_AFTER = """\
  EXPECT_EQ(s, "test");
}

struct implicitly_convertible_to_string_view {
  operator fmt::string_view() const { return "foo"; }
};

TEST(base_test, no_implicit_conversion_to_string_view) {
  EXPECT_FALSE(
      fmt::is_formattable<implicitly_convertible_to_string_view>::value);
}

struct explicitly_convertible_to_string_view {
  explicit operator fmt::string_view() const { return "foo"; }
};

TEST(base_test, format_explicitly_convertible_to_string_view) {
  // Types explicitly convertible to string_view are not formattable by
  // default because it may introduce ODR violations.
  static_assert(
      !fmt::is_formattable<explicitly_convertible_to_string_view>::value, "");
}

#if FMT_CPLUSPLUS >= 201703L
struct implicitly_convertible_to_std_string_view {
  operator std::string_view() const { return "foo"; }
};

TEST(base_test, no_implicit_conversion_to_std_string_view) {
  EXPECT_FALSE(
      fmt::is_formattable<implicitly_convertible_to_std_string_view>::value);
}

struct explicitly_convertible_to_std_string_view {
  explicit operator std::string_view() const { return "foo"; }
};

TEST(base_test, format_explicitly_convertible_to_std_string_view) {
  // Types explicitly convertible to string_view are not formattable by
  // default because it may introduce ODR violations.
  static_assert(
      !fmt::is_formattable<explicitly_convertible_to_std_string_view>::value,
      "");
}
#endif  // FMT_CPLUSPLUS >= 201703L

TEST(base_test, has_formatter) {
  EXPECT_TRUE((fmt::detail::has_formatter<const const_formattable, char>()));
  EXPECT_FALSE(
      (fmt::detail::has_formatter<const nonconst_formattable, char>()));
"""


def test_a_preprocessor_line_a_sketch_replaces_is_not_taken_for_a_comment() -> None:
    """The sketch writes `#if` where the original has `#  ifdef` above the same struct: the merge by lines
    and the checks agree that the `#  ifdef` went on purpose."""
    sketch = Sketch.read(PREPROCESSED_BEFORE, PREPROCESSED_SKETCH, language="cpp")
    assert sketch.merge is not None and sketch.merge.text == PREPROCESSED_AFTER
    check = sketch.check(PREPROCESSED_AFTER)
    assert check.ok, check


@pytest.mark.parametrize(
    ("lines", "above"),
    [
        (["# if the cache is empty, fill it", "def fill():"], 1),  # a Python comment
        (["// why", "#  ifdef FMT_USE_STRING_VIEW", "struct view {"], 1),  # the comment, not the directive
        (["#ifdef USE_VIEW", "struct view {"], 0),
        (["#endif", "int last() {"], 0),
        (["@Override", "/** Docs. */", "public int size() {"], 2),
    ],
)
def test_the_lines_above_a_block_are_its_comments_not_its_directives(lines: list[str], above: int) -> None:
    assert lines_above(lines) == above
