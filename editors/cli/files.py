"""Reading files to rewrite (with clear refusals), selecting a line region, and writing the results.

A file is replaced only if it still holds what the model read, in one rename of a complete, fsynced file
beside it, with the original's owner, group and mode; through a symlink, the file it points to is
replaced and the link stays (not through another user's link in /tmp, `_followed`). Nothing is left
behind when a write fails (a full or read-only file system). Side files (`.specedit`, `.orig`, the
temporaries) are made new in the file's folder (O_EXCL, O_NOFOLLOW) with the original's mode, and never
written through a link: a name taken by one, or by another user's file, is left alone.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specedit.engine.records.errors import FileChangedError, InputError, RegionError, WriteError
from specedit.engine.records.requests import MAX_INPUT_BYTES

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
    existing file keeps its owner, group and mode (through a symlink: the file it points to, if the link
    is one to follow, `_followed`)."""
    target = _followed(path)
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
    (`WriteError`) leaves no file behind. A backup name already taken by something that is not an earlier
    backup (a symlink, another user's file) is a `WriteError` before anything is written.
    """
    target = _followed(path)
    info = _stat_or_none(target)
    if info is None:
        raise FileChangedError(f"{path} was removed while it was rewritten; {keep_beside(path, text)}")
    backup_name = target.with_name(target.name + backup_suffix) if backup_suffix else None
    refusal = _why_not_replace(backup_name, info) if backup_name is not None else None
    if refusal is not None:
        raise WriteError(
            f"{path}: the backup name {backup_name} {refusal}: it was left alone and nothing was replaced "
            "(move it away, or rewrite with --no-backup)"
        )
    temporary = _temporary_copy(target, text.encode("utf-8"), info)
    backup: Path | None = None
    try:
        if backup_name is not None:
            backup = _temporary_copy(target, expected, info)
        if _read_or_none(target) != expected:
            raise FileChangedError(f"{path} changed while it was rewritten: not replaced; {keep_beside(path, text)}")
        if backup is not None and backup_name is not None:
            os.replace(backup, backup_name)  # a rename: a link planted there meanwhile is replaced, not followed
            backup = None
        os.replace(temporary, target)
    except OSError as error:
        raise WriteError(f"{path}: cannot replace it: {error.strerror or error}; nothing was replaced") from None
    finally:
        for leftover in (temporary, backup):
            if leftover is not None:
                leftover.unlink(missing_ok=True)


def keep_beside(path: Path, text: str) -> str:
    """Keep `text`, a result that could not replace `path`, at `PATH.specedit` with the mode (and, where
    permitted, the owner) of `path`; what to tell the user: where it is, or why it could not be kept.

    The side file is made new (O_EXCL, never through a link) and renamed into place. When the name is
    taken by something that is not an earlier result of the user's (a symlink another user planted in
    /tmp, pointing at a file of the user's; another user's file), that is left alone, and the result
    goes to a fresh name beside it, `PATH.XXXXXXXX.specedit`, which the message names.
    """
    beside = path.with_name(path.name + CHANGED_SUFFIX)
    original = _stat_or_none(path)
    data = text.encode("utf-8")
    try:
        reason = _why_not_replace(beside, original)
        if reason is None:
            temporary = _new_file(
                path.parent, f".{beside.name}.", ".specedit-tmp", data, original, owner_required=False
            )
            try:
                os.replace(temporary, beside)  # a rename: whatever appeared there meanwhile is replaced, not followed
                return f"the result is in {beside}"
            except OSError as error:  # a sticky folder where another user's file appeared meanwhile
                temporary.unlink(missing_ok=True)
                reason = f"could not be replaced ({error.strerror or error})"
        kept = _new_file(beside, f"{path.name}.", CHANGED_SUFFIX, data, original, owner_required=False)
    except WriteError as error:
        return f"the result could not be kept either ({error})"
    return f"the result is in {kept} ({beside} {reason}: it was left alone)"


def _why_not_replace(path: Path, original: os.stat_result | None) -> str | None:
    """Why a side file (`.specedit`, `.orig`) must not replace what is at `path`; None when nothing is
    there, or a regular file of the user's or of the original's owner (an earlier result or backup). A
    symlink is never followed there, nor replaced: nothing says the user made it for this."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot be looked at ({error.strerror or error})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid not in {os.getuid(), original.st_uid if original is not None else os.getuid()}:
        return f"belongs to uid {info.st_uid}"
    return None


