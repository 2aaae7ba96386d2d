"""The names of specedit's LSP extensions, declared once.

The VS Code extension and the Neovim plugin carry copies of these strings; a test keeps them equal to
the ones here (`NAMES`).

`specedit/rewrite` (request, client -> server)
    params: `RewriteParams`. `range` absent: the whole document. `textDocument.version` is the version the
    user saw: when the server's own writing (a live rewrite's) came since, the range is carried over to
    the current version; when the user's typing came since, the error ContentModified (-32801) answers.
    A running rewrite the request overlaps ends `superseded`, its provisional text taken out before the
    new one reads the document.
    partial results (`$/progress` with `partialResultToken`): `RewritePartialResult`, each with the hunks
    settled since the one before, in the coordinates of the request's version.
    result: `RewriteResult`; `hunks` is there only when no `partialResultToken` was given; `written` says
    where the hunks a live rewrite wrote are in the document now (for the editor to mark them, each with a
    way to undo it: `specedit.reject` with its id).

`specedit/provisional` (notification, server -> client)
    params: `ProvisionalParams`: where a live rewrite's provisional text is in the document at `version`
    (the output not settled yet, which the server writes just before the lines it has not reached), or
    `range: null` once there is none. Clients mark it as pending; the server replaces it as hunks settle.

Hunks are whole-line replacements of the region; their `id`s are what `specedit.accept` and
`specedit.reject` take to act on some hunks only.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

REWRITE_METHOD = "specedit/rewrite"
PROVISIONAL_NOTIFICATION = "specedit/provisional"

COMMAND_REWRITE = "specedit.rewrite"  # arguments: [RewriteParams]; returns RewriteResult
COMMAND_ACCEPT = "specedit.accept"  # arguments: [] or [JobSelector]; returns EditResult
COMMAND_REJECT = "specedit.reject"  # arguments: [] or [JobSelector]; returns EditResult
COMMAND_CANCEL = "specedit.cancel"  # arguments: [] or [JobSelector]; returns {"cancelled": [jobId]}
COMMANDS = (COMMAND_REWRITE, COMMAND_ACCEPT, COMMAND_REJECT, COMMAND_CANCEL)

CONFIGURATION_SECTION = "specedit"
CODE_ACTION_KIND = "refactor.rewrite"
INSTRUCTION_COMMENT = "specedit:"  # a line above the selection like `# specedit: make it async`

Delivery = Literal["live", "preview", "final"]
DELIVERIES: tuple[Delivery, ...] = ("live", "preview", "final")
Status = Literal["complete", "cancelled", "superseded", "conflict", "error"]
STATUSES: tuple[Status, ...] = ("complete", "cancelled", "superseded", "conflict", "error")

# Every name a client needs, for the test that checks the TypeScript and Lua copies.
NAMES: dict[str, Any] = {
    "rewriteMethod": REWRITE_METHOD,
    "provisionalNotification": PROVISIONAL_NOTIFICATION,
    "commands": list(COMMANDS),
    "configurationSection": CONFIGURATION_SECTION,
    "codeActionKind": CODE_ACTION_KIND,
    "deliveries": list(DELIVERIES),
    "statuses": list(STATUSES),
}


class TextDocumentRef(TypedDict, total=False):
    uri: str  # required
    version: int


class Position(TypedDict):
    line: int
    character: int


class Range(TypedDict):
    start: Position
    end: Position


class RewriteParams(TypedDict, total=False):
    textDocument: TextDocumentRef  # required
    range: Range
    instruction: str  # exactly one of instruction and sketch
    sketch: str
    delivery: Delivery  # default: the `delivery` setting ("live")
    maxNewTokens: int
    partialResultToken: int | str
    workDoneToken: int | str


class HunkPayload(TypedDict):
    id: int
    range: Range  # in the coordinates of the request's version
    newText: str


class RewritePartialResult(TypedDict):
    jobId: str
    hunks: list[HunkPayload]
    stats: dict[str, Any]  # generated_tokens, tokens_per_second, acceptance_rate, lines_done, lines_total


class WrittenHunks(TypedDict):
    version: int  # the document's version the ranges are in
    hunks: list[HunkPayload]  # `range`: where the hunk's new text is now


class RewriteResult(TypedDict, total=False):
    jobId: str
    status: Status
    stats: dict[str, Any]  # the engine's stats (as `specedit rewrite --stats` writes them)
    hunks: list[HunkPayload]
    written: WrittenHunks  # the hunks written into the document (a live rewrite), each one `reject`able
    message: str  # for conflict and error
    error: dict[str, Any]  # for error: {code, message, data}
    stepsAfterCancel: int  # engine steps completed after cancellation was requested (at most 1)


class ProvisionalParams(TypedDict):
    uri: str
    version: int
    jobId: str
    range: Range | None


class JobSelector(TypedDict, total=False):
    jobId: str  # the job; else the latest job on `uri`; else the latest job
    uri: str
    hunks: list[int]  # only these hunks (default: all)


class EditResult(TypedDict):
    jobId: str
    applied: list[int]  # hunks written (accept) or restored (reject)
    skipped: list[int]  # hunks the user has edited since: left alone
