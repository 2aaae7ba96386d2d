"""What an attacker on the same machine or a careless moment must not get: the user's code sent to another
user's engine, an edit lost on disk, one request stalling every client, a tampered model loaded silently.

Tests that need a second user run as root (as CI does) and drop to `nobody` in a forked child.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import pwd
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specedit.cli import files
from specedit.cli.main import main
from specedit.engine.backends.client import EngineClient, _open_unix
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.local import LocalBackend
from specedit.engine.backends.protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    FrameBuffer,
    decode_payload,
    encode_frame,
    parse_client_message,
)
from specedit.engine.doors import daemon as daemon_module
from specedit.engine.doors.daemon import serve
from specedit.engine.loop.generate import Engine
from specedit.engine.model.loading import load_model
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.requests import MAX_INPUT_BYTES, RewriteRequest, SamplingConfig
from specedit.engine.records.wire import ProtocolError, from_wire, to_wire
from specedit.engine.session.session import Session

from conftest import MEMORISED_REWRITES

ADD, ADD_INSTRUCTION, ADD_ANSWER = MEMORISED_REWRITES[0]
NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.getuid() != 0, reason="acting as a second user needs root (CI runs as root)")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    yield path
    with contextlib.suppress(OSError):
        for child in sorted(path.rglob("*"), reverse=True):
            child.unlink() if not child.is_dir() or child.is_symlink() else child.rmdir()
        path.rmdir()


def impostor(folder: Path, *, bind_as_root: bool = False) -> Callable[[], None]:
    """A process of `nobody` that listens on `folder/engine.sock` and answers every hello with hello_ok
    (as a daemon would, to receive the code). Returns a function that ends it."""
    # nobody must be able to reach the folder: its parent (the test's own short folder, 0700) gets search
    # and read for others, no bit taken away (a parent that is /tmp keeps its 1777: a chmod to 0755 here
    # once left the machine's /tmp closed to every other user, apt's _apt included)
    mode = folder.parent.stat().st_mode
    if mode & 0o005 != 0o005:
        folder.parent.chmod(stat.S_IMODE(mode) | 0o055)
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, listen, answer
        try:
            os.close(ready_read)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if bind_as_root:
                listener.bind(str(folder / "engine.sock"))
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            if not bind_as_root:
                listener.bind(str(folder / "engine.sock"))
            listener.listen(8)
            os.write(ready_write, b"x")
            while True:
                connection, _ = listener.accept()
                connection.sendall(encode_frame({"type": "hello_ok", "version": PROTOCOL_VERSION, "pid": os.getpid()}))
        except BaseException as error:  # say why, from the child, then leave without running pytest's cleanup
            os.write(2, f"impostor: {error!r}\n".encode())
        finally:
            os._exit(0)
    os.close(ready_write)
    assert os.read(ready_read, 1) == b"x"
    os.close(ready_read)

    def stop() -> None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)

    return stop


# --- 1. no impostor engine ------------------------------------------------------------------------------


@as_root
def test_a_socket_in_another_users_folder_is_refused(short_dir: Path) -> None:
    folder = short_dir / "planted"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    stop = impostor(folder)
    try:
        with pytest.raises(EngineUnavailableError, match=f"{folder}.* belongs to uid {NOBODY.pw_uid}"):
            EngineClient.connect(folder / "engine.sock")
        # `serve` never says "already running" about it: a clear error (exit 7).
        assert main(["serve", "--socket", str(folder / "engine.sock")]) == 7
    finally:
        stop()


@as_root
def test_another_users_process_behind_our_socket_is_refused(short_dir: Path) -> None:
    """The socket file and folder are ours, but the process that answers runs as another user."""
    stop = impostor(short_dir, bind_as_root=True)
    try:
        with pytest.raises(EngineUnavailableError, match=f"listening on {short_dir}.*runs as uid {NOBODY.pw_uid}"):
            EngineClient.connect(short_dir / "engine.sock")
        with pytest.raises(EngineUnavailableError, match="another user's process listens"):
            serve(DaemonConfig(socket_path=short_dir / "engine.sock"))
    finally:
        stop()


def test_a_folder_others_can_write_to_is_refused(short_dir: Path) -> None:
    folder = short_dir / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(EngineUnavailableError, match="writable by other users"):
        EngineClient.connect(folder / "engine.sock")
    with pytest.raises(EngineUnavailableError, match="writable by other users"):
        serve(DaemonConfig(socket_path=folder / "engine.sock"))


@as_root
def test_without_xdg_runtime_dir_a_planted_runtime_folder_is_refused(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specedit.engine.session.session import remote_session

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(short_dir))
    tempfile.tempdir = None  # tempfile caches the temp folder: make it read TMPDIR again
    try:
        planted = short_dir / f"specedit-{os.getuid()}"
        planted.mkdir(mode=0o755)
        os.chown(planted, NOBODY.pw_uid, NOBODY.pw_gid)
        stop = impostor(planted)
        try:
            with pytest.raises(EngineUnavailableError, match="belongs to"):
                remote_session(None).run(RewriteRequest(ADD, ADD_INSTRUCTION))
        finally:
            stop()
    finally:
        tempfile.tempdir = None


def test_a_full_listen_backlog_is_waited_out(short_dir: Path) -> None:
    path = short_dir / "busy.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    waiting: list[socket.socket] = []
    try:
        while True:  # fill the backlog: connects now fail at once with EAGAIN
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.setblocking(False)
            try:
                probe.connect(str(path))
            except BlockingIOError:
                probe.close()
                break
            waiting.append(probe)
        accepter = threading.Timer(0.3, lambda: [listener.accept() for _ in range(len(waiting) + 1)])
        accepter.start()
        started = time.monotonic()
        connection = _open_unix(path, timeout=5.0)  # retries until the daemon accepts
        assert time.monotonic() - started >= 0.2
        connection.close()
        accepter.join()
    finally:
        for probe in waiting:
            probe.close()
        listener.close()


TCP_TOKEN = "the-daemon-token-7f3a9c"
SECRET_CODE = "API_KEY = 'only-in-the-users-file'\n"


class RecordingListener:
    """What another local user can start on the daemon's TCP port once it is free (a daemon that exited on
    its idle timeout) or before it: a plain socket server that keeps every byte it receives and answers
    each hello with `answer(hello)` (what an old daemon would say, or a forged challenge), then waits for
    the client's next frame, keeps it, and hangs up."""

    def __init__(self, answer: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.answer = answer
        self.received = bytearray()
        self.types: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5.0)
                buffer = FrameBuffer(DEFAULT_MAX_FRAME_SIZE)
                with contextlib.suppress(OSError, ProtocolError):
                    while chunk := connection.recv(1 << 16):
                        self.received += chunk
                        buffer.feed(chunk)
                        while (payload := buffer.next_payload()) is not None:
                            message = decode_payload(payload)
                            assert isinstance(message, dict)
                            self.types.append(str(message.get("type")))
                            if message.get("type") != "hello":
                                raise OSError("got what it was after: hang up")
                            connection.sendall(encode_frame(self.answer(message)))

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()


