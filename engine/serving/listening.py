"""Where the daemon listens, made safe: its lock, its socket (bound so that it is never reachable with a
looser mode, a stale one replaced only under the lock, another user's never touched), its TCP port, and
the info file beside the socket (`daemon.serve` uses these)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path

from specedit.engine.errors import EngineUnavailableError
from specedit.engine.serving.config import LOOPBACK_HOSTS, DaemonConfig, peer_uid
from specedit.engine.serving.protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)


def acquire_lock(path: Path) -> int | None:
    """An exclusive flock held until the fd is closed (or the process dies); None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def owner(config: DaemonConfig) -> str:
    try:
        return f"pid {json.loads(config.info_path.read_text())['pid']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "still starting"


def answering_uid(path: Path) -> int | None:
    """The uid of the process that answers on the socket at `path` (-1 when the system does not say);
    None when nobody answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return None
        uid = peer_uid(probe)
    return -1 if uid is None else uid


def clear_stale_socket(path: Path) -> bool:
    """Remove a socket file nobody answers on (with the lock held); False when our own daemon answers.
    Another user's socket or process there is an error: never reported as "already running"."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return True
    if not stat.S_ISSOCK(info.st_mode):
        raise EngineUnavailableError(f"{path} exists and is not a socket; not touching it")
    uid = answering_uid(path)
    if uid is not None:
        if info.st_uid != os.getuid() or uid not in (os.getuid(), -1):
            raise EngineUnavailableError(f"another user's process listens on {path}; not starting a daemon there")
        return False
    log.info("removing the stale socket %s", path)
    path.unlink()
    return True


def bind_unix(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """Bind under a temporary name, make it 0600, listen, then rename into place: the socket is never
    reachable with a looser mode, and no process-wide umask is touched."""
    temporary = path.with_name(f".{os.getpid()}.s")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(temporary))
        os.chmod(temporary, 0o600)
        listener.listen(64)
        os.rename(temporary, path)
        info = path.lstat()
    except OSError as error:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise EngineUnavailableError(f"cannot listen on {path}: {error}") from error
    listener.setblocking(False)
    return listener, (info.st_dev, info.st_ino)


def bind_tcp(config: DaemonConfig) -> socket.socket:
    host = str(config.host)
    if host not in LOOPBACK_HOSTS:
        log.warning("listening on %s (--allow-remote): reachable from other machines; only the token guards it", host)
    try:
        listener = socket.create_server((host, int(config.port or 0)), backlog=64)
    except OSError as error:
        raise EngineUnavailableError(f"cannot listen on {config.address}: {error}") from error
    listener.setblocking(False)
    return listener


def remove_if_same(path: Path, socket_id: tuple[int, int]) -> None:
    with contextlib.suppress(FileNotFoundError):
        info = path.lstat()
        if (info.st_dev, info.st_ino) == socket_id:
            path.unlink()


def write_info(path: Path, address: str, config: DaemonConfig) -> None:
    """The daemon's info file beside its socket: pid, address, model and options (what
    `remote.running_daemon` compares), protocol, start time; written whole, 0600."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(
            {
                "pid": os.getpid(),
                "address": address,
                "model": config.options.model,
                "options": config.to_dict()["options"],
                "protocol": PROTOCOL_VERSION,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
            file,
        )
    os.replace(temporary, path)
