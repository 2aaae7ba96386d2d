"""Where an engine daemon listens and what it serves (`DaemonConfig`), its per-user runtime folder, and
token files: what the daemon and its clients both need. No torch, no asyncio.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specedit.engine.errors import EngineUnavailableError
from specedit.engine.options import EngineOptions
from specedit.engine.serving.protocol import DEFAULT_MAX_FRAME_SIZE, HELLO_MAX_FRAME_SIZE

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
    """The folder of the socket: the runtime dir is made private; a folder the user chose is only
    created when missing (its mode is the user's business; the socket itself is 0600)."""
    folder = config.state_dir
    if folder == runtime_dir():
        prepare_private_dir(folder)
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise EngineUnavailableError(f"cannot create {folder}: {error}") from error


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


@dataclass(frozen=True)
class DaemonConfig:
    """Where the daemon listens and what it serves. A unix socket unless `port` is given.

    TCP needs a token file (its first line is the token) and binds 127.0.0.1 unless `host` says
    otherwise; port 0 picks a free port (see `<runtime dir>/tcp-HOST-PORT.json` or `Daemon.address`).
    """

    socket_path: Path | None = None
    host: str | None = None
    port: int | None = None
    token_file: Path | None = None
    options: EngineOptions = field(default_factory=EngineOptions)  # the engine it serves
    idle_timeout: float | None = None  # seconds without any client before exiting; None: never
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    def __post_init__(self) -> None:
        if self.port is not None or self.host is not None:
            if self.socket_path is not None:
                raise ValueError("give a socket path or a TCP host and port, not both")
            if self.port is None or not 0 <= self.port <= 65535:
                raise ValueError("TCP needs a port in 0..65535")
            if self.token_file is None:
                raise ValueError("TCP needs a token file: anyone on the machine can reach a TCP port")
            if self.host is None:
                object.__setattr__(self, "host", "127.0.0.1")
            object.__setattr__(self, "token_file", Path(self.token_file).expanduser().absolute())
        else:
            if self.token_file is not None:
                raise ValueError("a token file only goes with TCP; a unix socket is guarded by its file mode")
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


def _absolute_paths(options: EngineOptions) -> EngineOptions:
    """Model paths made absolute (a daemon runs in another folder); known names and hub ids stay."""

    def absolute(name: str | None) -> str | None:
        if name is None:
            return None
        path = Path(name).expanduser()
        return str(path.absolute()) if path.exists() else name

    return dataclasses.replace(options, model=absolute(options.model), draft_model=absolute(options.draft_model))


def read_token(path: Path) -> str:
    """The token: the first line of the file, without surrounding whitespace."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise EngineUnavailableError(f"cannot read the token file {path}: {error}") from error
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise EngineUnavailableError(f"the token file {path} is empty")
    return token
