"""The cluster's sizing model (scripts/cluster_sizing.py) against queues whose answers are known."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cluster_sizing.py"


@pytest.fixture(scope="module")
def sizing() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_sizing", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cluster_sizing"] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_an_mm1_queue_has_its_utilisation_and_its_response_time(sizing: ModuleType) -> None:
    """Poisson arrivals at 0.6 a second, exponential service at 1 a second, one replica: utilisation
    rho = 0.6, mean response 1 / (mu - lambda) = 2.5 s, mean wait rho / (mu - lambda) = 1.5 s."""
    exponential = lambda rng: (0.0, rng.expovariate(1.0), 0.0)  # noqa: E731
    result = sizing.simulate(1, exponential, rate=0.6, requests=60_000, seed=1)
    assert result.utilisation == pytest.approx(0.6, abs=0.02)
    assert result.response_mean_s == pytest.approx(2.5, rel=0.1)
    assert result.wait_mean_s == pytest.approx(1.5, rel=0.15)
    assert result.per_minute == pytest.approx(36, rel=0.05)  # all that came was served


def test_an_mm3_queue_waits_as_erlang_c_says(sizing: ModuleType) -> None:
    """Three replicas, offered load a = lambda / mu = 2.4: the chance to wait is Erlang's C formula, and
    the mean wait C / (c mu - lambda)."""
    servers, load = 3, 2.4
    below = sum(load**k / math.factorial(k) for k in range(servers))
    top = load**servers / math.factorial(servers) * servers / (servers - load)
    waits = top / (below + top) / (servers * 1.0 - load)
    exponential = lambda rng: (0.0, rng.expovariate(1.0), 0.0)  # noqa: E731
    result = sizing.simulate(servers, exponential, rate=load, requests=80_000, seed=2)
    assert result.utilisation == pytest.approx(load / servers, abs=0.02)
    assert result.wait_mean_s == pytest.approx(waits, rel=0.15)


def test_editors_that_never_wait_send_one_rewrite_per_think_and_service(sizing: ModuleType) -> None:
    """A closed loop with a replica for every editor: no one waits, and each editor sends one rewrite per
    think time plus service time (the machine-repairman model with as many repairmen as machines)."""
    fixed = lambda rng: (0.5, 2.0, 0.5)  # noqa: E731
    result = sizing.simulate(20, fixed, editors=20, pace_s=8.0, requests=20_000, seed=3)
    assert result.wait_p99_s == 0.0 and result.first_text_p50_s == pytest.approx(0.5)
    assert result.per_minute == pytest.approx(20 * 60 / (8.0 + 2.0), rel=0.05)
    assert result.utilisation == pytest.approx(2.0 / (8.0 + 2.0), rel=0.05)


def test_routing_by_document_needs_no_more_replicas_and_reads_fewer_prompts(sizing: ModuleType) -> None:
    costs, work = sizing.Costs(), sizing.Workload(pace_s=120.0)
    routed = sizing.size(50, costs, work, routed=True, max_wait_s=2.0)
    default = sizing.size(50, costs, work, routed=False, max_wait_s=2.0)
    assert routed.replicas <= default.replicas and routed.wait_p99_s <= 2.0
    assert routed.prefill_share < default.prefill_share and routed.first_text_p50_s < default.first_text_p50_s
