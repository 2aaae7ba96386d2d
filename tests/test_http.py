"""The HTTP door (OpenAI's API) through a client no one here wrote: the `openai` package, against a real
daemon (`specedit serve --http`) in a thread of this process, serving tiny models.

The answer is the model's alone, whatever the prediction says: compared token for token with plain
decoding of the same prompt. The prediction drives the copy drafter (its accepted tokens in the usage).
The apply model merges a sketch as `specedit rewrite --sketch` does, and refuses what is no merge.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specedit.engine.backends.client import EngineClient
from specedit.engine.backends.config import DaemonConfig
from specedit.engine.backends.local import LocalBackend
from specedit.engine.doors.daemon import Daemon, serve
from specedit.engine.doors.http.openai import DEFAULT_TEMPERATURE
from specedit.engine.loop.completion import prompt_text
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.model.loading import load_model
from specedit.engine.records.requests import ChatMessage, CompletionRequest, RewriteRequest
from specedit.engine.sketch import sketch as sketch_module

from conftest import ECHOED_SKETCH, LINES_SKETCH

openai = pytest.importorskip("openai", reason="the dev extra: pip install -e '.[dev]' (scripts/setup.sh does)")

TOKEN = "http-test-token-0123456789abcdef"
TIMEOUT = 60.0
ORIGINAL = "def add(a, b):\n    return a + b\n"
MESSAGES = [
    {"role": "system", "content": "You edit code."},
    {"role": "user", "content": f"Rename add to plus.\n\n{ORIGINAL}"},
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "engine.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def http_daemon(engine: Engine, token_file: Path, folder: Path, **config_fields: Any) -> Iterator[Daemon]:
    """A daemon on a unix socket with the HTTP door on a free port, serving `engine`."""
    config = DaemonConfig(
        socket_path=folder / "engine.sock", http="127.0.0.1:0", token_file=token_file, **config_fields
    )
    ready = threading.Event()
    box: dict[str, Any] = {}

    def on_ready(daemon: Daemon) -> None:
        box["daemon"] = daemon
        ready.set()

    thread = threading.Thread(
        target=lambda: box.update(status=serve(config, backend=LocalBackend(engine=engine), on_ready=on_ready)),
        daemon=True,
    )
    thread.start()
    assert ready.wait(TIMEOUT) and box["daemon"].http_address, "the daemon did not start"
    try:
        yield box["daemon"]
    finally:
        box["daemon"].stop()
        thread.join(TIMEOUT)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def random_engine(tiny_model_dir: Path) -> Engine:
    return Engine(load_model(str(tiny_model_dir), dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def door(random_engine: Engine, token_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with http_daemon(random_engine, token_file, Path(tmp_path_factory.mktemp("sd", numbered=True))) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def client(door: Daemon) -> Any:
    return openai.OpenAI(base_url=f"{door.http_address}/v1", api_key=TOKEN, max_retries=0, timeout=TIMEOUT)


def plain(engine: Engine, messages: list[dict[str, str]], tokens: int) -> str:
    """What the model alone writes for these messages: plain decoding, no drafter."""
    request = CompletionRequest(messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages))  # type: ignore[arg-type]
    ids = engine.tokenize(prompt_text(engine.tokenizer, request))
    return engine.generate(ids, max_new_tokens=tokens).text


def test_the_models_are_listed(client: Any) -> None:
    ids = [model.id for model in client.models.list()]
    assert "specedit" in ids and "specedit-apply" in ids


def test_a_prediction_is_verified_not_written(client: Any, random_engine: Engine) -> None:
    """The answer is plain decoding's, token for token, with no prediction, a wrong one, or the answer
    itself; the right one is taken (the copy drafter drafts it)."""
    expected = plain(random_engine, MESSAGES, 40)
    answers = {}
    for name, prediction in (("none", None), ("wrong", "x = 1\n" * 20), ("right", expected)):
        extra = {"prediction": {"type": "content", "content": prediction}} if prediction is not None else {}
        answers[name] = client.chat.completions.create(
            model="specedit", messages=MESSAGES, max_tokens=40, temperature=0, **extra
        )
    for answer in answers.values():
        assert answer.choices[0].message.content == expected
        assert answer.choices[0].finish_reason == "length"  # this model never ends an answer
    usage = answers["right"].usage
    assert usage.prompt_tokens > 10 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # A random model's answer is not the tokens its text tokenizes into, so even the answer itself is a
    # partial prediction here (the real model's figures: the slow tier and the README); but it is taken
    # far more often than a wrong one, and the rejected tokens count in the completion, as OpenAI counts.
    right, wrong = (answers[name].usage.completion_tokens_details for name in ("right", "wrong"))
    assert right.accepted_prediction_tokens > max(2, wrong.accepted_prediction_tokens)
    assert usage.completion_tokens == 40 + right.rejected_prediction_tokens
    assert answers["none"].usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_streaming_gives_the_same_answer_and_the_usage_last(client: Any, random_engine: Engine) -> None:
    expected = plain(random_engine, MESSAGES, 30)
    chunks = list(
        client.chat.completions.create(
            model="specedit",
            messages=MESSAGES,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            prediction={"type": "content", "content": expected},
        )
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"


def test_a_raw_completion_and_a_stop_string(client: Any, random_engine: Engine) -> None:
    prompt = "def add(a, b):\n"
    expected = random_engine.generate(random_engine.tokenize(prompt), max_new_tokens=25).text
    answer = client.completions.create(model="specedit", prompt=prompt, max_tokens=25, temperature=0)
    assert answer.choices[0].text == expected
    stop = expected[5:8]  # a stop string that turns up in the answer: the text ends before it
    cut = client.completions.create(model="specedit", prompt=prompt, max_tokens=25, temperature=0, stop=[stop])
    assert cut.choices[0].text == expected[: expected.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_sampling_with_a_seed_is_the_same_with_and_without_a_prediction(client: Any) -> None:
    """Draws are keyed by seed and position: a prediction changes the speed, never the sample."""
    asked = {"model": "specedit", "messages": MESSAGES, "max_tokens": 30, "temperature": 0.8, "seed": 7}
    alone = client.chat.completions.create(**asked).choices[0].message.content
    predicted = client.chat.completions.create(**asked, prediction={"type": "content", "content": alone})
    assert predicted.choices[0].message.content == alone
    assert DEFAULT_TEMPERATURE == 1.0  # OpenAI's: a client that says nothing samples


def test_the_daemons_unix_socket_still_serves_its_own_user_without_the_token(
    door: Daemon, random_engine: Engine
) -> None:
    """The token file given for the HTTP door does not lock the editors out of the daemon's socket."""
    assert door.config.socket_path is not None
    request = RewriteRequest("x = 1\n", "Rename x.", max_new_tokens=3)
    with EngineClient.connect(door.config.socket_path) as engine_client:
        assert engine_client.daemon_pid == os.getpid()
        assert engine_client.rewrite(request).text == rewrite(random_engine, request).text


