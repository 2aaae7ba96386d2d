"""Prompts for a rewrite, and getting the code back out of what the model writes.

The code comes first and the request last: the system prompt, the code, then how to rewrite it (the
instruction or the edit sketch). Requests on one file share the prompt up to the request, and the
engine's prefix cache (`model.prefix_cache`) computes that part once for all of them, before the user
asks when the editor warms it. (A region is shown alone, not inside its file: with the whole file before
it, the default model went on past the region in 4 of 12 real edits; docs/benchmarks.md has the figures.)

The model is primed with the opening code fence (the answer already starts with "```python\\n"), so its
first token is the first token of the code: the copy drafter can propose from the very first step, and
no tokens go into a fence or a preamble. Generation stops at the closing fence (`AnswerStream`): tokens
spent on an explanation after the code are waste.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Protocol

SYSTEM_PROMPT = (
    "You are a precise code editor. Rewrite the code the user gives you as instructed. Reply with the "
    "complete rewritten code in a single fenced code block, keep everything that the instruction does not "
    "ask to change exactly as it is, and write nothing after the code block."
)

SKETCH_INSTRUCTION = (
    "Merge this edit sketch into the code. The sketch shows only the changed parts; comments like "
    "`... existing code ...` stand for unchanged code, which must be kept exactly as it is.\n\nEdit sketch:"
)

# A sketch written as a patch (`patches`): what its syntax means, and the fence's language tag.
PATCH_INSTRUCTIONS = {
    "udiff": (
        "Apply this unified diff to the code: lines starting with `-` are taken out, lines starting "
        "with `+` are put in, the others are context. Its line numbers may be wrong.",
        "diff",
    ),
    "search-replace": (
        "Apply these SEARCH/REPLACE blocks to the code: each SEARCH part's lines are replaced by its REPLACE part's.",
        "",
    ),
    "v4a": (
        "Apply this patch to the code: lines starting with `-` are taken out, lines starting with `+` "
        "are put in, the others are context; an `@@` line names what the change comes after.",
        "",
    ),
}

_LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "jsx",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".kt": "kotlin",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".cs": "csharp",
    ".rb": "ruby",
    ".php": "php",
    ".swift": "swift",
    ".lua": "lua",
    ".sh": "bash",
    ".bash": "bash",
    ".zsh": "bash",
    ".sql": "sql",
    ".html": "html",
    ".css": "css",
    ".scss": "scss",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".md": "markdown",
    ".r": "r",
    ".scala": "scala",
    ".hs": "haskell",
    ".ex": "elixir",
    ".exs": "elixir",
    ".vim": "vim",
}


def language_for_path(path: str | None) -> str:
    """The fence language tag for a file name ("" when unknown)."""
    if not path:
        return ""
    return _LANGUAGES.get(PurePath(path).suffix.lower(), "")


@dataclass(frozen=True)
class RewritePrompt:
    """What the model is asked: an instruction in plain language, or an edit sketch to merge."""

    original: str
    instruction: str | None = None
    sketch: str | None = None
    language: str = ""
    sketch_format: str = "lazy"  # how the sketch is written: lazy, or a patch's format (`PATCH_INSTRUCTIONS`)

    def __post_init__(self) -> None:
        if (self.instruction is None) == (self.sketch is None):
            raise ValueError("give exactly one of instruction and sketch")

    def user_message(self) -> str:
        """The code first (what requests on it share), then the request."""
        parts = [self.code_block()]
        if self.sketch is not None and self.sketch_format in PATCH_INSTRUCTIONS:
            instruction, tag = PATCH_INSTRUCTIONS[self.sketch_format]
            parts.append(f"{instruction}\n\nPatch:\n{_block(_fence_for(self.sketch), tag, self.sketch)}")
        elif self.sketch is not None:
            parts.append(f"{SKETCH_INSTRUCTION}\n{_block(_fence_for(self.sketch), self.language, self.sketch)}")
        else:
            parts.append(str(self.instruction))
        return "\n\n".join(parts)

    def code_block(self) -> str:
        """The code's block: it depends on the code alone."""
        return _block(_fence_for(self.original), self.language, self.original)

    @property
    def fence(self) -> str:
        """The fence the answer is primed with and closed by: longer than any backtick run in what it may
        copy."""
        return _fence_for(self.original, self.sketch or "")

    def answer_prefix(self) -> str:
        """The start of the answer the model is primed with: the opening fence."""
        return f"{self.fence}{self.language}\n"


