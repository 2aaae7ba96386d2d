"""A chat model's whole answer applied as an edit sketch: its code is the sketch, and nothing of its prose
or fences reaches the file (`engine.chat_answer`, taken once in the session for every door). The HTTP
door's apply model reads the file and the sketch as the command line reads them."""

from __future__ import annotations

import doctest

import pytest

from specedit.engine.doors.http.apply import apply_request
from specedit.engine.records.requests import ChatMessage, RewriteRequest, SamplingConfig
from specedit.engine.session.session import Session
from specedit.engine.sketch import chat_answer
from specedit.engine.sketch.chat_answer import ChatAnswerError, sketch_from_answer
from specedit.engine.sketch.merge import merge_sketch
from specedit.engine.sketch.patches import detect

from conftest import LINES_SKETCH, AnsweringBackend

ORIGINAL, SKETCH, MERGED = LINES_SKETCH  # `add` changed, `print(add(1, 2))` kept by the marker


def answered(sketch: str, *, opening: str = "Here's the change:", fence: str = "```python", closing: str = "") -> str:
    """`sketch` as a chat model answers it: a sentence, the fenced block, maybe a closing sentence."""
    text = f"{opening}\n\n{fence}\n{sketch}{closing_fence(fence)}\n"
    return text + (f"\n{closing}\n" if closing else "")


def closing_fence(fence: str) -> str:
    return fence[: len(fence) - len(fence.lstrip(fence[0]))]


def test_the_worked_examples() -> None:
    assert doctest.testmod(chat_answer).failed == 0


# --- the pure function ------------------------------------------------------------------------------


@pytest.mark.parametrize("fence", ["```python", "```", "~~~py", "````python"])
def test_prose_and_fences_are_left_out(fence: str) -> None:
    answer = answered(SKETCH, fence=fence, closing="The rest of the file is unchanged.")
    taken = sketch_from_answer(answer, ORIGINAL)
    assert taken.sketch == SKETCH and taken.blocks == 1
    assert taken.left_out == ("Here's the change:", fence, closing_fence(fence), "The rest of the file is unchanged.")


def test_a_bare_sketch_passes_unchanged() -> None:
    for sketch in (SKETCH, "Here is prose with no fence.\nx = 1\n", ""):
        taken = sketch_from_answer(sketch, ORIGINAL)
        assert taken.sketch is sketch and taken.blocks == 0 and taken.left_out == ()


@pytest.mark.parametrize(
    ("above", "info"),
    [
        ("", 'python title="app.py"'),
        ("", "app.py"),
        ("", "python:src/app.py"),
        ("app.py:", "python"),
        ("**app.py**", "python"),
        ("### `src/app.py`", ""),
        ("Here is the new `app.py`:", "python"),
        ("app.py", ""),  # aider's
    ],
)
def test_a_block_names_its_file_in_the_fence_or_above(above: str, info: str) -> None:
    answer = f"Sure.\n\n{above}\n```{info}\n{SKETCH}```\n"
    assert sketch_from_answer(answer, ORIGINAL, path="/home/me/project/src/app.py").sketch == SKETCH
    assert sketch_from_answer(answer, ORIGINAL).sketch == SKETCH  # no path known: taken
    with pytest.raises(ChatAnswerError, match=r"for (src/)?app\.py, not lib/other\.py"):
        sketch_from_answer(answer, ORIGINAL, path="lib/other.py")
    if "src/" in above + info:  # another folder's file of the same name is another file
        with pytest.raises(ChatAnswerError, match=r"for src/app\.py, not tests/app\.py"):
            sketch_from_answer(answer, ORIGINAL, path="tests/app.py")


def test_two_blocks_for_one_file_are_one_sketch_that_keeps_what_lies_between() -> None:
    original = "def a():\n    return 1\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 3\n"
    answer = (
        "Change `a`:\n\n```python\ndef a():\n    return 10\n```\n\nThen, further down:\n\n"
        "```python\ndef c():\n    return 30\n```\n\nThat's all.\n"
    )
    taken = sketch_from_answer(answer, original, path="m.py")
    assert taken.sketch == "def a():\n    return 10\n...\ndef c():\n    return 30\n" and taken.blocks == 2
    merged = merge_sketch(original, taken.sketch)
    assert merged.resolved and merged.text == original.replace("return 1\n", "return 10\n").replace("3\n", "30\n")
    # A block that ends with a marker needs no other.
    marked = answer.replace("    return 10\n```", "    return 10\n# ... existing code ...\n```")
    assert "\n...\n" not in sketch_from_answer(marked, original).sketch


