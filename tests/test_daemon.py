"""The engine daemon: rewrites through it equal in-process rewrites; it queues, cancels, survives bad
peers, times out, and never runs twice for one socket.

Most tests run the daemon in a thread of the test process (fast: the model is loaded once); one runs the
real `python -m specedit.cli.main serve` process, started by two concurrent `ensure_daemon` calls.
Every wait is bounded: sockets have timeouts, threads and processes are joined with timeouts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specedit.cli.serve_command import add_serve_parser, config_from_args, serve_command
from specedit.engine.backends.client import EngineAddress, EngineClient
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.local import LocalBackend, Turns
from specedit.engine.backends.protocol import (
    HANDSHAKE_NONCE_BYTES,
    PROTOCOL_VERSION,
    encode_frame,
    handshake_proof,
    is_handshake_proof,
    recv_payload,
)
from specedit.engine.backends.remote import ensure_daemon
from specedit.engine.doors.daemon import Daemon, serve
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.model.loading import load_model
from specedit.engine.model.prefix_cache import PrefixCache
from specedit.engine.records.errors import ContextLengthError, EngineUnavailableError, InputError
from specedit.engine.records.events import Event, Phase, Step
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest, WarmRequest
from specedit.engine.records.wire import to_wire
from specedit.engine.session.session import Session, remote_session

from conftest import MEMORISED_REWRITES, events_to

ADD, ADD_INSTRUCTION, ADD_ANSWER = MEMORISED_REWRITES[0]
XY, XY_INSTRUCTION, XY_ANSWER = MEMORISED_REWRITES[1]
TIMEOUT = 20.0  # the most any single wait in this file may take
ONE_THREAD = EngineOptions(threads=1)


def memorised(original: str, instruction: str) -> RewriteRequest:
    return RewriteRequest(original=original, instruction=instruction, language="python")


def random_model_request(max_new_tokens: int, instruction: str = "Rename add to plus.") -> RewriteRequest:
    """The tiny random model never finishes: `max_new_tokens` decides how many steps it takes."""
    return RewriteRequest(original=ADD, instruction=instruction, language="python", max_new_tokens=max_new_tokens)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models run many times faster on one thread than on two contended ones (on a 2-core machine under
    load); the daemons here get `threads=1` for the same reason."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def memorising_engine(memorising_model_dir: Path) -> Engine:
    return Engine(load_model(str(memorising_model_dir), dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def random_engine(tiny_model_dir: Path) -> Engine:
    return Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))


@contextlib.contextmanager
def daemon_thread(config: DaemonConfig, engine: Engine | LocalBackend) -> Iterator[Daemon]:
    """`serve` in a thread of this process, serving `engine` (or a backend); stopped (and joined) on exit."""
    backend = engine if isinstance(engine, LocalBackend) else LocalBackend(config.options, engine=engine)
    ready = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(daemon: Daemon) -> None:
        box["daemon"] = daemon
        ready.set()

    def run() -> None:
        try:
            box["status"] = serve(config, backend=backend, on_ready=on_ready)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="test-daemon", daemon=True)
    thread.start()
    assert ready.wait(TIMEOUT) and "daemon" in box, "the daemon did not start"
    try:
        yield box["daemon"]
    finally:
        box["daemon"].stop()
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the daemon did not stop"
    assert box["status"] == 0


# --- raw protocol helpers: what a misbehaving client sends ------------------------------------------


def raw_connect(address: str | Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT)
    sock.connect(str(address))
    return sock


def hello(nonce: bytes | None = None) -> dict[str, Any]:
    """A hello: over a unix socket without a nonce; over TCP with one (the daemon then sends its challenge)."""
    return {"type": "hello", "version": PROTOCOL_VERSION, "nonce": nonce, "client": "test"}


def rewrite_message(request_id: str, request: RewriteRequest) -> dict[str, Any]:
    return {"type": "rewrite", "id": request_id, "request": to_wire(request)}


def receive(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None when the daemon closed the connection."""
    try:
        payload = recv_payload(sock)
    except ConnectionResetError:
        return None
    assert payload is None or isinstance(payload, dict)
    return payload


