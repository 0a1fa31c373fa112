"""A fleet's rolling change on real lab hosts (the `lab` stream): two SGLang TP replicas of one
host each behind the real sglang-router on a third host, stand-ins that drain on SIGTERM. A
client keeps streaming requests through the router (each ~2 s in flight) while

- `apply` rolls a changed k2_context_length across both instances: every request is answered
  200, and each instance's /v1/models reports the new max_model_len;
- a new spec that fails (k2_lab_fault=exit_at_start on one instance's host) is rolled back:
  the run fails naming the instance, that instance runs its previous spec again and is back in
  the router, and every request is still answered 200;
- `restart --limit lab2` restarts replica-1 through the router the same way: every request
  is answered 200;
- one instance's host is stopped (`lab stop`): the requests that fail are those the dead
  instance held and those sent to it before the router took it out; they are counted and
  bounded (FAILED_BOUND), the router then answers every request from the other instance, and
  `status` exits 1 naming the instance down.
"""

from __future__ import annotations

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
    max_model_len,
    metric_sum,
    restart_rolls_replica_1,
    router_health,
)

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet]

ROUTER, REPLICAS = "lab1", ("lab2", "lab3")
VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "tp",
    "k2_instances": 2,
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """3 lab hosts: the router on lab1, replica-1 on lab2, replica-2 on lab3; applied."""
    yield from applied_fleet(tmp_path_factory, "fleet", {"router": 1, "nodes": 2}, VARS)


def edited(inventory: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = inventory.read_text()
    assert old in text
    # The same file name: the mesh's key pair is named after it, so an edited copy keeps the
    # mesh as the user's edited file would.
    path = tmp_path / inventory.name
    path.write_text(text.replace(old, new))
    return path


def test_a_changed_spec_rolls_instance_by_instance_without_a_failed_request(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    status = k2("status", str(inventory), runs=tmp_path / "status")
    assert status.returncode == 0, status.stdout[-3000:]
    assert "fleet: 2/2 instances up" in status.stdout
    changed = edited(inventory, tmp_path, "k2_context_length=32768", "k2_context_length=16384")
    with Traffic(fleet_endpoint(state)) as client:
        run = k2("apply", str(changed), runs=tmp_path / "runs")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "rollout order: 1. replica-1 on lab2" in run.stdout
    assert "rollout order: 2. replica-2 on lab3" in run.stdout
    assert client.failures == [], client.counts
    assert client.counts["200"] > 20
    assert [max_model_len(state, ROUTER, h) for h in REPLICAS] == [16384, 16384]
    assert list(router_health(state).values()) == [True, True]
    inventory.write_text(changed.read_text())  # the fleet's inventory from here on


def test_a_failing_new_spec_is_rolled_back_and_the_fleet_keeps_serving(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    before = max_model_len(state, ROUTER, "lab2")
    faulty = edited(
        inventory, tmp_path, "lab2 ansible_host=", "lab2 k2_lab_fault=exit_at_start ansible_host="
    )
    with Traffic(fleet_endpoint(state)) as client:
        run = k2("apply", str(faulty), runs=tmp_path / "runs")
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    assert "rollout stopped at replica-1: lab2: sglang: exited with code 1" in run.stdout
    assert client.failures == [], client.counts
    assert client.counts["200"] > 10
    # replica-1 runs its previous spec again, from its previous launch files, and serves.
    assert max_model_len(state, ROUTER, "lab2") == before
    assert list(router_health(state).values()) == [True, True]
    check = k2("apply", str(inventory), "--check", runs=tmp_path / "check")
    assert check.returncode == 0, check.stdout[-4000:]
    assert "rollout order" not in check.stdout


def test_restarting_one_instance_rolls_it_through_the_router(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    restart_rolls_replica_1(state, inventory, tmp_path, "k2-sglang")


def served(state: Any, host: str) -> float:
    """The requests the instance on `host` has answered (its sglang:num_requests_total)."""
    return metric_sum(
        state, f"http://{state.host(host).address}:30000", "sglang:num_requests_total"
    )


# A host that dies takes its in-flight streams with it: the router has already sent their
# headers, so it can only end them with an error (here a 500, a tenth of a second after the
# stop). New requests are not lost: one sent to the dead worker before the router takes it out
# (its circuit breaker after 5 failures, its health checks after 3 x 10 s, fleet_health_args
# and FLEET_ROUTER_ARGS)
# is retried on the other (3 retries). So the client loses at most the requests in flight on
# that instance when it died: at most one per client thread. Measured on the lab: 1 of 131.
THREADS = 4
FAILED_BOUND = THREADS
READ_TIMEOUT = 15.0


def test_a_stopped_instance_costs_only_its_in_flight_requests(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    before = served(state, "lab3")
    try:
        with Traffic(fleet_endpoint(state), threads=THREADS, timeout=READ_TIMEOUT) as client:
            # The router spreads the load over both: wait until lab3 has answered some of it
            # (a condition, not a timing: under load the first answers take longer).
            deadline = time.monotonic() + 60
            while served(state, "lab3") <= before and time.monotonic() < deadline:
                time.sleep(1)
            assert served(state, "lab3") > before, client.counts
            stopped = time.monotonic()  # before the kill: a stream may fail as it happens
            lab_api.stop_host("lab3")
            # Past the read timeout of the streams lab3 held and the router's health checks.
            time.sleep(READ_TIMEOUT + 35)
            settled = time.monotonic()
            time.sleep(10)
        failed = client.failures
        print(
            f"lab stop lab3: {len(failed)} failed of {sum(client.counts.values())}: "
            + ", ".join(f"{f.outcome} {f.ended - stopped:.1f} s after the stop" for f in failed)
        )
        assert all(f.ended >= stopped for f in failed), failed
        assert len(failed) <= FAILED_BOUND, (failed, client.counts)
        late = [a for a in client.since(settled) if a.started >= settled]
        assert late, client.counts
        assert [a for a in late if a.outcome != "200"] == []
        assert router_health(state)[f"http://{state.host('lab2').address}:30000"] is True
        status = k2("status", str(inventory), runs=tmp_path / "runs")
        assert status.returncode == 1, status.stdout[-3000:]
        assert "fleet: 1/2 instances up" in status.stdout, status.stdout[-3000:]
        assert "instance replica-2 (lab3)" in status.stdout
    finally:
        lab_api.start_host("lab3")
