"""The one error hierarchy. Each error knows its CLI exit code; the LSP maps them to JSON-RPC in one place.

Cancelled and content-modified are ordinary outcomes (a `status`), not errors.
"""

from __future__ import annotations


class SpeceditError(Exception):
    """Anything that goes wrong in a way the user should be told about, clearly."""

    exit_code = 1


class InputError(SpeceditError):
    """The input file or text cannot be rewritten: missing, a directory, binary, invalid UTF-8."""

    exit_code = 3


class RegionError(SpeceditError):
    """A region (lines, range) outside the document."""

    exit_code = 4


class ContextLengthError(SpeceditError):
    """The prompt plus the output budget does not fit the model's context window."""

    exit_code = 5


class ModelLoadError(SpeceditError):
    """The model could not be found, fetched, verified, converted or loaded."""

    exit_code = 6


class EngineUnavailableError(SpeceditError):
    """The engine daemon cannot be reached."""

    exit_code = 7


class IncompleteOutputError(SpeceditError):
    """The model used its whole token budget without finishing the code: nothing is written."""

    exit_code = 8


class FileChangedError(SpeceditError):
    """The file changed while it was rewritten: it is not replaced, and the result is kept beside it."""

    exit_code = 9


class MergeError(SpeceditError):
    """The answer to an edit sketch is not a merge of it (`merge_checks`): nothing is written or applied."""

    exit_code = 11


class EmptyAnswerError(SpeceditError):
    """The model answered nothing (or only whitespace) for a region that has code: such an answer would empty
    it, so nothing is written or applied (unless asked for: `RewriteRequest.allow_empty`)."""

    exit_code = 12


class WriteError(SpeceditError):
    """The result could not be written (a read-only or full file system, no permission): nothing was
    replaced, and no file was left behind."""

    exit_code = 10