def event_of(message: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
    """The event an `event` message carries ({} for any other message, or another request's)."""
    if message.get("type") != "event" or (request_id is not None and message.get("id") != request_id):
        return {}
    event: dict[str, Any] = message["event"]
    return event


def ends(message: dict[str, Any], request_id: str | None = None) -> bool:
    """Whether the message ends its request: its `done`, or an error."""
    return event_of(message, request_id).get("type") in ("done", "error")


def receive_until(sock: socket.socket, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        message = receive(sock)
        assert message is not None, f"closed early after {messages}"
        messages.append(message)
        if done(message):
            return messages
    raise AssertionError("timed out")


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(address: str) -> dict[str, Any]:
    with EngineClient.connect(address) as client:
        return client.status()


def recent(address: str, request_id: str) -> dict[str, Any] | None:
    return next((r for r in status_of(address)["recent"] if r["id"] == request_id), None)


# --- through the daemon = in process -----------------------------------------------------------------


def test_rewrite_through_the_daemon_equals_in_process(short_dir: Path, memorising_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    with daemon_thread(config, memorising_engine):
        assert (short_dir / "engine.sock").stat().st_mode & 0o777 == 0o600
        with EngineClient.connect(config.address) as client:
            deltas: list[str] = []
            steps: list[Step] = []
            result = client.rewrite(memorised(ADD, ADD_INSTRUCTION), events_to(text=deltas.append, step=steps.append))
            again = client.rewrite(memorised(XY, XY_INSTRUCTION))  # the connection serves many requests
        local = rewrite(memorising_engine, memorised(ADD, ADD_INSTRUCTION))
        assert result.text == local.text == ADD_ANSWER
        assert result.complete and result.finish_reason == local.finish_reason
        assert "".join(deltas) == result.text
        assert steps and steps[-1].step == result.stats.target_forwards == local.generation.stats.target_forwards
        assert result.stats.generated_tokens == local.generation.stats.generated_tokens
        assert again.text == XY_ANSWER
        info = status_of(config.address)
        assert info["pid"] == os.getpid() and info["state"] == "ready" and info["served"] == {"complete": 2}


class GatedEngine:
    """The engine, paused after the first step of its first request until `gate` is set: makes sure a
    request is still running when the test sends the next one."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.paused = threading.Event()
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, *args: Any, on_step: Callable[[Any], None] | None = None, **kwargs: Any) -> Any:
        def gated(info: Any) -> None:
            if on_step is not None:
                on_step(info)
            if not self.gate.is_set():
                self.paused.set()
                self.gate.wait(TIMEOUT)

        return self._engine.generate(*args, on_step=gated, **kwargs)


class GatedForward:
    """A loaded model whose first forward waits for `gate` (after setting `entered`): holds a warming
    forward open while the test queues a request."""

    def __init__(self, loaded: Any) -> None:
        self._loaded = loaded
        self.entered = threading.Event()
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loaded, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait(TIMEOUT)
        return self._loaded.forward(*args, **kwargs)


def test_a_warmed_document_costs_only_its_request_and_warming_gives_way(short_dir: Path, tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    gated = GatedForward(loaded)
    engine = Engine(gated, prefix_cache=PrefixCache(1 << 28))  # type: ignore[arg-type]
    document = ADD * 30
    request = RewriteRequest(document, "Rename add to plus.", language="python", max_new_tokens=8)
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    with daemon_thread(config, engine), EngineClient.connect(config.address) as client:
        assert client.warm(WarmRequest(document, "python", "file:///add.py"))
        assert gated.entered.wait(TIMEOUT)  # warming's first forward has begun
        assert status_of(config.address)["warming"] == "file:///add.py"
        outcome: dict[str, Any] = {}
        asking = threading.Thread(target=lambda: outcome.update(first=client.rewrite(request)), daemon=True)
        asking.start()
        wait_for(lambda: status_of(config.address)["queue_length"] == 1, "the request to be queued")
        gated.gate.set()  # warming gives way between two layers; the request runs
        asking.join(TIMEOUT)
        assert outcome["first"].stats.reused_tokens == 0  # warming had finished nothing
        done = wait_for(
            lambda: (info := status_of(config.address))["warming"] is None and info["to_warm"] == 0 and info,
            "warming to resume and finish",
        )
        assert done["prefix_cache"]["documents"] == 1
        second = client.rewrite(dataclasses.replace(request, instruction="Make y three."))
    assert second.stats.reused_tokens > 0.9 * second.stats.prompt_tokens
    assert second.stats.prefill_tokens < 0.1 * second.stats.prompt_tokens
    reference = Engine(loaded)
    assert outcome["first"].text == rewrite(reference, request).text
    assert second.text == rewrite(reference, dataclasses.replace(request, instruction="Make y three.")).text


def test_two_clients_at_once_the_second_queued(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    requests = {"first": random_model_request(40), "second": random_model_request(30, "Make y three.")}
    engine = GatedEngine(random_engine)
    results: dict[str, Any] = {}
    phases: dict[str, list[Phase]] = {name: [] for name in requests}

    def client(name: str) -> None:
        with EngineClient.connect(config.address) as client:
            results[name] = client.rewrite(requests[name], events_to(phase=phases[name].append))

    with daemon_thread(config, engine):  # type: ignore[arg-type]
        threads = {name: threading.Thread(target=client, args=(name,), daemon=True) for name in requests}
        threads["first"].start()
        assert engine.paused.wait(TIMEOUT)  # the first request is running, paused after one step
        threads["second"].start()
        wait_for(lambda: phases["second"], "the second request to be queued")
        engine.gate.set()
        for thread in threads.values():
            thread.join(TIMEOUT)
            assert not thread.is_alive()
    # The first ran at once; the second waited behind it. The model was loaded before either came.
    assert phases == {
        "first": [Phase("queued", 0), Phase("started")],
        "second": [Phase("queued", 1), Phase("started")],
    }
    for name, request in requests.items():
        assert results[name].text == rewrite(random_engine, request).text
        assert results[name].stats.generated_tokens == request.max_new_tokens
    assert results["second"].stats.queue_seconds > 0


def test_a_request_that_comes_while_the_model_loads_is_told_so(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    loaded = threading.Event()

    class SlowToLoad(LocalBackend):
        def load(self) -> Engine:
            assert loaded.wait(TIMEOUT)
            self._engine = random_engine
            return random_engine

    phases: list[Phase] = []
    with daemon_thread(config, SlowToLoad(config.options)), EngineClient.connect(config.address) as client:
        thread = threading.Thread(
            target=lambda: client.rewrite(random_model_request(5), events_to(phase=phases.append))
        )
        thread.start()
        wait_for(lambda: phases, "the request to be queued")
        loaded.set()
        thread.join(TIMEOUT)
    assert phases == [Phase("loading", 0), Phase("started")]


def test_stopping_ends_the_running_request_and_refuses_the_queued(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    engine = GatedEngine(random_engine)
    with daemon_thread(config, engine) as daemon:  # type: ignore[arg-type]
        sock = raw_connect(config.address)
        sock.sendall(encode_frame(hello()))
        assert receive(sock)["type"] == "hello_ok"  # type: ignore[index]
        sock.sendall(encode_frame(rewrite_message("running", random_model_request(5000))))
        assert engine.paused.wait(TIMEOUT)
        sock.sendall(encode_frame(rewrite_message("queued", random_model_request(3))))
        receive_until(sock, lambda m: event_of(m, "queued") == {"type": "phase", "name": "queued", "ahead": 1})
        daemon.stop()
        engine.gate.set()
        done = {m["id"]: event_of(m) for m in receive_until(sock, lambda m: ends(m, "running")) if ends(m)}
    assert done["queued"]["type"] == "error" and done["queued"]["code"] == "shutting_down"
    assert done["running"]["type"] == "done" and done["running"]["outcome"]["status"] == "cancelled"


def test_the_queue_is_round_robin_across_clients(short_dir: Path, random_engine: Engine) -> None:
    """A client's second and third requests wait behind another client's first."""
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    engine = GatedEngine(random_engine)
    with daemon_thread(config, engine):  # type: ignore[arg-type]
        busy, other = raw_connect(config.address), raw_connect(config.address)
        for sock in (busy, other):
            sock.sendall(encode_frame(hello()))
            assert receive(sock)["type"] == "hello_ok"  # type: ignore[index]
        busy.sendall(encode_frame(rewrite_message("a1", random_model_request(5000))))
        assert engine.paused.wait(TIMEOUT)  # a1 is running, paused after one step
        for request_id in ("a2", "a3"):
            busy.sendall(encode_frame(rewrite_message(request_id, random_model_request(3))))
        receive_until(busy, lambda m: event_of(m, "a3") == {"type": "phase", "name": "queued", "ahead": 2})
        other.sendall(encode_frame(rewrite_message("b1", random_model_request(3))))
        assert event_of(receive_until(other, lambda m: event_of(m).get("type") == "phase")[-1])["ahead"] == 1
        busy.sendall(encode_frame({"type": "cancel", "id": "a1"}))  # a1 would run for seconds
        engine.gate.set()
        receive_until(busy, lambda m: ends(m, "a3"))
        receive_until(other, ends)
        order = [r["id"] for r in status_of(config.address)["recent"]]
        busy.close()
        other.close()
    assert order == ["a1", "b1", "a2", "a3"]


def test_a_local_backend_runs_rewrites_in_turn_and_tells_each_its_place(random_engine: Engine) -> None:
    """In process (the language server's engine, a cluster replica), as in the daemon: the running rewrite
    first, then the others in the order they came, each told how many are ahead of it; one cancelled while
    it waits leaves the line and moves the others up."""
    engine = GatedEngine(random_engine)
    session = Session(LocalBackend(engine=engine))  # type: ignore[arg-type]
    phases: dict[str, list[Phase]] = {}
    started: list[str] = []
    cancels = {name: threading.Event() for name in ("a", "b", "c", "d")}

    def run(name: str) -> None:
        def on_phase(phase: Phase) -> None:
            phases[name].append(phase)
            if phase.name == "started":
                started.append(name)

        phases[name] = []
        session.run(random_model_request(3), events_to(phase=on_phase), cancel=cancels[name])

    threads = {name: threading.Thread(target=run, args=(name,), daemon=True) for name in cancels}
    threads["a"].start()
    assert engine.paused.wait(TIMEOUT)  # running, held after one step
    for name, ahead in (("b", 1), ("c", 2), ("d", 3)):
        threads[name].start()
        wait_for(lambda name=name, ahead=ahead: Phase("queued", ahead) in phases[name], f"{name} to be queued")
    cancels["b"].set()  # leaves the line: c and d move up
    wait_for(lambda: Phase("queued", 2) in phases["d"], "d to move up")
    engine.gate.set()
    for thread in threads.values():
        thread.join(TIMEOUT)
    assert started == ["a", "c", "d"]
    assert phases["b"] == [Phase("queued", 1)]
    assert phases["c"] == [Phase("queued", 2), Phase("queued", 1), Phase("started")]
    assert phases["d"] == [Phase("queued", 3), Phase("queued", 2), Phase("queued", 1), Phase("started")]


def test_backends_beside_each_other_take_turns_as_one(random_engine: Engine) -> None:
    """A replica's other models share its cores: a rewrite on one waits while the other runs."""
    engine = GatedEngine(random_engine)
    backend = LocalBackend(engine=engine)  # type: ignore[arg-type]
    session, other = Session(backend), Session(backend.beside(engine=random_engine))
    first = threading.Thread(target=session.run, args=(random_model_request(3),), daemon=True)
    first.start()
    assert engine.paused.wait(TIMEOUT)  # running, held after one step
    phases: list[Phase] = []
    second = threading.Thread(
        target=other.run, args=(random_model_request(3), events_to(phase=phases.append)), daemon=True
    )
    second.start()
    wait_for(lambda: Phase("queued", 1) in phases, "the other model's rewrite to be queued")
    assert Phase("started") not in phases
    engine.gate.set()
    for thread in (first, second):
        thread.join(TIMEOUT)
    assert phases == [Phase("queued", 1), Phase("started")]


# --- cancellation --------------------------------------------------------------------------------------


def test_a_client_that_disconnects_mid_stream_is_cancelled_within_a_step(
    short_dir: Path, random_engine: Engine
) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    other_request = random_model_request(20, "Make y three.")
    engine = GatedEngine(random_engine)
    with daemon_thread(config, engine):  # type: ignore[arg-type]
        leaver = raw_connect(config.address)
        leaver.sendall(encode_frame(hello()))
        leaver.sendall(encode_frame(rewrite_message("long", random_model_request(5000))))  # ~2000 steps
        assert engine.paused.wait(TIMEOUT)  # running, paused after one step until the other is queued

        results: dict[str, Any] = {}
        other_queued = threading.Event()

        def other() -> None:
            with EngineClient.connect(config.address) as client:
                results["other"] = client.rewrite(other_request, events_to(phase=lambda _: other_queued.set()))

        thread = threading.Thread(target=other, daemon=True)
        thread.start()
        assert other_queued.wait(TIMEOUT)
        engine.gate.set()
        receive_until(leaver, lambda m: event_of(m).get("type") == "step" and event_of(m)["step"] >= 3)  # freely
        leaver.close()
        entry = wait_for(lambda: recent(config.address, "long"), "the disconnected request to end")
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    assert entry["status"] == "cancelled" and entry["finish_reason"] == "cancelled"
    assert entry["steps_after_cancel"] is not None and entry["steps_after_cancel"] <= 1
    assert entry["steps"] < 1500  # it did not run to its budget
    assert results["other"].text == rewrite(random_engine, other_request).text


def test_cancel_stops_the_engine_within_a_step(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    cancel = threading.Event()

    def on_step(step: Step) -> None:
        if step.step >= 3:
            cancel.set()

    with daemon_thread(config, random_engine), EngineClient.connect(config.address) as client:
        deltas: list[str] = []
        result = client.rewrite(random_model_request(5000), events_to(text=deltas.append, step=on_step), cancel=cancel)
        follow_up = client.rewrite(random_model_request(5))  # the connection is still usable
    assert result.status == "cancelled" and not result.complete
    assert result.stats.steps_after_cancel <= 1 and result.stats.target_forwards < 1500
    assert "".join(deltas) == result.text
    assert follow_up.stats.generated_tokens == 5


# --- bad peers: an error reply or a closed connection, and the daemon serves on -----------------------


@pytest.mark.parametrize(
    ("frame", "code", "stays_open"),
    [
        pytest.param(struct.pack(">I", 3) + b"\xc1\xc1\xc1", "malformed_frame", True, id="not-msgpack"),
        pytest.param(encode_frame([1, 2, 3]), "malformed_frame", True, id="not-a-map"),  # type: ignore[arg-type]
        pytest.param(encode_frame({"type": "launch_missiles"}), "unknown_type", True, id="unknown-type"),
        pytest.param(encode_frame({"type": "cancel", "id": 7}), "bad_message", True, id="mistyped-field"),
        pytest.param(struct.pack(">I", 2**31) + b"x" * 64, "frame_too_large", False, id="oversized"),
    ],
)
def test_bad_frames_get_an_error_and_the_daemon_serves_on(
    short_dir: Path, random_engine: Engine, frame: bytes, code: str, stays_open: bool
) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD, max_frame_size=1 << 20)
    with daemon_thread(config, random_engine):
        # Before the hello: an error, then the connection is closed.
        sock = raw_connect(config.address)
        sock.sendall(frame)
        reply = receive(sock)
        assert reply is not None and reply["type"] == "error" and reply["code"] == code
        assert receive(sock) is None
        sock.close()
        # After the hello: the same error; the connection stays usable unless the frame boundary is lost.
        sock = raw_connect(config.address)
        sock.sendall(encode_frame(hello()))
        assert receive(sock) == {"type": "hello_ok", "version": PROTOCOL_VERSION, "pid": os.getpid()}
        sock.sendall(frame)
        reply = receive(sock)
        assert reply is not None and reply["type"] == "error" and reply["code"] == code
        if stays_open:
            sock.sendall(encode_frame({"type": "status"}))
            reply = receive(sock)
            assert reply is not None and reply["type"] == "status_ok"
        else:
            assert receive(sock) is None
        sock.close()
        # Other clients are served.
        with EngineClient.connect(config.address) as client:
            assert client.rewrite(random_model_request(4)).stats.generated_tokens == 4


def test_a_frame_over_the_limit_is_refused_before_it_is_read(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD, max_frame_size=1 << 20)
    with daemon_thread(config, random_engine), EngineClient.connect(config.address) as client:
        with pytest.raises(EngineUnavailableError, match=r"over the limit|closed the connection|lost"):
            # Each field within the 1 MB input limit, the frame over this daemon's 1 MiB.
            client.rewrite(RewriteRequest(original="x = 1\n" * 150_000, instruction="grow " * 40_000))
        with EngineClient.connect(config.address) as other:
            assert other.status()["state"] == "ready"


def test_bad_requests_get_an_error_and_the_connection_serves_on(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    neither = rewrite_message("r1", random_model_request(3))
    neither["request"]["instruction"] = None
    with daemon_thread(config, random_engine):
        sock = raw_connect(config.address)
        sock.sendall(encode_frame({"type": "status"}))  # before the hello
        assert receive(sock)["code"] == "hello_required"  # type: ignore[index]
        assert receive(sock) is None
        sock = raw_connect(config.address)
        sock.sendall(encode_frame({**hello(), "version": PROTOCOL_VERSION + 1}))
        assert receive(sock)["code"] == "version_mismatch"  # type: ignore[index]
        sock = raw_connect(config.address)
        sock.sendall(encode_frame(hello()))
        receive(sock)
        sock.sendall(encode_frame(neither))
        done = receive(sock)
        assert done is not None and done["id"] == "r1" and event_of(done)["type"] == "error"
        assert event_of(done)["code"] == "bad_request" and "instruction" in event_of(done)["message"]
        sock.sendall(encode_frame(rewrite_message("r2", random_model_request(500))))
        sock.sendall(encode_frame(rewrite_message("r2", random_model_request(3))))
        messages = receive_until(sock, lambda m: m["type"] == "error")
        assert messages[-1]["code"] == "duplicate_id" and messages[-1]["id"] == "r2"
        sock.sendall(encode_frame({"type": "cancel", "id": "no-such-request"}))  # ignored
        done = receive_until(sock, ends)[-1]
        assert done["id"] == "r2" and event_of(done)["outcome"]["stats"]["generated_tokens"] == 500
        sock.close()
        with EngineClient.connect(config.address) as client:  # engine errors arrive as the same exception
            with pytest.raises(ContextLengthError, match="too long for the model"):
                client.rewrite(RewriteRequest(original="x = 1\n" * 2000, instruction="Make y three."))
            assert client.rewrite(random_model_request(3)).stats.generated_tokens == 3


def test_a_model_that_does_not_load_ends_the_daemon(short_dir: Path) -> None:
    config = DaemonConfig(
        socket_path=short_dir / "engine.sock", options=EngineOptions(model=str(short_dir / "no-such-model"))
    )
    assert serve(config) == 6  # ModelLoadError's exit status
    assert not (short_dir / "engine.sock").exists()


def test_tcp_needs_the_right_token(short_dir: Path, random_engine: Engine) -> None:
    """Over TCP both sides prove they hold the token (`protocol`'s handshake), and the token never crosses:
    a client with the wrong one refuses the daemon's proof; a peer that cannot prove it holds the token
    is refused before any request of it runs."""
    token, wrong = "s3cret-token", "s3cret-tokeN"
    token_file = short_dir / "token"
    token_file.write_text(token + "\n")
    (short_dir / "wrong").write_text(wrong + "\n")
    for path in (token_file, short_dir / "wrong"):
        path.chmod(0o600)  # a token others can read is refused
    config = DaemonConfig(host="127.0.0.1", port=0, token_file=token_file, options=ONE_THREAD)
    with daemon_thread(config, random_engine) as daemon:
        assert daemon.address.startswith("tcp://127.0.0.1:")
        host, port = "127.0.0.1", int(daemon.address.rsplit(":", 1)[1])
        with pytest.raises(EngineUnavailableError, match="did not prove it holds the token") as refused:
            EngineClient.connect(daemon.address, token_file=short_dir / "wrong")
        assert refused.value.exit_code == 7

        def wrong_proofs(nonce: bytes, theirs: bytes) -> list[bytes]:
            return [b"", os.urandom(32), handshake_proof(wrong, "client", nonce, theirs)]

        for attempt in range(3):  # a peer without the token answers the challenge: refused, its rewrite not run
            with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
                nonce = os.urandom(HANDSHAKE_NONCE_BYTES)
                sock.sendall(encode_frame(hello(nonce)))
                challenge = receive(sock)
                assert challenge is not None and challenge["type"] == "challenge"
                assert is_handshake_proof(challenge["proof"], token, "server", nonce, challenge["nonce"])
                assert token.encode() not in encode_frame(challenge)  # (only proofs cross, never the token)
                proof = wrong_proofs(nonce, challenge["nonce"])[attempt]
                sock.sendall(encode_frame({"type": "proof", "proof": proof}))
                sock.sendall(encode_frame(rewrite_message("r1", random_model_request(3))))  # sent at once
                reply = receive(sock)
                assert reply is not None and reply["code"] == "unauthorized"
                assert receive(sock) is None
        old_hello = {"type": "hello", "version": 5, "token": token, "client": "specedit 0.1 (protocol 5)"}
        for first_messages in (
            [hello(None)],  # no nonce over TCP
            [hello(b"short")],
            [old_hello],  # told the version, not a missing field
            [{"type": "status"}],
            [{"type": "proof", "proof": os.urandom(32)}],  # a proof without a challenge
            [hello(os.urandom(HANDSHAKE_NONCE_BYTES)), rewrite_message("r2", random_model_request(3))],  # no proof
        ):
            with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
                for message in first_messages:
                    sock.sendall(encode_frame(message))
                replies = []
                while (reply := receive(sock)) is not None:
                    replies.append(reply)
                assert replies and replies[-1]["type"] == "error", replies
                assert replies[-1]["code"] in ("unauthorized", "hello_required", "version_mismatch"), replies
                if first_messages[0] is old_hello:
                    assert replies[-1]["code"] == "version_mismatch"
        with socket.create_connection((host, port), timeout=TIMEOUT) as sock:  # big frames wait for the hello
            sock.sendall(struct.pack(">I", 1 << 20))
            reply = receive(sock)
            assert reply is not None and reply["code"] == "frame_too_large"
        with EngineClient.connect(daemon.address, token_file=token_file) as client:
            assert client.status()["served"] == {}  # none of the refused peers' rewrites ran
            assert client.rewrite(random_model_request(3)).stats.generated_tokens == 3


# --- lifecycle: one daemon per socket, idle timeout, --status and --stop ------------------------------


def test_one_daemon_per_socket_and_stale_sockets_are_replaced(short_dir: Path, random_engine: Engine) -> None:
    path = short_dir / "engine.sock"
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a crashed daemon's socket file
    leftover.bind(str(path))
    leftover.close()
    config = DaemonConfig(socket_path=path, options=ONE_THREAD)
    with daemon_thread(config, random_engine):
        assert serve(config, backend=LocalBackend(engine=random_engine)) == 0  # a second one does not start
        assert status_of(config.address)["pid"] == os.getpid()
        info = json.loads((short_dir / "engine.sock.json").read_text())
        assert info["pid"] == os.getpid() and info["address"] == str(path)
    assert not path.exists() and not (short_dir / "engine.sock.json").exists()


def test_idle_timeout(short_dir: Path, random_engine: Engine) -> None:
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD, idle_timeout=0.6)
    finished = threading.Event()
    backend = LocalBackend(engine=random_engine)
    thread = threading.Thread(target=lambda: (serve(config, backend=backend), finished.set()), daemon=True)
    started = time.monotonic()
    thread.start()
    client = wait_for(lambda: _try_connect(config.address), "the daemon to answer")
    time.sleep(1.5)  # a connected client keeps it alive
    assert not finished.is_set()
    client.close()
    assert finished.wait(TIMEOUT)
    assert time.monotonic() - started >= 2.0
    thread.join(TIMEOUT)
    assert not (short_dir / "engine.sock").exists()


def _try_connect(address: str) -> EngineClient | None:
    try:
        return EngineClient.connect(address)
    except EngineUnavailableError:
        return None


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specedit")
    add_serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_the_config_travels_as_data_and_the_flags_build_it(short_dir: Path) -> None:
    token, sock = short_dir / "token", str(short_dir / "e.sock")
    configs = {
        ("--socket", sock, "--model", str(short_dir), "--dtype", "float32", "--idle-timeout", "30"): (
            DaemonConfig(
                socket_path=short_dir / "e.sock",
                options=EngineOptions(model=str(short_dir), dtype="float32"),
                idle_timeout=30.0,
            )
        ),
        ("--port", "7341", "--token-file", str(token), "--device", "cpu", "--threads", "2"): DaemonConfig(
            host="127.0.0.1", port=7341, token_file=token, options=EngineOptions(device="cpu", threads=2)
        ),
        ("--socket", sock, "--draft-layers", "0-11,20-23", "--p-min", "0.4"): DaemonConfig(
            socket_path=short_dir / "e.sock", options=EngineOptions(draft_layers="0-11,20-23", p_min=0.4)
        ),
        ("--socket", sock, "--draft-model", str(short_dir)): DaemonConfig(
            socket_path=short_dir / "e.sock", options=EngineOptions(draft_model=str(short_dir))
        ),
    }  # fmt: skip
    for flags, config in configs.items():
        assert config_from_args(serve_args(*flags)) == config
        assert DaemonConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config  # what a spawn reads
    with pytest.raises(SystemExit):
        config_from_args(serve_args("--port", "1234"))  # TCP without a token file
    with pytest.raises(SystemExit):
        config_from_args(serve_args("--draft", "copy"))  # the request chooses its draft method, not the daemon
    with pytest.raises(SystemExit):
        config_from_args(serve_args("--draft-model", "m", "--draft-layers", "auto"))  # one fallback at most


def test_real_daemon_process_shared_by_two_starters(
    short_dir: Path, memorising_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `ensure_daemon` calls at once start one `specedit serve` process; --status and --stop."""
    socket_path = short_dir / "engine.sock"
    options = EngineOptions(model=str(memorising_model_dir), dtype="float32", threads=1)
    config = DaemonConfig(socket_path=socket_path, options=options, idle_timeout=60)
    clients: list[EngineClient] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            clients.append(ensure_daemon(config, start_timeout=45))
        except BaseException as error:
            errors.append(error)

    starters = [threading.Thread(target=start, daemon=True) for _ in range(2)]
    try:
        for thread in starters:
            thread.start()
        for thread in starters:
            thread.join(60)
        assert not errors and len(clients) == 2, errors or "ensure_daemon hung"
        pid = clients[0].daemon_pid
        assert pid == clients[1].daemon_pid != os.getpid()
        result = clients[0].rewrite(memorised(ADD, ADD_INSTRUCTION))
        assert result.text == ADD_ANSWER and result.complete
        for client in clients:
            client.close()

        assert serve_command(serve_args("--socket", str(socket_path), "--status")) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["pid"] == pid and info["model"] == str(memorising_model_dir) and info["dtype"] == "float32"
        assert info["served"] == {"complete": 1} and info["idle_timeout"] == 60

        assert serve_command(serve_args("--socket", str(socket_path), "--stop")) == 0
        wait_for(lambda: not _alive(pid), "the daemon process to exit")
        assert not socket_path.exists()
        assert "serving on" in (short_dir / "engine.sock.log").read_text()
    finally:
        for client in clients:
            client.close()
        if clients and _alive(clients[0].daemon_pid):
            os.kill(clients[0].daemon_pid, 9)
    with pytest.raises(EngineUnavailableError):
        serve_command(serve_args("--socket", str(socket_path), "--status"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its starter) is not alive.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"
    return True


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("/run/user/1000/specedit/engine.sock", "/run/user/1000/specedit/engine.sock"),
        ("unix:///tmp/x.sock", "/tmp/x.sock"),
        ("unix:/tmp/x.sock", "/tmp/x.sock"),  # the form the editors' settings document
    ],
)
def test_engine_addresses_name_a_socket(text: str, path: str) -> None:
    assert EngineAddress.parse(text) == EngineAddress(path=Path(path))


@pytest.mark.parametrize("text", ["", "http://host:1", "tcp://host", "tcp://:7341", "tcp://host:99999"])
def test_other_addresses_are_refused(text: str) -> None:
    with pytest.raises(EngineUnavailableError, match="not an engine address"):
        EngineAddress.parse(text)


def test_an_editor_with_documents_open_keeps_the_daemon(short_dir: Path, random_engine: Engine) -> None:
    """`Session.keep_alive` on a daemon: the language server holds a connection while documents are open, so the
    daemon outlives its idle timeout between rewrites; released, the daemon exits. No daemon is started
    for it."""
    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD, idle_timeout=0.6)
    editor = remote_session(str(config.address))
    editor.keep_alive(True)  # nothing answers yet: nothing happens, nothing is started
    assert not (short_dir / "engine.sock").exists()
    finished = threading.Event()
    backend = LocalBackend(engine=random_engine)
    thread = threading.Thread(target=lambda: (serve(config, backend=backend), finished.set()), daemon=True)
    thread.start()
    wait_for(lambda: _try_connect(config.address), "the daemon to answer").close()
    editor.keep_alive(True)
    time.sleep(1.5)  # well past the idle timeout
    assert not finished.is_set()
    editor.keep_alive(False)
    assert finished.wait(TIMEOUT)
    thread.join(TIMEOUT)


def test_the_command_line_uses_a_running_shared_daemon_with_its_engine_flags(
    short_dir: Path, memorising_engine: Engine, memorising_model_dir: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """`specedit rewrite` without --engine: the shared daemon when one runs with the same engine flags (its
    model is loaded: no start-up), else in process (other flags, or `--engine inprocess`); the same answer
    either way, and `--stats` says which engine and when the first text came."""
    from specedit.cli.main import main
    from specedit.engine.backends.remote import running_daemon

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    options = EngineOptions(model=str(memorising_model_dir), threads=1)
    config = DaemonConfig(options=options)
    source, out, stats = tmp_path / "add.py", tmp_path / "out.py", tmp_path / "stats.json"
    source.write_text(ADD)
    flags = ["--model", str(memorising_model_dir), "--threads", "1"]
    command = ["rewrite", str(source), "-i", ADD_INSTRUCTION, *flags, "--no-progress", "-o", str(out), "--stats"]
    assert running_daemon(options) is None  # none runs
    with daemon_thread(config, memorising_engine) as daemon:
        assert running_daemon(options) == config.address
        assert running_daemon(dataclasses.replace(options, p_min=0.25)) is None  # another engine
        assert main([*command, str(stats)]) == 0
        assert out.read_text() == ADD_ANSWER and len(daemon.status_info()["recent"]) == 1
        through_daemon = json.loads(stats.read_text())
        assert through_daemon["engine"] == f"daemon at {config.address}"
        assert through_daemon["first_text_from_start_seconds"] > 0
        out.unlink()
        assert main([*command, str(stats), "--engine", "inprocess"]) == 0
        assert out.read_text() == ADD_ANSWER and len(daemon.status_info()["recent"]) == 1
        assert json.loads(stats.read_text())["engine"] == "inprocess"
    assert running_daemon(options) is None  # stopped: its info file is gone


# --- no request stalls another: outsized ones refused before their turn, long prefills give way ----------


def test_an_outsized_sketch_is_refused_before_its_turn(random_engine: Engine) -> None:
    """A sketch just under the 1 MB limit, far over the tiny model's 2,048 positions: refused at once, while
    another rewrite holds the model, its text never tokenized whole (a fraction of a second)."""
    engine = GatedEngine(random_engine)
    session = Session(LocalBackend(engine=engine))  # type: ignore[arg-type]
    running = threading.Thread(target=session.run, args=(random_model_request(5),), daemon=True)
    running.start()
    assert engine.paused.wait(TIMEOUT)  # the model is busy
    huge = RewriteRequest("x = 1\n", sketch="# ... existing code ...\n" + "y = 2\n" * 160_000, merge="model")
    started = time.monotonic()
    with pytest.raises(ContextLengthError, match=r"the sketch \d+ \(at least"):
        session.run(huge)
    assert time.monotonic() - started < 2.0
    engine.gate.set()
    running.join(TIMEOUT)


def test_a_heavy_sketchs_merge_by_lines_waits_for_the_running_rewrite(random_engine: Engine) -> None:
    """Merging a sketch by its lines into a request of over 100,000 characters takes a share of the CPU
    (0.3-0.8 s for 1 MB) that would slow another client's steps: it takes a turn after the rewrites, told
    it is queued; a short one merges at once, model or not."""
    engine = GatedEngine(random_engine)
    session = Session(LocalBackend(engine=engine))  # type: ignore[arg-type]
    running = threading.Thread(target=session.run, args=(random_model_request(5),), kwargs={"client": "a"})
    running.start()
    assert engine.paused.wait(TIMEOUT)  # the model is busy
    original = "".join(f"value_{n} = {n}\n" for n in range(8_000))
    sketch = "# ... existing code ...\nvalue_2 = 2\nvalue_3 = 333\nvalue_4 = 4\n# ... existing code ...\n"
    short = RewriteRequest(original[:600], sketch=sketch)
    assert session.run(short, client="b").text == original[:600].replace("value_3 = 3\n", "value_3 = 333\n")
    heavy_sketch = "# ... existing code ...\nvalue_4 = 4\nvalue_5 = 55\nvalue_6 = 6\n# ... existing code ...\n"
    heavy = RewriteRequest(original, sketch=heavy_sketch)  # a file of over 100,000 characters
    assert heavy.heavy and not short.heavy
    events: list[Event] = []
    merged: list[str] = []
    waiting = threading.Thread(target=lambda: merged.append(session.run(heavy, events.append, client="b").text))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not merged and Phase("queued", 1) in events
    engine.gate.set()
    waiting.join(TIMEOUT)
    running.join(TIMEOUT)
    assert merged == [original.replace("value_5 = 5\n", "value_5 = 55\n")]


def test_warming_goes_on_after_a_turn_for_other_work(tiny_model_dir: Path) -> None:
    """A document offered while a heavy sketch's merge holds a turn is warmed once the turn ends (warming
    gives way to any turn; whoever held it starts the warmer again)."""
    loaded = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    cache = PrefixCache(1 << 28)
    backend = LocalBackend(engine=Engine(loaded, prefix_cache=cache))  # type: ignore[arg-type]
    offered = WarmRequest(ADD * 30, "python", "file:///add.py")

    def offer_while_holding_the_turn() -> bool:
        taken = backend.warm(offered)
        wait_for(lambda: backend._warmer is None, "the warmer to give way to the turn")
        assert backend.to_warm() == 1 and len(cache) == 0  # offered, not warmed while the turn is held
        return taken

    assert backend.in_turn(offer_while_holding_the_turn, lambda event: None, threading.Event(), "a")
    # The warmer starts as the turn ends: it may have taken the document before this line runs.
    wait_for(lambda: backend.to_warm() == 0 and backend.warming is None, "the offered document to be warmed")
    assert len(cache) == 1


def test_work_other_than_a_rewrite_lets_the_rewrites_that_wait_go_first() -> None:
    """A turn taken for other work (a heavy sketch's merge) goes after every rewrite waiting, whoever asked
    first: the rewrites are what a user waits for."""
    turns = Turns()
    never = threading.Event()
    first = turns.take("a", lambda ahead: None, never)
    assert first is not None
    order: list[str] = []

    def take(name: str, after_rewrites: bool) -> None:
        ticket = turns.take(name, lambda ahead: None, never, after_rewrites=after_rewrites)
        assert ticket is not None
        order.append(name)
        turns.leave(ticket)

    other_work = threading.Thread(target=take, args=("merge", True))
    other_work.start()
    time.sleep(0.1)
    rewrite_after = threading.Thread(target=take, args=("rewrite", False))
    rewrite_after.start()
    time.sleep(0.1)
    turns.leave(first)
    other_work.join(TIMEOUT)
    rewrite_after.join(TIMEOUT)
    assert order == ["rewrite", "merge"]


def test_a_long_prefill_gives_way_to_a_short_rewrite(random_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two parts of a long prompt's prefill, a rewrite that waits takes the model first: it ends
    before the long one writes its first token; and the long one's answer is the same as in one piece."""
    from specedit.engine.loop import generate

    assert random_engine.loaded.row_invariant
    monkeypatch.setattr(generate, "PREFILL_CHUNK", 16)
    long_request = RewriteRequest("value = 1\n" * 150, "Make y three.", max_new_tokens=5)
    alone = rewrite(random_engine, long_request).text
    slow = SlowForward(random_engine.loaded)
    backend = LocalBackend(engine=Engine(slow))  # type: ignore[arg-type]
    session = Session(backend)
    order: list[str] = []
    results: dict[str, Any] = {}

    def long_one() -> None:
        def on_event(event: Any) -> None:
            if isinstance(event, Step) and "long's first step" not in order:
                order.append("long's first step")

        results["long"] = session.run(long_request, on_event, client="a")

    thread = threading.Thread(target=long_one, daemon=True)
    thread.start()
    assert slow.prefilling.wait(TIMEOUT)  # in its prefill, a part at a time
    results["short"] = session.run(random_model_request(3), client="b")
    order.append("short done")
    thread.join(TIMEOUT)
    assert order == ["short done", "long's first step"]
    assert results["long"].text == alone and results["short"].stats.queue_seconds < 2.0


class SlowForward:
    """A loaded model whose prefill forwards (more than one token) take a while: a long prefill to cut in."""

    def __init__(self, loaded: Any) -> None:
        self._loaded = loaded
        self.prefilling = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loaded, name)

    def forward(self, ids: Any, *args: Any, **kwargs: Any) -> Any:
        if len(ids) > 8 and kwargs.get("logits_to_keep") == 1:
            self.prefilling.set()
            time.sleep(0.05)
        return self._loaded.forward(ids, *args, **kwargs)


# --- sketch work: off the event loop, and bounded in its turn ------------------------------------------


def test_a_sketchs_check_does_not_stall_the_socket(
    short_dir: Path, random_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding a long sketch's format takes a while (a diff's): the sketch is read off the event loop (in the
    session's thread, `sketch.Sketch`), and other clients are answered meanwhile."""
    from specedit.engine.sketch import sketch as sketch_module

    checking, checked = threading.Event(), threading.Event()
    detect = sketch_module.detect

    def slow_detect(sketch: str, original: str = "") -> Any:
        checking.set()
        time.sleep(3.0)
        checked.set()
        return detect(sketch, original)

    config = DaemonConfig(socket_path=short_dir / "engine.sock", options=ONE_THREAD)
    wire = to_wire(RewriteRequest(ADD, sketch="def add(a, b):\n    return a - b\n"))
    with daemon_thread(config, random_engine):
        monkeypatch.setattr(sketch_module, "detect", slow_detect)
        sock = raw_connect(config.address)
        sock.sendall(encode_frame(hello()))
        receive(sock)
        sock.sendall(encode_frame({"type": "rewrite", "id": "r1", "request": wire}))
        assert checking.wait(TIMEOUT)
        assert status_of(config.address)["state"] == "ready"
        assert not checked.is_set(), "the daemon waited for the sketch's check"
        assert event_of(receive_until(sock, ends)[-1])["type"] == "done"
        sock.close()


def test_a_heavy_sketchs_merge_is_cut_off_and_its_turn_given_up(
    random_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge by lines that runs far longer than such a merge takes (a case the merge handles badly)
    is stopped at `MERGE_SECONDS`, with a clear error: the next client waits no longer than that. The
    merge's own loops check the deadline (`deadline.Deadline`): here every merge runs over it."""
    from specedit.engine.session import session as session_module

    monkeypatch.setattr(session_module, "MERGE_SECONDS", 0.0)
    session = Session(LocalBackend(engine=random_engine))
    original = "".join(f"value_{n} = {n}\n" for n in range(8_000))
    heavy = RewriteRequest(original, sketch="# ... existing code ...\nvalue_5 = 55\n# ... existing code ...\n")
    assert heavy.heavy
    errors: list[BaseException] = []
    waiting = threading.Thread(target=lambda: errors.append(_raised(lambda: session.run(heavy, client="a"))))
    waiting.start()
    waiting.join(TIMEOUT)
    assert not waiting.is_alive(), "the merge held its turn"
    assert isinstance(errors[0], InputError) and "took over" in str(errors[0])
    wait_for(lambda: not any(t.name == "specedit-merge" for t in threading.enumerate()), "the merge to stop")
    assert session.run(random_model_request(3), client="b").stats.generated_tokens == 3  # the turn is free


def _raised(work: Callable[[], Any]) -> BaseException | None:
    try:
        work()
    except BaseException as error:
        return error
    return None
