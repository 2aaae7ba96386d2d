"""The engine on a real local Ray cluster (Ray Serve), with tiny models: `backends.cluster` end to end.

One cluster for the module (`ray.init(num_cpus=2)`), the engine deployed on it as `specedit cluster
deploy` does it (`deploy`), with two replicas of the tiny random model, over HTTPS with a self-signed
certificate the clients trust through `SSL_CERT_FILE`; clients are sessions on `ClusterBackend`s, as the command
line and the language server use them (`--engine https://HOST:PORT`).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specedit.engine.records.errors import EngineUnavailableError, InputError
from specedit.engine.records.events import Phase, Step
from specedit.engine.records.options import EngineOptions
from specedit.engine.records.requests import RewriteRequest
from specedit.engine.records.wire import to_wire
from specedit.engine.session.session import Session, local_session, remote_session

ray = pytest.importorskip("ray", reason="the cluster extra: pip install -e '.[cluster]' (scripts/setup.sh does)")
serve = pytest.importorskip("ray.serve")

from specedit.engine.backends.cluster import ClusterBackend  # noqa: E402
from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy  # noqa: E402

from conftest import events_to  # noqa: E402

TOKEN = "cluster-test-token-0123456789"
ORIGINAL = "def add(a, b):\n    return a + b\n"


def request(max_new_tokens: int) -> RewriteRequest:
    """The tiny random model never finishes: `max_new_tokens` decides how long it runs."""
    return RewriteRequest(
        original=ORIGINAL, instruction="Rename add to plus.", language="python", max_new_tokens=max_new_tokens
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def options(tiny_model_dir: Path) -> EngineOptions:
    return EngineOptions(model=str(tiny_model_dir), dtype="float32", device="cpu", threads=1, prefix_cache_mb=0)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        [*openssl, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def cluster(options: EngineOptions, certificate: tuple[Path, Path]) -> Iterator[str]:
    """The engine on a local Ray cluster, two replicas, HTTPS; its address (clients trust the certificate)."""
    cert, key = certificate
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    trusted = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(cert)
    try:
        config = ClusterConfig(options, TOKEN, min_replicas=2, max_replicas=2, port=free_port(), cpus_per_replica=0.5)
        config = ClusterConfig(**{**config.__dict__, "tls_cert": str(cert), "tls_key": str(key)})
        address = deploy(config)
        assert address.startswith("https://127.0.0.1:")
        yield address
    finally:
        serve.shutdown()
        ray.shutdown()
        if trusted is None:
            os.environ.pop("SSL_CERT_FILE", None)
        else:
            os.environ["SSL_CERT_FILE"] = trusted


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "team.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def stream(address: str, body: bytes, token: str = TOKEN) -> tuple[int, list[dict[str, Any]]]:
    """A raw request to /rewrite: the status, and the events (or the error) it answered."""
    host, port = address.removeprefix("https://").split(":")
    connection = http.client.HTTPSConnection(host, int(port), timeout=60, context=ssl.create_default_context())
    try:
        connection.request("POST", "/rewrite", body, {"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, [json.loads(line) for line in response.read().splitlines()]
    finally:
        connection.close()


def test_a_rewrite_through_the_cluster_is_the_in_process_one(
    cluster: str, token_file: Path, options: EngineOptions
) -> None:
    session = remote_session(cluster, token_file=str(token_file))
    assert isinstance(session.backend, ClusterBackend)
    pieces: list[str] = []
    steps: list[Step] = []
    phases: list[Phase] = []
    outcome = session.run(request(40), events_to(text=pieces.append, step=steps.append, phase=phases.append))
    local = local_session(options).run(request(40))
    assert outcome.text == local.text and outcome.status == local.status == "incomplete"
    assert "".join(pieces) == outcome.text and steps and steps[-1].generated_tokens == 40
    assert Phase("started") in phases


def test_concurrent_clients_each_get_their_answer_and_both_replicas_serve(cluster: str, options: EngineOptions) -> None:
    budgets = [12, 16, 20, 24, 28, 32]
    expected = {budget: local_session(options).run(request(budget)).text for budget in budgets}
    answers: dict[int, dict[str, Any]] = {}

    def client(budget: int) -> None:
        status, events = stream(cluster, json.dumps({"request": to_wire(request(budget))}).encode())
        assert status == 200
        answers[budget] = events[-1]

    threads = [threading.Thread(target=client, args=(budget,), daemon=True) for budget in budgets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(answers) == budgets
    assert {budget: done["outcome"]["text"] for budget, done in answers.items()} == expected
    assert len({done["outcome"]["stats"]["replica"] for done in answers.values()}) == 2  # the load was spread


def test_a_wrong_or_missing_token_is_refused_and_nothing_runs(cluster: str, tmp_path: Path) -> None:
    body = json.dumps({"request": to_wire(request(8))}).encode()
    status, events = stream(cluster, body, token="not-the-token")
    assert status == 401 and events == [{"error_code": "unauthorized", "error_message": "a wrong or missing token"}]
    wrong = tmp_path / "wrong.token"
    wrong.write_text("guess\n")
    wrong.chmod(0o600)
    with pytest.raises(EngineUnavailableError, match="token"):
        Session(ClusterBackend(cluster, token_file=wrong)).run(request(8))
    with pytest.raises(EngineUnavailableError, match="token file"):
        ClusterBackend(cluster)


def test_a_malformed_request_is_a_clear_error(cluster: str, token_file: Path) -> None:
    status, events = stream(cluster, b"{not json")
    assert status == 400 and events[0]["error_code"] == "malformed_frame"
    status, events = stream(cluster, json.dumps({"request": {"original": 3}}).encode())
    assert status == 400 and events[0]["error_code"] == "bad_message"
    bad = {**to_wire(request(8)), "instruction": None}  # neither an instruction nor a sketch
    status, events = stream(cluster, json.dumps({"request": bad}).encode())
    assert status == 400 and events[0]["error_code"] == "bad_request"
    with pytest.raises(InputError):
        backend = ClusterBackend(cluster, token_file=token_file)
        backend._send(backend._connect(), "POST", "/rewrite", {"request": bad})


def test_a_client_that_hangs_up_stops_the_engine(cluster: str, token_file: Path) -> None:
    session = Session(ClusterBackend(cluster, token_file=token_file))
    cancel = threading.Event()
    steps: list[Step] = []

    def on_step(info: Step) -> None:
        steps.append(info)
        if len(steps) == 3:
            cancel.set()

    outcome = session.run(request(1500), events_to(step=on_step), cancel=cancel)
    assert outcome.status == "cancelled" and len(steps) >= 3
    # The replica saw its client go: its engine stopped the rewrite (status "cancelled", not run to the
    # end of its budget), and it runs nothing now. Serve routes each status call to either replica.
    for _ in range(200):
        replicas = {info["pid"]: info for info in (session.backend.status() for _ in range(4))}
        if any(info["cancelled"] == 1 and info["running"] == 0 for info in replicas.values()):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no replica stopped the rewrite: {replicas}")
    assert all(answer.status == "incomplete" for answer in (session.run(request(8)) for _ in range(4)))


def test_plain_http_to_the_https_engine_is_a_clear_error(cluster: str, token_file: Path) -> None:
    with pytest.raises(EngineUnavailableError, match="cluster engine"):
        Session(ClusterBackend(cluster.replace("https://", "http://"), token_file=token_file)).run(request(8))


def test_no_engine_at_the_address_is_a_clear_error(token_file: Path) -> None:
    with pytest.raises(EngineUnavailableError, match="no cluster engine answers"):
        Session(ClusterBackend(f"http://127.0.0.1:{free_port()}", token_file=token_file)).run(request(8))
    with pytest.raises(EngineUnavailableError, match="not an engine address"):
        ClusterBackend("ftp://host:1", token_file=token_file)
    assert os.environ.get("RAY_ADDRESS") is None  # the tests never reach a cluster they did not start


def test_the_command_line_rewrites_through_the_cluster(
    cluster: str, token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specedit rewrite --engine http://...`: the cluster runs it (the tiny model never finishes, so the
    answer is the budget error), and a file is never half-written."""
    from specedit.cli.main import main

    source = tmp_path / "add.py"
    source.write_text(ORIGINAL)
    args = ["rewrite", str(source), "-i", "Rename add to plus.", "--engine", cluster, "--max-new-tokens", "16"]
    assert main([*args, "--engine-token-file", str(token_file), "--in-place", "--no-progress"]) == 8
    assert "used all 16 tokens of its budget" in capsys.readouterr().err
    assert source.read_text() == ORIGINAL and sorted(path.name for path in tmp_path.iterdir()) == [
        "add.py",
        "team.token",
    ]
    wrong = tmp_path / "wrong.token"
    wrong.write_text("guess\n")
    wrong.chmod(0o600)
    assert main([*args, "--engine-token-file", str(wrong), "--no-progress"]) == 7
    assert "wrong or missing token" in capsys.readouterr().err


