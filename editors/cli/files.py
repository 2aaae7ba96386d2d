"""Reading files to rewrite (with clear refusals), selecting a line region, and writing the results.

A file is replaced only if it still holds what the model read, in one rename of a complete, fsynced file
beside it, with the original's owner, group and mode; through a symlink, the file it points to is
replaced and the link stays. Nothing is left behind when a write fails (a full or read-only file system).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specedit.engine.errors import FileChangedError, InputError, RegionError, WriteError
from specedit.engine.requests import MAX_INPUT_BYTES

STDIN = "-"
CHANGED_SUFFIX = ".specedit"  # where a result goes when its file changed meanwhile


@dataclass(frozen=True)
class SourceText:
    name: str  # the path, or "-" for standard input
    text: str
    data: bytes = b""  # the bytes read: a file is only replaced if it still holds them


def read_source(name: str) -> SourceText:
    """The text of a file to rewrite, or a clear `InputError`."""
    if name == STDIN:
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        path = Path(name)
        if not path.exists():
            raise InputError(f"{name}: no such file")
        if path.is_dir():
            raise InputError(f"{name}: is a directory, not a file")
        if not path.is_file():  # a FIFO, a socket, a device: reading it could block or never end
            raise InputError(f"{name}: not a regular file")
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
        except OSError as error:
            raise InputError(f"{name}: cannot read: {error.strerror or error}") from error
    return SourceText(name, decode_source(name, data), data)


def decode_source(name: str, data: bytes) -> str:
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{name}: larger than {MAX_INPUT_BYTES:,} bytes; rewrite a region with --lines")
    if b"\0" in data[:8192]:
        raise InputError(f"{name}: looks like a binary file (it contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise InputError(f"{name}: not valid UTF-8 (byte {error.start}, line {line})") from error


@dataclass(frozen=True)
class Region:
    """A region of whole lines: text = before + region + after, exactly (line endings included)."""

    before: str
    region: str
    after: str


def parse_lines(spec: str) -> tuple[int, int]:
    """`A:B`, 1-based and inclusive: `3:7`, `3:` (to the end), `:7`, `5` (one line)."""
    start_text, colon, end_text = spec.partition(":")
    try:
        start = int(start_text) if start_text else 1
        end = int(end_text) if end_text else (-1 if colon else start)
    except ValueError:
        raise RegionError(f"--lines {spec!r}: expected A:B with line numbers, e.g. 10:25") from None
    if start < 1 or (end != -1 and end < start):
        raise RegionError(f"--lines {spec!r}: lines are numbered from 1 and A must not exceed B")
    return start, end


def select_lines(text: str, start: int, end: int) -> Region:
    """Split `text` around lines start..end (1-based, inclusive; end -1 = the last line)."""
    lines = text.splitlines(keepends=True)
    last = len(lines) if end == -1 else end
    if start > len(lines) or last > len(lines):
        raise RegionError(
            f"lines {start}:{last if end != -1 else ''} are outside the file, which has {len(lines)} lines"
        )
    return Region("".join(lines[: start - 1]), "".join(lines[start - 1 : last]), "".join(lines[last:]))


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` in one rename: readers see the old file or the new one, never a part. An
    existing file keeps its owner, group and mode (through a symlink: the file it points to)."""
    target = path.resolve()
    info = _stat_or_none(target)
    temporary = _temporary_copy(target, text.encode("utf-8"), info)
    try:
        os.replace(temporary, target)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise WriteError(f"{path}: cannot write it: {error.strerror or error}; nothing was replaced") from None


def replace_checked(path: Path, expected: bytes, text: str, *, backup_suffix: str | None) -> None:
    """Replace the file at `path` with `text`, if it still holds `expected` (what the model read).

    The new content and the backup (`PATH<suffix>`, the bytes read) are written completely beside the
    file first; then, just before the renames, the file is read again: if it changed meanwhile, nothing
    is replaced and the result is kept at `PATH.specedit` (`FileChangedError`). A write that fails
    (`WriteError`) leaves no file behind.
    """
    target = path.resolve()
    info = _stat_or_none(target)
    if info is None:
        raise FileChangedError(f"{path} was removed while it was rewritten; {keep_beside(path, text)}")
    temporary = _temporary_copy(target, text.encode("utf-8"), info)
    backup: Path | None = None
    try:
        if backup_suffix:
            backup = _temporary_copy(target, expected, info)
        if _read_or_none(target) != expected:
            raise FileChangedError(f"{path} changed while it was rewritten: not replaced; {keep_beside(path, text)}")
        if backup is not None and backup_suffix:
            os.replace(backup, target.with_name(target.name + backup_suffix))
            backup = None
        os.replace(temporary, target)
    except OSError as error:
        raise WriteError(f"{path}: cannot replace it: {error.strerror or error}; nothing was replaced") from None
    finally:
        for leftover in (temporary, backup):
            if leftover is not None:
                leftover.unlink(missing_ok=True)


def keep_beside(path: Path, text: str) -> str:
    beside = path.with_name(path.name + CHANGED_SUFFIX)
    try:
        write_atomically(beside, text)
    except WriteError as error:
        return f"the result could not be kept either ({error})"
    return f"the result is in {beside}"


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _temporary_copy(target: Path, data: bytes, info: os.stat_result | None) -> Path:
    """`data` in a complete, fsynced temporary file beside `target` (same file system), with the owner,
    group and mode of `info` (the file it will replace). `WriteError` (and no file) when that fails."""
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".specedit-tmp", dir=target.parent)
    except OSError as error:
        raise WriteError(f"{target}: cannot write beside it: {error.strerror or error}; nothing was replaced") from None
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if info is None:
            os.chmod(temporary, 0o644)
            return temporary
        os.chmod(temporary, stat.S_IMODE(info.st_mode))
        if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
            os.chown(temporary, info.st_uid, info.st_gid)
    except PermissionError:
        temporary.unlink(missing_ok=True)
        raise WriteError(
            f"{target}: cannot give the new file the owner and group of the old one "
            f"(uid {info.st_uid if info else '?'}); nothing was replaced"
        ) from None
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise WriteError(f"{target}: cannot write beside it: {error.strerror or error}; nothing was replaced") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary
