"""The apply model's request: hosted fast-apply models take one user message in Morph's format (the one
Continue's apply role sends such a model), and answer the merged file.

    <instruction>Add a docstring.</instruction>
    <code>THE FILE</code>
    <update>THE SKETCH (`// ... existing code ...` for the rest), a diff or SEARCH/REPLACE blocks</update>

The sketch is merged as `specedit rewrite --sketch` merges it (`session.Session`: by its lines where they
say where it goes, else by the model with that merge as its draft; a merge that would delete code the
sketch does not show is refused; a whole chat answer gives its code, `chat_answer`). The file and the
sketch are read as the command line reads them, whatever they hold: a Javadoc's `<code>` tags, a first
blank line, a last one.
"""

from __future__ import annotations

import re

from specedit.engine.doors.http.openai import invalid
from specedit.engine.records.requests import ChatMessage, RewriteRequest, SamplingConfig

APPLY_MODEL = "specedit-apply"
_INSTRUCTION = re.compile(r"\s*<instruction>.*?</instruction>", re.DOTALL)
# Tags on lines of their own around a text that ends its last line: `<code>\nTEXT\n\n</code>`.
_OWN_LINES = re.compile(r"\r?\n(.*\n)\r?\n", re.DOTALL)


def is_apply_model(model: str) -> bool:
    """Whether a model id asks for the apply model (any id with `apply` in it: tools name theirs freely)."""
    return "apply" in model.lower()


def apply_request(
    messages: tuple[ChatMessage, ...], sampling: SamplingConfig, max_tokens: int | None
) -> RewriteRequest:
    """The rewrite an apply model's chat stands for: its last user message's code, sketch and instruction."""
    said = next((message.content for message in reversed(messages) if message.role == "user"), "")
    after = instruction.end() if (instruction := _INSTRUCTION.match(said)) else 0  # its text may name the tags
    parts = _tagged(said, "code", "update", after)
    if parts is None and (swapped := _tagged(said, "update", "code", after)) is not None:
        parts = (swapped[1], swapped[0])
    if parts is None:
        raise invalid(
            f"{APPLY_MODEL} takes a user message holding <code>THE FILE</code> and <update>THE EDIT</update>",
            param="messages",
        )
    code, update = map(_inside, parts)
    try:
        return RewriteRequest(original=code, sketch=update, sampling=sampling, max_new_tokens=max_tokens)
    except ValueError as error:
        raise invalid(str(error), param="messages") from None


def _tagged(said: str, first: str, second: str, start: int) -> tuple[str, str] | None:
    """The texts of `<first>...</first>` and `<second>...</second>` after `start`. The first runs to the
    last `</first>` that `<second>` follows, the second to the last `</second>`: either may hold the tags
    themselves (gson's Javadoc writes `<code>null</code>`). Found in one pass, whatever the texts hold."""
    opening, closing = said.find(f"<{first}>", start), said.rfind(f"</{second}>")
    if opening < 0 or closing < 0:
        return None
    found = list(re.compile(rf"</{first}>\s*<{second}>").finditer(said, opening, closing))
    if not found:
        return None
    between = found[-1]
    return said[opening + len(first) + 2 : between.start()], said[between.end() : closing]


def _inside(text: str) -> str:
    """A tag's text as the file or sketch it holds: as it is (`<code>{file}</code>`, the form Morph and
    Continue send), unless the tags stand on lines of their own around it (`<code>\nx = 1\n\n</code>`
    is "x = 1\n"). A file that starts with a blank line keeps it, as the command line reads it."""
    found = _OWN_LINES.fullmatch(text)
    return found[1] if found is not None else text
