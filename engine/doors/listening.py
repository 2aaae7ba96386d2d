"""Where the daemon listens, made safe: its lock, its socket (bound so that it is never reachable with a
looser mode, a stale one replaced only under the lock, another user's never touched), its TCP port, the
info file beside the socket (`daemon.serve` uses these), and the budget of connections at the network
doors (the TCP port, the HTTP door): a flood of idle peers costs a bounded number of descriptors, and
the owner's unix socket always has some left."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import resource
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path

from specedit.engine.backends.config import LOOPBACK_HOSTS, DaemonConfig, peer_uid
from specedit.engine.backends.protocol import PROTOCOL_VERSION
from specedit.engine.records.errors import EngineUnavailableError

log = logging.getLogger(__name__)

# Descriptors no network door may take: the owner's unix socket, the model's files, the process's own.
DESCRIPTOR_RESERVE = 128
MAX_DOOR_CONNECTIONS = 1024  # the most connections one network door holds at once, whatever the limit
# Connections that have not proven themselves yet (the TCP handshake; an HTTP head with the token): this
# many of one peer, and in all, at one door. Loopback is one peer: a local flood and the owner share it.
UNPROVEN_PER_PEER = 32
UNPROVEN_IN_ALL = 128
PROVE_SECONDS = 10.0  # what a new connection has for its hello (and proof), or an HTTP request for its head


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


def raise_descriptor_limit() -> int:
    """Raise the soft limit of open files to the hard one (systems often start a process at 1,024, with
    a hard limit far above); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        # An infinite hard limit is not a soft limit every system takes (macOS caps it): a high one is.
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def door_connections(descriptors: int) -> int:
    """The most connections each of the two network doors (TCP, HTTP) holds at once: what `descriptors`
    leaves after the reserve, shared between them.

    >>> door_connections(1024), door_connections(1 << 20)
    (448, 1024)
    """
    return max(16, min(MAX_DOOR_CONNECTIONS, (descriptors - DESCRIPTOR_RESERVE) // 2))


class Unproven:
    """A network door's connections that have not proven themselves yet: few. At most `per_peer` of one
    peer and `in_all` in all are held; one more closes the oldest (of that peer, else of all), so that a
    flood of idle connections costs the daemon a bounded number of descriptors, while a client that
    proves itself at once (the owner's) still gets in beside it. Each door closes its own at a deadline
    (`PROVE_SECONDS`). Lives on the event loop's thread.

    >>> closed = []
    >>> door = Unproven(in_all=2, per_peer=2)
    >>> for name in "abc":
    ...     door.admit(name, "127.0.0.1", lambda name=name: closed.append(name))
    >>> closed, len(door)
    (['a'], 2)
    >>> door.proven("b"); door.admit("d", "::1", lambda: closed.append("d")); closed
    ['a']
    """

    def __init__(self, *, in_all: int = UNPROVEN_IN_ALL, per_peer: int = UNPROVEN_PER_PEER) -> None:
        self._in_all, self._per_peer = in_all, per_peer
        self._held: dict[Hashable, tuple[str, Callable[[], None]]] = {}  # oldest first
        self._of_peer: Counter[str] = Counter()
        self.closed = 0  # connections closed to make room, for status

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, key: Hashable, peer: str, close: Callable[[], None]) -> None:
        """Hold a new connection until it proves itself or goes (`proven`); `close` ends it early."""
        if self._of_peer[peer] >= self._per_peer:
            self._close(next(held for held, (of, _) in self._held.items() if of == peer))
        elif len(self._held) >= self._in_all:
            self._close(next(iter(self._held)))
        self._held[key] = (peer, close)
        self._of_peer[peer] += 1

    def make_room(self) -> bool:
        """Close the oldest connection held, for a door at its limit; False when none is held."""
        if not self._held:
            return False
        self._close(next(iter(self._held)))
        return True

    def proven(self, key: Hashable) -> None:
        """The connection proved itself, or went: no longer held (nothing happens to an unknown one)."""
        held = self._held.pop(key, None)
        if held is not None:
            self._of_peer[held[0]] -= 1
            if not self._of_peer[held[0]]:
                del self._of_peer[held[0]]

    def _close(self, key: Hashable) -> None:
        close = self._held[key][1]
        self.proven(key)
        self.closed += 1
        close()