def _fence_for(*texts: str) -> str:
    """A backtick fence longer than any run of backticks in the texts (CommonMark's rule)."""
    longest = max((len(run) for text in texts for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _block(fence: str, language: str, text: str) -> str:
    newline = "" if text.endswith("\n") or not text else "\n"
    return f"{fence}{language}\n{text}{newline}{fence}"


class ChatTemplate(Protocol):
    """What a prompt reads of a tokenizer: its chat template (None for a base model), rendered to text."""

    @property
    def chat_template(self) -> str | None: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str: ...


def build_prompt(tokenizer: ChatTemplate, prompt: RewritePrompt) -> str:
    """The full prompt text, primed with the answer's opening fence.

    Instruct models get their chat template; base models (no template) a plain one.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt.user_message()},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = f"{SYSTEM_PROMPT}\n\n{prompt.user_message()}\n\nRewritten code:\n"
    return text + prompt.answer_prefix()


def file_prefix(tokenizer: ChatTemplate, document: str, language: str = "") -> str:
    """The start of the prompt of every request on the whole of `document` (with "\\n" line endings): the
    system prompt and the code's block; what the engine prefills before it is asked
    (`loop.rewrite.warm_document`)."""
    marker = "\x00"  # an instruction no template changes, found after the document
    text = build_prompt(tokenizer, RewritePrompt(document, marker, None, language))
    return text[: text.rindex(marker)]


def closing_fence_at(text: str, fence: str = "```") -> int | None:
    """Index where a line holding only a closing fence starts in `text`, or None.

    >>> closing_fence_at("x = 1\\n```\\nDone.")
    6
    >>> closing_fence_at("```\\n") is None, closing_fence_at("```") is None  # a fence must end its line
    (False, True)
    """
    start = 0
    while True:
        index = text.find(fence, start)
        if index < 0:
            return None
        at_line_start = index == 0 or text[index - 1] == "\n"
        line_end = text.find("\n", index)
        if at_line_start and line_end >= 0 and text[index:line_end].rstrip() == fence:
            return index
        start = index + len(fence)


def extract_code(text: str, *, primed: bool = True) -> str:
    """The code in what the model wrote, robust to a missing fence, a language tag, and text after it.

    With `primed`, the opening fence was part of the prompt, so `text` starts inside the block.

    >>> extract_code("x = 1\\n```\\nThis sets x.")
    'x = 1\\n'
    >>> extract_code("```python\\nx = 1\\n```", primed=False)
    'x = 1\\n'
    >>> extract_code("x = 1\\n", primed=False)  # no fence at all: the whole text is the code
    'x = 1\\n'
    >>> extract_code("Here you go:\\n```js\\nf()\\n```\\n", primed=False)
    'f()\\n'
    """
    if not primed:
        opening = re.search(r"^(`{3,})[^\n`]*\n", text, flags=re.MULTILINE)
        if opening is None:
            return text
        text = text[opening.end() :]
    end = closing_fence_at(text + "\n")
    return text if end is None else text[:end]


class AnswerStream:
    r"""Turns the streamed answer (primed: it starts inside the code block) into streamed code.

    `feed` takes text as the model writes it and returns True once the closing fence line is complete;
    `take` returns the code released since the last call. A line that could still become the closing
    fence is held back until it is decided, so the fence never reaches the editor.

    >>> answer = AnswerStream()
    >>> answer.feed("x = 1\n``"), answer.take()
    (False, 'x = 1\n')
    >>> answer.feed("`\nThat was it."), answer.take(), answer.code
    (True, '', 'x = 1\n')
    >>> answer = AnswerStream()
    >>> answer.feed("y = 2\n```"), answer.code  # the answer ended right after the fence
    (False, 'y = 2\n')
    """

    def __init__(self, fence: str = "```") -> None:
        self._fence = fence
        self._code: list[str] = []
        self._line = ""  # the current, unfinished line: not yet known not to be the fence
        self._released = 0
        self._mid_line = False  # part of the current line was released: it cannot be the fence
        self.closed = False

    @property
    def code(self) -> str:
        """All code so far, with a held-back last line unless it is the closing fence (the model may end
        its answer right after the fence, without a newline)."""
        held = "" if self.closed or self._line.rstrip() == self._fence else self._line
        return "".join(self._code) + held

    def feed(self, text: str) -> bool:
        if self.closed:
            return True
        pending, self._line = self._line + text, ""
        while (newline := pending.find("\n")) >= 0:
            line, pending = pending[:newline], pending[newline + 1 :]
            if not self._mid_line and line.rstrip() == self._fence:
                self.closed = True
                return True
            self._code.append(line + "\n")
            self._mid_line = False
        # A partial line is released at once unless it could still become the closing fence.
        if pending and (self._mid_line or not self._fence.startswith(pending.rstrip())):
            self._code.append(pending)
            self._mid_line = True
        else:
            self._line = pending
        return False

    def take(self) -> str:
        text = "".join(self._code[self._released :])
        self._released = len(self._code)
        return text