def test_a_replica_killed_mid_rewrite_is_a_clear_error_and_serve_replaces_it(cluster: str, token_file: Path) -> None:
    """The client gets an error (no retry: the rewrite's text already streamed would be streamed again),
    never a truncated answer; Serve starts new replicas and the next rewrite succeeds."""
    session = Session(ClusterBackend(cluster, token_file=token_file))
    started = threading.Event()
    result: dict[str, Any] = {}

    def client() -> None:
        try:
            result["outcome"] = session.run(request(1500), events_to(step=lambda info: started.set()))
        except EngineUnavailableError as error:
            result["error"] = error

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    assert started.wait(60)
    replicas = [
        actor for actor in ray.util.list_named_actors(all_namespaces=True) if actor["name"].startswith("SERVE_REPLICA")
    ]
    assert len(replicas) == 2
    for actor in replicas:  # the one serving it among them
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    thread.join(60)
    assert "outcome" not in result and "the cluster engine at" in str(result["error"])
    # Serve brings replicas up again; it holds a request meanwhile (or refuses it: then ask again).
    recovered = threading.Event()

    def ask_until_served() -> None:
        for _ in range(120):
            try:
                if session.run(request(8)).status == "incomplete":
                    recovered.set()
                    return
            except EngineUnavailableError:
                time.sleep(0.5)

    threading.Thread(target=ask_until_served, daemon=True).start()
    assert recovered.wait(120), "no replica came back"