def test_a_block_for_another_file_is_left_out_or_refused_by_name() -> None:
    answer = (
        f"**app.py**\n```python\n{SKETCH}```\n\n**tests/test_app.py**\n```python\ndef test_add():\n"
        "    assert add(1, 2) == -1\n```\n\nRun them with:\n```bash\npytest -q\n```\n"
    )
    taken = sketch_from_answer(answer, ORIGINAL, path="app.py")
    assert taken.sketch == SKETCH and taken.other_files == ("tests/test_app.py",)
    assert "tests/test_app.py" in taken.describe()
    with pytest.raises(ChatAnswerError, match=r"for app\.py, tests/test_app\.py, not lib/other\.py"):
        sketch_from_answer(answer, ORIGINAL, path="lib/other.py")
    # With no path, the file whose code the original has.
    assert sketch_from_answer(answer, ORIGINAL).sketch == SKETCH


DIFF = "--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n+    return a - b\n"
SEARCH_REPLACE = (
    "app.py\n```python\n<<<<<<< SEARCH\n    return a + b\n=======\n    return a - b\n>>>>>>> REPLACE\n```\n"
)
V4A = (
    "*** Begin Patch\n*** Update File: app.py\n@@ def add(a, b):\n-    return a + b\n+    return a - b\n*** End Patch\n"
)


@pytest.mark.parametrize(
    ("answer", "written_as"),
    [
        (f"Here is the diff:\n\n```diff\n{DIFF}```\n\nApply it with git.\n", "udiff"),
        (f"I'll change `add`:\n\n{SEARCH_REPLACE}\nThat's it.\n", "search-replace"),
        (f"```\n{V4A}```\n", "v4a"),
    ],
)
def test_a_patch_in_a_fence_stays_that_patch(answer: str, written_as: str) -> None:
    taken = sketch_from_answer(answer, ORIGINAL, path="app.py")
    assert detect(taken.sketch, ORIGINAL) == written_as and "```" not in taken.sketch
    merged = merge_sketch(ORIGINAL, taken.sketch)
    assert merged.resolved and merged.text == ORIGINAL.replace("a + b", "a - b")


README = "# Tool\n\nInstall it:\n\n```sh\npip install tool\n```\n\nRun it:\n\n```sh\ntool run\n```\n"


def test_a_markdown_files_own_fences_are_its_code() -> None:
    # A bare sketch of a Markdown file: its fences are the file's, and it passes unchanged.
    bare = "Install it:\n\n```sh\npip install tool[all]\n```\n\n<!-- ... rest unchanged ... -->\n"
    assert sketch_from_answer(bare, README, path="README.md").sketch is bare
    new_section = "## Usage\n\n```sh\ntool run --fast\n```\n"  # all new text, no marker: still the file's
    assert sketch_from_answer(new_section, README, path="README.md").sketch is new_section
    assert sketch_from_answer(new_section, README, language="markdown").sketch is new_section
    assert sketch_from_answer(new_section, README).sketch is new_section  # a file with fences: Markdown
    # Answers that fence Markdown as chat models do: longer, named `markdown`, or around the file's text.
    for fence in ("````", "````markdown", "```markdown", "```md"):
        answer = f"Here's the updated README:\n\n{fence}\n{bare}{fence[:3] if fence[3] != '`' else '````'}\nDone.\n"
        taken = sketch_from_answer(answer, README, path="README.md")
        assert taken.sketch == bare, fence
        assert sketch_from_answer(taken.sketch, README, path="README.md").sketch == taken.sketch
    plain = "Here's the updated README:\n\n```\nInstall it:\n\n<!-- ... rest unchanged ... -->\n```\n"
    assert (
        sketch_from_answer(plain, README, path="README.md").sketch == "Install it:\n\n<!-- ... rest unchanged ... -->\n"
    )


def test_a_docstrings_fences_are_the_codes() -> None:
    original = 'def f():\n    """Use it so:\n\n```\nf()\n```\n    """\n    return 1\n'
    sketch = 'def f():\n    """Use it so:\n\n```\nf()\n```\n    """\n    return 2\n'
    assert sketch_from_answer(sketch, original).sketch is sketch  # bare: its lines are the original's
    answer = f"Here you go:\n\n```python\n{sketch}```\n\nIt returns 2 now.\n"
    taken = sketch_from_answer(answer, original, path="f.py")
    assert taken.sketch == sketch and sketch_from_answer(taken.sketch, original).sketch == sketch
    # A string holding an unclosed fence (a parser's test) does not swallow the closing sentence.
    unclosed = 'def test():\n    edit = """\n```text\nfoo\n"""\n    assert edit\n'
    answer = f"Here:\n\n```python\n{unclosed}```\n\nEverything else stays the same.\n"
    assert sketch_from_answer(answer, "def test():\n    assert True\n").sketch == unclosed


