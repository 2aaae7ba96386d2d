"""The edit sketch in a chat model's whole answer: its code, without the prose and the fences around it.
A user asks a chat model for a change, copies its whole answer and applies it: a sentence, a fenced code
block (the sketch), maybe a second block for another part, a closing sentence. Only the code is the
sketch; the prose and the fence lines must never reach the file. `sketch_from_answer` takes what the
model answered and returns the sketch to merge, by the rules its docstring lists.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from specedit.engine.records.errors import InputError
from specedit.engine.records.prompts import language_for_path
from specedit.engine.sketch.merge_checks import FENCE, counts, is_elision
from specedit.engine.sketch.patches import SYNTAX, detect

# What names a file in a fence's info string: `title="app.py"`, `file=app.py`, `path: app.py`.
_NAMED = re.compile(r"""\b(?:title|file|filename|path|name)\s*[=:]\s*["']?([^"'\s{}]+)""", re.IGNORECASE)
# What may come around a file's name on the line above a block (`### File: **src/app.py**:`): a heading's
# or a list item's start, `File:`, Markdown's marks.
_LABEL_START = re.compile(r"^(?:#{1,6}\s+|[-+*]\s+|\d+\.\s+)")
_FILE_SAID = re.compile(r"^(?:file(?:name)?|path)\s*:\s*", re.IGNORECASE)  # `File: app.py`
_DECORATIONS = ("**", "__", "`", "*")  # bold, code, emphasis around a whole name
_SEARCH = re.compile(r"^<{5,9} ?SEARCH\b")  # aider's SEARCH/REPLACE markers (`patches`): fences between are code
_REPLACE = re.compile(r"^>{5,9} ?REPLACE\b")
_SAYS = re.compile(r"[^\W_]")  # a letter or a digit
# A line of prose or Markdown, not of code: two words in a row, an end of a sentence, a heading, a list
# item, a quote, a table, emphasis, inline code.
_PROSE = re.compile(r"[^\W\d_]{2,}[ ,]+[^\W\d_]{2,}|[.!?:]$|^(?:#|[-*+>|`]|\d+[.)]\s)")
_QUOTED = re.compile(r"`([^`\s]+)`")  # a file name quoted in a sentence: "Here is the new `app.py`:"
# Suffixes of file names beside those the prompts know a language for (`prompts.language_for_path`).
_MORE_SUFFIXES = frozenset(
    {".txt", ".rst", ".mdx", ".markdown", ".cfg", ".ini", ".conf", ".env", ".xml", ".svg", ".vue", ".svelte"}
    | {".kt", ".dart", ".m", ".pl", ".tf", ".gradle", ".proto", ".graphql", ".mk", ".cmake", ".h", ".c", ".cc"}
    | {".rs", ".java", ".ts", ".tsx", ".jsx", ".less", ".sass", ".jinja", ".j2"}
)
_MARKDOWN = frozenset({"markdown", "md", "mdx", "gfm"})
_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdx"})
# Languages of a block that shows a command to run, not code of the file ("Run the tests with:").
_TERMINAL = frozenset(
    {"bash", "sh", "shell", "zsh", "fish", "console", "terminal", "shell-session", "powershell", "pwsh", "cmd"}
)
_NONE: Mapping[int, bool] = {}  # no SEARCH/REPLACE markers
ELISION = "..."  # joins two blocks of one file: a line that is only an ellipsis (`merge_checks.is_elision`)


class ChatAnswerError(InputError):
    """The answer's code is for another file than the one it is applied to (named), or for several files
    none of which is named as this one."""


@dataclass(frozen=True)
class AnswerSketch:
    """The sketch in an answer: `sketch` to merge; `left_out`, the answer's lines around it that must never
    be written into the file (prose, file names, fence lines, without their line endings); `blocks`, how many
    fenced blocks it took (0: the answer is a bare sketch); `other_files`, the files of blocks left out."""

    sketch: str
    left_out: tuple[str, ...] = ()
    blocks: int = 0
    other_files: tuple[str, ...] = ()

    def describe(self) -> str:
        """What was taken, in a few words, for the rewrite's stats (empty for a bare sketch)."""
        if not self.blocks:
            return ""
        said = f"a chat answer: {self.blocks} fenced block{'s' if self.blocks > 1 else ''}"
        return said + (f"; left out: code for {', '.join(self.other_files)}" if self.other_files else "")


@dataclass(frozen=True)
class _Fence:
    at: int  # line number
    indent: int
    char: str
    length: int
    info: str


@dataclass(frozen=True)
class _Block:
    opening: _Fence
    closing: int  # the closing fence's line number, or the number of lines (no closing fence)
    label: int | None  # the line above that names its file, if one does
    name: str | None  # its file, named in the fence or above it, or the file of the block before it


def sketch_from_answer(answer: str, original: str = "", *, path: str | None = None, language: str = "") -> AnswerSketch:
    """The sketch to merge from what a chat model answered. `original` is the text it is applied to, `path`
    its file (None: not known; a block for another file cannot be told then, and of several files named the
    one whose code the original has most is taken), `language` its language (`prompts.language_for_path`'s
    names). `ChatAnswerError` names the file an answer's code is for, where it is for other files only. The
    answer is read so:

    - prose before, between and after the blocks is left out, as are the fence lines;
    - a block is fenced with three or more backticks or tildes, with or without a language, indented by at
      most three spaces (CommonMark's rule); a block whose fence is longer holds shorter fences as code;
    - a block's file is named in its fence (```` ```python title="app.py" ````, ```` ```app.py ````,
      ```` ```python:app.py ````) or on the line above it (`app.py:`, `**app.py**`, `### app.py`, aider's bare
      `app.py`, "Here is the new `app.py`:"); a block with no name belongs to the file of the block before it;
    - several blocks for the file are one sketch, joined by a `...` marker where neither block marks the
      gap (so the code between them is kept); a unified diff, SEARCH/REPLACE blocks or a V4A patch in a
      fence stay that patch (`patches`), joined as they are;
    - a block for another file is left out, and an answer with code for other files only is refused by
      name (`ChatAnswerError`); a terminal block (```` ```bash ````: "run the tests with") beside code is
      left out;
    - an answer with no fence, or whose fences are the code's own, is a bare sketch and passes unchanged.

    The code's own fences: a Markdown file, a docstring holding ```` ``` ````. A text is read as a chat
    answer only where everything it leaves out is new to the file and reads as prose: no line the original
    has, no elision marker, no patch syntax, no code between two blocks (a bare sketch of a Markdown file
    shows the file's lines or its markers between its code blocks; a split inside the code leaves code
    between). Where the file is Markdown, its own fences look like an answer's, so a block is taken as the
    answer's only where its fence says so (a `markdown` language, a file name, a fence longer than the file's
    own or of a kind the file has none of, as CommonMark asks of a fenced Markdown text) or where its code is
    the file's text or holds a marker. Reading the sketch it returns again gives the same sketch: the
    daemon's session reads the request the client's session made.

    >>> answer = "Here's the fix:\\n\\n```python\\ndef add(a, b):\\n    return a + b\\n```\\n"
    >>> answer += "\\nThe rest is unchanged.\\n"
    >>> sketch_from_answer(answer).sketch
    'def add(a, b):\\n    return a + b\\n'
    >>> sketch_from_answer(answer).left_out
    ("Here's the fix:", '```python', '```', 'The rest is unchanged.')
    >>> two = "app.py:\\n```python\\ndef f():\\n    return 1\\n```\\nAnd further down:\\n"
    >>> two += "```python\\ndef g():\\n    return 2\\n```\\n"
    >>> print(sketch_from_answer(two, path="src/app.py").sketch, end="")
    def f():
        return 1
    ...
    def g():
        return 2
    >>> try:
    ...     sketch_from_answer(two, path="lib.py")
    ... except ChatAnswerError as error:
    ...     print(error)
    the answer's code is for app.py, not lib.py: apply it to that file
    >>> sketch_from_answer("x = 2\\n").sketch  # a bare sketch
    'x = 2\\n'
    """
    lines = answer.splitlines(keepends=True)
    bodies = [line.rstrip("\r\n") for line in lines]
    fences = {number: fence for number, line in enumerate(bodies) if (fence := _fence(number, line))}
    if not fences:
        return AnswerSketch(answer)
    original_lines = original.splitlines()
    known = {line.strip() for line in original_lines}
    own_fences = {number: fence for number, line in enumerate(original_lines) if (fence := _fence(number, line))}
    markdown = _is_markdown(path, language, bool(own_fences))
    own_text = _outside(original_lines, own_fences) if markdown else set()
    markers = {
        n: bool(_SEARCH.match(body)) for n, body in enumerate(bodies) if _SEARCH.match(body) or _REPLACE.match(body)
    }
    readings = [_nested(fences, len(lines), markers, nesting) for nesting in (True, False)]
    closed = [spans for spans in [*readings, _outermost(fences)] if spans and spans[-1][1] < len(lines)]
    for spans in [*closed, *readings]:  # a reading that closes every block first (the code's own may not)
        blocks = _named(bodies, fences, spans)
        if not blocks or not _reads_as_answer(bodies, blocks, known):
            continue
        if not markdown or all(_plainly_answers(bodies, block, own_fences, own_text) for block in blocks):
            return _taken(lines, bodies, blocks, original, known, path)
    return AnswerSketch(answer)


def _fence(number: int, line: str) -> _Fence | None:
    found = FENCE.match(line)
    if found is None or (found["fence"][0] == "`" and "`" in found["info"]):
        return None
    return _Fence(number, len(found["indent"]), found["fence"][0], len(found["fence"]), found["info"])


def _nested(
    fences: dict[int, _Fence], count: int, patch_markers: Mapping[int, bool] = _NONE, nesting: bool = True
) -> list[tuple[_Fence, int]]:
    """The blocks as CommonMark reads them, with two allowances for what chat models write: with `nesting`,
    inside a block, a fence of its kind with a language opens a block in the code (a Markdown file's
    ```` ```sh ```` in a ```` ``` ```` answer), closed by the next bare one; and between SEARCH/REPLACE
    markers (`patch_markers`: their lines, True for a SEARCH line) fences are the code's. A block left open
    runs to the end (its closing number is `count`)."""
    spans: list[tuple[_Fence, int]] = []
    opening: _Fence | None = None
    depth = 0
    in_patch = False
    for number in sorted({*fences, *patch_markers}):
        fence = fences.get(number)
        if fence is None:  # a SEARCH line opens the code's own text, a REPLACE line closes it
            in_patch = opening is not None and patch_markers[number]
            continue
        if in_patch:
            continue
        if opening is None:
            opening, depth = fence, 0
        elif fence.char == opening.char and fence.length >= opening.length:
            if fence.info and not nesting:
                continue  # CommonMark: a fence with an info string closes nothing
            if fence.info:
                depth += 1
            elif depth:
                depth -= 1
            else:
                spans.append((opening, number))
                opening = None
    if opening is not None:
        spans.append((opening, count))
    return spans


def _outermost(fences: dict[int, _Fence]) -> list[tuple[_Fence, int]]:
    """One block from the first fence to the last bare one of its kind: an answer whose code holds bare
    fences of the answer's own kind (a docstring's ```` ``` ```` in a ```` ```python ```` block)."""
    first = fences[min(fences)]
    last = [
        number
        for number, fence in fences.items()
        if number > first.at and fence.char == first.char and fence.length >= first.length and not fence.info
    ]
    return [(first, max(last))] if last else []


def _named(bodies: list[str], fences: dict[int, _Fence], spans: list[tuple[_Fence, int]]) -> list[_Block]:
    """The blocks with the file each is for (`_Block.name`)."""
    blocks: list[_Block] = []
    after = 0  # the first line past the block before
    name: str | None = None
    for opening, closing in spans:
        label = next((n for n in range(opening.at - 1, after - 1, -1) if bodies[n].strip()), None)
        labelled = _label_name(bodies[label]) if label is not None else None
        own = _info_name(opening.info) or labelled
        name = own or name
        blocks.append(_Block(opening, closing, label if labelled else None, name))
        after = closing + 1
    return blocks


def _info_name(info: str) -> str | None:
    """The file a fence's info string names: `python title="app.py"`, `app.py`, `python:app.py`, `py app.py`."""
    if (found := _NAMED.search(info)) is not None:
        return found[1]
    words = info.replace(":", " ").split()
    return next((word for word in words if _file_name(word)), None)


def _label_name(line: str) -> str | None:
    """The file a line above a block names: the line is the name (`app.py:`, `**app.py**`, `### app.py`,
    `File: app.py`), or a sentence ending in a colon that quotes one file name ("Here is the new `app.py`:")."""
    text = line.strip()
    name = _undecorated(_FILE_SAID.sub("", _undecorated(_LABEL_START.sub("", text))))
    if " " not in name and _file_name(name):
        return name
    quoted = [name for name in _QUOTED.findall(text) if _file_name(name)]
    return quoted[0] if text.rstrip("*").endswith(":") and len(quoted) == 1 else None


def _undecorated(text: str) -> str:
    """`text` without a colon after it and the Markdown marks around it (`**app.py**:` is "app.py"); marks
    inside a name are its own (`__init__.py`, `_posts/x.md`)."""
    text = text.strip().removesuffix(":")
    for mark in _DECORATIONS:
        if len(text) > 2 * len(mark) and text.startswith(mark) and text.endswith(mark):
            text = text[len(mark) : -len(mark)].strip().removesuffix(":")
    return text


def _file_name(word: str) -> bool:
    """Whether a word is a file's name: a known suffix (`app.py`, `src/lib/util.ts`), not a sentence's
    word with a dot (`e.g.`, `foo.bar`)."""
    name = word.replace("\\", "/").rpartition("/")[2]
    dot = name.rfind(".")
    return 0 < dot < len(name) - 1 and _known_suffix(name[dot:].lower())


@functools.cache
def _known_suffix(suffix: str) -> bool:
    return bool(language_for_path(f"x{suffix}")) or suffix in _MORE_SUFFIXES


def _reads_as_answer(bodies: list[str], blocks: list[_Block], known: set[str]) -> bool:
    """Whether everything outside the blocks is new to the file and reads as a chat answer's: prose, file
    names, blank lines. A line the original has (`f()`, `import os`), an elision marker or a patch's
    syntax outside them says the fences are the code's own (a Markdown file's sketch, a docstring's
    example), as does code between two blocks (`}`, `x = f()`): a split inside the code."""
    inside: set[int] = set()
    for block in blocks:
        inside.update(range(block.opening.at, min(block.closing + 1, len(bodies))))
    if not any(counts(bodies[n]) for b in blocks for n in range(b.opening.at + 1, min(b.closing, len(bodies)))):
        return False  # no code in any block
    labels = {block.label for block in blocks}
    first, last = blocks[0].opening.at, blocks[-1].closing
    for number, line in enumerate(bodies):
        text = line.strip()
        if number in inside or not text or number in labels:
            continue
        if is_elision(line) or SYNTAX.match(line) or (_SAYS.search(text) and text in known):
            return False
        if first < number < last and not _PROSE.search(text):
            return False
    return True


def _is_markdown(path: str | None, language: str, own_fences: bool) -> bool:
    """Whether the file is Markdown (its own fences look like an answer's): by its name or language, or,
    with neither known, by fences of its own at the start of a line."""
    if path is not None and PurePosixPath(path.replace("\\", "/")).suffix.lower() in _MARKDOWN_SUFFIXES:
        return True
    if language:
        return language.lower() in _MARKDOWN
    return path is None and own_fences


def _outside(original_lines: list[str], own_fences: dict[int, _Fence]) -> set[str]:
    """The lines of a Markdown file outside its own code blocks, stripped, those that say something."""
    inside: set[int] = set()
    for opening, closing in _nested(own_fences, len(original_lines)):
        inside.update(range(opening.at, closing + 1))
    return {line.strip() for n, line in enumerate(original_lines) if n not in inside and counts(line)}


def _plainly_answers(bodies: list[str], block: _Block, own_fences: dict[int, _Fence], own_text: set[str]) -> bool:
    """Whether a block in an answer for a Markdown file is plainly the answer's, not one of the file's own:
    its fence says so (a `markdown` language, a file name, a fence longer than the file's of its kind, or
    of a kind the file has none of), or its code is Markdown text (a line of the file's own text outside
    its code blocks) or a sketch (an elision marker)."""
    fence = block.opening
    words = fence.info.split()
    if (words and words[0].lower() in _MARKDOWN) or _info_name(fence.info) or block.label is not None:
        return True
    own = [other.length for other in own_fences.values() if other.char == fence.char]
    if not own or fence.length > max(own):
        return True
    code = bodies[fence.at + 1 : block.closing]
    return any(is_elision(line) or line.strip() in own_text for line in code)


def _taken(
    lines: list[str], bodies: list[str], blocks: list[_Block], original: str, known: set[str], path: str | None
) -> AnswerSketch:
    """The sketch of the blocks for the file, and the answer's lines left out around them."""
    inside: set[int] = set()
    for block in blocks:
        inside.update(range(block.opening.at + 1, min(block.closing, len(lines))))
    left_out = tuple(body for number, body in enumerate(bodies) if number not in inside and body.strip())
    coding = [block for block in blocks if _language(block) not in _TERMINAL]
    if coding:  # "Run the tests with:" beside the code: a command, not the file's
        blocks = coding
    names = sorted({block.name for block in blocks if block.name is not None})
    if path is not None:
        mine = [block for block in blocks if block.name is None or _same_file(block.name, path)]
        if not mine:
            raise ChatAnswerError(f"the answer's code is for {', '.join(names)}, not {path}: apply it to that file")
    elif len(names) > 1:
        mine = _most_known(lines, blocks, names, known)
    else:
        mine = blocks
    others = tuple(sorted({block.name for block in blocks if block not in mine and block.name is not None}))
    codes = [_code(lines, block) for block in mine]
    return AnswerSketch(_joined(codes, original), left_out, len(mine), others)


def _language(block: _Block) -> str:
    words = block.opening.info.split()
    return words[0].lower() if words else ""


def _same_file(name: str, path: str) -> bool:
    """Whether a block's file name is the file at `path`: one's parts end the other's (`app.py` and
    `/home/me/src/app.py`, `src/app.py` and `app.py`), not `tests/app.py` for `src/app.py`."""

    def parts(text: str) -> list[str]:
        return [part for part in text.replace("\\", "/").split("/") if part not in ("", ".", "..")]

    named, target = parts(name), parts(path)
    shared = min(len(named), len(target))
    return shared > 0 and named[-shared:] == target[-shared:]


def _most_known(lines: list[str], blocks: list[_Block], names: list[str], known: set[str]) -> list[_Block]:
    """With no path given and several files named: the blocks of the file whose code the original has most
    (unnamed blocks go with it); a tie is refused by name."""

    def score(name: str) -> int:
        return sum(
            counts(line) and line.strip() in known
            for block in blocks
            if block.name == name
            for line in lines[block.opening.at + 1 : block.closing]
        )

    scores = sorted(((score(name), name) for name in names), reverse=True)
    if scores[0][0] == scores[1][0]:
        raise ChatAnswerError(f"the answer holds code for several files ({', '.join(names)}): apply it to one by name")
    return [block for block in blocks if block.name in (None, scores[0][1])]


def _code(lines: list[str], block: _Block) -> str:
    """A block's lines, less the fence's indentation (a block in a list item)."""
    indent = " " * block.opening.indent
    code = [line.removeprefix(indent) if indent else line for line in lines[block.opening.at + 1 : block.closing]]
    text = "".join(code)
    return text if not text or text.endswith("\n") else text + "\n"


def _joined(codes: Sequence[str], original: str) -> str:
    """The blocks of one file as one sketch: a patch's blocks as they are; a lazy sketch's joined by an
    elision marker where neither side of the gap has one, so that the code between them is kept."""
    if len(codes) == 1 or any(detect(code, original) != "lazy" for code in codes):
        return "".join(codes)
    joined = [codes[0]]
    for before, after in itertools.pairwise(codes):
        last = next((line for line in reversed(before.splitlines()) if line.strip()), "")
        first = next((line for line in after.splitlines() if line.strip()), "")
        joined += [after] if is_elision(last) or is_elision(first) else [ELISION + "\n", after]
    return "".join(joined)
