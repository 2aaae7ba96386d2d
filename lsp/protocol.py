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

    Every hunk carries `oldText`, the lines it replaces, so an editor can show them as deleted. A live
    rewrite's partial results also carry `written`: where its hunks are now, redrawn by the editor on
    each report whose `version` it is at.

    A live rewrite becomes a preview in two cases. Its answer removes most of the region on an
    instruction that asks for no removal (the guard), or the user cancels it. The server then takes out
    what it wrote and writes no more. The result says `delivery: "preview"`, and `offered` says where each
    hunk's old text is in the document now. `specedit.accept` writes them; `specedit.reject` drops them.
    `message` says why, in one line ("it removes 45 of 49 lines", "cancelled").

`specedit/provisional` (notification, server -> client)
    params: `ProvisionalParams`: where a live rewrite's provisional text is in the document at `version`
    (the output not settled yet, which the server writes just before the lines it has not reached), or
    `range: null` once there is none. Clients mark it as pending; the server replaces it as hunks settle.

`specedit/engine` (notification, server -> client)
    params: `EngineParams`: the engine's state, for an editor's status item. `loading`: the model is being
    fetched or loaded (`message` says which: "loading the model", "fetching the model 120/491 MB");
    `ready`; `failed` (`message`: the error). Sent when it changes: from the editor's start where the
    server starts the engine with it (the setting `loadOnStart`), else from the first rewrite.

Hunks are whole-line replacements of the region; their `id`s are what `specedit.accept` and
`specedit.reject` take to act on some hunks only.
"""

from __future__ import annotations

from typing import Literal, TypedDict

REWRITE_METHOD = "specedit/rewrite"
PROVISIONAL_NOTIFICATION = "specedit/provisional"
ENGINE_NOTIFICATION = "specedit/engine"

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
EngineState = Literal["loading", "ready", "failed"]
ENGINE_STATES: tuple[EngineState, ...] = ("loading", "ready", "failed")

# Every name a client needs, for the test that checks the TypeScript and Lua copies.
NAMES: dict[str, str | list[str]] = {
    "rewriteMethod": REWRITE_METHOD,
    "provisionalNotification": PROVISIONAL_NOTIFICATION,
    "engineNotification": ENGINE_NOTIFICATION,
    "commands": list(COMMANDS),
    "configurationSection": CONFIGURATION_SECTION,
    "codeActionKind": CODE_ACTION_KIND,
    "deliveries": list(DELIVERIES),
    "statuses": list(STATUSES),
    "engineStates": list(ENGINE_STATES),
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
    range: Range  # in the coordinates of the request's version (in `written`, `offered`: of theirs)
    newText: str
    oldText: str  # the whole lines the hunk replaces, as they were at the request's version


class WrittenHunks(TypedDict):
    version: int  # the document's version the ranges are in
    hunks: list[HunkPayload]  # `range`: where the hunk's new text (`offered`: old text) is now


class ProgressStats(TypedDict):
    """A running rewrite's figures, in partial results and in work-done progress."""

    phase: str  # starting, loading, queued, started, writing
    seconds: float  # since the job started
    generated_tokens: int
    tokens_per_second: float  # decoding alone
    acceptance_rate: float
    target_forwards: int
    lines_done: int
    lines_total: int
    message: str  # one line for people


class RewritePartialResult(TypedDict, total=False):
    jobId: str  # required
    hunks: list[HunkPayload]  # required
    stats: ProgressStats  # required
    delivery: Delivery  # required: the job's delivery now ("preview" once a live rewrite became one)
    written: WrittenHunks  # a live rewrite's hunks written so far, where they are now


class RewriteResult(TypedDict, total=False):
    jobId: str
    status: Status
    stats: dict[str, object]  # the engine's stats (`Stats.to_dict`, as `specedit rewrite --stats` writes them)
    hunks: list[HunkPayload]
    written: WrittenHunks  # the hunks written into the document (a live rewrite), each one `reject`able
    offered: WrittenHunks  # a live rewrite that became a preview: its hunks, each one `accept`able
    delivery: Delivery  # the delivery the job ended with ("preview" where a live rewrite became one)
    message: str  # for conflict and error
    error: ErrorPayload  # for error
    stepsAfterCancel: int  # engine steps completed after cancellation was requested (at most 1)


class ErrorPayload(TypedDict):
    code: int
    message: str
    data: dict[str, object] | None  # kind: the error's class; exitCode: the command line's, for specedit's own


class ProvisionalParams(TypedDict):
    uri: str
    version: int
    jobId: str
    range: Range | None


class EngineParams(TypedDict):
    state: EngineState
    message: str  # one line, for a status item's text or tooltip


class JobSelector(TypedDict, total=False):
    jobId: str  # the job; else the latest job on `uri`; else the latest job
    uri: str
    hunks: list[int]  # only these hunks (default: all)


class EditResult(TypedDict):
    jobId: str
    applied: list[int]  # hunks written (accept) or restored (reject)
    skipped: list[int]  # hunks the user has edited since: left alone
