"""Edit sketches merged by their lines: each placement rule on a small case shaped like the real ones that
taught it, and what is left to the model."""

from __future__ import annotations

import doctest
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest

from specedit.cli.main import main
from specedit.engine.records.errors import ModelLoadError
from specedit.engine.sketch import merge, placement
from specedit.engine.sketch.merge import merge_sketch
from specedit.engine.sketch.merge_checks import check_merge

from conftest import ECHOED_SKETCH, LINES_SKETCH, events_to, handlers

CALCULATOR = """\
class Calculator {
  constructor() {
    this.result = 0;
  }

  add(number) {
    this.result += number;
    return this;
  }

  reset() {
    this.result = 0;
    return this;
  }
}
"""


def merged(original: str, sketch: str) -> str:
    result = merge_sketch(original, sketch)
    assert result.resolved, result.unresolved
    assert check_merge(original, sketch, result.text).ok
    return result.text


def test_the_docstring_example() -> None:
    assert doctest.testmod(merge).failed == 0


def test_a_changed_line_between_context_lines() -> None:
    original = "import os\n\n\ndef load(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef main():\n"
    sketch = (
        "# ... existing code ...\ndef load(path):\n    with open(path, encoding='utf-8') as f:\n"
        "        return f.read()\n# ... existing code ...\n"
    )
    assert merged(original, sketch) == original.replace("open(path)", "open(path, encoding='utf-8')")


def test_a_new_method_goes_after_the_closing_brace_it_repeats() -> None:
    """The chunk's first lines are context (`}` and a blank line): the method goes after that brace, not
    after the first `}` of the file."""
    sketch = "  // ... existing code ...\n  }\n\n  double(number) {\n    this.result *= 2;\n  }\n\n  reset() {\n"
    sketch = "class Calculator {\n" + sketch + "  // ... existing code ...\n}\n"
    expected = CALCULATOR.replace("  reset() {", "  double(number) {\n    this.result *= 2;\n  }\n\n  reset() {")
    assert merged(CALCULATOR, sketch) == expected


def test_a_changed_first_line_and_an_appended_function() -> None:
    """A chunk before the first marker starts the file (its first line changed); one after the last ends it."""
    original = "from fastapi import FastAPI\n\napp = FastAPI()\n\n\ndef root():\n    return {}\n"
    sketch = (
        "from fastapi import FastAPI, HTTPException\n\n# ... same ...\n\n"
        "def root():\n    return {}\n\n\ndef missing():\n    raise HTTPException(404)\n"
    )
    expected = original.replace("FastAPI\n", "FastAPI, HTTPException\n", 1) + (
        "\n\ndef missing():\n    raise HTTPException(404)\n"
    )
    assert merged(original, sketch) == expected


def test_a_deletion_between_two_context_lines() -> None:
    original = "def a():\n    return 1\n\n\ndef unused():\n    return 2\n\n\ndef b():\n    return 3\n"
    sketch = "# ... existing code ...\n    return 1\n\n\ndef b():\n    return 3\n"
    assert merged(original, sketch) == "def a():\n    return 1\n\n\ndef b():\n    return 3\n"