def test_a_block_in_a_list_item_and_crlf() -> None:
    answer = "1. Change `add`:\n\n   ```python\n   def add(a, b):\n       return a - b\n   ```\n"
    assert sketch_from_answer(answer, ORIGINAL).sketch == "def add(a, b):\n    return a - b\n"
    crlf = answered(SKETCH).replace("\n", "\r\n")
    assert sketch_from_answer(crlf, ORIGINAL).sketch == SKETCH.replace("\n", "\r\n")


# --- the session: every door ---------------------------------------------------------------------------


def test_a_chat_answer_merges_as_its_bare_sketch_does() -> None:
    backend = AnsweringBackend("never asked")
    answer = answered(SKETCH, closing="The rest of the file is unchanged.")
    outcome = Session(backend).run(RewriteRequest(ORIGINAL, sketch=answer, path="add.py"))
    bare = Session(backend).run(RewriteRequest(ORIGINAL, sketch=SKETCH, path="add.py"))
    assert outcome.complete and outcome.text == bare.text == MERGED and backend.asked == []
    assert outcome.stats.merge == "lines" and outcome.stats.sketch_from == "a chat answer: 1 fenced block"
    assert bare.stats.sketch_from is None


def test_the_model_is_shown_the_code_and_may_not_write_the_prose() -> None:
    answer = answered(SKETCH, closing="The rest of the file is unchanged.")
    backend = AnsweringBackend(f"Here's the change:\n{MERGED}")
    outcome = Session(backend).run(RewriteRequest(ORIGINAL, sketch=answer, merge="model"))
    assert backend.asked[0].sketch == SKETCH  # the prompt holds the code alone
    assert outcome.status == "not_a_merge" and "prose or code fences" in outcome.problem
    fenced = Session(AnsweringBackend(f"```python\n{MERGED}")).run(
        RewriteRequest(ORIGINAL, sketch=answer, merge="model")
    )
    assert fenced.status == "not_a_merge" and "'```python'" in fenced.problem
    right = Session(AnsweringBackend(MERGED)).run(RewriteRequest(ORIGINAL, sketch=answer, merge="model"))
    assert right.complete and right.text == MERGED


def test_a_session_refuses_an_answer_for_another_file_by_name() -> None:
    answer = f"**lib/other.py**\n```python\n{SKETCH}```\n"
    with pytest.raises(ChatAnswerError, match=r"for lib/other\.py, not add\.py"):
        Session(AnsweringBackend("never asked")).run(RewriteRequest(ORIGINAL, sketch=answer, path="add.py"))


# --- the HTTP door's apply model reads what the command line reads -------------------------------------

JAVADOC = "/**\n * Returns <code>true</code> when empty.\n */\nclass Box {\n  int size() { return 0; }\n}\n"
BOX_SKETCH = "// ... existing code ...\n  int size() { return 1; }\n}\n"


@pytest.mark.parametrize(
    ("code", "sketch"),
    [
        (JAVADOC, BOX_SKETCH),  # gson's Javadoc: `</code>` in the file
        ("\nvar x = 1;\nvar y = 2;\n", "var x = 1;\nvar y = 3;\n"),  # express: a first blank line
        ("x = 1\ny = 2\n\n\n", "x = 1\ny = 3\n"),  # requests: last blank lines
        ("x = 1\ny = 2", "x = 1\ny = 3"),  # no last newline
    ],
)
def test_the_apply_model_reads_the_file_and_sketch_as_the_command_line_does(code: str, sketch: str) -> None:
    cli = RewriteRequest(code, sketch=sketch)  # `specedit rewrite FILE --sketch SKETCH` reads both as they are
    for said in (
        f"<instruction>Apply the edit.</instruction>\n<code>{code}</code>\n<update>{sketch}</update>",
        f"<code>{code}</code>\n<update>{sketch}</update>",  # Continue's template
        f"<update>{sketch}</update>\n<code>{code}</code>",
    ):
        door = apply_request((ChatMessage("user", said),), SamplingConfig(), None)
        assert (door.original, door.sketch) == (cli.original, cli.sketch)
    backend = AnsweringBackend("the model's answer")
    by_door, by_cli = Session(backend).run(door), Session(backend).run(cli)
    assert (by_door.text, by_door.status) == (by_cli.text, by_cli.status)
    if code == JAVADOC:  # merged by its lines (the door cut the file at the Javadoc's `</code>`: the model, 422)
        assert by_door.complete and by_door.text == JAVADOC.replace("return 0", "return 1") and backend.asked == []


def test_the_apply_model_takes_tags_on_lines_of_their_own() -> None:
    said = "<code>\nx = 1\ny = 2\n\n</code>\n<update>\nx = 1\ny = 3\n\n</update>"
    door = apply_request((ChatMessage("user", said),), SamplingConfig(), None)
    assert (door.original, door.sketch) == ("x = 1\ny = 2\n", "x = 1\ny = 3\n")
