"""A daemon as the session's backend (`DaemonBackend`): the one at an address, or the shared one, started on
demand (`ensure_daemon`) and exiting by itself once idle.

One connection per rewrite: a connection serialises its calls, and a rewrite waiting for another one's
connection could not be cancelled; connecting to a running daemon takes a millisecond. Like the client,
this module imports neither torch nor the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from specedit.engine.backends.client import EngineAddress, EngineClient, answers
from specedit.engine.backends.config import DaemonConfig, prepare_state_dir
from specedit.engine.records.errors import EngineUnavailableError, InputError, SpeceditError
from specedit.engine.records.events import Event
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import CompletionRequest, RewriteOutcome, RewriteRequest, WarmRequest

if TYPE_CHECKING:
    from specedit.engine.sketch.sketch import Sketch

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_SPAWN_IDLE_TIMEOUT = 300.0  # a daemon a client started exits after 5 minutes without clients
_LOG_ROTATE_BYTES = 4 * 1024 * 1024


class DaemonBackend:
    """Rewrites in an engine daemon: the one at `address`, or (None) the default one, started with the
    `spawn` options when none answers."""

    def __init__(
        self,
        address: str | None,
        *,
        token_file: str | None = None,
        spawn: EngineOptions | None = None,
        client_name: str | None = None,
    ) -> None:
        self.address = address
        self._token_file = token_file
        self._spawn = spawn or EngineOptions()
        self._client_name = client_name or f"specedit pid {os.getpid()}"
        self._held: EngineClient | None = None  # see keep_alive
        self._held_lock = threading.Lock()

    def connect(self) -> EngineClient:
        if self.address is not None:
            return EngineClient.connect(self.address, token_file=self._token_file, client_name=self._client_name)
        return ensure_daemon(DaemonConfig(options=self._spawn), client_name=self._client_name)

    def run(
        self,
        request: RewriteRequest | CompletionRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        client: str,
        sketch: Sketch | None = None,  # not sent: the host reads the request's sketch once there
    ) -> RewriteOutcome:
        if not isinstance(request, RewriteRequest):
            raise InputError(f"{self.address} takes rewrites; completions (OpenAI's API) go to its HTTP door")
        with self.connect() as connection:  # (the daemon knows this client by its connection)
            return connection.rewrite(request, emit, cancel)

    def in_turn(self, work: Callable[[], T], emit: Callable[[Event], None], cancel: threading.Event, client: str) -> T:
        return work()  # the daemon's model runs in its own process: the work here takes no turn

    def warm(self, request: WarmRequest) -> bool:
        """Offer `request` to the daemon if one answers (none is started for it)."""
        try:
            with self._connect_running() as connection:
                return connection.warm(request)
        except SpeceditError as error:
            log.debug("not warmed: %s", error)
            return False

    def keep_alive(self, wanted: bool) -> None:
        """Hold a connection to the daemon while `wanted`, if one answers: a daemon exits once no client is
        connected for its idle timeout, and an editor with documents open is a client even between rewrites.
        Each call re-opens it (the daemon may have started, or been restarted, since)."""
        with self._held_lock:
            if self._held is not None:
                self._held.close()
                self._held = None
            if wanted:
                try:
                    self._held = self._connect_running()
                except SpeceditError as error:
                    log.debug("no daemon to keep: %s", error)

    def start(self) -> None:
        """The daemon at the address answers, or the shared one is started (it loads the model at once)."""
        self.connect().close()

    def _connect_running(self) -> EngineClient:
        """A connection to the daemon if one answers; none is started."""
        address = self.address if self.address is not None else EngineAddress.of(DaemonConfig(options=self._spawn))
        return EngineClient.connect(address, token_file=self._token_file, client_name=self._client_name)

    def close(self) -> None:
        self.keep_alive(False)


def running_daemon(options: EngineOptions) -> str | None:
    """The address of the shared daemon if one runs and answers, serving the engine `options` describe (as
    its info file says: the same model and settings, so the same answers); else None. Nothing is started."""
    config = DaemonConfig(options=options)
    try:  # (an older daemon's file has no options; a newer one's may have options this one does not know)
        served = EngineOptions.from_dict(json.loads(config.info_path.read_text(encoding="utf-8"))["options"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if served != EngineOptions.from_dict(config.to_dict()["options"]):
        return None
    try:
        EngineClient.connect(EngineAddress.of(config), client_name="specedit (is a daemon there?)").close()
    except EngineUnavailableError:
        return None  # a stale info file, or a daemon on its way out
    return config.address


def ensure_daemon(
    config: DaemonConfig,
    start_timeout: float = 120.0,
    *,
    client_name: str | None = None,
) -> EngineClient:
    """A client of the daemon at `config.address`, starting the daemon first when none answers.

    The daemon is spawned detached (its own session; output to `config.log_path`) with an idle timeout
    (`config.idle_timeout`, else `DEFAULT_SPAWN_IDLE_TIMEOUT`), so it exits once its last client is gone.
    Concurrent callers share one daemon: they take turns (an flock) at starting one, and the daemon's
    own lock settles any race that remains. `start_timeout` bounds the wait for the socket to answer;
    the model loads after that, and the first request waits for it.
    """
    address = EngineAddress.of(config)
    token_file = config.token_file
    try:
        return EngineClient.connect(address, token_file=token_file, client_name=client_name)
    except EngineUnavailableError:
        if answers(address):
            raise  # a daemon is there but refused us (token, version): starting another cannot help
    if config.idle_timeout is None:
        config = dataclasses.replace(config, idle_timeout=DEFAULT_SPAWN_IDLE_TIMEOUT)
    deadline = time.monotonic() + start_timeout
    prepare_state_dir(config)
    with _spawn_turn(config.lock_path.with_name(config.lock_path.name + ".spawn"), deadline):
        with contextlib.suppress(EngineUnavailableError):  # whoever had the turn before may have started it
            return EngineClient.connect(address, token_file=token_file, client_name=client_name)
        process = _spawn(config)
        while time.monotonic() < deadline:
            try:
                client = EngineClient.connect(address, token_file=token_file, client_name=client_name)
            except EngineUnavailableError:
                code = process.poll()
                if code not in (None, 0):  # 0: another daemon had the lock; it will answer soon
                    raise EngineUnavailableError(
                        f"the engine daemon exited with status {code}: {_tail(config.log_path)}"
                    ) from None
                time.sleep(0.1)
                continue
            if process.returncode is None:  # reap it whenever it exits: no zombie in a long-lived client
                threading.Thread(target=process.wait, name="specedit-daemon-reaper", daemon=True).start()
            return client
    raise EngineUnavailableError(
        f"no engine daemon answered at {address} within {start_timeout:.0f} s (log: {config.log_path})"
    )


@contextlib.contextmanager
def _spawn_turn(path: Path, deadline: float) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EngineUnavailableError(f"timed out waiting to start the engine daemon ({path})") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _spawn(config: DaemonConfig) -> subprocess.Popen[bytes]:
    log_path = config.log_path
    with contextlib.suppress(OSError):
        if log_path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(log_path, log_path.with_name(log_path.name + ".old"))
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    # The config goes as data on the daemon's standard input, not as a command line to parse again.
    command = [sys.executable, "-m", "specedit.engine.doors.daemon"]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,  # no terminal signals from the starter's session (Ctrl-C in an editor)
            close_fds=True,
        )
    except OSError as error:
        raise EngineUnavailableError(f"cannot start the engine daemon ({' '.join(command)}): {error}") from error
    finally:
        os.close(log_fd)
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError), process.stdin:
        process.stdin.write(json.dumps(config.to_dict()).encode())
    return process


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return " | ".join(text.strip().splitlines()[-lines:]) or f"(empty log at {path})"