def test_a_unique_line_of_new_code_does_not_pull_the_chunk_over_old_code() -> None:
    """A new test repeats `s = requests.session()`, which the original has once, far from where the new test
    goes: the placement that would replace everything in between loses to the one at the chunk's context."""
    filler = "".join(f"    def test_{n}(self):\n        r = get({n})\n        assert r.ok_{n}\n\n" for n in range(30))
    original = (
        "class Tests:\n    def test_session(self):\n        s = requests.session()\n        assert s\n\n"
        + filler
        + "    def test_last(self):\n        assert r.ok\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    new_test = "    def test_cookies(self):\n        s = requests.session()\n        assert s.cookies\n"
    sketch = (
        "# ... existing code ...\n        assert r.ok\n\n" + new_test + "\nif __name__ == '__main__':\n# ... rest\n"
    )
    expected = original.replace("        assert r.ok\n\n\n", "        assert r.ok\n\n" + new_test + "\n")
    assert merged(original, sketch) == expected


def test_a_method_added_as_a_near_copy_of_another_keeps_the_original() -> None:
    """New code that copies an old method's lines in the same order would also fit as a change of it; the
    chunk's own context (its first line, at the old method's end) says it is an insertion."""
    original = (
        "class Holder {\n  Holder(Map map) {\n    this.collection = collection;\n    this.map = map;\n  }\n}\n\n"
        "class Base {\n  int b;\n}\n"
    )
    added = "class Other {\n  Other(Map map) {\n    this.collection = collection;\n    this.map = map;\n  }\n}\n"
    sketch = "// ... existing code ...\n  int b;\n}\n\n" + added
    assert merged(original, sketch) == original + "\n" + added


def test_a_new_test_repeating_an_old_tests_lines_goes_where_its_context_is() -> None:
    """A new test whose argument lines repeat an old test's far above, between generic context (`assert
    value`) and the next test's name: placing the chunk over the repeated lines would delete every test
    in between (guzzle's XML visitor test lost 150 lines so); its context alone places it losing nothing."""
    original = (
        'def test_a():\n    value = run(\n        kind="object",\n        sent_as="item",\n        name="a",\n'
        "    )\n    assert value\n\n\n"
        'def test_b():\n    value = run(name="b")\n    assert value\n\n\n'
        'def test_c():\n    value = run(name="c")\n    assert value\n\n\n'
        "def test_last():\n    assert True\n"
    )
    new_test = (
        'def test_new():\n    value = run(\n        kind="object",\n        sent_as="item",\n        name="new",\n'
        "    )\n    assert value\n\n\n"
    )
    sketch = "# ...\n    assert value\n\n\n" + new_test + "def test_last():\n# ...\n"
    assert merged(original, sketch) == original.replace("def test_last", new_test + "def test_last")


def test_a_chunk_written_without_its_class_indentation_is_indented_like_the_original() -> None:
    original = "class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n"
    sketch = "# ... existing code ...\ndef g(self):\n    return 3\n"
    assert merged(original, sketch) == original.replace("return 2", "return 3")


def test_lines_the_chunk_repeats_keep_the_originals_text() -> None:
    """The sketch writes a blank line without the original's spaces: the merge keeps the original's."""
    original = "x = 1\n    \ny = 2\nz = 3\n"
    sketch = "x = 1\n\ny = 20\n# ... existing code ...\n"
    assert merged(original, sketch) == "x = 1\n    \ny = 20\nz = 3\n"


def test_a_line_trimmed_beside_a_change_is_the_sketchs() -> None:
    """An edit trims the lines it touches: the ` * ` between rewritten doc lines loses its space, while a
    blank line and a context line further off keep the original's text."""
    original = "/**\n * Raised when a stream\n * cannot be read.\n * \n * @author A \n */\n    \nclass E {}\n"
    sketch = "/**\n * Raised when the input\n * is malformed.\n *\n * @author A\n */\n\nclass E {}\n// ... rest\n"
    expected = "/**\n * Raised when the input\n * is malformed.\n *\n * @author A \n */\n    \nclass E {}\n"
    assert merged(original, sketch) == expected


def test_crlf_and_no_final_newline_survive() -> None:
    original = "a = 1\r\nb = 2\r\nc = 3"
    sketch = "# ... existing code ...\nb = 20\nc = 3\n"
    assert merged(original, sketch) == "a = 1\r\nb = 20\r\nc = 3"


def test_a_chunk_ending_the_file_ends_it_with_the_sketchs_blank_lines_or_the_originals() -> None:
    """The blank lines after a file's last line are the sketch's where it shows some (HumanEvalFix's
    fixed Go and JavaScript functions), else the original's (a copied answer loses them): a chunk that
    ends the file does not drop them."""
    original = "package p\n\nfunc f() int {\n    return 1\n}\n\n"
    fixed = "// ... existing code ...\nfunc f() int {\n    return 2\n}\n"
    assert merged(original, fixed + "\n") == "package p\n\nfunc f() int {\n    return 2\n}\n\n"
    assert merged(original, fixed) == "package p\n\nfunc f() int {\n    return 2\n}\n\n"
    assert merged(original.rstrip() + "\n", fixed + "\n\n") == "package p\n\nfunc f() int {\n    return 2\n}\n\n\n"


REPEATED = """\
func labels() []string {
	return []string{
		"Latency",
		"Total",
	}
}

func describe() []string {
	return []string{
		"Latency",
		"Total",
	}
}
"""


def test_a_block_the_file_repeats_goes_where_the_chunks_after_it_still_fit() -> None:
    """Two chunks alike, for two places alike: in order, the first takes the first place (the second would
    leave the second chunk nowhere)."""
    chunk = '		"Latency",\n		"Duration",\n		"Total",\n'
    sketch = f"// ... existing code ...\n{chunk}// ... existing code ...\n{chunk}// ... existing code ...\n"
    assert merged(REPEATED, sketch) == REPEATED.replace('"Latency",\n', '"Latency",\n		"Duration",\n')


def test_a_block_the_file_repeats_shown_once_is_left_to_the_model() -> None:
    chunk = '		"Latency",\n		"Duration",\n		"Total",\n'
    result = merge_sketch(REPEATED, f"// ... existing code ...\n{chunk}// ... existing code ...\n")
    assert not result.resolved and "more than one place" in result.unresolved[0]


def test_a_repeated_deletion_goes_where_the_chunks_after_it_still_fit() -> None:
    """An import block that a template further down repeats, a line deleted from it and a change in the
    template after: the deletion goes to the first block (at the template's, the change would find no
    place after it)."""
    imports = (
        'import (\n	"os"\n\n	"github.com/spf13/cobra"\n	"github.com/spf13/viper"\n)\n\nfunc init() {\n}\n'
    )
    template = 'const tpl = `package main\n\nimport (\n	"github.com/spf13/cobra"\n)\n\nfunc init() {\n}\n`\n'
    original = imports + "\n" + template
    sketch = '...\n	"github.com/spf13/cobra"\n)\n\nfunc init() {\n...\nconst tpl = `package {{.name}}\n...\n'
    expected = original.replace('	"github.com/spf13/viper"\n', "").replace("package main", "package {{.name}}")
    assert merged(original, sketch) == expected


def test_a_block_the_file_repeats_goes_where_it_changes_clearly_less_else_it_is_a_doubt() -> None:
    """A doc example the file has twice, with the line the chunk changes at one place only: a change there,
    or an insertion at the other? Where the chunk is clearly more like one place (`&lt;` for `<` in a line
    it has, against a whole new line), there (gson); where both would change about as much, the model
    decides (what each would change told it wrong as often as right: a duplicate test deleted, a block
    moved)."""
    example = "   * private List<String> red;\n   * }\n   *\n"
    line = "   * Type t = new TypeToken<List<String>>() {}.getType();\n"
    end = "   * </pre>\n   */\n"
    original = "  /**\n" + example + line + end + "  void a() {}\n\n  /**\n" + example + end + "  void b() {}\n"
    escaped = line.replace("<", "&lt;").replace(">", "&gt;")
    sketch = "// ... existing code ...\n" + example + escaped + "   * </pre>\n// ... existing code ...\n"
    assert merged(original, sketch) == original.replace(line, escaped)

    other = sketch.replace(escaped, "   * Type t = new Token();\n")
    result = merge_sketch(original, other)
    assert not result.resolved and "more than one place" in result.unresolved[0]


def test_a_chunk_whose_context_lines_the_file_repeats_goes_between_the_nearest_pair() -> None:
    """A new test after the asserts two tests share and before the doc comment three tests share (gson):
    between the last place of its first line before a place of its last line, and that place; not by a
    line of the new test that the test before happens to have (`}).create();`)."""
    doc = "  /**\n   * See issue 99\n   */\n"
    old = _java_test("testA") + _java_test("testB", "    }).create();\n")
    original = old + doc + "  void testC() {}\n\n" + doc + "  void testD() {}\n"
    new = "  public void testNew() {\n    gson = builder(new Adapter() {\n    }).create();\n  }\n\n"
    sketch = f"// ... existing code ...\n{ASSERT}  }}\n\n{new}  /**\n   * See issue 99\n// ... existing code ...\n"
    assert merged(original, sketch) == original.replace(old, old + new)


def test_a_placement_between_context_pairs_must_not_keep_the_old_code_it_rewrites() -> None:
    """Between a nested `try:` and the outer one's `except` (requests), a chunk rewriting the call above
    would leave the old call beside the new one: three lines in a row that say something, added where
    the original still has them. New lines alike to old ones elsewhere, one or two in a row, pass."""
    original = ["try:\n", "    resp = conn.urlopen(\n", "        method=m,\n", "        url=u,\n", "    )\n"]
    original += [
        "    try:\n",
        "        low.send(b)\n",
        "    except Exception:\n",
        "        raise\n",
        "except OSError:\n",
    ]
    keys = [line.strip() for line in original]
    call = ["resp = conn.urlopen(\n", "    method=m,\n", "    url=u,\n", "    chunked=chunked,\n", ")\n"]
    assert placement._repeats_old_code(
        keys, placement.Placement(5, 9, ["    try:\n", *call, "    except Exception:\n"])
    )
    assert not placement._repeats_old_code(keys, placement.Placement(0, 9, ["try:\n", *call]))
    assert not placement._repeats_old_code(keys, placement.Placement(5, 9, ["    try:\n", *call[:2], *call[3:]]))


ASSERT = '    assertEquals("1", map.get("a"));\n'


def _java_test(name: str, build: str = "") -> str:
    return f"  public void {name}() {{\n    Map map = make();\n{build}{ASSERT}  }}\n\n"


def test_a_new_test_before_a_near_copy_of_it_goes_between_its_context() -> None:
    """A new test written before an old one much like it: the chunk's first lines (the end of the test
    before) and its last (the start of the old one) frame it, though its body repeats the old one's."""
    old = "  it('renders', function(done){\n    var app = express();\n    app.render('user');\n    done();\n  })\n"
    first = "  it('starts', function(done){\n    var app = express();\n    app.listen();\n    done();\n  })\n"
    original = first + "\n" + old
    new = old.replace("'renders'", "'renders with options'")
    sketch = (
        "// ... existing code ...\n    done();\n  })\n\n"
        + new
        + "\n  it('renders', function(done){\n    var app = express();\n// ...\n"
    )
    assert merged(original, sketch) == first + "\n" + new + "\n" + old


def test_a_chunks_closing_context_goes_to_the_nearest_place_that_loses_nothing() -> None:
    """`#  endif` and `#endif` end the chunk; a later block of the file ends with both lines, the nearest
    `#endif` with one: the nearest, since the later one would drop the code between."""
    original = (
        "#include <system_error>\n\n#if defined(__APPLE__) && __has_include(<xlocale.h>)\n#  include <xlocale.h>\n"
        '#endif\n\n#include "format.h"\n\n#ifndef FMT_USE_FCNTL\n#  if FMT_HAS_INCLUDE("winapifamily.h")\n'
        "#    include <winapifamily.h>\n#  endif\n#  if FMT_HAS_INCLUDE(<fcntl.h>)\n"
        "#    define FMT_USE_FCNTL 1\n#  endif\n#endif\n"
    )
    new = "#if defined(__APPLE__)\n#  if __has_include(<xlocale.h>)\n#    include <xlocale.h>\n#  endif\n#endif\n"
    sketch = "// ... existing code ...\n#include <system_error>\n\n" + new + "// ... existing code ...\n"
    old = "#if defined(__APPLE__) && __has_include(<xlocale.h>)\n#  include <xlocale.h>\n#endif\n"
    assert merged(original, sketch) == original.replace(old, new)


def test_a_chunk_that_ends_the_file_goes_after_its_context_not_onto_a_near_copy() -> None:
    """A test appended at the end, much like the last one: its first lines (the last test's end) say
    where it goes; its own end, equal to the last test's, does not."""
    last = "  it('sets the status', function(done){\n    render({ status: 500 });\n    expect(done);\n  })\n"
    original = (
        "describe('render', function(){\n  it('renders', function(done){\n    expect(done);\n  })\n\n" + last + "})\n"
    )
    added = "\n  it('sets the charset', function(done){\n    render({ charset: 'x' });\n    expect(done);\n  })\n"
    sketch = "// ... existing code ...\n    expect(done);\n  })\n" + added + "})\n"
    assert merged(original, sketch) == original.replace(last, last + added)


def test_a_chunks_context_outweighs_a_run_that_new_code_repeats() -> None:
    """A rewritten doc comment whose new lines equal another method's doc (`string value.` and the two
    lines after it): the chunk goes where its last lines, the method's signature, are."""
    doc = (
        "  /**\n   * get this element as a {kind} value.\n   * @throws ClassCastException if not a valid\n"
        "   * {kind} value.\n   * @throws IllegalStateException if an array of\n"
        "   * more than a single element.\n   */\n"
    )
    body = "    throw new UnsupportedOperationException();\n  }\n\n"
    original = (
        doc.format(kind="string")
        + "  public String getAsString() {\n"
        + body
        + doc.format(kind="char")
        + "  public char getAsCharacter() {\n"
        + body
    )
    new_doc = doc.format(kind="string").replace("this element as a string", "the first character as a string")
    sketch = (
        "// ... existing code ...\n" + body + new_doc + "  @Deprecated\n"
        "  public char getAsCharacter() {\n// ... existing code ...\n"
    )
    expected = original.replace(doc.format(kind="char") + "  public char", new_doc + "  @Deprecated\n  public char")
    assert merged(original, sketch) == expected


def test_a_chunks_context_places_it_whatever_its_brackets() -> None:
    """A Go template rewritten between two lines the file has once (cobra's usage template): the new text
    closes a brace more than it opens (`{{end}}}`, in a string), which a count of brackets cannot tell from
    code that does not fit; the chunk's first and last lines, its context, say where it goes."""
    original = (
        "var usage = `Usage:\n\nExamples:\n{{ .Example }}\n{{end}}{{ if .HasSubCommands}}\n"
        "Available Commands: {{range .Commands}}\n  {{rpad .Name .NamePadding }}{{end}}\n{{end}}\n"
        'Use "{{.CommandPath}} --help" for more information.\n{{end}}`\n\nfunc run() {\n}\n'
    )
    new = (
        "Examples:\n{{ .Example }}{{end}}{{ if .HasNonHelpSubCommands}}\n"
        "Available Commands: {{range .Commands}}{{if .IsHelp}}\n  {{rpad .Name .NamePadding }}{{end}}}{{end}}\n"
        'Use "{{.CommandPath}} --help" for more information.\n'
    )
    sketch = "...\n" + new + "...\n"
    start = original.index("Examples:")
    stop = original.index("{{end}}`")
    assert merged(original, sketch) == original[:start] + new + original[stop:]


def test_a_deletion_shown_only_by_the_context_around_it() -> None:
    """An argument parser's 40 lines replaced by one line (aider's benchmark moving to typer): the chunk's
    context lines are once in the file, so what lies between them goes, up to a screenful; a stretch far
    longer than that between two such lines is left to the model."""
    parser = "".join(f'    parser.add_argument("--option-{n}", help="option {n}")\n' for n in range(40))
    original = (
        'def main():\n    commit_hash = head()\n    if dirty():\n        commit_hash += "-dirty"\n\n'
        + parser
        + "    args = parser.parse_args()\n    dirname = Path(args.dirname)\n\n    if len(dirname.parts) == 1:\n"
        + "        dirname = ROOT / dirname\n"
    )
    sketch = (
        '# ... (same as before)\n        commit_hash += "-dirty"\n\n    dirname = Path(dirname)\n\n'
        "    if len(dirname.parts) == 1:\n# ... (same as before)\n"
    )
    start, stop = original.index(parser), original.index("\n    if len(")
    assert merged(original, sketch) == original[:start] + "    dirname = Path(dirname)\n" + original[stop:]
    longer = original.replace(parser, parser * 3)
    assert not merge_sketch(longer, sketch).resolved


def test_context_ends_that_disagree_are_read_each_alone() -> None:
    """A call rewrapped the way a later one is wrapped (gson's boolean adapters): the chunk's first lines
    now equal the later call's (they anchor there), its last lines are this call's own. Read alone, only
    the last ones place the chunk: it goes there."""
    original = (
        "  public void testSerialize() {\n    Gson gson =\n        new GsonBuilder()\n            .register(\n"
        "                boolean.class, (Serializer<Boolean>) (s, t, c) -> s ? 1 : 0)\n            .create();\n"
        '    assertThat(gson.toJson(true)).isEqualTo("1");\n  }\n\n'
        "  public void testDeserialize() {\n    Gson gson =\n        new GsonBuilder()\n            .register(\n"
        "                boolean.class,\n                (Deserializer<Boolean>) (j, t, c) -> j.getAsInt() != 0)\n"
        '            .create();\n    assertThat(gson.fromJson("1")).isEqualTo(Boolean.TRUE);\n  }\n'
    )
    old = "                boolean.class, (Serializer<Boolean>) (s, t, c) -> s ? 1 : 0)\n"
    new = (
        "                boolean.class,\n                (Serializer<Boolean>)\n"
        "                    (v, type, context) -> v ? 1 : 0)\n"
    )
    sketch = (
        "...\n        new GsonBuilder()\n            .register(\n"
        + new
        + '            .create();\n    assertThat(gson.toJson(true)).isEqualTo("1");\n...\n'
    )
    assert merged(original, sketch) == original.replace(old, new)


def test_new_code_repeating_old_code_does_not_replace_it_when_the_context_says_where_it_goes() -> None:
    """aider's versionbump.py (commit 54939d5f6ca2): a dev-version step written after the last loop, like
    the steps before it, then the old loop again. The chunk's first line is the old loop's last, its
    last lines the old loop and what follows it: the two ends disagree. The runs alone (the old loop)
    put the new step in place of the old ones, 21 lines lost; the first line puts it after the loop,
    losing none: that one."""
    step = (
        "    content = re.sub(r'v.+', f'v{{new}}{suffix}', text)\n\n    if dry_run:\n"
        '        print("Updating the version{note}:")\n        print(content)\n    else:\n'
        '        with open("version.py", "w") as f:\n            f.write(content)\n\n'
    )
    loop = (
        '    for cmd in {name}:\n        if dry_run:\n            print(f"Running: {{cmd}}")\n'
        "        else:\n            subprocess.run(cmd, check=True)\n"
    )
    original = "import re\nimport subprocess\n\n\ndef main(new, text, dry_run):\n"
    original += step.format(suffix="", note="") + '    commands = [["git", "tag", new]]\n\n'
    original += loop.format(name="commands") + '\n\nif __name__ == "__main__":\n    main()\n'
    added = step.format(suffix="-dev", note=" to dev") + '    dev_commands = [["git", "push"]]\n\n'
    added += loop.format(name="dev_commands") + "\n" + loop.format(name="commands")
    sketch = "            subprocess.run(cmd, check=True)\n\n" + added + '\n\nif __name__ == "__main__":\n'
    end = original.index("\n\nif __name__")
    assert merged(original, sketch) == original[:end] + "\n" + added + original[end:]


def test_a_line_joined_from_several_replaces_them() -> None:
    """`if (x) {` / `y;` / `}` written as `if (x) y;` (fmt's printf flags): the chunk's context before it
    (`case ' ':`, once in the file) is where it goes, not one `break;` further (which would leave the
    old lines and write `case ' ':` twice)."""
    original = (
        "  switch (c) {\n    case '0':\n      fill = '0';\n      break;\n    case ' ':\n"
        "      if (sign != plus) {\n        sign = space;\n      }\n      break;\n    case '#':\n"
        "      alt = true;\n      break;\n  }\n"
    )
    sketch = (
        "...\n      break;\n    case ' ':\n      if (sign != plus) sign = space;\n      break;\n    case '#':\n...\n"
    )
    old = "      if (sign != plus) {\n        sign = space;\n      }\n"
    assert merged(original, sketch) == original.replace(old, "      if (sign != plus) sign = space;\n")


def test_new_code_that_ends_like_the_context_before_it() -> None:
    """An argument added after another (aider's `--openai-organization-id`): the chunk's `)` and
    `add_argument(` after the context it repeats are the start of the new argument as well as its end:
    the new lines go right after the context, not over the next argument."""
    argument = '    group.add_argument(\n        "--{name}",\n        help="Specify the {name}",\n    )\n'
    original = "".join(argument.format(name=name) for name in ("deployment-id", "openrouter", "edit-format"))
    added = argument.format(name="organization-id")
    sketch = '...\n        help="Specify the deployment-id",\n    )\n' + added + "    group.add_argument(\n...\n"
    first = argument.format(name="deployment-id")
    assert merged(original, sketch) == original.replace(first, first + added)


def test_a_merge_that_writes_a_block_twice_in_a_row_is_left_to_the_model() -> None:
    """A sketch that shows a deletion like a change (express: `var router = Router();` and its assert
    deleted before the `new Router()` pair): a merge that has the same lines twice in a row, where
    neither the original nor the sketch has, is a doubt."""
    original = (
        "describe('Router', function(){\n  it('is a function', function() {\n    var router = Router();\n"
        "    assert(typeof router == 'function');\n\n    var router = new Router();\n"
        "    assert(typeof router == 'function');\n\n    assert(typeof router.get == 'function');\n"
        "  });\n\n  it('has a stack', function() {\n    var router = new Router();\n"
        "    assert(typeof router == 'function');\n    assert(router.stack.length == 0);\n  });\n})\n"
    )
    sketch = (
        "// ... existing code ...\ndescribe('Router', function(){\n  it('is a function', function() {\n"
        "    var router = new Router();\n    assert(typeof router == 'function');\n// ... existing code ...\n"
    )
    result = merge_sketch(original, sketch)
    assert not result.resolved and "twice in a row" in result.unresolved[0], result.unresolved


def test_a_chunk_ending_the_file_does_not_replace_far_more_than_it_holds() -> None:
    """A function appended near the end, a near copy of the one before it (aider's `build_docker`): its
    lines repeat that one's, and its first context line (`return res`) is also where a function far above
    ends; replacing all from there would delete much more than the chunk holds. Left to the model, not
    merged wrong."""
    old_function = (
        "def run_test(testdir):\n    command = [\n        'docker',\n        'run',\n    ]\n"
        "    try:\n        result = subprocess.run(command, text=True)\n        res = result.stdout\n"
        "    except subprocess.CalledProcessError as e:\n        res = e.output\n    return res\n\n\n"
    )
    between = "".join(f"def helper_{n}(x):\n    value = x * {n}\n    return value + {n}\n\n\n" for n in range(30))
    last = "def summarize(results):\n    res = len(results)\n    return res\n\n\n"
    original = last + between + old_function + "if __name__ == '__main__':\n    app()\n"
    new = old_function.replace("run_test(testdir)", "build_docker()").replace("'run'", "'build'")
    sketch = "# ... existing code ...\n    return res\n\n\n" + new + "if __name__ == '__main__':\n    app()\n"
    result = merge_sketch(original, sketch)
    assert not result.resolved, result.text
    assert result.text == original or check_merge(original, sketch, result.text).ok


@pytest.mark.parametrize(
    ("sketch", "why"),
    [
        # Nothing in it is in the original, and markers on both sides: it could go anywhere.
        ("// ... existing code ...\n  exp(n) {\n    this.result **= n;\n  }\n// ... existing code ...\n", "once"),
        # A new method much like an old one (`add`): an addition, or `add` changed? Not for the lines to say.
        (
            "// ... existing code ...\n  subtract(number) {\n    this.result -= number;\n  }\n"
            "// ... existing code ...\n",
            "once",
        ),
        # Its only lines in the original occur more than once (`return this;`), and change nothing there.
        ("// ... existing code ...\n    return this;\n  }\n// ... existing code ...\n", "once"),
        # New lines that open a block nothing closes, before a line that says where: not an insertion.
        ("// ... existing code ...\n  if (x) {\n  reset() {\n// ... existing code ...\n", "more than one place"),
    ],
)
def test_what_the_lines_cannot_place_is_left_to_the_model(sketch: str, why: str) -> None:
    result = merge_sketch(CALCULATOR, sketch)
    assert not result.resolved and why in result.unresolved[0], result.unresolved
    assert result.text == CALCULATOR  # the partial merge (the model's draft): nothing placed here


def test_a_merge_that_fails_the_checks_is_not_resolved() -> None:
    """The lines place the chunk, but the merge drops a line the checks say the sketch did not touch: the
    model decides (a second opinion on the placement)."""
    original = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    result = merge_sketch(original, "def f():\n    return 1\n")  # no marker: the whole file, g deleted?
    assert result.resolved and result.text == original  # a part of the file: it changes nothing
    echoed = merge_sketch(original, "# ... existing code ...\n# ... existing code ...\n")
    assert echoed.resolved and echoed.text == original


def test_the_command_line_merges_by_lines_without_loading_a_model(tmp_path: Path) -> None:
    """`--merge auto` (the default) needs no model for a sketch its lines place: a model that cannot load
    is never touched. `--merge model` asks it, and fails cleanly."""
    original, sketch, merged_text = LINES_SKETCH
    source, sketch_file, stats = tmp_path / "add.py", tmp_path / "sketch.py", tmp_path / "stats.json"
    source.write_text(original)
    sketch_file.write_text(sketch)
    common = ["rewrite", str(source), "--sketch", str(sketch_file), "--model", str(tmp_path / "no-such-model")]
    assert main([*common, "--no-progress", "--in-place", "--stats", str(stats)]) == 0
    assert source.read_text() == merged_text and (tmp_path / "add.py.orig").read_text() == original
    assert json.loads(stats.read_text())["merge"] == "lines"
    source.write_text(original)
    assert main([*common, "--no-progress", "--in-place", "--merge", "model"]) == ModelLoadError.exit_code
    assert source.read_text() == original


def test_the_model_drafts_from_the_merge_by_lines(tmp_path: Path, memorising_model_dir: Path) -> None:
    """With `merge="model"` the model writes the answer (the same as plain decoding), and the lines' merge
    is the copy drafter's first source; an unplaced sketch's stats say why the lines could not merge it."""
    from specedit.engine.backends.local import LocalBackend
    from specedit.engine.records.options import EngineOptions
    from specedit.engine.records.requests import RewriteRequest
    from specedit.engine.session.session import Session

    backend = LocalBackend(EngineOptions(model=str(memorising_model_dir), threads=1))
    session = Session(backend)
    original, sketch, _ = LINES_SKETCH
    by_model = session.run(RewriteRequest(original, sketch=sketch, language="python", merge="model"))
    plain = session.run(RewriteRequest(original, sketch=sketch, language="python", merge="model", draft="none"))
    assert by_model.stats.merge == "model" and by_model.text == plain.text
    from specedit.engine.loop.rewrite import prepare_rewrite

    engine = backend.load()
    prepared = prepare_rewrite(engine, RewriteRequest(original, sketch=sketch, merge="model"))
    assert prepared.source_ids[: len(engine.tokenize(LINES_SKETCH[2]))] == engine.tokenize(LINES_SKETCH[2])
    echoed = session.run(RewriteRequest(ECHOED_SKETCH[0], sketch=ECHOED_SKETCH[1], language="python"))
    assert echoed.stats.merge == "model" and "once" in echoed.stats.merge_unresolved[0]
    session.close()


ORDER = (
    "import os\n\n\ndef total(items):\n    s = 0\n    for item in items:\n        s += item.price\n    return s\n"
    "\n\ndef main():\n    print(total([]))\n"
)


@pytest.mark.parametrize(
    ("sketch", "old", "new"),
    [
        # A changed signature alone.
        (
            "# ... existing code ...\ndef total(items, tax=0.0):\n    # ... existing code ...\n",
            "(items):",
            "(items, tax=0.0):",
        ),
        # A partial function: its start and one changed line, the rest "unchanged".
        ("# ... existing code ...\ndef total(items):\n    s = 0.0\n    # ... rest unchanged\n", "s = 0\n", "s = 0.0\n"),
        # Bare `...` markers, the changed line last in its chunk.
        (
            "...\ndef total(items):\n    s = 0\n    for item in items:\n        s += item.price * 2\n...\n",
            "price\n",
            "price * 2\n",
        ),
        # `# rest unchanged`, the changed line first in its chunk, blank lines between it and its context.
        (
            "# rest unchanged\n    return round(s, 2)\n\n\ndef main():\n# rest unchanged\n",
            "return s\n",
            "return round(s, 2)\n",
        ),
        # `# ... (same as before)` around a new function.
        (
            "# ... (same as before)\n    return s\n\n\ndef count(items):\n    return len(items)\n\n\ndef main():\n"
            "# ... (same as before)\n",
            "\n\ndef main",
            "\n\ndef count(items):\n    return len(items)\n\n\ndef main",
        ),
    ],
)
def test_the_styles_chat_models_write(sketch: str, old: str, new: str) -> None:
    assert merged(ORDER, sketch) == ORDER.replace(old, new, 1)


def test_a_remote_session_merges_by_lines_without_asking_a_daemon(tmp_path: Path) -> None:
    """No daemon answers at the address: a sketch its lines place is merged anyway (none is started or
    asked), streamed whole; one they cannot place needs the daemon, and says it is unreachable."""
    from specedit.engine.records.errors import EngineUnavailableError
    from specedit.engine.records.requests import RewriteRequest
    from specedit.engine.session.session import remote_session

    session = remote_session(f"unix:{tmp_path / 'nobody.sock'}")
    original, sketch, merged_text = LINES_SKETCH
    streamed: list[str] = []
    outcome = session.run(RewriteRequest(original, sketch=sketch), events_to(text=streamed.append))
    assert outcome.text == merged_text and streamed == [merged_text] and outcome.stats.merge == "lines"
    with pytest.raises(EngineUnavailableError):
        session.run(RewriteRequest(ECHOED_SKETCH[0], sketch=ECHOED_SKETCH[1]))


# --- Sketches as chat models write them: no marker at the start or the end ------------------------------

RUBY_SPEC = "".join(
    [
        "require 'spec_helper'\n\ndescribe Calculator do\n",
        *(
            f"  it 'adds {n}' do\n    calculator = Calculator.new\n"
            f"    expect(calculator.add({n}, 1)).to eq({n + 1})\n  end\n\n"
            for n in range(1, 8)
        ),
        "end\n",
    ]
)


def test_a_missing_last_marker_keeps_what_follows() -> None:
    """A leading marker and one changed `it` block, no marker after it ("here is the updated test:"): the
    blocks after it stay. Read as "the file ends here", the merge would delete five tests nobody showed."""
    sketch = (
        "# ... existing code ...\n  it 'adds 2' do\n    calculator = Calculator.new\n"
        "    expect(calculator.add(2, 1)).to eq(3)\n    expect(calculator.add(2, 2)).to eq(4)\n  end\n"
    )
    kept = "    expect(calculator.add(2, 1)).to eq(3)\n"
    expected = RUBY_SPEC.replace(kept, kept + "    expect(calculator.add(2, 2)).to eq(4)\n")
    assert merged(RUBY_SPEC, sketch) == expected


def test_a_missing_first_marker_keeps_what_comes_before() -> None:
    sketch = (
        "  it 'adds 6' do\n    calculator = Calculator.new(strict: true)\n"
        "    expect(calculator.add(6, 1)).to eq(7)\n  end\n# ... existing code ...\n"
    )
    old = "  it 'adds 6' do\n    calculator = Calculator.new\n"
    expected = RUBY_SPEC.replace(old, old.replace("new", "new(strict: true)"))
    assert merged(RUBY_SPEC, sketch) == expected


def test_a_whole_function_without_markers_replaces_that_function() -> None:
    original = "import math\n\n\ndef area(r):\n    return 3.14 * r * r\n\n\n"
    original += "def volume(r):\n    return 4 / 3 * 3.14 * r**3\n"
    sketch = "def area(r):\n    return math.pi * r * r\n"
    assert merged(original, sketch) == original.replace("3.14 * r * r", "math.pi * r * r")


def test_a_whole_method_whose_new_body_is_its_neighbours_replaces_that_method_alone() -> None:
    """aider's test_coder.py (commit fa1158d8a80b): a method rewritten in its neighbour's style, sketched
    whole without markers. Its new lines are the next method's, some of them once in the file: on them
    alone the chunk reached over the neighbour's `def` and deleted it. The method it shows is the block
    of its first line."""
    header = "import unittest\n\n\nclass TestCoder(unittest.TestCase):\n"
    old_body = '        io = MagicMock()\n        coder.send = MagicMock(return_value=("a message", False))\n'
    new_body = (
        "        io = MagicMock()\n\n        def mock_send(*args):\n"
        '            coder.partial_response_content = "a message"\n            return False\n\n'
        "        coder.send = MagicMock(side_effect=mock_send)\n"
    )
    check = '        self.assertEqual(coder.get_commit_message(), "a message")\n'
    method = "    def test_get_commit_message(self):\n{}" + check
    neighbour = "    def test_strip_quotes(self):\n" + new_body + check
    original = header + method.format(old_body) + "\n" + neighbour + "\n    def test_other(self):\n        pass\n"
    sketch = method.format(new_body)
    assert merged(original, sketch) == original.replace(method.format(old_body), sketch)


def test_a_method_shown_whole_between_markers_replaces_that_method() -> None:
    """aider's repomap.py (commit 777a36d36626): a method's loop rewritten as a binary search, the method
    shown whole between two markers. `if num_tokens < max_map_tokens:` is in the file three times, so the
    anchors end at `num_tokens = ...` and the new lines after it (`return best_tree`) have no place of
    their own: a doubt, left to the model. The method is the block of its `def`, once in the file: it
    replaces that."""
    method = (
        "    def get_ranked_tags_map(self, fnames):\n        max_map_tokens = 2048\n\n"
        "        ranked_tags = self.get_ranked_tags(fnames)\n        num_tags = len(ranked_tags)\n\n{}"
    )
    old_body = (
        "        for i in range(num_tags, 0, -1):\n            tree = to_tree(ranked_tags[:i])\n"
        "            num_tokens = self.token_count(tree)\n            dump(i, num_tokens)\n"
        "            if num_tokens < max_map_tokens:\n                return tree\n"
    )
    new_body = (
        "        lower_bound = 0\n        upper_bound = num_tags\n        best_tree = None\n\n"
        "        while lower_bound <= upper_bound:\n            middle = (lower_bound + upper_bound) // 2\n"
        "            tree = to_tree(ranked_tags[:middle])\n            num_tokens = self.token_count(tree)\n\n"
        "            if num_tokens < max_map_tokens:\n                best_tree = tree\n"
        "                lower_bound = middle + 1\n            else:\n                upper_bound = middle - 1\n\n"
        "        return best_tree\n"
    )
    original = (
        "class RepoMap:\n    def get_map(self, other_files, max_map_tokens):\n        if self.use_ctags:\n"
        "            files_listing = self.get_tags_map(other_files)\n"
        "            num_tokens = self.token_count(files_listing)\n            if num_tokens < max_map_tokens:\n"
        "                return files_listing\n\n        files_listing = self.get_simple_files_map(other_files)\n"
        "        num_tokens = self.token_count(files_listing)\n        if num_tokens < max_map_tokens:\n"
        "            return files_listing\n\n"
        + method.format(old_body)
        + "\n\ndef find_py_files(directory):\n    if not os.path.isdir(directory):\n        return [directory]\n"
    )
    sketch = "# ... same ...\n" + method.format(new_body) + "# ... same ...\n"
    assert merged(original, sketch) == original.replace(old_body, new_body)


def test_a_sketch_that_is_one_method_replaces_it_with_its_last_lines() -> None:
    """aider's coder.py (commit 227e64b6a825): a method sketched whole without markers; the edit deleted
    its last line (`print("ls")`), which a sketch can show only by ending before it. The sketch is the
    method: it replaces the method, the last lines too (up to `BLOCK_DROPS`)."""
    method = (
        "    def cmd_ls(self, args):\n        if self.repo:\n            for file in self.repo.files():\n"
        '                if file in self.fnames:\n                    print(f"{file} (in chat)")\n'
        "                else:\n                    print(file)\n"
    )
    original = "class Coder:\n    def cmd_add(self, args):\n        self.add(args)\n\n" + method
    original += '        print("ls")\n\n    def cmd_drop(self, args):\n        self.drop(args)\n'
    sketch = method.replace("print(file)", "print(file.upper())")
    expected = original.replace(method + '        print("ls")\n', sketch)
    assert merged(original, sketch) == expected
    # A method shown whole drops no more than that: what lies past its lines is kept.
    longer = original.replace('        print("ls")\n', '        print("ls")\n' * 5)
    assert merged(longer, sketch) == longer.replace(method, sketch)


def test_a_block_shown_without_its_end_is_not_shown_whole() -> None:
    """express's Ruby spec (commit ce82a91d1464): an `it` block sketched without its `end` shows its first
    lines, not the block: the lines after them stay."""
    block = (
        "  it 'should push a flash message'\n    headers = { cookie: 'sid=123' }\n"
        "    post('/', headers)\n    get('/', headers).body.should.eql 'sent'\n  end\n"
    )
    original = "describe 'flash'\n" + block + "end\n"
    sketch = "  it 'should push a flash message'\n    headers = { cookie: 'sid=456' }\n    post('/', headers)\n"
    assert merged(original, sketch) == original.replace("sid=123", "sid=456")


def test_a_block_cut_by_a_string_at_a_lower_indentation_is_not_a_whole_block() -> None:
    """aider's test_repomap.py (commit 03f300ec75bb): a method whose triple-quoted string goes on at
    column 2 does not end there; the chunk showing its first lines changes them and keeps the rest."""
    original = (
        "class TestRepoMap:\n    def test_ctags(self):\n        with patch('run') as run:\n"
        '            run.return_value = Done(stdout=b\'\'\'{\n  "name": "status",\n  "kind": "variable"\n}\'\'\')\n'
        "            result = check()\n            self.assertTrue(result)\n"
    )
    sketch = (
        "...\n    def test_ctags(self):\n        with patch('run') as run:\n"
        '            run.return_value = Done(stdout=b\'{"name": "status", "kind": "variable"}\')\n'
        "            result = check()\n...\n"
    )
    start, end = original.index("            run.return_value"), original.index("            result")
    expected = original[:start] + sketch.splitlines(keepends=True)[3] + original[end:]
    assert merged(original, sketch) == expected


# aider's scrape.py before commit 1509e21698d3 (a real edit of a sketch set), shortened
SCRAPE = """\
import sys

import httpx


def html_to_markdown(page_source: str) -> str:
    pass


def main(url):
    scraper = Scraper()
    content = scraper.scrape(url)
    print(content)
"""
CONVERT = "    return pypandoc.convert_text(page_source, 'md', format='html')\n"


@pytest.mark.parametrize("marker", ["# (unchanged)\n", "# ... existing code ...\n"])
def test_a_block_shown_whole_replaces_the_rest_of_the_original_block(marker: str) -> None:
    """A function shown whole, new code last, a marker after it no deeper than its `def`: the original's
    lines still in the function after the placed ones (the `pass` the new code replaces) go."""
    sketch = f"{marker}def html_to_markdown(page_source: str) -> str:\n{CONVERT}{marker}"
    assert merged(SCRAPE, sketch) == SCRAPE.replace("    pass\n", CONVERT)


COMMANDS = """\
import os


class Commands:
    # Adds files.
    def add(self, files):
        count = 0

    def ls(self, files):
        count = 0
        for name in files:
            path = os.path.join(root, name)
            if path in seen:
                print("*", name)
"""
ADD_LOOP = """\
        for name in args:
            path = os.path.join(root, name)
            if path in seen:
                print("Added", name)
"""
GO_FLAGS = """\
#include "flags.h"
// LocalFlags returns the local flags.
// They are made once.
func (c *Command) LocalFlags() *FlagSet {
\treturn c.lflags
}

func (c *Command) Flags() *FlagSet {
\treturn c.flags
}
"""


def test_a_block_shown_whole_under_its_changed_doc_comment_replaces_that_comment() -> None:
    """A method shown whole under a doc comment the edit rewrote (a chat model shows "the method, changed",
    comment and all): the comment right above the original's method goes with it, nothing past the method
    does. Its new loop is like the next method's: read by its lines alone, the chunk stretched over that
    method, and the checks refused the merge, and the right answer too (the old comment "dropped")."""
    sketch = (
        f"    # ... same ...\n    # Adds the files named.\n    def add(self, files):\n        count = 0\n{ADD_LOOP}"
    )
    sketch += "    # ... same ...\n"
    expected = COMMANDS.replace("    # Adds files.\n", "    # Adds the files named.\n").replace(
        "        count = 0\n\n    def ls", f"        count = 0\n{ADD_LOOP}\n    def ls"
    )
    assert merged(COMMANDS, sketch) == expected
    assert check_merge(COMMANDS, sketch, expected).ok
    assert not check_merge(COMMANDS, sketch, expected[: expected.index("    def ls")]).ok


def test_only_comment_lines_begun_as_the_chunks_stand_for_them() -> None:
    """The comment right above a block goes where the chunk shows its own begun alike (`//`), not a line
    above it begun otherwise (a C file's `#include`)."""
    sketch = "// ...\n// LocalFlags returns the flags set here.\nfunc (c *Command) LocalFlags() *FlagSet {\n"
    sketch += "\treturn c.local()\n}\n// ...\n"
    expected = GO_FLAGS.replace(
        "// LocalFlags returns the local flags.\n// They are made once.\n", sketch.split("\n")[1] + "\n"
    )
    assert merged(GO_FLAGS, sketch) == expected.replace("return c.lflags", "return c.local()")


def test_a_chunk_in_spaces_takes_tabs_where_a_line_left_the_block_it_was_in() -> None:
    """A Go function shown in spaces (a chat answer's code block), a line moved out of a block the edit
    removed (three tabs in the original, two levels of spaces in the chunk): the chunk still takes the
    file's tabs, four spaces a tab as most of its lines say, the moved line with one tab fewer. A block
    placement matches every equal line, that one too, and kept the chunk's spaces (cobra 6f735782e098)."""
    lines = ["\tif ok {\n", "\t\t\tlog.Println(err)\n", "\treturn nil\n", "\tdone()\n"]
    chunk = ["    if ok {\n", "        log.Println(err)\n", "    return nil\n", "    done()\n"]
    retabbed = placement._retabbed(chunk, [placement.Anchor(0, 0, 4, 0)], lines)
    assert retabbed == ["\tif ok {\n", "\t\tlog.Println(err)\n", "\treturn nil\n", "\tdone()\n"]


def test_a_marker_deeper_than_the_block_stands_for_the_rest_of_it() -> None:
    """The same sketch with its last marker inside the function: the rest of it is elided, kept."""
    sketch = f"# ...\ndef html_to_markdown(page_source: str) -> str:\n{CONVERT}    # ...\n"
    assert merged(SCRAPE, sketch) == SCRAPE.replace("    pass\n", CONVERT + "    pass\n")


def test_a_block_ending_in_old_code_keeps_the_rest_of_the_original_block() -> None:
    """A chunk whose last line is the original's (context, as a tidy sketch ends) or a change of the line
    it lands on (`s += item.price * 2`: see `test_the_styles_chat_models_write`) says nothing about the
    lines after it: they stay."""
    sketch = "# ...\ndef main(url):\n    scraper = Scraper(timeout=5)\n    content = scraper.scrape(url)\n# ...\n"
    assert merged(SCRAPE, sketch) == SCRAPE.replace("Scraper()", "Scraper(timeout=5)")


def test_the_closing_brace_after_the_last_method_is_kept() -> None:
    """A sketch ending with the changed last method of a class, no marker after it: the class's `}` stays
    (the method's own `}` is not the class's)."""
    original = "class Url {\n    function a() {\n        return 1;\n    }\n\n"
    original += "    function scheme() {\n        return 'http';\n    }\n}\n"
    sketch = "// ...\n    function scheme() {\n        return strtolower($this->scheme);\n    }\n"
    assert merged(original, sketch) == original.replace("return 'http';", "return strtolower($this->scheme);")


def test_new_code_at_an_open_end_is_a_doubt() -> None:
    """The sketch ends with new code and no marker: whether it goes beside the file's last line or
    replaces it, nothing says. Neither reading is written: the model decides."""
    original = "import sys\n\n\ndef files(paths):\n    for p in paths:\n        print(p)\n"
    sketch = "# ... existing code ...\n    for p in paths:\n        yield str(p)\n"
    merge = merge_sketch(original, sketch)
    assert not merge.resolved and "no marker at its end" in merge.unresolved[0]


def test_a_sketch_that_ends_as_the_file_ends_reaches_its_end() -> None:
    """Three changed branches and the file's own last lines, no marker after them: the sketch's end is the
    file's, so the branches are rewritten where they end the file, not put in beside an earlier copy."""
    branch = "        elif code < {0}:\n            error = Error('%s' % (code, self.{1}))\n            raise error\n"
    block = "".join(branch.format(n, "{0}") for n in (400, 500, 600))
    original = "def check(self, code):\n" + block.format("content")
    original += "\n\ndef raise_for(self, code):\n" + block.format("content")
    sketch = "# ... existing code ...\ndef raise_for(self, code):\n" + block.format("reason")
    expected = original[: original.rindex("def raise_for")] + "def raise_for(self, code):\n" + block.format("reason")
    assert merged(original, sketch) == expected


def test_tabs_written_as_spaces_are_tabs_again() -> None:
    """A chat answer's code block turns a Go file's tabs into spaces: the merge writes tabs where the
    file has them."""
    original = "func main() {\n\tx := 1\n\tif x > 0 {\n\t\tfmt.Println(x)\n\t}\n}\n"
    sketch = "func main() {\n    x := 1\n    if x > 0 {\n        fmt.Println(x + 1)\n    }\n}\n"
    assert merged(original, sketch) == original.replace("Println(x)", "Println(x + 1)")


def test_the_best_chain_is_the_one_every_pair_of_anchors_gives() -> None:
    """`best_chain` tries the chains best first and counts `fits` from running sums; it must choose what
    weighing every earlier chain for every anchor chose (the first of the best that fits, in anchor order),
    on chunks and originals of lines drawn from a few, brackets and all."""
    from specedit.engine.sketch.anchors import REPLACED_PER_LINE, REPLACED_SLACK, best_chain, find_anchors
    from specedit.engine.sketch.blocks import balance
    from specedit.engine.sketch.merge_checks import counts

    def every_pair(keys: list[str], chunk_keys: list[str], anchors: list[Any]) -> list[Any]:
        said = [n for n, key in enumerate(chunk_keys) if counts(key)]
        best: list[tuple[float, list[Any]]] = []
        for anchor in anchors:
            options = []
            for score, chain in best:
                new = chunk_keys[chain[-1].chunk + chain[-1].size : anchor.chunk]
                old = keys[chain[-1].original + chain[-1].size : anchor.original]
                in_order = (
                    chain[-1].original + chain[-1].size <= anchor.original
                    and chain[-1].chunk + chain[-1].size <= anchor.chunk
                )
                little = sum(map(counts, old)) <= REPLACED_PER_LINE * sum(map(counts, new)) + REPLACED_SLACK
                if in_order and balance(new) == balance(old) and little:
                    options.append((score, chain))
            score, chain = max(options, key=lambda option: option[0], default=(0.0, []))
            lines = chunk_keys[anchor.chunk : anchor.chunk + anchor.size]
            edges = (anchor.chunk <= said[0]) + (anchor.chunk + anchor.size > said[-1])
            best.append((score + sum(map(counts, lines)) + 0.5 * edges, [*chain, anchor]))
        return max(best, key=lambda option: option[0])[1]

    pool = ["def f(x):", "return x", "if x {", "}", "value = 1", "call(a, b)", "", "end", "total += 1", "(["]
    chosen = random.Random(7)
    compared = 0
    for _ in range(300):
        keys = [chosen.choice(pool) + (str(chosen.randrange(40)) if chosen.random() < 0.6 else "") for _ in range(60)]
        chunk_keys = [chosen.choice(keys) if chosen.random() < 0.7 else chosen.choice(pool) for _ in range(30)]
        anchors = find_anchors(keys, 0, chunk_keys)
        if anchors:
            assert best_chain(keys, chunk_keys, anchors) == every_pair(keys, chunk_keys, anchors)
            compared += 1
    assert compared > 200


def test_new_code_repeating_one_old_line_goes_between_its_context_not_over_a_test() -> None:
    """gson's MapTest (commit 97d00f49309d): a new test after `assertEquals` lines two tests end with,
    before a comment two classes share. Its `}).create();` is once in the file, in the test before: on
    that one anchor the chunk reached back to the first test's `assertEquals` and replaced the test
    between (12 lines, the checks passing). Between its context lines, where it loses nothing, it goes."""
    holder = "  /**\n   * Created for issue 99\n   */\n"
    ends = '    assertEquals("1", map.get("a"));\n    assertEquals("2", map.get("b"));\n  }\n\n'
    original = (
        "class MapTest {\n  public void testA() {\n    Map map = gson.fromJson(json, type);\n"
        + ends
        + "  public void testB() {\n"
        + "    Gson gson = new GsonBuilder().registerTypeAdapter(MyMap.class, new InstanceCreator<MyMap>() {\n"
        + "      public MyMap createInstance(Type type) {\n        return new MyMap();\n      }\n    }).create();\n"
        + "    MyMap map = gson.fromJson(json, MyMap.class);\n"
        + ends
        + holder
        + "  private static class Holder {}\n\n"
        + holder
        + "  public void testC() {}\n}\n"
    )
    new_test = (
        "  public void testNew() {\n    Gson gson = new GsonBuilder()\n"
        + "        .registerTypeAdapter(type, new Serializer() {\n"
        + "          public JsonElement serialize(Map src) {\n            return array;\n          }\n"
        + '        }).create();\n    assertEquals("[1]", gson.toJson(src, type));\n  }\n\n'
    )
    sketch = "// ...\n" + ends + new_test + "  /**\n   * Created for issue 99\n// ...\n"
    at = original.index(holder)
    assert merged(original, sketch) == original[:at] + new_test + original[at:]


@pytest.mark.parametrize(
    "sketched",
    [
        pytest.param(lambda f: f, id="the function alone"),
        pytest.param(lambda f: "// TestA checks the usage.\n" + f, id="below its doc comment"),
    ],
)
def test_a_function_shown_from_its_first_line_to_its_brace_may_change_its_last_lines(sketched: Any) -> None:
    """cobra's command_test.go (commit 6e91dded25d7): a test's `t.Fatalf` written over two lines joined into
    one, the test shown whole between markers. The chunk spans the original from its first line that says
    something to its last, the joined line, and `}` says nothing: the old second line fell outside, and the
    checks refused the right merge. What lies between a function's first line and its `}` in the sketch is
    all the function holds (cobra's `Execute`, commit d9414968f876, shown under its doc comment, so too)."""
    old = '\t\tt.Fatalf("Expected usage %s, " +\n\t\t\t"but got %s", usage, actual)\n'
    new = '\t\tt.Fatalf("Expected usage %s, but got %s", usage, actual)\n'
    function = "func TestA(t *testing.T) {\n\tactual := lookup()\n\tif actual != usage {\n{}\t}\n}\n"
    original = (
        "package cobra\n\n// TestA checks the usage.\n"
        + function.replace("{}", old)
        + "\nfunc TestB(t *testing.T) {\n\tother()\n}\n"
    )
    sketch = "/* ... */\n" + sketched(function.replace("{}", new)) + "/* ... */\n"
    assert merged(original, sketch) == original.replace(old, new)


def test_a_method_with_its_brace_below_its_first_line_is_a_block() -> None:
    """guzzle's `getResponseBodySummary` (commit 7fad7865dc25), PSR-2's style: the `{` on a line of its own
    under the method's first line. Shown whole between markers, its new body replaces the old one's 15
    lines; read as no block (the `{` not deeper than the first line), the checks refused it."""
    method = "    public static function summarize(ResponseInterface $response)\n    {\n{}    }\n"
    old = (
        "        $body = $response->getBody();\n        if (!$body->isSeekable()) {\n"
        "            return null;\n        }\n        return $body->read(120);\n"
    )
    new = "        return \\GuzzleHttp\\Psr7\\get_message_body_summary($response);\n"
    original = (
        "<?php\nclass Summary\n{\n"
        + method.replace("{}", old)
        + "\n    public static function other()\n    {\n        return 1;\n    }\n}\n"
    )
    sketch = "    // ... keep existing code ...\n" + method.replace("{}", new) + "    // ... keep existing code ...\n"
    assert merged(original, sketch) == original.replace(old, new)


def test_two_methods_of_one_name_each_shown_whole_change_all_of_their_own() -> None:
    """gson's tests (commit 44c93364c934): `equals` of two classes rewritten with `Objects.equals`, each
    shown whole under `@Override`. The method's first line is in the file twice; each is the block that
    holds its own class's lines (`instanceof Sandwich`), and the comparisons it drops are its own."""

    def equals(name: str, body: str) -> str:
        return (
            "    @Override\n    public boolean equals(Object o) {\n"
            f"      if (!(o instanceof {name})) {{\n        return false;\n      }}\n"
            f"      {name} other = ({name}) o;\n{body}    }}\n"
        )

    def compared(*parts: str) -> str:
        return (
            "".join(
                f"      if (this.{part} == null ? other.{part} != null : !this.{part}.equals(other.{part})) {{\n"
                "        return false;\n      }\n"
                for part in parts
            )
            + "      return true;\n"
        )

    def objects(*parts: str) -> str:
        return "\n      return " + " && ".join(f"Objects.equals(this.{part}, other.{part})" for part in parts) + ";\n"

    classes = "class Test {{\n  static class {0} {{\n{1}  }}\n\n  static class {2} {{\n{3}  }}\n}}\n"
    original = classes.format(
        "Sandwich", equals("Sandwich", compared("bread", "cheese")), "Many", equals("Many", compared("sandwiches"))
    )
    marker = "  // ... keep existing code ...\n"
    sketch = (
        marker
        + equals("Sandwich", objects("bread", "cheese"))
        + marker
        + equals("Many", objects("sandwiches"))
        + marker
    )
    expected = original.replace(compared("bread", "cheese"), objects("bread", "cheese"))
    assert merged(original, sketch) == expected.replace(compared("sandwiches"), objects("sandwiches"))


def test_a_method_shown_whole_ending_in_a_closing_bracket_replaces_its_old_last_line() -> None:
    """aider's getinput.py (commit 9bd635a7a4d8): `__init__` shown whole, its last statement rewritten as a
    call over three lines, the marker after it at column 0. Its last line, `)`, is in the file elsewhere,
    and so the chunk was not read as ending the block: the old last statement stayed after the new one.
    The chunk's last line that says something is what tells new code."""
    head = "    def __init__(self, fnames):\n        self.words = set()\n        for fname in fnames:\n"
    head += "            content = read(fname)\n"
    old = '            self.words.update(re.split(r"\\W+", content))\n'
    new = "            self.words.update(\n                token for token in tokens(content)\n            )\n"
    tail = "\n    def complete(self, text):\n        return (\n            sorted(self.words)\n        )\n"
    original = "class Completer:\n" + head + old + tail
    sketch = "# ... keep existing code ...\n" + head + new + "# ... keep existing code ...\n"
    assert merged(original, sketch) == original.replace(old, new)


# --- Large sketches: the work grows with the sketch and the file, not with their product ------------------


def sketch_of_handlers(numbers: range) -> str:
    """A lazy sketch showing each of the handlers `numbers` whole with its log line changed, markers between."""
    shown = [handlers(number + 1).split("\n\n\n")[number] for number in numbers]
    return "".join(f"# ... existing code ...\n{body}\n\n\n" for body in shown).replace("'big order", "'large order")


def best_seconds(run: Any, tries: int = 3) -> float:
    """The least wall time of `tries` runs of `run`: the machine is shared."""
    best = math.inf
    for _ in range(tries):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def test_ten_times_the_chunks_on_ten_times_the_file_take_about_ten_times_as_long() -> None:
    """A lazy sketch of 98,000 characters took 10.9 s to merge: each chunk's edges, anchors and block were
    looked for by reading the file from the chunk on, and its edge lines were compared with every line
    after it. The original's lines are now read once, and each chunk looks no farther than it may reach."""
    seconds = []
    for count in (40, 400):
        original, sketch = handlers(count), sketch_of_handlers(range(count))
        expected = original.replace("'big order", "'large order")
        assert merged(original, sketch) == expected
        seconds.append(best_seconds(lambda original=original, sketch=sketch: merge_sketch(original, sketch)))
    assert seconds[1] < 30 * seconds[0], seconds


def test_a_sketch_on_a_file_ten_times_longer_takes_at_most_about_ten_times_as_long() -> None:
    """The same sketch of 40 handlers, on a file of 400 and of 4,000: every chunk read the rest of the file."""
    sketch = sketch_of_handlers(range(0, 400, 10))
    seconds = []
    for count in (400, 4000):
        original = handlers(count)
        result = merge_sketch(original, sketch)
        assert result.resolved and result.text.count("'large order") == 40
        seconds.append(best_seconds(lambda original=original: merge_sketch(original, sketch)))
    assert seconds[1] < 30 * seconds[0], seconds


# --- Code between two shown blocks that the sketch neither shows nor marks --------------------------------

FILES = """\
import os


def load(path):
    with open(path) as handle:
        return handle.read()


def parse(text):
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        key, _, value = line.partition("=")
        rows.append((key.strip(), value.strip()))
    return rows


def save(path, rows):
    with open(path, "w") as handle:
        for key, value in rows:
            handle.write(f"{key}={value}\\n")


def main():
    save(os.environ["OUT"], parse(load(os.environ["FILE"])))
"""
# `load` and `save` shown whole, one after the other: no marker stands for `parse` between them.
TWO_SHOWN = """\
# ... existing code ...

def load(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def save(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for key, value in rows:
            handle.write(f"{key}={value}\\n")

# ... existing code ...
"""
BOTH_CHANGED = FILES.replace("open(path)", 'open(path, encoding="utf-8")').replace(
    'open(path, "w")', 'open(path, "w", encoding="utf-8")'
)


def test_a_function_between_two_shown_ones_without_a_marker_is_kept() -> None:
    """A chat model showed two functions it changed and left out the one between them, and the marker for
    it: the merge deleted its 9 lines. Code between two blocks a sketch shows, that it neither shows nor
    marks, stays; a deletion the sketch shows by the lines around it still goes
    (`test_a_deletion_between_two_context_lines`)."""
    assert merged(FILES, TWO_SHOWN) == BOTH_CHANGED
    # The same in braces, with a doc comment above the second method (Go).
    original = (
        "package files\n\nfunc Load(path string) string {\n\treturn read(path)\n}\n\n"
        "func Parse(text string) []Row {\n\trows := split(text)\n\treturn rows\n}\n\n"
        "// Save writes the rows.\nfunc Save(path string, rows []Row) {\n\twrite(path, rows)\n}\n"
    )
    sketch = (
        "// ... existing code ...\nfunc Load(path string) string {\n\treturn readUTF8(path)\n}\n\n"
        "// Save writes the rows.\nfunc Save(path string, rows []Row) {\n\twriteUTF8(path, rows)\n}\n"
    )
    expected = original.replace("return read(path)", "return readUTF8(path)").replace("\twrite(", "\twriteUTF8(")
    assert merged(original, sketch) == expected


def test_two_shown_functions_next_to_each_other_merge_as_before() -> None:
    """Where the original has nothing between the two functions shown, nothing is left out."""
    original = FILES.replace(FILES[FILES.index("def parse") : FILES.index("def save")], "")
    expected = BOTH_CHANGED.replace(BOTH_CHANGED[BOTH_CHANGED.index("def parse") : BOTH_CHANGED.index("def save")], "")
    assert merged(original, TWO_SHOWN) == expected


def test_a_session_keeps_the_function_between_two_shown_ones(tmp_path: Path) -> None:
    """The rule at the session, which every door goes through: the lines' merge keeps `parse`, and a model's
    answer that drops it is no merge (nothing written)."""
    from specedit.engine.records.requests import RewriteOutcome, RewriteRequest
    from specedit.engine.records.stats import Stats
    from specedit.engine.session.session import judged, remote_session

    session = remote_session(f"unix:{tmp_path / 'nobody.sock'}")  # no daemon: the lines merge it
    request = RewriteRequest(FILES, sketch=TWO_SHOWN)
    outcome = session.run(request)
    assert outcome.text == BOTH_CHANGED and outcome.stats.merge == "lines"
    without_parse = BOTH_CHANGED.replace(
        BOTH_CHANGED[BOTH_CHANGED.index("def parse") : BOTH_CHANGED.index("def save")], ""
    )
    verdict = judged(request, RewriteOutcome.finished(without_parse, "stop", Stats()))
    assert verdict.status == "not_a_merge" and "def parse(text):" in (verdict.problem or "")


def test_the_command_line_keeps_the_function_between_two_shown_ones(tmp_path: Path) -> None:
    source, sketch = tmp_path / "files.py", tmp_path / "sketch.py"
    source.write_text(FILES)
    sketch.write_text(TWO_SHOWN)
    command = ["rewrite", str(source), "--sketch", str(sketch), "--model", str(tmp_path / "no-such-model")]
    assert main([*command, "--no-progress", "--in-place"]) == 0
    assert source.read_text() == BOTH_CHANGED
