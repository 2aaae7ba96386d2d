"""Code actions of kind `refactor.rewrite`: the presets on a selection, and "as the comment above says" for
a line like `# specedit: make it async`. Each runs the `specedit.rewrite` command on whole lines."""

from __future__ import annotations

import re
from collections.abc import Sequence

from lsprotocol import types
from pygls.workspace.position_codec import PositionCodec

from specedit.lsp import protocol
from specedit.lsp.config import Preset
from specedit.lsp.delivery import DocumentState

_COMMENT = re.compile(
    r"^\s*(?:#|//|--|;+|/\*|\*|<!--)\s*" + re.escape(protocol.INSTRUCTION_COMMENT) + r"\s*(.*?)\s*(?:\*/|-->)?\s*$"
)


def code_actions(
    doc: DocumentState, params: types.CodeActionParams, presets: Sequence[Preset], codec: PositionCodec
) -> list[types.CodeAction]:
    only = params.context.only
    if only and not any(protocol.CODE_ACTION_KIND.startswith(kind) for kind in only):
        return []
    lines = re.split(r"\r\n|\r|\n", doc.text)
    first, last = params.range.start.line, params.range.end.line
    if params.range.end.character == 0 and last > first:
        last -= 1  # a selection of whole lines ends at the start of the next one
    end_line = min(last + 1, len(lines))
    if params.range.start == params.range.end and first > 0 and instruction_comment(lines[first - 1]):
        end_line = next((n for n in range(first, len(lines)) if not lines[n].strip()), len(lines))
    last_line: protocol.Position = {"line": len(lines) - 1, "character": codec.client_num_units(lines[-1])}
    whole_lines: protocol.Range = {
        "start": {"line": first, "character": 0},
        "end": {"line": end_line, "character": 0} if end_line < len(lines) else last_line,
    }
    document: protocol.TextDocumentRef = {"uri": doc.uri, "version": doc.version}
    actions = []
    comment = instruction_comment(lines[first - 1]) if first > 0 else None
    if comment:
        actions.append(
            _action(
                f"Rewrite as the comment says: {comment}"[:80],
                {"textDocument": document, "range": whole_lines, "instruction": comment},
            )
        )
    if params.range.start != params.range.end:
        for preset in presets:
            arguments: protocol.RewriteParams = {
                "textDocument": document,
                "range": whole_lines,
                "instruction": preset.instruction,
            }
            actions.append(_action(preset.title, arguments))
    return actions


def instruction_comment(line: str) -> str | None:
    """The instruction of a `specedit: ...` comment line, in any common comment syntax.

    >>> instruction_comment("    # specedit: make it async")
    'make it async'
    >>> instruction_comment("/* specedit: add logging */")
    'add logging'
    """
    match = _COMMENT.match(line)
    return match.group(1) if match and match.group(1) else None


def _action(title: str, arguments: protocol.RewriteParams) -> types.CodeAction:
    return types.CodeAction(
        title=f"specedit: {title}",
        kind=protocol.CODE_ACTION_KIND,
        command=types.Command(title=title, command=protocol.COMMAND_REWRITE, arguments=[arguments]),
    )