_MAX_LINKS = 40  # links followed in a row, as the kernel's own limit (ELOOP)


def _followed(path: Path) -> Path:
    """The file writing `path` replaces: through its symlinks, as the module promises, but only through
    links Linux's `fs.protected_symlinks` lets a process follow, a rule kept here where the system has it
    off: in a folder anyone may write to with the sticky bit (/tmp), a link whose owner is neither the
    user nor the folder's owner is refused (`WriteError`), or another user could make the user's run
    overwrite any file of the user's. (Links among the folders above are resolved as they are.)"""
    current = path
    for _ in range(_MAX_LINKS):
        try:
            info = current.lstat()
            if not stat.S_ISLNK(info.st_mode):
                break
            folder = current.parent.stat()
        except OSError:
            break  # nothing there (a new file), or nothing to look at: writing says what is wrong
        shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
        if shared and info.st_uid not in (os.getuid(), folder.st_uid):
            raise WriteError(
                f"{path}: {current} is a symbolic link of uid {info.st_uid} in a folder anyone may write to; "
                "not written through it, nothing was replaced"
            )
        current = current.parent / os.readlink(current)
    return current.resolve()


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
    return _new_file(target, f".{target.name}.", ".specedit-tmp", data, info, owner_required=True)


NEW_FILE_MODE = 0o644  # a file written where there was none (`--output`); a side file without original: 0600


def _new_file(
    name: Path, prefix: str, suffix: str, data: bytes, info: os.stat_result | None, *, owner_required: bool
) -> Path:
    """`data` in a new, complete, fsynced file beside `name` (the file it is for, named in errors), called
    `prefix` + random + `suffix`, with the owner, group and mode of `info`. Made with O_CREAT|O_EXCL|
    O_NOFOLLOW (mkstemp) and given its owner and mode through its descriptor, so nothing is ever written,
    chown-ed or chmod-ed through a link put in its way (in a folder others may write to).

    `owner_required`: a file that will replace the original must take its owner (`WriteError` otherwise).
    A side file takes it where permitted; where not, and not the group either, its group gets no more than
    others have, since its group is then another than the original's. Without `info`, a side file is
    private (0600: nothing says who may read it) and a new file is `NEW_FILE_MODE`.
    `WriteError` (and no file) when it cannot be made.
    """
    try:
        descriptor, made = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=name.parent)
    except OSError as error:
        raise WriteError(f"{name}: cannot write beside it: {error.strerror or error}; nothing was replaced") from None
    temporary = Path(made)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            if info is None:
                os.fchmod(handle.fileno(), NEW_FILE_MODE if owner_required else 0o600)
                return temporary
            mode = stat.S_IMODE(info.st_mode)
            # The owner before the mode: a chown may clear the set-user-id and set-group-id bits.
            if (info.st_uid, info.st_gid) != (os.getuid(), os.getgid()):
                mode = _give_owner(handle.fileno(), info, mode, required=owner_required)
            os.fchmod(handle.fileno(), mode)
    except PermissionError:
        temporary.unlink(missing_ok=True)
        raise WriteError(
            f"{name}: cannot give the new file the owner and group of the old one "
            f"(uid {info.st_uid if info else '?'}); nothing was replaced"
        ) from None
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise WriteError(f"{name}: cannot write beside it: {error.strerror or error}; nothing was replaced") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def _give_owner(descriptor: int, info: os.stat_result, mode: int, *, required: bool) -> int:
    """Give the open file the owner and group of `info`; the mode it may then have. `PermissionError`
    when `required` and it cannot."""
    try:
        os.fchown(descriptor, info.st_uid, info.st_gid)
        return mode
    except PermissionError:
        if required:
            raise
    try:  # a member of the original's group may give it that group
        os.fchown(descriptor, -1, info.st_gid)
        return mode
    except PermissionError:  # our group, not the original's: it may do what others may, no more
        return (mode & ~0o070) | (mode & 0o070 & ((mode & 0o007) << 3))