def test_a_wrong_key_is_refused_and_nothing_runs(door: Daemon) -> None:
    wrong = openai.OpenAI(base_url=f"{door.http_address}/v1", api_key="not-the-token", max_retries=0)
    served = door.status_info()["served"]
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="specedit", messages=MESSAGES, max_tokens=5)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert door.status_info()["served"] == served


def test_what_the_door_does_not_do_is_refused_by_name(client: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="`n` = 2"):
        client.chat.completions.create(model="specedit", messages=MESSAGES, max_tokens=5, n=2)
    with pytest.raises(openai.BadRequestError, match="`tools`"):
        client.chat.completions.create(
            model="specedit",
            messages=MESSAGES,
            max_tokens=5,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        )
    with pytest.raises(openai.NotFoundError, match="no model 'gpt-4o'"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
    # The defaults clients send cost nothing: accepted.
    client.chat.completions.create(
        model="specedit", messages=MESSAGES, max_tokens=3, n=1, presence_penalty=0, user="me", temperature=0
    )


def test_requests_over_the_limits_never_reach_the_model(door: Daemon) -> None:
    served = dict(door.status_info()["served"])
    host, port = door.http_address.removeprefix("http://").rsplit(":", 1)  # type: ignore[union-attr]
    huge = {"model": "specedit", "messages": [{"role": "user", "content": "x" * 1_200_000}], "max_tokens": 1}
    for body, status in ((json.dumps(huge).encode(), 400), (b"{" + b" " * (5 << 20) + b"}", 413)):
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        connection.request("POST", "/v1/chat/completions", body, headers)
        response = connection.getresponse()
        assert response.status == status
        assert json.loads(response.read())["error"]["code"] in ("request_too_large", "invalid_value")
        connection.close()
    assert door.status_info()["served"] == served


def test_a_client_that_hangs_up_is_cancelled_within_a_step(door: Daemon) -> None:
    host, port = door.http_address.removeprefix("http://").rsplit(":", 1)  # type: ignore[union-attr]
    body = {"model": "specedit", "messages": MESSAGES, "max_tokens": 1500, "temperature": 0, "stream": True}
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {TOKEN}"})
    response = connection.getresponse()
    chunks = 0
    while chunks < 2:  # a few chunks: it streams
        line = response.readline()
        assert line and line != b"data: [DONE]\n", "the stream ended before the client hung up"
        chunks += line.startswith(b"data: ")
    connection.close()  # hang up
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        status = _door_status(host, int(port))
        if status["running"] == 0 and status["cancelled"] >= 1:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the engine did not stop: {status}")


def _door_status(host: str, port: int) -> dict[str, Any]:
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    connection.request("GET", "/status", headers={"Authorization": f"Bearer {TOKEN}"})
    status: dict[str, Any] = json.loads(connection.getresponse().read())
    connection.close()
    return status


# --- the apply model ---------------------------------------------------------------------------------


def apply_message(code: str, update: str) -> list[dict[str, str]]:
    said = f"<instruction>Apply the edit.</instruction>\n<code>{code}</code>\n<update>{update}</update>"
    return [{"role": "user", "content": said}]


def test_the_apply_model_merges_a_sketch_by_its_lines(client: Any) -> None:
    original, sketch, merged = LINES_SKETCH
    answer = client.chat.completions.create(model="specedit-apply", messages=apply_message(original, sketch))
    assert answer.choices[0].message.content == merged and answer.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="specedit-apply", messages=apply_message(original, sketch), stream=True)
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == merged


