"""Reading files to rewrite (with clear refusals), selecting a line region, and writing atomically."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specedit.engine.errors import InputError, RegionError

# Larger inputs are refused before any model work: a rewrite repeats the whole input through the model,
# and the default model's context holds 32k tokens (about 100 KB of code) for prompt and answer together.
MAX_INPUT_BYTES = 1_000_000
STDIN = "-"


@dataclass(frozen=True)
class SourceText:
    name: str  # the path, or "-" for standard input
    text: str


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
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
        except OSError as error:
            raise InputError(f"{name}: cannot read: {error.strerror or error}") from error
    return SourceText(name, decode_source(name, data))


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


def write_atomically(path: Path, text: str, *, backup_suffix: str | None = None) -> None:
    """Replace `path` with `text` in one rename: readers see the old file or the new one, never a part.

    With `backup_suffix`, the original is first kept beside it (written the same way). Both take the
    original's permission bits.
    """
    path = path.resolve()
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    if backup_suffix and path.exists():
        _replace(path.with_name(path.name + backup_suffix), path.read_bytes(), mode)
    _replace(path, text.encode("utf-8"), mode)


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temporary file beside `path` (same file system), flush it to disk, rename it."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".specedit-tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
