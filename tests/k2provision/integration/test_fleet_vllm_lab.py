"""A vLLM fleet on real lab hosts (the `lab-fleet` stream): two vLLM replicas of one host each
behind the real, pinned sglang-router on a third host. The stand-ins serve vLLM 0.33.0's HTTP
surface, so the router meets what it meets in production: no /server_info or /model_info
(vLLM serves them only in its development mode), which the router asks a new worker for and
goes on without.

- `apply` brings the fleet up: each replica serves the router on its k2_local_ip and
  k2_vllm_port, the launch registers both with their model id (the router cannot learn it
  from a vLLM server), the router lists both healthy and /v1/models the served name, `status`
  shows the fleet up, and every request sent through the router is answered 200, by both
  replicas;
- the router restarted on its own (`docker restart`, no apply) serves both replicas again: its
  launch script registers them with their model id once it answers;
- `restart --limit lab2` rolls replica-1 through the router (out, drained, started, smoke-tested
  on its own URL, back in) while a client keeps streaming: every request is answered 200 and
  only replica-1's container is new.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.traffic import Traffic
from tests.pd_lab import (
    MODEL_DIR,
    applied_fleet,
    fleet_endpoint,
    k2,
    metric_sum,
    restart_rolls_replica_1,
    router_health,
    router_listing,
)
from tests.runners import on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet]

ROUTER, REPLICAS = "lab1", ("lab2", "lab3")
VLLM_PORT = 8100  # k2_vllm_port's default
VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "vllm",
    "k2_layout": "tp",
    "k2_instances": 2,
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """3 lab hosts: the router on lab1, replica-1 on lab2, replica-2 on lab3; applied."""
    yield from applied_fleet(tmp_path_factory, "vllm-fleet", {"router": 1, "nodes": 2}, VARS)


def served(state: Any, host: str) -> float:
    """The requests the vLLM server on `host` has answered (its e2e latency count)."""
    return metric_sum(
        state,
        f"http://{state.host(host).address}:{VLLM_PORT}",
        "vllm:e2e_request_latency_seconds_count",
    )


def model_ids(state: Any) -> set[str]:
    """The model ids the router holds its workers under."""
    return {w["model_id"] for w in router_listing(state).values()}


def test_the_router_serves_both_vllm_replicas_from_their_private_port(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    urls = [f"http://{state.host(h).address}:{VLLM_PORT}" for h in REPLICAS]
    assert router_health(state) == dict.fromkeys(urls, True)
    # vLLM's surface: no SGLang introspection for the router to name the workers by, so the
    # launch registered each with its model id, and /v1/models lists the served name.
    gone = on_host(state, ROUTER, f"curl -s -o /dev/null -w '%{{http_code}}' {urls[0]}/server_info")
    assert gone == "404"
    assert model_ids(state) == {"kimi-k2"}
    models = json.loads(on_host(state, ROUTER, "curl -s http://127.0.0.1:8000/v1/models"))
    assert [m["id"] for m in models["data"]] == ["kimi-k2"]
    status = k2("status", str(inventory), runs=tmp_path / "runs")
    assert status.returncode == 0, status.stdout[-3000:]
    assert "fleet: 2/2 instances up" in status.stdout
    before = {h: served(state, h) for h in REPLICAS}
    with Traffic(fleet_endpoint(state), threads=4) as client:
        deadline = time.monotonic() + 120
        while sum(client.counts.values()) < 40 and time.monotonic() < deadline:
            time.sleep(0.5)
    assert client.failures == [], client.counts
    assert all(served(state, h) > before[h] for h in REPLICAS), before


def test_restarting_one_vllm_instance_rolls_it_through_the_router(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    restart_rolls_replica_1(state, inventory, tmp_path, "k2-vllm")
    # Back in the router under its model id (the rollout posts the plan's registration body).
    assert model_ids(state) == {"kimi-k2"}


def test_a_router_that_restarts_serves_both_replicas_without_an_apply(
    fleet: tuple[Any, Path],
) -> None:
    """The router's launch script starts the registrar beside it: after `docker restart`
    (no apply), the router lists both replicas healthy under their model id again."""
    state, _ = fleet
    urls = [f"http://{state.host(h).address}:{VLLM_PORT}" for h in REPLICAS]

    def registered() -> list[str]:
        """The registrar's lines in the router's log (every start of it so far)."""
        log = on_host(
            state, ROUTER, "docker logs k2-router 2>&1 | grep 'k2provision registrar' || true"
        )
        return log.splitlines()

    before = registered()
    on_host(state, ROUTER, "docker restart --time 5 k2-router >/dev/null")
    deadline = time.monotonic() + 90
    listed: dict[str, bool] = {}
    while time.monotonic() < deadline:
        try:
            listed = router_health(state)
        except (AssertionError, ValueError):  # the router not answering yet
            listed = {}
        if listed == dict.fromkeys(urls, True):
            break
        time.sleep(1)
    assert listed == dict.fromkeys(urls, True), listed
    assert model_ids(state) == {"kimi-k2"}
    # This start's registrar posted both: the restarted router listed neither.
    after = sorted(x.split("registrar: ", 1)[1] for x in registered()[len(before) :])
    assert len(after) == 2, after
    for url, line in zip(urls, after, strict=True):  # 200 or 202: taken, or queued
        assert re.match(rf"{re.escape(url)} registered as kimi-k2: 20[02]\b", line), after
