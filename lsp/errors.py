"""Errors of the language server, and the one place where any error becomes a JSON-RPC error."""

from __future__ import annotations

from pygls.exceptions import (
    JsonRpcContentModified,
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidParams,
)

from specedit.engine.records.errors import InputError, RegionError, SpeceditError
from specedit.lsp.protocol import ErrorPayload

REQUEST_FAILED = -32803  # LSP: the request is valid but failed (model, engine, context length)


# The ignores: with pyproject's mypy settings `specedit.*` resolves to Any (editable install); clean either way.
class InvalidRequestError(SpeceditError):  # type: ignore[misc,unused-ignore]
    """The client sent parameters the server cannot use (missing fields, unknown document, bad range)."""

    exit_code = 2


class StaleVersionError(SpeceditError):  # type: ignore[misc,unused-ignore]
    """The request names a document version the server no longer has: the client should ask again."""

    exit_code = 2


def to_jsonrpc(error: BaseException) -> JsonRpcException:
    """Map any error to the JSON-RPC error the client gets. `data` says which kind it was."""
    data: dict[str, object] = {"kind": type(error).__name__}
    if isinstance(error, SpeceditError):
        data["exitCode"] = error.exit_code
    message = str(error) or type(error).__name__
    if isinstance(error, StaleVersionError):
        return JsonRpcContentModified(message, data=data)
    if isinstance(error, (InvalidRequestError, InputError, RegionError)):
        return JsonRpcInvalidParams(message, data=data)
    if isinstance(error, SpeceditError):
        return JsonRpcException(message, code=REQUEST_FAILED, data=data)
    if isinstance(error, JsonRpcException):
        return error
    return JsonRpcInternalError(message, data=data)


def error_payload(error: BaseException) -> ErrorPayload:
    """The same mapping, as the `error` member of a result (for a job that had started)."""
    mapped = to_jsonrpc(error)
    return {"code": mapped.code, "message": mapped.message, "data": mapped.data}
