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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from specedit.engine.http.openai import DEFAULT_TEMPERATURE
from specedit.engine.loop.completion import prompt_text
from specedit.engine.loop.generate import Engine
from specedit.engine.loop.rewrite import rewrite
from specedit.engine.model.loading import load_model
from specedit.engine.requests import ChatMessage, CompletionRequest, RewriteRequest
from specedit.engine.serving.client import EngineClient
from specedit.engine.serving.config import DaemonConfig
from specedit.engine.serving.daemon import Daemon, serve
from specedit.engine.serving.local import LocalBackend

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
def http_daemon(engine: Engine, token_file: Path, folder: Path) -> Iterator[Daemon]:
    """A daemon on a unix socket with the HTTP door on a free port, serving `engine`."""
    config = DaemonConfig(socket_path=folder / "engine.sock", http="127.0.0.1:0", token_file=token_file)
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
