"""The engine on a real local Ray cluster (Ray Serve), with tiny models: `backends.cluster` end to end.

One cluster for the module (`ray.init(num_cpus=2)`), the engine deployed on it as `specedit cluster
deploy` does it (`deploy`), with two replicas of the tiny random model, over HTTPS with a self-signed
certificate the clients trust through `SSL_CERT_FILE`; clients are sessions on `ClusterBackend`s, as the command
line and the language server use them (`--engine https://HOST:PORT`). Routing by document
(`cluster_router`) shows on a second engine whose replicas keep prompts (`routed`): a document's rewrites
and warm-up land on one replica, and reuse its prefix cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import signal
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
from specedit.engine.records.requests import RewriteOutcome, RewriteRequest, WarmRequest
from specedit.engine.records.wire import to_wire
from specedit.engine.session.session import Session, local_session, remote_session

ray = pytest.importorskip("ray", reason="the cluster extra: pip install -e '.[cluster]' (scripts/setup.sh does)")
serve = pytest.importorskip("ray.serve")

from specedit.engine.backends.cluster import ClusterBackend, warm_key  # noqa: E402
from specedit.engine.doors.cluster_deploy import ClusterConfig, deploy  # noqa: E402

from conftest import events_to  # noqa: E402

TOKEN = "cluster-test-token-0123456789"
ORIGINAL = "def add(a, b):\n    return a + b\n"


# A file long enough that its prefill shows in the stats: 24 functions, about 750 tokens of the tiny model's
# (a warm-up takes up to half its context, 1,024 tokens: room for an answer of its size).
DOCUMENT = "".join(f"def area_{n}(r):\n    return 3.14 * r * r + {n}\n\n" for n in range(24))


def request(max_new_tokens: int, path: str | None = None, original: str = ORIGINAL) -> RewriteRequest:
    """The tiny random model never finishes: `max_new_tokens` decides how long it runs. `path` names the
    document, which the router routes by."""
    return RewriteRequest(
        original=original,
        instruction="Rename add to plus.",
        language="python",
        max_new_tokens=max_new_tokens,
        path=path,
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


def test_a_replica_killed_mid_rewrite_is_a_clear_error_and_its_documents_go_to_another(
    cluster: str, token_file: Path
) -> None:
    """Under load, the replica serving a document is killed. Its client gets an error (no retry: the
    rewrite's text already streamed would be streamed again), never a truncated answer. The rewrite on the
    other replica goes on to its end. The killed one's document goes to a live replica at once (the other,
    or the one Serve starts in its place), and its next rewrite succeeds."""
    session = Session(ClusterBackend(cluster, token_file=token_file))
    homes: dict[int, str] = {}  # a document on each replica (the router spreads documents over them)
    for number in range(40):
        path = f"/work/killed/doc{number}.py"
        replica = session.run(request(4, path)).stats.replica
        assert replica is not None
        homes.setdefault(replica, path)
        if len(homes) == 2:
            break
    (doomed, doomed_path), (spared, spared_path) = homes.items()
    results: dict[str, Any] = {}
    started = {doomed_path: threading.Event(), spared_path: threading.Event()}

    def client(path: str, budget: int) -> None:
        try:
            results[path] = session.run(request(budget, path), events_to(step=lambda info: started[path].set()))
        except EngineUnavailableError as error:
            results[path] = error

    threads = [
        threading.Thread(target=client, args=(doomed_path, 1500), daemon=True),
        threading.Thread(target=client, args=(spared_path, 400), daemon=True),
    ]
    for thread in threads:
        thread.start()
    assert all(event.wait(60) for event in started.values())
    os.kill(doomed, signal.SIGKILL)  # its process: the replica dies as on a crash
    for thread in threads:
        thread.join(60)
    assert isinstance(results[doomed_path], EngineUnavailableError)
    assert "the cluster engine at" in str(results[doomed_path]) and "nothing was written" in str(results[doomed_path])
    kept = results[spared_path]
    assert isinstance(kept, RewriteOutcome) and kept.status == "incomplete" and kept.stats.replica == spared
    # Serve may hold a request while it replaces the replica, or refuse it: then ask again.
    served: list[RewriteOutcome] = []

    def ask_until_served() -> None:
        for _ in range(120):
            try:
                served.append(session.run(request(8, doomed_path)))
                return
            except EngineUnavailableError:
                time.sleep(0.5)

    asking = threading.Thread(target=ask_until_served, daemon=True)
    asking.start()
    asking.join(120)
    assert served, "no replica served the killed one's document"
    assert served[0].status == "incomplete" and served[0].stats.replica not in (None, doomed)


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
    for option in (["--spill-at", "0"], ["--place-timeout", "0"], ["--upscale-delay", "-1"]):
        with pytest.raises(SystemExit) as exited:
            main(["cluster", "deploy", "--token-file", str(token_file), *option])
        assert exited.value.code == 2


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


@pytest.fixture(scope="module")
def routed(cluster: str, certificate: tuple[Path, Path], options: EngineOptions) -> str:
    """A third engine on the cluster, whose replicas keep prompts (a prefix cache), routed by document (the
    default): two replicas of a quarter CPU each (the others hold 1.5 of the cluster's 2)."""
    cert, key = certificate
    config = ClusterConfig(
        dataclasses.replace(options, prefix_cache_mb=64),
        TOKEN,
        min_replicas=2,
        max_replicas=2,
        port=int(cluster.rsplit(":", 1)[1]),
        cpus_per_replica=0.25,
        tls_cert=str(cert),
        tls_key=str(key),
        name="routed",
        route="/routed",
    )
    return deploy(config)


def test_a_documents_second_rewrite_and_its_warm_up_land_on_the_replica_that_served_its_first(
    routed: str, token_file: Path
) -> None:
    """The stats name the replica's pid. The warm-up (the editor's, of the document as it is after an edit
    near its top) is prefilled there, so the second rewrite reuses nearly all of its prompt."""
    backend = ClusterBackend(routed, token_file=token_file)
    session = Session(backend)
    path = "/work/src/shapes.py"
    first = session.run(request(4, path, DOCUMENT))
    replica = first.stats.replica
    edited = DOCUMENT.replace("3.14 * r * r + 1\n", "3.14159 * r * r + 1\n", 1)  # the second function
    warm = WarmRequest(edited, "python", f"file://{path}")
    assert backend.warm(warm) is True
    assert backend.offer(warm) == replica  # where the document's rewrites go
    idle = 0  # twice idle in a row: done (between taking a document and prefilling it, one look may miss it)
    for _ in range(300):
        info = backend.status(warm_key(warm))
        assert info["pid"] == replica  # the status, routed by the document too
        idle = idle + 1 if info["to_warm"] == 0 and info["warming"] is None else 0
        if idle == 2:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"not warmed: {info}")
    second = session.run(request(4, path, edited))
    assert second.stats.replica == replica
    prompt = second.stats.reused_tokens + second.stats.prefill_tokens
    assert second.stats.reused_tokens > max(first.stats.reused_tokens, 0.9 * prompt), (first.stats, second.stats)