def test_the_apply_model_refuses_what_is_no_merge(memorising_model_dir: Path, token_file: Path, tmp_path: Path) -> None:
    """The model echoes this sketch, elision markers and all: never sent as the file (an OpenAI error)."""
    engine = Engine(load_model(str(memorising_model_dir), dtype="float32", device="cpu"))
    with http_daemon(engine, token_file, tmp_path) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.http_address}/v1", api_key=TOKEN, max_retries=0)
        original, sketch, _ = ECHOED_SKETCH
        with pytest.raises(openai.UnprocessableEntityError, match="not a merge of the edit sketch"):
            client.chat.completions.create(model="specedit-apply", messages=apply_message(original, sketch))
        with pytest.raises(openai.BadRequestError, match="<code>"):
            client.chat.completions.create(model="specedit-apply", messages=[{"role": "user", "content": "hi"}])


# --- the door's budget: idle, slow and oversized peers cost little, and the owner is served ----------------


def address_of(daemon: Daemon) -> tuple[str, int]:
    host, port = daemon.http_address.removeprefix("http://").rsplit(":", 1)  # type: ignore[union-attr]
    return host, int(port)


def ask(
    daemon: Daemon, method: str, path: str, body: Any = None, *, token: str | None = TOKEN
) -> tuple[http.client.HTTPResponse, dict[str, Any]]:
    """One request on a connection of its own: the response (read) and its JSON body."""
    connection = http.client.HTTPConnection(*address_of(daemon), timeout=TIMEOUT)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    connection.request(method, path, json.dumps(body) if body is not None else None, headers)
    response = connection.getresponse()
    answer = json.loads(response.read() or b"{}")
    connection.close()
    return response, answer


def closed_by_the_door(peers: list[socket.socket]) -> int:
    """How many of these connections the other side has closed (nothing sent on them)."""
    closed = 0
    for peer in peers:
        peer.setblocking(False)
        try:
            closed += peer.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:  # reset
            closed += 1
    return closed


def test_idle_connections_without_the_token_are_few_and_the_owner_is_served(door: Daemon) -> None:
    """1,100 connections that send nothing: the door holds few of them (the oldest are closed to make
    room), and the owner's requests, through HTTP and the socket, are answered beside them."""
    idle = [socket.create_connection(address_of(door), timeout=TIMEOUT) for _ in range(1100)]
    try:
        started = time.monotonic()
        response, answer = ask(
            door, "POST", "/v1/chat/completions", {"model": "specedit", "messages": MESSAGES, "max_tokens": 3}
        )
        assert response.status == 200 and answer["choices"][0]["finish_reason"] == "length"
        assert door.config.socket_path is not None
        with EngineClient.connect(door.config.socket_path) as engine_client:
            assert engine_client.rewrite(RewriteRequest("x = 1\n", "Rename x.", max_new_tokens=3)).complete is False
        assert time.monotonic() - started < 10.0  # seconds at most, under any load: no 15 s time-out waited
        deadline = time.monotonic() + 10  # the door may be accepting the last ones still
        while closed_by_the_door(idle) < 1000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert closed_by_the_door(idle) >= 1000
    finally:
        for peer in idle:
            peer.close()


