"""The cluster's HTTP door without Ray: `EngineReplica` is a plain class that Serve wraps, so the tests
call it as Serve's proxy does, with a Starlette request, and read the response it returns.

Every body that is not the request the door takes gets a 4xx with the door's error shape
(`{"error_code", "error_message"}`), never a 500: not JSON, nested too deep for the parser, the wrong shape,
or too big. The tiny random model is loaded once, so the good path runs too.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the cluster extra: pip install -e '.[cluster]'")

from starlette.requests import Request

from specedit.engine.backends.cluster import MAX_BODY_BYTES, json_object
from specedit.engine.doors.cluster_deploy import EngineReplica
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest, WarmRequest
from specedit.engine.records.wire import ProtocolError, to_wire

TOKEN = "door-test-token-0123456789"
GOOD = to_wire(RewriteRequest(original="def add(a, b):\n    return a + b\n", instruction="Rename.", max_new_tokens=3))
BELOW_ZERO = {**GOOD["sampling"], "temperature": -1}
WARM = to_wire(WarmRequest("def area(r):\n    return 3.14 * r * r\n" * 20, "python", "file:///a.py"))


@pytest.fixture(scope="module")
def replica(tiny_model_dir: Path) -> Iterator[EngineReplica]:
    options = EngineOptions(model=str(tiny_model_dir), dtype="float32", device="cpu", threads=1, prefix_cache_mb=0)
    yield EngineReplica(options, TOKEN)


def call(
    replica: EngineReplica,
    body: bytes,
    *,
    token: str = TOKEN,
    declared: bool = False,
    sent: dict[str, int] | None = None,
    path: str = "/rewrite",
) -> tuple[int, Any]:
    """POST `path` through the replica as Serve's proxy would, the body in 64 KiB pieces (`declared`: with
    its Content-Length): the status, and the JSON error (or, for a 200, the streamed events, or the JSON
    answer). `sent["n"]` counts the pieces the replica asked for."""
    chunk = 1 << 16
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    sent = {"n": 0} if sent is None else sent

    async def receive() -> dict[str, Any]:
        index = sent["n"]
        sent["n"] += 1
        if index >= len(pieces):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": pieces[index], "more_body": index < len(pieces) - 1}

    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")],
    }
    if declared:
        scope["headers"].append((b"content-length", str(len(body)).encode()))

    async def run() -> tuple[int, Any]:
        response = await replica(Request(scope, receive))
        if response.status_code != 200 or not hasattr(response, "body_iterator"):
            return response.status_code, json.loads(response.body)
        events = [json.loads(line) async for line in response.body_iterator]
        return 200, events

    return asyncio.run(run())


def nested(depth: int) -> bytes:
    return b'{"request": ' + b"[" * depth + b"]" * depth + b"}"


def test_the_good_path_streams_the_rewrite(replica: EngineReplica) -> None:
    status, events = call(replica, json.dumps({"request": GOOD}).encode())
    assert status == 200 and events[-1]["type"] == "done"
    assert events[-1]["outcome"]["stats"]["generated_tokens"] == 3


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (nested(200_000), "malformed_frame"),  # deeper than the parser goes: was a raw 500 (RecursionError)
        (b'{"request": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}", "malformed_frame"),
        (b"{not json", "malformed_frame"),
        (b"", "malformed_frame"),
        (b"\xff\xfe\x00garbage", "malformed_frame"),
        (b"[1, 2, 3]", "malformed_frame"),  # JSON, but not an object
        (b'"request"', "malformed_frame"),
        (b"null", "malformed_frame"),
        (b'{"request": NaN}', "malformed_frame"),  # not JSON (Python's parser takes it by default)
        (b'{"request": 1' + b"0" * 5000 + b"}", "malformed_frame"),  # over Python's digits limit: ValueError
        (json.dumps({"request": {**GOOD, "original": "\ud800"}}).encode(), "malformed_frame"),  # not Unicode text
        (b"{}", "bad_message"),  # no request
        (json.dumps({"request": [GOOD]}).encode(), "bad_message"),
        (json.dumps({"request": {**GOOD, "original": 3}}).encode(), "bad_message"),
        (json.dumps({"request": {**GOOD, "sampling": "hot"}}).encode(), "bad_message"),
        (json.dumps({"request": {**GOOD, "sampling": BELOW_ZERO}}).encode(), "bad_request"),
        (json.dumps({"request": {**GOOD, "instruction": None}}).encode(), "bad_request"),
    ],
    ids=lambda value: value if isinstance(value, str) else repr(value[:24]),
)
def test_a_bad_body_of_any_shape_is_a_400_with_an_error_code(replica: EngineReplica, body: bytes, code: str) -> None:
    status, error = call(replica, body)
    assert status == 400, error
    assert set(error) == {"error_code", "error_message"} and error["error_code"] == code, error


@pytest.mark.parametrize("declared", [False, True], ids=["streamed", "content-length"])
def test_a_body_over_the_limit_is_a_413_and_is_not_read_to_its_end(replica: EngineReplica, declared: bool) -> None:
    body = b'{"request": "' + b"x" * (2 * MAX_BODY_BYTES) + b'"}'
    sent = {"n": 0}
    status, error = call(replica, body, declared=declared, sent=sent)
    assert status == 413 and error["error_code"] == "frame_too_large", error
    assert sent["n"] <= (0 if declared else MAX_BODY_BYTES // (1 << 16) + 1)  # read no further than the limit


def test_a_wrong_token_is_a_401_before_the_body_is_looked_at(replica: EngineReplica) -> None:
    status, error = call(replica, nested(200_000), token="not-the-token")
    assert status == 401 and error == {"error_code": "unauthorized", "error_message": "a wrong or missing token"}


def test_json_object_refuses_what_json_loads_would_raise_on() -> None:
    """The one parser of the door's JSON (and of the client's events): a `ProtocolError`, whatever it is."""
    for body in (nested(200_000), b'{"a": Infinity}', b"1" * 5000, b"[]"):
        with pytest.raises(ProtocolError) as caught:
            json_object(body)
        assert caught.value.code == "malformed_frame"
    assert json_object(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


@pytest.fixture(scope="module")
def warming_replica(tiny_model_dir: Path) -> Iterator[EngineReplica]:
    """A replica that keeps prompts (a prefix cache), so that it takes warm-ups."""
    options = EngineOptions(model=str(tiny_model_dir), dtype="float32", device="cpu", threads=1, prefix_cache_mb=16)
    yield EngineReplica(options, TOKEN)


def status_of(replica: EngineReplica) -> dict[str, Any]:
    scope = {"type": "http", "method": "GET", "path": "/status", "raw_path": b"/status", "query_string": b""}
    scope["headers"] = [(b"authorization", f"Bearer {TOKEN}".encode())]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    response = asyncio.run(replica(Request(scope, receive)))
    answer: dict[str, Any] = json.loads(response.body)
    return answer


def test_a_warm_up_is_prefilled_by_the_replica_it_reaches(
    warming_replica: EngineReplica, replica: EngineReplica
) -> None:
    """POST /warm answers at once whether the replica took the document, and its pid; the replica then
    prefills it while idle (its status says what is left). One without a prefix cache takes none."""
    warm = {"request": WARM}
    status, answer = call(warming_replica, json.dumps(warm).encode(), path="/warm")
    assert status == 200 and answer == {"accepted": True, "replica": os.getpid()}
    for _ in range(200):
        if (info := status_of(warming_replica))["to_warm"] == 0 and info["warming"] is None:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"still warming: {info}")
    status, answer = call(replica, json.dumps(warm).encode(), path="/warm")
    assert status == 200 and answer == {"accepted": False, "replica": os.getpid()}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "malformed_frame"),
        (b"{}", 400, "bad_message"),
        (json.dumps({"request": {"document": 3}}).encode(), 400, "bad_message"),
        (json.dumps({"request": {**WARM, "document": "x" * 1_000_001}}).encode(), 400, "bad_request"),
        (b'{"request": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}', 413, "frame_too_large"),
    ],
    ids=["not-json", "no-request", "wrong-shape", "too-long", "too-big"],
)
def test_a_bad_warm_up_is_refused_with_an_error_code(
    warming_replica: EngineReplica, body: bytes, status: int, code: str
) -> None:
    answered, error = call(warming_replica, body, path="/warm")
    assert (answered, error["error_code"]) == (status, code), error
    answered, error = call(
        warming_replica, json.dumps({"request": {"document": "x"}}).encode(), path="/warm", token="no"
    )
    assert (answered, error["error_code"]) == (401, "unauthorized")