def test_a_busy_documents_replica_spills_the_next_request_to_the_other(routed: str, token_file: Path) -> None:
    """One rewrite runs on the document's replica and one waits there; the next goes to the other replica
    (`spill_at` 2), where nothing runs."""
    session = Session(ClusterBackend(routed, token_file=token_file))
    path = "/work/src/busy.py"
    home = session.run(request(4, path)).stats.replica
    cancel = threading.Event()
    running, waiting = threading.Event(), threading.Event()
    threads = [
        threading.Thread(
            target=session.run,
            args=(request(1500, path), events_to(step=lambda info: running.set())),
            kwargs={"cancel": cancel},
            daemon=True,
        ),
        threading.Thread(
            target=session.run,
            args=(
                request(1500, path),
                events_to(phase=lambda phase: waiting.set() if phase.name == "queued" else None),
            ),
            kwargs={"cancel": cancel},
            daemon=True,
        ),
    ]
    try:
        threads[0].start()
        assert running.wait(60)
        threads[1].start()
        assert waiting.wait(60)  # behind the first: on the same replica
        spilled = session.run(request(4, path))
    finally:
        cancel.set()
        for thread in threads:
            thread.join(60)
    assert spilled.status == "incomplete" and spilled.stats.replica not in (None, home)


def test_a_cluster_without_room_for_a_replica_says_so_to_deploy_and_to_a_request(
    cluster: str, certificate: tuple[Path, Path], options: EngineOptions, token_file: Path
) -> None:
    """A deployment whose replica asks for more CPUs than the cluster has: `deploy` and a request sent
    meanwhile are told so after `place_timeout_s`, instead of waiting for good."""
    cert, key = certificate
    config = ClusterConfig(
        options,
        TOKEN,
        port=int(cluster.rsplit(":", 1)[1]),
        cpus_per_replica=3,
        tls_cert=str(cert),
        tls_key=str(key),
        name="no-room",
        route="/no-room",
        place_timeout_s=2,
    )
    deployed: dict[str, object] = {}

    def deploying() -> None:
        try:
            deployed["address"] = deploy(config)
        except EngineUnavailableError as error:
            deployed["error"] = error

    thread = threading.Thread(target=deploying, daemon=True)
    thread.start()
    try:
        session = Session(ClusterBackend(config.url, token_file=token_file))
        for _ in range(100):  # until Serve's proxy knows the route (a 404 before)
            try:
                session.run(request(4))
            except EngineUnavailableError as error:
                if "404" not in str(error):
                    refused = error
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the proxy never routed to the new application")
        assert "503" in str(refused) and "no room for a replica of 'no-room'" in str(refused)
        assert "each asks for 3 CPUs" in str(refused)
        thread.join(60)
        assert "no room for a replica" in str(deployed["error"]) and "nothing serves it" in str(deployed["error"])
    finally:
        thread.join(60)
        serve.delete("no-room", _blocking=False)
        for _ in range(150):  # its replicas were never placed: no graceful stop to wait for
            if "no-room" not in serve.status().applications:
                break
            for actor in ray.util.list_named_actors(all_namespaces=True):
                if actor["name"].startswith("SERVE_REPLICA::no-room#"):
                    with contextlib.suppress(ValueError):  # (gone meanwhile)
                        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            time.sleep(0.2)