def old_daemons_welcome(hello: dict[str, Any]) -> dict[str, Any]:
    return {"type": "hello_ok", "version": PROTOCOL_VERSION, "pid": 1}


def a_forged_challenge(hello: dict[str, Any]) -> dict[str, Any]:
    return {"type": "challenge", "nonce": os.urandom(32), "proof": os.urandom(32)}


def an_empty_proof(hello: dict[str, Any]) -> dict[str, Any]:
    return {"type": "challenge", "nonce": os.urandom(32), "proof": b""}


@pytest.mark.parametrize("answer", [old_daemons_welcome, a_forged_challenge, an_empty_proof], ids=lambda f: f.__name__)
def test_an_impostor_on_the_tcp_port_gets_neither_the_token_nor_the_code(
    short_dir: Path, answer: Callable[[dict[str, Any]], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = short_dir / "token"
    token_file.write_text(TCP_TOKEN + "\n")
    token_file.chmod(0o600)
    source = short_dir / "secret.py"
    source.write_text(SECRET_CODE)
    impostor = RecordingListener(answer)
    try:
        with (
            pytest.raises(EngineUnavailableError, match="did not prove it holds the token") as refused,
            EngineClient.connect(impostor.address, token_file=token_file, timeout=5.0) as client,
        ):
            client.rewrite(RewriteRequest(SECRET_CODE, "Rename the key."))
        assert refused.value.exit_code == 7
        # The command line, as a user would run it: exit 7, and nothing of the file goes out either.
        argv = ["rewrite", str(source), "-i", "Rename the key.", "--engine", impostor.address]
        assert main([*argv, "--engine-token-file", str(token_file)]) == 7
        assert "did not prove it holds the token" in capsys.readouterr().err
    finally:
        impostor.close()
    assert impostor.types == ["hello", "hello"]  # nothing after the hello: not the token, not the request
    assert TCP_TOKEN.encode() not in impostor.received and b"only-in-the-users-file" not in impostor.received
    assert source.read_text() == SECRET_CODE


# --- 2. no lost edits on disk ------------------------------------------------------------------------


def rewrite_in_place(*paths: Path, model: Path, extra: tuple[str, ...] = ()) -> int:
    return main(["rewrite", *map(str, paths), "-i", ADD_INSTRUCTION, "--model", str(model), "--in-place", *extra])


def test_a_file_edited_during_the_rewrite_is_not_replaced(
    tmp_path: Path, memorising_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "add.py"
    source.write_text(ADD)
    edited = ADD + "# saved by the user meanwhile\n"
    run = Session.run

    def run_while_the_user_saves(self: Session, *args: Any, **kwargs: Any) -> Any:
        outcome = run(self, *args, **kwargs)
        source.write_text(edited)
        return outcome

    monkeypatch.setattr(Session, "run", run_while_the_user_saves)
    assert rewrite_in_place(source, model=memorising_model_dir) == 9
    assert source.read_text() == edited  # the user's edit stays
    assert (tmp_path / "add.py.specedit").read_text() == ADD_ANSWER  # the result, kept beside
    assert not (tmp_path / "add.py.orig").exists()
    assert "changed while being rewritten" in capsys.readouterr().err
    assert leftovers(tmp_path) == []


@as_root
def test_through_a_symlink_the_target_keeps_its_owner_group_and_mode(
    tmp_path: Path, memorising_model_dir: Path
) -> None:
    target, link = tmp_path / "real.py", tmp_path / "link.py"
    target.write_text(ADD)
    target.chmod(0o640)
    os.chown(target, NOBODY.pw_uid, NOBODY.pw_gid)
    link.symlink_to(target)
    assert rewrite_in_place(link, model=memorising_model_dir) == 0
    assert link.is_symlink() and target.read_text() == ADD_ANSWER
    info = target.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (NOBODY.pw_uid, NOBODY.pw_gid, 0o640)
    assert (tmp_path / "real.py.orig").read_text() == ADD
    assert (tmp_path / "real.py.orig").stat().st_uid == NOBODY.pw_uid


def test_several_files_are_all_written_or_none(tmp_path: Path, memorising_model_dir: Path) -> None:
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text(ADD)
    second.write_text("x = 1\n" * 3000)  # too long for the tiny model's context: fails after the first is done
    assert rewrite_in_place(first, second, model=memorising_model_dir, extra=("--max-new-tokens", "50")) == 5
    assert first.read_text() == ADD and not (tmp_path / "a.py.orig").exists()  # the first was not written


@pytest.mark.parametrize("failing", ["mkstemp", "fsync"])
def test_a_full_or_read_only_file_system_leaves_nothing_behind(
    tmp_path: Path,
    memorising_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failing: str,
) -> None:
    source = tmp_path / "add.py"
    source.write_text(ADD)
    calls = {"n": 0}
    fsync = os.fsync

    def second_fsync_fails(fd: int) -> None:  # the backup fits, the new file does not
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    if failing == "mkstemp":
        monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    else:
        monkeypatch.setattr(files.os, "fsync", second_fsync_fails)
    assert rewrite_in_place(source, model=memorising_model_dir) == 10
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("specedit:")]
    assert "Traceback" not in err and len(ours) == 1, err
    assert ("Read-only" if failing == "mkstemp" else "No space left") in err
    assert source.read_text() == ADD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["add.py"]  # no backup, no temporary file


def saved_meanwhile(source: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The user saves `source` while it is rewritten (so the result must be kept beside it, exit 9)."""
    edited = ADD + "# saved by the user meanwhile\n"
    run = Session.run

    def run_while_the_user_saves(self: Session, *args: Any, **kwargs: Any) -> Any:
        outcome = run(self, *args, **kwargs)
        source.write_text(edited)
        return outcome

    monkeypatch.setattr(Session, "run", run_while_the_user_saves)
    return edited


def kept_at(err: str) -> Path:
    """The file the message says the result is in."""
    return Path(err.split("the result is in ", 1)[1].split()[0].rstrip(";,"))


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755], ids=oct)
def test_the_result_kept_beside_has_the_originals_mode_whatever_the_umask(
    tmp_path: Path,
    memorising_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    mode: int,
) -> None:
    source = tmp_path / "add.py"
    source.write_text(ADD)
    source.chmod(mode)
    saved_meanwhile(source, monkeypatch)
    umask = os.umask(0o022)
    try:
        assert rewrite_in_place(source, model=memorising_model_dir) == 9
    finally:
        os.umask(umask)
    kept = tmp_path / "add.py.specedit"
    assert kept_at(capsys.readouterr().err) == kept and kept.read_text() == ADD_ANSWER
    assert stat.S_IMODE(kept.stat().st_mode) == mode  # a private file's result stays private
    assert leftovers(tmp_path) == []


def test_a_symlink_planted_at_the_side_name_is_not_written_through(
    tmp_path: Path, memorising_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, yours = tmp_path / "victim.py", tmp_path / "yours.txt"
    source.write_text(ADD)
    source.chmod(0o600)
    yours.write_text("a file of yours\n")
    (tmp_path / "victim.py.specedit").symlink_to(yours)
    edited = saved_meanwhile(source, monkeypatch)
    assert rewrite_in_place(source, model=memorising_model_dir) == 9
    err = capsys.readouterr().err
    assert yours.read_text() == "a file of yours\n"  # not written through the link
    assert (tmp_path / "victim.py.specedit").is_symlink() and os.readlink(tmp_path / "victim.py.specedit") == str(yours)
    kept = kept_at(err)  # the result is kept, where the message says
    assert kept.parent == tmp_path and kept.name.startswith("victim.py.") and not kept.is_symlink()
    assert kept.read_text() == ADD_ANSWER and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert "symbolic link" in err and source.read_text() == edited
    assert leftovers(tmp_path) == []


@as_root
def test_in_a_sticky_folder_another_users_link_at_the_side_name_is_not_written_through(
    tmp_path: Path, memorising_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """/tmp's case: a world-writable sticky folder where `nobody` links victim.py.specedit to a file of ours
    before our --in-place run ends with exit 9 (root is not held back by the sticky bit: only the code is)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    source, yours = shared / "victim.py", tmp_path / "yours.txt"
    source.write_text(ADD)
    yours.write_text("a file of yours\n")
    link = shared / "victim.py.specedit"
    link.symlink_to(yours)
    os.lchown(link, NOBODY.pw_uid, NOBODY.pw_gid)
    saved_meanwhile(source, monkeypatch)
    assert rewrite_in_place(source, model=memorising_model_dir) == 9
    err = capsys.readouterr().err
    assert yours.read_text() == "a file of yours\n" and link.is_symlink()
    assert kept_at(err).read_text() == ADD_ANSWER and kept_at(err).stat().st_uid == 0
    assert leftovers(shared) == []


def test_a_symlink_planted_at_the_backup_name_is_a_clear_error_and_nothing_is_replaced(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, yours = tmp_path / "add.py", tmp_path / "yours.txt"
    source.write_text(ADD)
    yours.write_text("a file of yours\n")
    (tmp_path / "add.py.orig").symlink_to(yours)
    assert rewrite_in_place(source, model=memorising_model_dir) == 10  # WriteError
    err = capsys.readouterr().err
    assert "add.py.orig" in err and "symbolic link" in err and "nothing was replaced" in err
    assert source.read_text() == ADD and yours.read_text() == "a file of yours\n"
    assert (tmp_path / "add.py.orig").is_symlink() and leftovers(tmp_path) == []
    assert rewrite_in_place(source, model=memorising_model_dir, extra=("--no-backup",)) == 0  # the way out
    assert source.read_text() == ADD_ANSWER and yours.read_text() == "a file of yours\n"


@as_root
def test_an_output_path_through_another_users_link_in_a_sticky_folder_is_refused(
    tmp_path: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Linux's fs.protected_symlinks rule, kept where the system has it off: a link in a sticky world-writable
    folder is followed only when its owner is the user or the folder's owner."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    source, yours = tmp_path / "add.py", tmp_path / "yours.txt"
    source.write_text(ADD)
    yours.write_text("a file of yours\n")
    planted = shared / "out.py"
    planted.symlink_to(yours)
    os.lchown(planted, NOBODY.pw_uid, NOBODY.pw_gid)
    argv = ["rewrite", str(source), "-i", ADD_INSTRUCTION, "--model", str(memorising_model_dir), "-o", str(planted)]
    assert main(argv) == 10
    assert "symbolic link" in capsys.readouterr().err and yours.read_text() == "a file of yours\n"
    os.lchown(planted, 0, 0)  # our own link is followed, as ever
    assert main(argv) == 0 and yours.read_text() == ADD_ANSWER and planted.is_symlink()


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    assert main(["rewrite", str(fifo), "-i", "x", "--model", str(tmp_path / "never-loaded")]) == 3
    assert "not a regular file" in capsys.readouterr().err


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "specedit-tmp" in p.name)


# --- 3. no request that stalls everyone ----------------------------------------------------------------


def test_inputs_over_the_limit_are_refused_before_any_model_work() -> None:
    with pytest.raises(ValueError, match="larger than 1,000,000 bytes"):
        RewriteRequest(original="x" * (MAX_INPUT_BYTES + 1), instruction="y")
    with pytest.raises(ValueError, match="instruction is larger"):
        RewriteRequest(original="x", instruction="é" * (MAX_INPUT_BYTES // 2 + 1))  # 2 bytes each
    assert DEFAULT_MAX_FRAME_SIZE < 5 * MAX_INPUT_BYTES  # a 5 MB frame is refused by its header alone


def test_the_context_is_checked_before_the_whole_input_is_tokenized(tiny_model_dir: Path) -> None:
    from specedit.engine.loop.rewrite import prepare_rewrite
    from specedit.engine.records.errors import ContextLengthError

    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    tokenized: list[int] = []
    tokenize = engine.tokenize

    def counting(text: str) -> list[int]:
        tokenized.append(len(text))
        return tokenize(text)

    engine.tokenize = counting  # type: ignore[method-assign]
    original = "value = 1\n" * 90_000  # 900 KB, far over the tiny model's 2,048 positions
    with pytest.raises(ContextLengthError, match="too long for the model"):
        prepare_rewrite(engine, RewriteRequest(original, "Rename value."))
    assert sum(tokenized) < len(original) // 20  # only a prefix was tokenized


def test_temperature_and_top_p_out_of_range_are_refused() -> None:
    for temperature, top_p in ((1e-300, 1.0), (0.7, 1e-300), (float("nan"), 1.0), (1e9, 1.0)):
        with pytest.raises(ValueError):
            SamplingConfig(temperature=temperature, top_p=top_p)
    assert SamplingConfig(temperature=0.001, top_p=1e-6).temperature == 0.001


def test_an_unauthenticated_client_does_not_keep_an_idle_daemon_alive(short_dir: Path, tiny_model_dir: Path) -> None:
    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    config = DaemonConfig(socket_path=short_dir / "engine.sock", idle_timeout=0.8)
    finished = threading.Event()
    thread = threading.Thread(
        target=lambda: (serve(config, backend=LocalBackend(engine=engine)), finished.set()), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not finished.is_set() and time.monotonic() < deadline:  # connects and never says hello
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.connect(str(config.socket_path))
            time.sleep(0.15)
    assert finished.wait(5), "the daemon stayed up for a client that never authenticated"


def test_a_nil_frame_is_malformed_not_a_hang_up(short_dir: Path, tiny_model_dir: Path) -> None:
    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    config = DaemonConfig(socket_path=short_dir / "engine.sock")
    with daemon_in_thread(config, engine):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(config.socket_path))
            hello = {"type": "hello", "version": PROTOCOL_VERSION, "nonce": None, "client": "a\nforged line"}
            sock.sendall(encode_frame(hello))
            buffer = FrameBuffer(1 << 20)
            replies = []
            for frame in (encode_frame(None), encode_frame({"type": "status"})):  # type: ignore[arg-type]
                sock.sendall(frame)
            while len(replies) < 3:
                chunk = sock.recv(1 << 16)
                assert chunk, f"the daemon hung up after {replies}"
                buffer.feed(chunk)
                while (payload := buffer.next_payload()) is not None:
                    replies.append(decode_payload(payload))
        assert replies[0]["type"] == "hello_ok"
        assert replies[1]["code"] == "malformed_frame"  # and the connection goes on:
        assert replies[2]["type"] == "status_ok"


# --- idle and slow peers: a budget of connections at every door -------------------------------------------


@contextlib.contextmanager
def daemon_in_thread(config: DaemonConfig, engine: Engine) -> Iterator[Any]:
    ready = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(daemon: Any) -> None:
        box["daemon"] = daemon
        ready.set()

    thread = threading.Thread(
        target=lambda: serve(config, backend=LocalBackend(engine=engine), on_ready=on_ready), daemon=True
    )
    thread.start()
    assert ready.wait(20), "the daemon did not start"
    try:
        yield box["daemon"]
    finally:
        box["daemon"].stop()
        thread.join(20)


def closed_by_the_daemon(peers: list[socket.socket]) -> int:
    closed = 0
    for peer in peers:
        peer.setblocking(False)
        try:
            closed += peer.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def test_idle_peers_on_the_tcp_port_are_few_and_the_owner_is_served(short_dir: Path, tiny_model_dir: Path) -> None:
    """1,100 connections that never say hello: the daemon holds few of them (the oldest closed to make
    room), and a client with the token is served beside them."""
    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    token = short_dir / "token"
    token.write_text(TCP_TOKEN + "\n")
    token.chmod(0o600)
    config = DaemonConfig(host="127.0.0.1", port=0, token_file=token)
    with daemon_in_thread(config, engine) as daemon:
        port = int(daemon.address.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(1100)]
        try:
            started = time.monotonic()
            with EngineClient.connect(daemon.address, token_file=token) as client:
                assert client.rewrite(RewriteRequest("x = 1\n", "Rename x.", max_new_tokens=3)).text
                assert client.status()["unproven"] <= 32
            assert time.monotonic() - started < 10.0  # seconds at most, under any load
            deadline = time.monotonic() + 10  # the door may be accepting the last ones still
            while closed_by_the_daemon(idle) < 1000 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert closed_by_the_daemon(idle) >= 1000
        finally:
            for peer in idle:
                peer.close()


def test_the_tcp_handshake_has_one_deadline_for_all_of_it(
    short_dir: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that sends each handshake frame just within the deadline is still cut off: the deadline is
    for the whole handshake, not for each frame."""
    from specedit.engine.backends.protocol import handshake_proof

    monkeypatch.setattr(daemon_module, "HELLO_TIMEOUT", 1.0)
    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    token = short_dir / "token"
    token.write_text(TCP_TOKEN + "\n")
    token.chmod(0o600)
    config = DaemonConfig(host="127.0.0.1", port=0, token_file=token)
    with daemon_in_thread(config, engine) as daemon:
        port = int(daemon.address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as peer:
            nonce = os.urandom(32)
            time.sleep(0.8)
            peer.sendall(encode_frame({"type": "hello", "version": PROTOCOL_VERSION, "nonce": nonce, "client": "slow"}))
            buffer = FrameBuffer(1 << 16)
            buffer.feed(peer.recv(1 << 16))
            challenge = decode_payload(buffer.next_payload() or b"")
            assert isinstance(challenge, dict) and challenge["type"] == "challenge"
            time.sleep(0.8)
            proof = handshake_proof(TCP_TOKEN, "client", nonce, challenge["nonce"])
            with contextlib.suppress(OSError):
                peer.sendall(encode_frame({"type": "proof", "proof": proof}))
            replies = []
            while chunk := peer.recv(1 << 16):
                buffer.feed(chunk)
                while (payload := buffer.next_payload()) is not None:
                    replies.append(decode_payload(payload))
        assert [reply["type"] for reply in replies] == ["error"] and replies[0]["code"] == "hello_required"


def test_the_daemon_raises_its_limit_of_open_files(short_dir: Path, tiny_model_dir: Path) -> None:
    """A process often starts with a soft limit of 1,024 open files and a hard one far above: the daemon
    takes the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard limit of open files is {hard}: nothing to raise")
    engine = Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        with daemon_in_thread(DaemonConfig(socket_path=short_dir / "engine.sock"), engine) as daemon:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 1024
            assert daemon.status_info()["door_limit"] > (1024 - 128) // 2
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_at_a_limit_of_1024_files_idle_peers_leave_the_owner_served(short_dir: Path, tiny_model_dir: Path) -> None:
    """The real daemon with a hard limit of 1,024 open files (as on many machines): 1,100 idle connections
    to its HTTP door cost it few descriptors; the owner's requests through HTTP and the socket are
    answered; a 20 MB head costs it little memory."""
    import http.client
    import resource
    import subprocess
    import sys

    token = short_dir / "token"
    token.write_text(TCP_TOKEN + "\n")
    token.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    socket_path = short_dir / "engine.sock"
    command = [sys.executable, "-m", "specedit.cli.main", "serve", "--socket", str(socket_path), "--model"]
    command += [str(tiny_model_dir), "--dtype", "float32", "--threads", "1", "--http", f"127.0.0.1:{port}"]
    command += ["--token-file", str(token)]

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    with open(short_dir / "log", "w") as log:
        daemon = subprocess.Popen(command, preexec_fn=low_limit, stdout=subprocess.DEVNULL, stderr=log)
    idle: list[socket.socket] = []

    def owner_over_http() -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        body = {"model": "specedit", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {TCP_TOKEN}"})
        status = connection.getresponse().status
        connection.close()
        return status

    def rss_kb() -> int:
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0])

    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(EngineUnavailableError), EngineClient.connect(socket_path) as client:
                if client.status()["state"] == "ready":
                    break
            assert time.monotonic() < deadline and daemon.poll() is None, (short_dir / "log").read_text()
            time.sleep(0.3)
        assert owner_over_http() == 200
        for _ in range(1100):
            peer = socket.socket()
            peer.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                peer.connect(("127.0.0.1", port))
            idle.append(peer)
        time.sleep(1.0)
        started = time.monotonic()
        assert owner_over_http() == 200
        with EngineClient.connect(socket_path, timeout=15) as client:
            assert client.rewrite(RewriteRequest("x = 1\n", "Rename x.", max_new_tokens=3)).text
        assert time.monotonic() - started < 10.0  # neither waits out a 15 s time-out
        assert len(os.listdir(f"/proc/{daemon.pid}/fd")) < 300
        before = rss_kb()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as peer, contextlib.suppress(OSError):
            peer.sendall(b"GET /v1/models?" + b"x" * (20 << 20))
        assert owner_over_http() == 200
        assert rss_kb() - before < 8 * 1024  # KB: the 20 MB head is not kept
    finally:
        for peer in idle:
            peer.close()
        daemon.terminate()
        daemon.wait(30)


def test_a_flood_of_loop_errors_is_logged_once_a_while(caplog: pytest.LogCaptureFixture) -> None:
    handler = daemon_module.QuietLoopErrors(interval=60.0)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="specedit.engine.doors.daemon"):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")})
    finally:
        loop.close()
    assert len(caplog.records) == 1 and "out of system resource" in caplog.records[0].getMessage()


def test_remote_tcp_needs_a_flag_and_a_private_token(short_dir: Path) -> None:
    token = short_dir / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    with pytest.raises(ValueError, match="--allow-remote"):
        DaemonConfig(host="0.0.0.0", port=7341, token_file=token)
    assert DaemonConfig(host="0.0.0.0", port=7341, token_file=token, allow_remote=True).host == "0.0.0.0"
    with pytest.raises(EngineUnavailableError, match="chmod 600"):
        EngineClient.connect("tcp://127.0.0.1:1", token_file=token)


# --- fuzz: the frame reader and the request validator only ever raise their own errors -----------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_random_bytes_are_frames_or_protocol_errors(data: bytes) -> None:
    buffer = FrameBuffer(128)
    buffer.feed(data)
    try:
        while (payload := buffer.next_payload()) is not None:
            with contextlib.suppress(ProtocolError):
                parse_client_message(decode_payload(payload))
    except ProtocolError as error:
        assert error.code == "frame_too_large"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(to_wire(RewriteRequest("x", "y")))), JSONISH, max_size=8), JSONISH)
def test_random_requests_are_requests_or_clean_refusals(fields: dict[str, Any], sampling: Any) -> None:
    wire = {**to_wire(RewriteRequest("x", "y")), **fields}
    if isinstance(sampling, dict):
        wire["sampling"] = {**to_wire(SamplingConfig()), **sampling}
    try:
        request = from_wire(RewriteRequest, wire)
    except (ProtocolError, ValueError):
        return
    assert isinstance(request, RewriteRequest) and to_wire(request) == {**wire, "sampling": to_wire(request.sampling)}
    json.dumps(to_wire(request))  # what went through is plain data


def test_the_connection_budgets_examples_hold() -> None:
    import doctest

    from specedit.engine.doors import listening

    result = doctest.testmod(listening)
    assert result.attempted > 0 and result.failed == 0