@pytest.mark.parametrize("where", ["url", "header"])
def test_a_huge_head_is_refused_after_a_bounded_read(door: Daemon, where: str) -> None:
    """A 20 MB URL or header line without the token: the door stops reading it after a bounded part
    (h11's head limit), so the client cannot send it whole; the door serves on."""
    head = (
        b"GET /v1/models?" + b"x" * (20 << 20)
        if where == "url"
        else b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"x" * (20 << 20)
    )
    peer = socket.create_connection(address_of(door), timeout=5.0)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    sent = 0
    try:
        while sent < len(head):
            sent += peer.send(head[sent : sent + (1 << 16)])
    except OSError:  # a broken pipe, a reset, or nothing read any more (time-out)
        pass
    finally:
        peer.close()
    assert sent < len(head) // 2  # what the kernel's buffers take, at most: the door stops reading
    assert ask(door, "GET", "/v1/models")[0].status == 200


def test_a_slow_head_is_dropped_at_its_deadline(
    random_engine: Engine, token_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head sent a byte at a time is dropped once its deadline passes (and a silent connection too)."""
    monkeypatch.setattr("specedit.engine.doors.http.server.HEAD_SECONDS", 1.0)
    with http_daemon(random_engine, token_file, tmp_path) as daemon:
        silent = socket.create_connection(address_of(daemon), timeout=TIMEOUT)
        slow = socket.create_connection(address_of(daemon), timeout=TIMEOUT)
        started = time.monotonic()
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"y" * 1000
        try:
            for byte in head:
                slow.send(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - started > 15:
                    break
        except OSError:
            pass
        assert time.monotonic() - started < 15, "the slow head was read on and on"
        assert closed_by_the_door([silent]) == 1
        silent.close()
        slow.close()


def test_a_request_without_the_token_closes_its_connection(door: Daemon) -> None:
    """Unproven connections are short-lived: a request without the token is answered, then closed."""
    for token in (None, "not-the-token"):
        response, answer = ask(door, "GET", "/v1/models", token=token)
        assert response.status == 401 and response.will_close and answer["error"]["code"] == "invalid_api_key"
    response, _ = ask(door, "GET", "/v1/models")
    assert response.status == 200 and not response.will_close  # the owner's connection is kept


def test_unknown_paths_and_methods_get_the_doors_error_shapes(door: Daemon) -> None:
    response, answer = ask(door, "GET", "/v1/no-such-thing")
    assert response.status == 404
    assert answer["error"]["type"] == "invalid_request_error" and "/v1/no-such-thing" in answer["error"]["message"]
    response, answer = ask(door, "DELETE", "/v1/chat/completions")
    assert (
        response.status == 405
        and answer["error"]["code"] == "unknown_url"
        and "POST" in response.getheader("allow", "")
    )
    response, answer = ask(door, "GET", "/rewrite")  # the cluster's own route: its own shape
    assert response.status == 405 and answer["error_code"] == "unknown_type"
    with pytest.raises(openai.NotFoundError, match="Invalid URL"):
        openai.OpenAI(base_url=f"{door.http_address}/v2", api_key=TOKEN, max_retries=0).models.list()


def test_a_body_over_the_limit_gets_a_413_the_client_reads(door: Daemon) -> None:
    """A body far over 4 MiB, sent whole by a client that reads only then and asks to close the connection
    after the answer (as `urllib` does): a 413 in OpenAI's shape, not a reset."""
    for size in (5 << 20, 20 << 20):
        body = b'{"model": "specedit", "messages": [], "x": "' + b"y" * size + b'"}'
        connection = http.client.HTTPConnection(*address_of(door), timeout=TIMEOUT)
        headers = {"Authorization": f"Bearer {TOKEN}", "Connection": "close"}
        connection.request("POST", "/v1/chat/completions", body, headers)
        response = connection.getresponse()
        assert response.status == 413 and json.loads(response.read())["error"]["code"] == "request_too_large"
        connection.close()


def test_each_connection_takes_its_turns_as_a_client_of_its_own(door: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fair turns are kept per client; every OpenAI client sends the same key (the token), so each
    connection is a client, as each of the socket's is: one busy program does not take the others' turns."""
    backend = door._backend
    clients: list[str] = []
    run = backend.run
    monkeypatch.setattr(
        backend,
        "run",
        lambda request, emit, cancel, client, sketch=None: (
            clients.append(client),
            run(request, emit, cancel, client, sketch),
        )[1],
    )
    body = json.dumps({"model": "specedit", "messages": MESSAGES, "max_tokens": 2})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    first, second = (http.client.HTTPConnection(*address_of(door), timeout=TIMEOUT) for _ in range(2))
    for connection in (first, first, second):
        connection.request("POST", "/v1/chat/completions", body, headers)
        assert connection.getresponse().read()
    first.close()
    second.close()
    assert clients[0] == clients[1] != clients[2]


def test_requests_through_http_keep_an_idle_timed_daemon_alive(
    random_engine: Engine, token_file: Path, tmp_path: Path
) -> None:
    with http_daemon(random_engine, token_file, tmp_path, idle_timeout=2.0) as daemon:
        started = time.monotonic()
        while time.monotonic() - started < 5.0:  # well past the idle timeout
            assert ask(daemon, "GET", "/v1/models")[0].status == 200, "the daemon stopped while used"
            time.sleep(0.25)
        # Unused, it goes (the idle timeout counted from the last request).
        deadline = time.monotonic() + TIMEOUT
        while daemon.status_info()["state"] != "stopping" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemon.status_info()["state"] == "stopping"


# --- the same limits as at the socket, refused before the turn -----------------------------------------


@contextlib.contextmanager
def model_held(daemon: Daemon) -> Iterator[None]:
    """The engine's turn held by other work (as by a long rewrite) until the block ends."""
    released, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        released.wait(TIMEOUT)

    holder = threading.Thread(
        target=daemon._backend.in_turn, args=(hold, lambda event: None, threading.Event(), "holder"), daemon=True
    )
    holder.start()
    assert holding.wait(TIMEOUT)
    try:
        yield
    finally:
        released.set()
        holder.join(TIMEOUT)


def test_a_prediction_longer_than_the_context_is_refused_before_the_turn(door: Daemon) -> None:
    """A 0.99 MB prediction (far over the tiny model's 2,048 positions) is refused at once while another
    request holds the model: never tokenized whole in a turn the others wait for."""
    prediction = "".join(f"value_{n} = {n * 7919 % 10007}\n" for n in range(60_000))[:990_000]
    asked = {
        "model": "specedit",
        "messages": MESSAGES,
        "max_tokens": 3,
        "prediction": {"type": "content", "content": prediction},
    }
    with model_held(door):
        response, answer = ask(door, "POST", "/v1/chat/completions", asked)
    assert response.status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert "prediction" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop", ["x" * 990_000]),
        ("seed", 2**70),
        ("messages", [{"role": "user", "content": "x"}] * 3000),
        ("model", "m" * 10_000),
    ],
    ids=["long-stop", "huge-seed", "many-messages", "long-model"],
)
def test_every_field_is_bounded_and_refused_before_the_turn(door: Daemon, field: str, value: Any) -> None:
    served = dict(door.status_info()["served"])
    asked = {"model": "specedit", "messages": MESSAGES, "max_tokens": 3, field: value}
    with model_held(door):
        response, answer = ask(door, "POST", "/v1/chat/completions", asked)
    assert response.status == 400 and answer["error"]["param"] == field
    assert door.status_info()["served"] == served


def test_a_sketchs_check_does_not_stall_the_event_loop(door: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding a long sketch's format takes a while (a diff's); meanwhile both doors answer."""
    checking, checked = threading.Event(), threading.Event()
    detect = sketch_module.detect  # the session reads the sketch on its own thread (`sketch.Sketch`)

    def slow_detect(sketch: str, original: str = "") -> Any:
        checking.set()
        time.sleep(3.0)
        checked.set()
        return detect(sketch, original)

    monkeypatch.setattr(sketch_module, "detect", slow_detect)
    original, sketch, _ = LINES_SKETCH
    asked = {"model": "specedit-apply", "messages": apply_message(original, sketch)}
    applying = threading.Thread(target=ask, args=(door, "POST", "/v1/chat/completions", asked), daemon=True)
    applying.start()
    assert checking.wait(TIMEOUT)
    assert ask(door, "GET", "/v1/models")[0].status == 200
    assert door.config.socket_path is not None
    with EngineClient.connect(door.config.socket_path) as engine_client:
        assert engine_client.status()["state"] == "ready"
    assert not checked.is_set(), "the doors waited for the sketch's check"
    applying.join(TIMEOUT)