def test_cluster_deploy_usage_errors_come_before_any_cluster(
    token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specedit.cli.main import main

    for replicas in ("x", "3:1", "0"):
        with pytest.raises(SystemExit) as exited:
            main(["cluster", "deploy", "--token-file", str(token_file), "--replicas", replicas])
        assert exited.value.code == 2
    with pytest.raises(SystemExit):
        main(["cluster", "deploy", "--token-file", str(token_file), "--tls-cert", "cert.pem"])
    assert "TLS needs both" in capsys.readouterr().err


@pytest.fixture(scope="module")
def two_models(cluster: str, certificate: tuple[Path, Path], options: EngineOptions, memorising_model_dir: Path) -> str:
    """A second engine on the same cluster (its own application and route), with two models: the tiny one
    its own, the memorising one (which finishes its answers) for requests that name it (Serve's model
    multiplexing), loaded on first use."""
    cert, key = certificate
    port = int(cluster.rsplit(":", 1)[1])
    config = ClusterConfig(
        options,
        TOKEN,
        port=port,
        cpus_per_replica=0.5,
        tls_cert=str(cert),
        tls_key=str(key),
        name="two-models",
        route="/two-models",
        models=(str(memorising_model_dir),),
    )
    return deploy(config)


def test_a_request_chooses_among_the_deployments_models(
    two_models: str, token_file: Path, options: EngineOptions, memorising_model_dir: Path
) -> None:
    assert two_models.endswith("/two-models")
    own = remote_session(two_models, token_file=str(token_file))
    assert own.run(request(12)).text == local_session(options).run(request(12)).text
    named = remote_session(two_models, token_file=str(token_file), spawn=EngineOptions(model=str(memorising_model_dir)))
    phases: list[Phase] = []
    outcome = named.run(request(200), events_to(phase=phases.append))
    assert outcome.status == "complete" and outcome.text == "def plus(a, b):\n    return a + b\n"
    assert phases[0] == Phase("loading") and Phase("started") in phases  # loaded for this request
    assert isinstance(own.backend, ClusterBackend)
    assert own.backend.status()["models"] == [str(memorising_model_dir)]
    unknown = remote_session(two_models, token_file=str(token_file), spawn=EngineOptions(model="/etc"))
    with pytest.raises(InputError, match="no model '/etc' on this engine"):  # a client never makes it load a path
        unknown.run(request(8))


def test_the_command_line_writes_a_rewrite_from_the_cluster(
    two_models: str, token_file: Path, tmp_path: Path, memorising_model_dir: Path
) -> None:
    from specedit.cli.main import main

    source = tmp_path / "add.py"
    source.write_text(ORIGINAL)
    args = ["rewrite", str(source), "-i", "Rename add to plus.", "--engine", two_models, "--in-place"]
    args += ["--model", str(memorising_model_dir), "--engine-token-file", str(token_file)]
    assert main([*args, "--no-progress", "--no-backup"]) == 0
    assert source.read_text() == "def plus(a, b):\n    return a + b\n"


@pytest.mark.asyncio
async def test_the_language_server_writes_a_live_rewrite_from_the_cluster(
    two_models: str, token_file: Path, memorising_model_dir: Path
) -> None:
    """An editor whose `specedit.engine` is the cluster: the live rewrite lands in the document."""
    import sys

    from lsprotocol import types
    from pytest_lsp import ClientServerConfig, client_capabilities
    from test_lsp_e2e import EditorClient, make_client, new_uri, send_rewrite, settle

    command = [sys.executable, "-m", "specedit.lsp", "--engine", two_models, "--model", str(memorising_model_dir)]
    config = ClientServerConfig(
        server_command=[*command, "--engine-token-file", str(token_file)],
        client_factory=lambda: make_client("nvim"),
        server_env=dict(os.environ),  # SSL_CERT_FILE: the test's certificate
    )
    client = await config.start()
    assert isinstance(client, EditorClient)
    try:
        result = await client.initialize_session(types.InitializeParams(capabilities=client_capabilities("neovim")))
        client.encoding = str(result.capabilities.position_encoding)
        uri = new_uri("cluster")
        client.open(uri, ORIGINAL)
        params = {"textDocument": {"uri": uri, "version": 1}, "instruction": "Rename add to plus.", "delivery": "live"}
        answer = await send_rewrite(client, params)
        assert answer["status"] == "complete", answer
        assert (await settle(client, uri)) == "def plus(a, b):\n    return a + b\n"
    finally:
        await client.shutdown_session()
        await client.stop()
