"""The apply model's request: hosted fast-apply models take one user message in Morph's format (the one
Continue's apply role sends such a model), and answer the merged file.

    <instruction>Add a docstring.</instruction>
    <code>THE FILE</code>
    <update>THE SKETCH (`// ... existing code ...` for the rest), a diff or SEARCH/REPLACE blocks</update>

The sketch is merged as `specedit rewrite --sketch` merges it (`session.Session`: by its lines where they
say where it goes, else by the model with that merge as its draft; a merge that would delete code the
sketch does not show is refused).
"""

from __future__ import annotations

import re

from specedit.engine.http.openai import invalid
from specedit.engine.requests import ChatMessage, RewriteRequest, SamplingConfig

APPLY_MODEL = "specedit-apply"
_TAG = r"<{0}>\n?(.*?)\n?</{0}>"


def is_apply_model(model: str) -> bool:
    """Whether a model id asks for the apply model (any id with `apply` in it: tools name theirs freely)."""
    return "apply" in model.lower()


def apply_request(
    messages: tuple[ChatMessage, ...], sampling: SamplingConfig, max_tokens: int | None
) -> RewriteRequest:
    """The rewrite an apply model's chat stands for: its last user message's code, sketch and instruction."""
    said = next((message.content for message in reversed(messages) if message.role == "user"), "")
    code, update = _tag("code", said), _tag("update", said)
    if code is None or update is None:
        raise invalid(
            f"{APPLY_MODEL} takes a user message holding <code>THE FILE</code> and <update>THE EDIT</update>",
            param="messages",
        )
    try:
        return RewriteRequest(original=code, sketch=update, sampling=sampling, max_new_tokens=max_tokens)
    except ValueError as error:
        raise invalid(str(error), param="messages") from None


def _tag(name: str, text: str) -> str | None:
    """The text between `<name>` and `</name>`, a newline right inside either tag left out (tags on lines
    of their own); of the code, the file's last newline kept (`<code>x = 1\n</code>` is "x = 1\n")."""
    found = re.search(_TAG.format(name), text, flags=re.DOTALL)
    if found is None:
        return None
    inner = found.group(1)
    if name == "code" and found.group(0).endswith("\n</code>") and inner and not inner.endswith("\n"):
        inner += "\n"
    return inner
