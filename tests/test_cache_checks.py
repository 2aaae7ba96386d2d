"""What runs is what specedit made (issue 39, item 4): every file a load reads from the cache is hashed
when it is made and checked at each load by a signature no one can put back by hand (its change time),
hashed again when that changed; a forged completion marker cannot pass another model off as the default.

Each tampering here is as careful as can be: the bytes changed in place, the file's size and modification
time put back, a marker forged with every field the real one records.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_kernels import needs_kernel
from test_model_store import FakeIndex, _flip_a_byte, chunk_data

from specedit.cli.main import main
from specedit.engine.model import exactness, kernels, loading
from specedit.engine.model.tokenizer import KeptTokenizer
from specedit.engine.records.errors import ModelLoadError
from specedit.engine.store import fetch, integrity, store
from specedit.engine.store.store import MARKER_NAME, ModelSpec

from conftest import build_tokenizer


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own (the kernels' test takes this run's, where they are compiled once)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(cache))
    return cache


def _put_back_times(path: Path, change: Any) -> None:
    """`change(path)`, then the file's access and modification times put back (`touch -r`, `os.utime`)."""
    before = path.stat()
    change(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _zero_the_second_half(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.seek(size // 2)
        file.write(bytes(size - size // 2))


def _copying_converter(model_dir: Path) -> fetch.Converter:
    """A converter that 'converts' any GGUF into a copy of a real (tiny) model folder."""

    def convert(gguf_file: Path, out_dir: Path) -> str:
        for path in model_dir.iterdir():
            shutil.copy(path, out_dir / path.name)
        return "bfloat16"

    return convert


@pytest.fixture
def converted(isolated_cache: Path, tmp_path: Path, tiny_model_dir: Path) -> tuple[ModelSpec, Path]:
    """A provisioned model whose converted folder holds the tiny model's files."""
    index = FakeIndex(tmp_path, chunk_data())
    spec = index.spec()
    folder = fetch.ensure_model(spec, downloader=index, converter=_copying_converter(tiny_model_dir))
    return spec, folder


# ------------------------------------------------------------------------------- the converted folder


@pytest.mark.usefixtures("isolated_cache")
def test_a_forged_marker_cannot_pass_another_model_off_as_the_default(tiny_model_dir: Path) -> None:
    """The marker says the default model's pinned source, and records the tiny model's files exactly
    (sizes, times, inodes, change times, hashes): the default model's pinned identity refuses them."""
    folder = store.converted_path(store.DEFAULT_MODEL)
    shutil.copytree(tiny_model_dir, folder)
    files = {}
    for path in sorted(folder.iterdir()):
        info = path.stat()
        files[path.name] = {
            "size": info.st_size, "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
            "inode": info.st_ino, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }  # fmt: skip
    spec = store.DEFAULT_MODEL
    marker = {"name": spec.name, "source_sha256": spec.sha256, "spec_fingerprint": spec.fingerprint}
    (folder / MARKER_NAME).write_text(json.dumps({**marker, "dtype": "bfloat16", "files": files}))
    with pytest.raises(ModelLoadError, match=r"config\.json .*not the .*pinned.*specedit model fetch"):
        fetch.resolve_model(None)
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        store.verify_model(spec)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_converted_file_changed_with_its_times_put_back_is_refused_at_load(
    converted: tuple[ModelSpec, Path], name: str
) -> None:
    spec, folder = converted
    _flip_a_byte(folder / name, keep_time=True)
    with pytest.raises(ModelLoadError, match=rf"{name} changed since it was converted.*specedit model fetch"):
        fetch.ensure_model(spec)
    with pytest.raises(ModelLoadError, match=rf"{name} changed"):
        store.verify_model(spec)


def test_a_file_touched_but_the_same_is_hashed_once_and_its_signature_recorded(
    converted: tuple[ModelSpec, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, folder = converted
    weights = folder / "model.safetensors"
    weights.chmod(0o600)  # metadata only: the change time moves, the bytes stay
    hashed: list[Path] = []
    real_hash = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: hashed.append(path) or real_hash(path))
    assert fetch.ensure_model(spec) == folder
    assert hashed == [weights]
    recorded = json.loads((folder / MARKER_NAME).read_text())["files"]["model.safetensors"]
    assert recorded["ctime_ns"] == weights.stat().st_ctime_ns
    assert fetch.ensure_model(spec) == folder and hashed == [weights]  # the new signature holds: no hash


def test_a_marker_from_before_signatures_is_hashed_once_and_completed(converted: tuple[ModelSpec, Path]) -> None:
    """A marker that records sizes, modification times and hashes only (an older specedit's): the files are
    hashed again at the next load, and their signatures recorded."""
    spec, folder = converted
    marker = json.loads((folder / MARKER_NAME).read_text())
    for record in marker["files"].values():
        del record["inode"], record["ctime_ns"]
    (folder / MARKER_NAME).write_text(json.dumps(marker))
    assert fetch.ensure_model(spec) == folder
    files = json.loads((folder / MARKER_NAME).read_text())["files"]
    assert all(record["ctime_ns"] == (folder / name).stat().st_ctime_ns for name, record in files.items())


def test_the_default_models_identity_is_pinned_whatever_library_wrote_it(tmp_path: Path) -> None:
    """config.json and tokenizer.json say which model it is. Another library version writes them with other
    bytes (its own version, merges as pairs): still the same model; another model's are not."""
    pinned = {name: (sha256, identity) for name, sha256, identity in store.DEFAULT_MODEL.identity}
    assert set(pinned) == {"config.json", "tokenizer.json"}
    config = {key: 1 for key in store.IDENTITY_KEYS}
    (tmp_path / "config.json").write_text(json.dumps({**config, "transformers_version": "5.24.0"}))
    before = store.identity_digest("config.json", tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps({**config, "transformers_version": "6.0.0", "dtype": "x"}))
    assert store.identity_digest("config.json", tmp_path / "config.json") == before
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    assert store.identity_digest("config.json", tmp_path / "config.json") != before
    tokenizer = {"model": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "added_tokens": []}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    before = store.identity_digest("tokenizer.json", tmp_path / "tokenizer.json")
    tokenizer["model"]["merges"] = [["a", "b"]]  # type: ignore[index]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert store.identity_digest("tokenizer.json", tmp_path / "tokenizer.json") == before


@pytest.mark.usefixtures("isolated_cache")
def test_a_conversion_other_than_the_pinned_one_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    index = FakeIndex(tmp_path, chunk_data())
    spec = index.spec(identity=(("config.json", "0" * 64, "1" * 64),))
    with pytest.raises(ModelLoadError, match=r"config\.json says it is another model"):
        fetch.ensure_model(spec, downloader=index, converter=_copying_converter(tiny_model_dir))
    assert not store.converted_path(spec).exists()


# ---------------------------------------------------------------------------------- what loads keep


def _load_int8(folder: Path) -> loading.LoadedModel:
    return loading.load_model(str(folder), dtype="float32", weights="int8", device="cpu", kept_folder=store.kept_dir())


@needs_kernel
def test_kept_int8_weights_zeroed_by_half_are_refused_and_model_verify_says_so(
    converted: tuple[ModelSpec, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, folder = converted
    monkeypatch.setitem(store.KNOWN_MODELS, spec.name, spec)
    _load_int8(folder)  # quantized, and kept
    [kept] = store.kept_dir().glob("int8-*.safetensors")
    assert main(["model", "verify", spec.name]) == 0
    assert "hashed again" in capsys.readouterr().out
    _put_back_times(kept, _zero_the_second_half)
    refused = rf"{kept.name} changed since specedit wrote it.*Delete {store.kept_dir()} "
    with pytest.raises(ModelLoadError, match=refused):
        _load_int8(folder)
    assert main(["model", "verify", spec.name]) == 6
    assert kept.name in capsys.readouterr().err
    shutil.rmtree(store.kept_dir())  # the recovery the message names: quantized again
    assert loading.quantized.is_quantized(_load_int8(folder).model)


def test_a_tampered_kept_tokenizer_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The kept tokenizer's vocabulary with two tokens swapped: valid, and wrong."""
    kept = tmp_path / "kept"
    loading.load_tokenizer(str(tiny_model_dir), {}, kept)  # built and kept
    [pipeline] = kept.glob("tokenizer-*[0-9a-f].json")

    def swap_two_tokens(path: Path) -> None:
        text = json.loads(path.read_text())
        vocab = text["model"]["vocab"]
        first, second = list(vocab)[300:302]
        vocab[first], vocab[second] = vocab[second], vocab[first]
        path.write_text(json.dumps(text, separators=(",", ":")))

    _put_back_times(pipeline, swap_two_tokens)
    with pytest.raises(ModelLoadError, match=rf"{pipeline.name} changed since specedit wrote it"):
        loading.load_tokenizer(str(tiny_model_dir), {}, kept)


def test_a_tampered_verdict_is_refused(tmp_path: Path) -> None:
    from test_invariant import wide_model

    loaded = wide_model(512, torch.float32)
    exactness.settle(loaded, tmp_path)
    [verdict] = tmp_path.glob("*.json")

    def claim_the_other(path: Path) -> None:
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "bitwise": not record["bitwise"]}, indent=1))

    _put_back_times(verdict, claim_the_other)
    with pytest.raises(ModelLoadError, match=rf"{verdict.name} changed since specedit wrote it"):
        exactness.settle(wide_model(512, torch.float32, settle=False), tmp_path)


@needs_kernel
def test_a_changed_kernel_library_is_refused(tmp_path: Path) -> None:
    """The compiled kernels are code that runs: a library changed since it was compiled is not loaded."""
    library = kernels.library(store.cache_dir() / "kernels")  # this run's: compiled (or found) and sealed
    assert isinstance(library, Path), library
    folder = tmp_path / "kernels"
    folder.mkdir()
    for path in (library, integrity.seal_path(library)):
        shutil.copy2(path, folder / path.name)
    assert kernels.library(folder) == folder / library.name  # found, as sealed: not compiled again
    _flip_a_byte(folder / library.name, keep_time=True)
    with pytest.raises(ModelLoadError, match=rf"{library.name} changed since specedit wrote it"):
        kernels.library(folder)


def test_a_file_without_a_seal_is_made_again_not_trusted(tmp_path: Path) -> None:
    """A kept file with no seal (kept by an older specedit, or its seal deleted) is not read: it is made
    again, and sealed."""
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path / "model")
    kept = tmp_path / "kept"
    loading.load_tokenizer(str(tmp_path / "model"), {}, kept)
    [pipeline] = kept.glob("tokenizer-*[0-9a-f].json")
    integrity.seal_path(pipeline).unlink()
    pipeline.write_text("{}")
    assert loading.load_tokenizer(str(tmp_path / "model"), {}, kept).encode("def f") == tokenizer.encode("def f")
    assert integrity.is_sealed(pipeline)


def test_a_kept_tokenizer_writes_its_merges_compactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The kept pipeline's BPE merges are `"a b"` strings (read back sooner than pairs), and it tokenizes
    as the tokenizer built by transformers does."""
    from transformers import AutoTokenizer

    kept = tmp_path / "kept"
    loading.load_tokenizer(str(tiny_model_dir), {}, kept)  # built and kept
    [pipeline] = kept.glob("tokenizer-*[0-9a-f].json")
    merges = json.loads(pipeline.read_text(encoding="utf-8"))["model"]["merges"]
    assert merges and all(isinstance(merge, str) and merge.count(" ") == 1 for merge in merges)
    read_back = loading.load_tokenizer(str(tiny_model_dir), {}, kept)
    assert isinstance(read_back, KeptTokenizer)
    text = "def f(x):\n    return x  # \u00e9 \u4f60\u597d\n"
    assert read_back.encode(text) == AutoTokenizer.from_pretrained(tiny_model_dir).encode(text)
