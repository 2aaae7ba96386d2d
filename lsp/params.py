"""The parameters of specedit's request and commands, parsed once into typed objects.

pygls hands the params of methods it does not know (`specedit/rewrite`, the commands' arguments) over as
plain JSON (dicts, lists, or namedtuples); each is checked here, once, and a bad one is an
`InvalidRequestError` that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from lsprotocol import types

from specedit.lsp import protocol
from specedit.lsp.errors import InvalidRequestError


def plain(value: object) -> object:
    """JSON as dicts and lists: pygls hands the params of methods it does not know over as namedtuples."""
    as_dict = getattr(value, "_asdict", None)
    if callable(as_dict):
        return plain(as_dict())
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


@dataclass(frozen=True)
class RewriteCall:
    """`specedit/rewrite` and the `specedit.rewrite` command: `protocol.RewriteParams`, checked."""

    uri: str
    version: int | None  # None: whatever version the server has
    range: types.Range | None  # None: the whole document
    instruction: str | None  # exactly one of instruction and sketch
    sketch: str | None
    delivery: protocol.Delivery | None  # None: the `delivery` setting
    max_new_tokens: int | None  # None: the `maxNewTokens` setting
    partial_token: int | str | None
    work_done_token: int | str | None

    @classmethod
    def parse(cls, params: object) -> RewriteCall:
        params = plain(params)
        if not isinstance(params, Mapping):
            raise InvalidRequestError("the parameters must be an object")
        document = params.get("textDocument")
        if not isinstance(document, Mapping) or not isinstance(document.get("uri"), str):
            raise InvalidRequestError("textDocument.uri is required")
        version = document.get("version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise InvalidRequestError("textDocument.version must be an integer")
        delivery = params.get("delivery")
        if delivery is not None and delivery not in protocol.DELIVERIES:
            raise InvalidRequestError(f"delivery must be one of {', '.join(protocol.DELIVERIES)}")
        instruction, sketch = params.get("instruction"), params.get("sketch")
        if (instruction is None) == (sketch is None) or not isinstance(instruction or sketch, str):
            raise InvalidRequestError("give exactly one of instruction and sketch, as a string")
        max_new_tokens = params.get("maxNewTokens")
        if max_new_tokens is not None and (
            not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1
        ):
            raise InvalidRequestError("maxNewTokens must be a positive integer")
        return cls(
            uri=cast(str, document["uri"]),
            version=version,
            range=_range(params["range"]) if params.get("range") is not None else None,
            instruction=instruction,
            sketch=sketch,
            delivery=delivery,
            max_new_tokens=max_new_tokens,
            partial_token=_token(params.get("partialResultToken")),
            work_done_token=_token(params.get("workDoneToken")),
        )


@dataclass(frozen=True)
class JobSelector:
    """Which job `specedit.accept`, `specedit.reject` and `specedit.cancel` act on: `protocol.JobSelector`."""

    job_id: str | None = None  # the job; else the latest job on `uri`; else the latest job
    uri: str | None = None
    hunks: tuple[int, ...] | None = None  # only these hunks (None: all)

    @classmethod
    def parse(cls, arguments: tuple[object, ...]) -> JobSelector:
        """From a command's arguments: none, or one selector object."""
        value = plain(arguments[0]) if arguments else None
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise InvalidRequestError("the selector must be an object: {jobId?, uri?, hunks?}")
        job_id, uri, hunks = value.get("jobId"), value.get("uri"), value.get("hunks")
        if job_id is not None and not isinstance(job_id, str):
            raise InvalidRequestError("jobId must be a string")
        if uri is not None and not isinstance(uri, str):
            raise InvalidRequestError("uri must be a string")
        if hunks is not None and not (
            isinstance(hunks, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in hunks)
        ):
            raise InvalidRequestError("hunks must be a list of hunk ids")
        return cls(job_id, uri, tuple(hunks) if hunks is not None else None)

    def pick(self, candidates: list[int]) -> list[int]:
        """The hunks of `candidates` this selector names (all of them when it names none)."""
        return candidates if self.hunks is None else [i for i in candidates if i in self.hunks]


UINTEGER_MAX = 2**31 - 1  # the LSP's `uinteger`: positions are 0 to this


def _range(value: object) -> types.Range:
    try:
        if not isinstance(value, Mapping):
            raise TypeError
        return types.Range(start=_position(value["start"], "start"), end=_position(value["end"], "end"))
    except (KeyError, TypeError):
        raise InvalidRequestError("range must be {start: {line, character}, end: {line, character}}") from None


def _position(value: object, name: str) -> types.Position:
    if not isinstance(value, Mapping):
        raise TypeError
    line, character = value["line"], value["character"]
    for field, number in (("line", line), ("character", character)):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= UINTEGER_MAX:
            raise InvalidRequestError(f"range.{name}.{field} must be an integer from 0 to {UINTEGER_MAX}")
    return types.Position(line=line, character=character)


def _token(value: object) -> int | str | None:
    if value is None or (isinstance(value, (int, str)) and not isinstance(value, bool)):
        return value
    raise InvalidRequestError("a progress token is an integer or a string")
