"""Files checked by what runs: each hashed once when it is made, and checked at every load by its signature.

Hashing what a load reads costs a second or two (the 0.5B model's folder is 1.27 GB); a stat costs
microseconds. So a file is hashed (sha256) when specedit makes it, and recorded with its signature: inode,
size, modification time and change time (`FileRecord`). A user can put a file's size and modification time
back by hand (`truncate`, `touch -r`, `os.utime`), but not its change time: the kernel sets it to the
present at every write, chmod, utime or rename, and no system call sets it back (only the system clock or
the raw disk would). So at a load an unchanged signature stands for unchanged bytes, and a changed one
has the file hashed again (`checked`): the same bytes, and the new signature is recorded; other bytes, and
the file is not loaded: a `ModelLoadError` that names it and says how to get a good one.

The converted model's files are recorded in its completion marker (`store.store`). What loads derive and
keep (`store.kept`: tokenizers, int8 weights, the prompts' start, the self-check's verdicts, and the
compiled kernels) is recorded in a seal beside each file, `NAME.seal` (`replace_sealed`, `is_sealed`). A
file without a seal (kept by an older specedit, or its seal deleted) is never read: it is made again.

What this does not promise: whoever can write the cache can also write a marker or a seal that matches
the files they wrote. For the default model the pinned hashes of its converted files refuse that
(`store.ModelSpec.identity`); what loads keep has nothing to pin, and is as trusted as the account.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specedit.engine.records.errors import ModelLoadError

SEAL_SUFFIX = ".seal"


@dataclass(frozen=True)
class FileRecord:
    """A file's sha256 and the signature it had when that was taken."""

    sha256: str
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path, sha256: str | None = None) -> FileRecord:
        """`path`'s record now: its bytes hashed, unless their `sha256` is known (a file just written)."""
        info = path.stat()
        digest = sha256 if sha256 is not None else sha256_file(path)
        return cls(digest, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    @classmethod
    def from_dict(cls, record: object) -> FileRecord | None:
        """The record as `to_dict` wrote it; None where it is not one. A record from before signatures (a
        size, a modification time and a hash) reads with the signature unknown: its file is hashed again."""
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            return None
        signature = [record.get(key, -1) for key in ("inode", "size", "mtime_ns", "ctime_ns")]
        if not all(isinstance(value, int) for value in signature):
            return None
        return cls(record["sha256"], *signature)

    def to_dict(self) -> dict[str, str | int]:
        return asdict(self)

    def same_signature(self, info: os.stat_result) -> bool:
        return (self.inode, self.size, self.mtime_ns, self.ctime_ns) == (
            info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns
        )  # fmt: skip


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def checked(path: Path, recorded: FileRecord, made: str, recover: str, *, rehash: bool = False) -> FileRecord:
    """`recorded` where `path`'s signature is unchanged (and not `rehash`); else `path` is hashed again: its
    new record where the bytes are the recorded ones, a `ModelLoadError` where they are not, that names the
    file, says since when it `made` a difference ("it was converted"), and how to `recover`."""
    try:
        info = path.stat()
    except OSError as error:
        raise ModelLoadError(f"{path} is missing ({error.strerror}): it is not loaded. {recover}") from error
    if recorded.same_signature(info) and not rehash:
        return recorded
    now = FileRecord.of(path)
    if now.sha256 != recorded.sha256:
        raise ModelLoadError(f"{path} changed since {made} (sha256 differs): it is not loaded. {recover}")
    return now


# ---------------------------------------------------------------------------- seals of kept files

_KEPT_CHANGED = "specedit wrote it"


def seal_path(path: Path) -> Path:
    return path.with_name(path.name + SEAL_SUFFIX)


def _recover(path: Path) -> str:
    return f"Delete {path.parent} (loads make what it holds again); `specedit model verify` checks the whole cache"


def _read_seal(path: Path) -> FileRecord | None:
    try:
        return FileRecord.from_dict(json.loads(seal_path(path).read_text()))
    except (OSError, ValueError):
        return None


def _write_seal(path: Path, record: FileRecord) -> None:
    seal = seal_path(path)
    writing = seal.with_name(f"{seal.name}.tmp-{os.getpid()}")
    try:
        writing.write_text(json.dumps(record.to_dict()))
        writing.replace(seal)
    finally:
        writing.unlink(missing_ok=True)


def replace_sealed(writing: Path, path: Path) -> None:
    """Rename the file `writing` (complete, and private to this process) to `path`, and seal it: its
    sha256 taken before the rename, its signature after. The old seal goes first, so that it never vouches
    for the new bytes; a reader in between finds no seal, and makes the file again."""
    sha256 = sha256_file(writing)
    seal_path(path).unlink(missing_ok=True)
    writing.replace(path)
    _write_seal(path, FileRecord.of(path, sha256))


def is_sealed(path: Path) -> bool:
    """Whether `path` is there with the bytes its seal records (hashed again where its signature changed,
    and the new signature sealed, if the cache can be written). False where it is missing or has no seal:
    the caller makes it again. A `ModelLoadError` where its bytes changed since it was sealed."""
    recorded = _read_seal(path)
    if recorded is None or not path.is_file():
        return False
    try:
        now = checked(path, recorded, _KEPT_CHANGED, _recover(path))
    except ModelLoadError:
        # Another process may have just replaced the file and its seal (`replace_sealed`): read it again.
        again = _read_seal(path)
        if again is None:
            return False
        if again == recorded:
            raise
        recorded, now = again, checked(path, again, _KEPT_CHANGED, _recover(path))
    if now != recorded:
        with contextlib.suppress(OSError):  # a read-only cache: hashed again at the next load too
            _write_seal(path, now)
    return True


def verify_sealed(folder: Path) -> list[Path]:
    """Every sealed file in `folder` hashed again (`specedit model verify`); returns them. A file without a
    seal is not counted, nor a seal without its file: no load reads them. A `ModelLoadError` for the first
    file whose bytes changed."""
    found = []
    for seal in sorted(folder.glob(f"*{SEAL_SUFFIX}")) if folder.is_dir() else []:
        path = seal.with_name(seal.name.removesuffix(SEAL_SUFFIX))
        recorded = _read_seal(path)
        if recorded is not None and path.is_file():
            checked(path, recorded, _KEPT_CHANGED, _recover(path), rehash=True)
            found.append(path)
    return found
