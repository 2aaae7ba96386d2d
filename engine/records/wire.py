"""What crosses a process boundary, whatever the transport: records and errors as plain data.

The records (`RewriteRequest`, `WarmRequest`, `RewriteOutcome` and the events of `events`) travel as the very
dataclasses the engine uses, field for field (`to_wire` / `from_wire`, checked against their type hints):
a field added there is on every wire with nothing to change here. A `Stats` travels as its own dict
(`Stats.to_dict`), the one every front end shows. The daemon sends them in msgpack frames
(`backends.protocol`), the cluster and the HTTP door in JSON; the forms are the same.

An error travels as a code and a message (`error_code_for` / `error_from`): the one place that maps the
error hierarchy to wire codes and back. This module imports neither torch nor the engine.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union, cast

from specedit.engine.records.errors import (
    ContextLengthError,
    EmptyAnswerError,
    EngineUnavailableError,
    IncompleteOutputError,
    InputError,
    MergeError,
    ModelLoadError,
    RegionError,
    SpeceditError,
)
from specedit.engine.records.stats import Stats

ErrorCode = Literal[
    "malformed_frame",  # not msgpack (or JSON), or not a map with a string `type`; the connection stays open
    "frame_too_large",  # over the receiver's maximum; the connection is closed (its bytes are not read)
    "truncated_frame",  # the peer closed the connection in the middle of a frame
    "unknown_type",  # a `type` this side does not know; the connection stays open
    "bad_message",  # a known type with missing or mistyped fields
    "hello_required",  # the first message was not `hello`; the connection is closed
    "version_mismatch",  # the hello's protocol version is not ours; the connection is closed
    "unauthorized",  # over TCP a missing nonce or a wrong proof (not the token); another user's process; closed
    "duplicate_id",  # a rewrite id already queued or running on this connection
    "bad_request",  # a rewrite the engine cannot take (e.g. both instruction and sketch)
    "input",  # the error hierarchy's children, by name (see `ERROR_CLASSES`)
    "region",
    "context_length",
    "model_load",
    "incomplete_output",
    "not_a_merge",
    "empty_answer",
    "engine_error",  # anything else that went wrong inside the engine (logged where it happened)
    "shutting_down",  # the daemon is stopping and takes no more work
]


class ProtocolError(Exception):
    """A frame, message or record that breaks the protocol. `fatal`: the connection cannot go on after it.

    Internal to the wire: a server answers it with an error, a client turns it into an
    `EngineUnavailableError` at its API.
    """

    def __init__(self, code: ErrorCode, message: str, *, fatal: bool = False, request_id: str | None = None):
        super().__init__(message)
        self.code: ErrorCode = code
        self.fatal = fatal
        self.request_id = request_id


# One place that maps the error hierarchy to wire codes and back.
ERROR_CLASSES: dict[str, type[SpeceditError]] = {
    "input": InputError,
    "bad_request": InputError,
    "region": RegionError,
    "context_length": ContextLengthError,
    "model_load": ModelLoadError,
    "incomplete_output": IncompleteOutputError,
    "not_a_merge": MergeError,
    "empty_answer": EmptyAnswerError,
}


def error_code_for(error: BaseException) -> ErrorCode:
    """The wire code of an exception raised inside the engine."""
    if isinstance(error, ProtocolError):
        return error.code
    for code, cls in ERROR_CLASSES.items():
        if isinstance(error, cls):
            return cast(ErrorCode, code)
    return "engine_error"


def error_from(code: str, message: str) -> SpeceditError:
    """The exception a client raises for an error the other side reported (unknown codes: engine unavailable)."""
    return ERROR_CLASSES.get(code, EngineUnavailableError)(message)


Record = TypeVar("Record")


def to_wire(record: object) -> dict[str, object]:
    """A frozen dataclass (`RewriteRequest`, `Step`, `RewriteOutcome`) as plain msgpack- and JSON-able data:
    its fields by name, nested records as theirs, `Stats` as its dict (`Stats.to_dict`)."""
    assert dataclasses.is_dataclass(record) and not isinstance(record, type)
    return {field.name: _plain(getattr(record, field.name)) for field in dataclasses.fields(record)}


def _plain(value: object) -> object:
    if isinstance(value, Stats):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return to_wire(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def from_wire(cls: type[Record], value: object) -> Record:
    """The dataclass `cls` back from `to_wire`'s form: every field present and of its declared type (nested
    dataclasses too, `Stats` from its dict), extra fields ignored. `ProtocolError("bad_message")` when it
    does not fit; the dataclass's own validation (`__post_init__`) raises what it raises (ValueError)."""
    if not isinstance(value, dict):
        raise ProtocolError("bad_message", f"a {cls.__name__} is a map")
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    fields = {}
    for field in dataclasses.fields(cls):
        if field.name not in value:
            raise ProtocolError("bad_message", f"{cls.__name__}: missing field {field.name!r}")
        hint, item = hints[field.name], value[field.name]
        if hint is Stats:
            try:
                item = Stats.from_dict(item)
            except ValueError as error:
                raise ProtocolError("bad_message", f"{cls.__name__}: {error}") from None
        elif dataclasses.is_dataclass(hint):
            item = from_wire(cast(type, hint), item)
        elif not conforms(item, hint):
            raise ProtocolError("bad_message", f"{cls.__name__}: field {field.name!r} has the wrong type")
        fields[field.name] = item
    return cls(**fields)


_UNION_TYPES: tuple[object, ...] = (Union, types.UnionType)


def conforms(value: object, hint: object) -> bool:
    """Whether a decoded value fits a type hint (the hints records and messages are declared with)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in _UNION_TYPES:
        return any(conforms(value, arm) for arm in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(hint, type) and isinstance(value, hint)
