"""Where an engine daemon listens and what it serves (`DaemonConfig`), its per-user runtime folder, and
token files: what the daemon and its clients both need. No torch, no asyncio.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specedit.engine.backends.protocol import DEFAULT_MAX_FRAME_SIZE, HELLO_MAX_FRAME_SIZE
from specedit.engine.records.errors import EngineUnavailableError
from specedit.engine.records.options import EngineOptions

SOCKET_NAME = "engine.sock"
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes on Linux, NUL included


def runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/specedit`, or a per-user folder in the temp dir where there is none."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return Path(xdg) / "specedit"
    return Path(tempfile.gettempdir()) / f"specedit-{os.getuid()}"


def default_socket_path() -> Path:
    return runtime_dir() / SOCKET_NAME


def prepare_state_dir(config: DaemonConfig) -> None:
    """The folder of the socket, made if missing (mode 0700). The runtime dir is made private; a folder
    the user chose must be theirs and writable by nobody else (`check_own_folder`), or a daemon there
    could be replaced by another user's."""
    folder = config.state_dir
    if folder == runtime_dir():
        prepare_private_dir(folder)
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise EngineUnavailableError(f"cannot create {folder}: {error}") from error
    check_own_folder(folder)


def prepare_private_dir(path: Path) -> None:
    """Create `path` with mode 0700; refuse a folder another user owns (e.g. planted in /tmp)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError as error:
        raise EngineUnavailableError(f"cannot create the runtime folder {path}: {error}") from error
    if not stat.S_ISDIR(info.st_mode):
        raise EngineUnavailableError(f"{path} is not a folder (a symlink?); refusing to use it")
    if info.st_uid != os.getuid():
        raise EngineUnavailableError(f"{path} belongs to another user; refusing to use it")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)


def check_own_folder(folder: Path) -> None:
    """The folder of a socket must belong to this user and be writable by nobody else: otherwise another
    user could put their own socket there (and receive the code sent to it)."""
    try:
        info = folder.stat()
    except OSError as error:
        raise EngineUnavailableError(f"cannot use the socket folder {folder}: {error}") from error
    if info.st_uid != os.getuid():
        raise EngineUnavailableError(
            f"the socket folder {folder} belongs to uid {info.st_uid}, not to you; refusing to use it"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EngineUnavailableError(
            f"the socket folder {folder} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "refusing to use it: choose a folder only you can write to"
        )


def check_own_socket(path: Path) -> None:
    """A socket a client may send code to: in a folder of this user's (`check_own_folder`), and itself
    this user's. The peer's uid is checked again once connected (`peer_uid`)."""
    if not path.parent.exists():
        return  # no daemon ever started there: connecting fails with its own message, "no daemon answers"
    check_own_folder(path.parent)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # nobody listens there: connecting fails with its own message
    except OSError as error:
        raise EngineUnavailableError(f"cannot use the socket {path}: {error}") from error
    if info.st_uid != os.getuid():
        raise EngineUnavailableError(f"the socket {path} belongs to uid {info.st_uid}, not to you; refusing to use it")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected unix socket (SO_PEERCRED, Linux); None
    where the system does not say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", credentials)[1])


@dataclass(frozen=True)
class DaemonConfig:
    """Where the daemon listens and what it serves. A unix socket unless `port` is given.

    TCP needs a token file (its first line is the token) and binds 127.0.0.1 unless `host` says
    otherwise; port 0 picks a free port (see `<runtime dir>/tcp-HOST-PORT.json` or `Daemon.address`).
    `http` ([HOST:]PORT) adds the HTTP door (OpenAI's API, `http.door`) beside the socket or TCP, on the
    same engine: it needs the token file too, and binds 127.0.0.1 unless HOST says otherwise.
    """

    socket_path: Path | None = None
    host: str | None = None
    port: int | None = None
    token_file: Path | None = None
    options: EngineOptions = field(default_factory=EngineOptions)  # the engine it serves
    allow_remote: bool = False  # TCP on an address other machines reach: only when asked for
    idle_timeout: float | None = None  # seconds without any client before exiting; None: never
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    http: str | None = None  # the HTTP door's [HOST:]PORT

    def __post_init__(self) -> None:
        if self.http is not None:
            host, _ = http_address(self.http)  # ValueError when it is none
            if self.token_file is None:
                raise ValueError("the HTTP door needs a token file: every OpenAI client sends it as its API key")
            if host not in LOOPBACK_HOSTS and not self.allow_remote:
                raise ValueError(
                    f"--http {self.http} is reachable from other machines, and OpenAI's clients send the token in "
                    "every request: add --allow-remote, and put TLS in front"
                )
        if self.port is not None or self.host is not None:
            if self.socket_path is not None:
                raise ValueError("give a socket path or a TCP host and port, not both")
            if self.port is None or not 0 <= self.port <= 65535:
                raise ValueError("TCP needs a port in 0..65535")
            if self.token_file is None:
                raise ValueError("TCP needs a token file: anyone on the machine can reach a TCP port")
            if self.host is None:
                object.__setattr__(self, "host", "127.0.0.1")
            if self.host not in LOOPBACK_HOSTS and not self.allow_remote:
                raise ValueError(
                    f"--host {self.host} is reachable from other machines, and the token would cross the network "
                    "in clear text: add --allow-remote, and put TLS in front (see the README)"
                )
            object.__setattr__(self, "token_file", Path(self.token_file).expanduser().absolute())
        else:
            if self.token_file is not None and self.http is None:
                raise ValueError("a token file goes with TCP or --http; a unix socket is guarded by its file mode")
            if self.token_file is not None:
                object.__setattr__(self, "token_file", Path(self.token_file).expanduser().absolute())
            path = default_socket_path()
            if self.socket_path is not None:
                path = Path(self.socket_path).expanduser().absolute()
            object.__setattr__(self, "socket_path", path)
            # Binding goes through a short temporary name in the same folder (see `_bind_unix`).
            longest = len(os.fsencode(path.parent)) + 1 + max(len(os.fsencode(path.name)), 12)
            if longest > UNIX_PATH_MAX:
                raise ValueError(f"socket path too long for a unix socket ({UNIX_PATH_MAX} bytes): {path}")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError("idle_timeout must be > 0 seconds (None: never)")
        if not HELLO_MAX_FRAME_SIZE <= self.max_frame_size < 2**32:
            raise ValueError(f"max_frame_size must be in {HELLO_MAX_FRAME_SIZE}..2**32-1")

    @property
    def tcp(self) -> bool:
        return self.port is not None

    @property
    def address(self) -> str:
        """What a client connects to: the socket path, or tcp://HOST:PORT."""
        if self.tcp:
            host = f"[{self.host}]" if self.host and ":" in self.host else self.host
            return f"tcp://{host}:{self.port}"
        return str(self.socket_path)

    @property
    def state_dir(self) -> Path:
        """The folder of the socket (and its lock, info and log files); the runtime dir for TCP."""
        return self.socket_path.parent if self.socket_path is not None else runtime_dir()

    def _state_file(self, suffix: str, port: int | None = None) -> Path:
        if self.socket_path is not None:
            return self.socket_path.with_name(self.socket_path.name + suffix)
        return self.state_dir / f"tcp-{self.host}-{self.port if port is None else port}{suffix}"

    @property
    def lock_path(self) -> Path:
        return self._state_file(".lock")

    @property
    def info_path(self) -> Path:
        return self._state_file(".json")

    @property
    def log_path(self) -> Path:
        return self._state_file(".log")

    def to_dict(self) -> dict[str, Any]:
        """The config as data, for a daemon started by a client (`from_dict` reads it back): paths as
        absolute strings, the engine options as `EngineOptions.to_dict`."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name in ("socket_path", "token_file"):
            values[name] = str(values[name]) if values[name] is not None else None
        values["options"] = _absolute_paths(self.options).to_dict()
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DaemonConfig:
        values = dict(values)
        values["options"] = EngineOptions.from_dict(values.get("options") or {})
        for name in ("socket_path", "token_file"):
            if values.get(name) is not None:
                values[name] = Path(values[name])
        return cls(**values)


def http_address(text: str) -> tuple[str, int]:
    """The HTTP door's (host, port) from `[HOST:]PORT` (127.0.0.1 without a host; port 0: any free one).

    >>> http_address("8080"), http_address("0.0.0.0:8080"), http_address("[::1]:0")
    (('127.0.0.1', 8080), ('0.0.0.0', 8080), ('::1', 0))
    """
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http takes [HOST:]PORT, not {text!r}")
    return host, int(port)


def _absolute_paths(options: EngineOptions) -> EngineOptions:
    """Model paths made absolute (a daemon runs in another folder); known names and hub ids stay."""

    def absolute(name: str | None) -> str | None:
        if name is None:
            return None
        path = Path(name).expanduser()
        return str(path.absolute()) if path.exists() else name

    return dataclasses.replace(options, model=absolute(options.model), draft_model=absolute(options.draft_model))


INPROCESS = "inprocess"  # the engine address that means: no daemon, the model in this process

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def read_token(path: Path) -> str:
    """The token: the first line of the file, without surrounding whitespace. The file must be readable
    by its owner alone: a token others can read guards nothing."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise EngineUnavailableError(f"cannot read the token file {path}: {error}") from error
    if mode & 0o077:
        raise EngineUnavailableError(
            f"the token file {path} can be read by other users (mode {mode:o}): `chmod 600 {path}` first"
        )
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise EngineUnavailableError(f"the token file {path} is empty")
    return token
