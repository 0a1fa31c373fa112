"""TensorRT-LLM and KTransformers fleets on real lab hosts, behind the real, pinned
sglang-router alone on lab1 (the `lab` stream, on its shared lab instance after the converge
module, whose hosts it takes over). The stand-ins serve each engine's pinned HTTP
surface: trtllm-serve 1.2's routes only (no /model_info, a /server_info without a model id),
so the launch registers its instances with the router by model id, as it does vLLM's.

TensorRT-LLM, two tp_ep instances of two hosts each (replica-1 on lab2+lab3, replica-2 on
lab4+lab5), each its own mpirun world over its hosts' sshd on port 2233:
- `apply` brings the fleet up: each instance's rank 0 runs mpirun over its own two hosts
  (the stand-in mpirun checks each -H host's sshd), trtllm-serve serves the router on its
  head's k2_local_ip and k2_trtllm_port, the router lists both healthy under the served name,
  `status` shows 2/2 up, and every request sent through the router is answered 200, by both
  instances; the real sshd of each instance takes its own instance's mpirun and refuses the
  other's;
- `restart --limit lab2` rolls replica-1 through the router while a client keeps streaming:
  every request is answered 200, only replica-1's containers are new;
- `logs` reads replica-2's exec'd trtllm-serve; killing it fails `status`, naming it, and
  `restart --limit lab5` (its other rank) restarts the whole instance: `status` is 0 again;
- `bench` runs TensorRT-LLM's own client (module tensorrt_llm.serve.scripts.benchmark_serving;
  in the lab the stand-in image carries a stand-in of it, since the real wheel is not on
  PyPI) in the engine image on the router's host, against the fleet's endpoint.

KTransformers, two single-host replicas (lab2, lab3) on the same hosts afterwards:
- `apply --tags launch,verify` (the hosts are prepared) brings them up behind the router,
  which takes them by URL (sglang-kt's server is SGLang's); `status` shows 2/2 up; every
  request through the router is answered 200, by both;
- `restart --limit lab2` rolls replica-1 through the router: every request is answered 200.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k2lab.traffic import Traffic
from tests.pd_lab import (
    MODEL_DIR,
    applied_fleet,
    fleet_endpoint,
    k2,
    remove_engine_containers,
    restart_rolls_replica_1,
    router_health,
    router_listing,
)
from tests.runners import on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

ROUTER = "lab1"
INSTANCES = {"replica-1": ("lab2", "lab3"), "replica-2": ("lab4", "lab5")}
TRTLLM_PORT, SGLANG_PORT = 8200, 30000  # k2_trtllm_port's and k2_sglang_port's defaults
SERVED = Path(MODEL_DIR).name  # trtllm-serve names a directory model by its base name
VARS = {
    "k2_engine": "trtllm",
    "k2_layout": "tp_ep",
    "k2_instances": 2,
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}
MESH = "/etc/k2provision/ssh"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """5 lab hosts: the router on lab1, two 2-host TensorRT-LLM instances; applied."""
    yield from applied_fleet(
        tmp_path_factory, "trtllm-fleet", {"router": 1, "nodes": 4}, dict(VARS)
    )


def answered(state: Any, host: str, port: int) -> int:
    """The generation requests the stand-in server on `host`:`port` has answered."""
    info = on_host(state, ROUTER, f"curl -s http://{state.host(host).address}:{port}/standin/info")
    return int(json.loads(info)["answered"])


def serves_through_the_router(
    state: Any, inventory: Path, runs: Path, heads: tuple[str, ...], port: int
) -> None:
    """`status` shows every instance up, and a client streaming through the router has every
    request answered, by each instance (its head `heads` serving on `port`)."""
    status = k2("status", str(inventory), runs=runs)
    assert status.returncode == 0, status.stdout[-3000:]
    assert f"fleet: {len(heads)}/{len(heads)} instances up" in status.stdout
    before = {h: answered(state, h, port) for h in heads}
    with Traffic(fleet_endpoint(state), threads=4) as client:
        deadline = time.monotonic() + 120
        while sum(client.counts.values()) < 40 and time.monotonic() < deadline:
            time.sleep(0.5)
    assert client.failures == [], client.counts
    assert all(answered(state, h, port) > before[h] for h in heads), before


def test_each_trtllm_instance_is_its_own_mpirun_world_behind_the_router(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    heads = [hosts[0] for hosts in INSTANCES.values()]
    urls = [f"http://{state.host(h).address}:{TRTLLM_PORT}" for h in heads]
    assert router_health(state) == dict.fromkeys(urls, True)
    # trtllm-serve names no model to the router: the launch registered each by model id.
    assert {w["model_id"] for w in router_listing(state).values()} == {SERVED}
    info = on_host(state, ROUTER, f"curl -s {urls[0]}/server_info")
    assert json.loads(info) == {"disaggregated_params": None}
    gone = on_host(state, ROUTER, f"curl -s -o /dev/null -w '%{{http_code}}' {urls[0]}/model_info")
    assert gone == "404"
    models = json.loads(on_host(state, ROUTER, "curl -s http://127.0.0.1:8000/v1/models"))
    assert [m["id"] for m in models["data"]] == [SERVED]
    # Each rank 0 started its own world: 16 ranks over its own two hosts.
    for name, hosts in INSTANCES.items():
        started = json.loads(
            on_host(
                state,
                ROUTER,
                f"curl -s http://{state.host(hosts[0]).address}:{TRTLLM_PORT}/standin/info",
            )
        )
        assert started["world_size"] == 16, (name, started)
        assert started["host"] == state.host(hosts[0]).address, (name, started)
    # The mesh's real sshd: an instance's rank 0 reaches its own peer, never the other's.
    own_peer = state.host("lab3").address
    other = state.host("lab5").address
    ssh = f"docker exec k2-trtllm ssh -F {MESH}/ssh_config -p 2233"
    on_host(state, "lab2", f"{ssh} {own_peer} true")
    refused = on_host(state, "lab2", f"{ssh} {other} true 2>&1; echo rc=$?", check=False)
    assert "rc=255" in refused, refused
    serves_through_the_router(state, inventory, tmp_path / "runs", tuple(heads), TRTLLM_PORT)


def test_restarting_one_trtllm_instance_rolls_it_through_the_router(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = fleet
    restart_rolls_replica_1(state, inventory, tmp_path, "k2-trtllm", replicas=("lab2", "lab4"))
    assert {w["model_id"] for w in router_listing(state).values()} == {SERVED}


def test_a_dead_trtllm_serve_is_named_and_restarting_its_other_rank_restarts_the_world(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    """Day two on one instance's mpirun world: `logs` reads the exec'd trtllm-serve of
    replica-2's rank 0 (lab4); killing it is named by `status` (exit 1); `restart --limit
    lab5`, the other rank, restarts the whole instance (every rank's sshd, then mpirun from
    rank 0) through the router, and `status` is 0 again."""
    state, inventory = fleet
    runs = tmp_path / "runs"
    logs = k2("logs", str(inventory), "lab4", "--tail", "20", runs=runs)
    assert logs.returncode == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert any(x.startswith("lab4/trtllm-serve") for x in logs.stdout.splitlines()), logs.stdout
    on_host(state, "lab4", "docker exec k2-trtllm sh -c 'kill \"$(cat /run/k2-trtllm-serve.pid)\"'")
    deadline = time.monotonic() + 60
    while True:
        status = k2("status", str(inventory), runs=runs)
        if status.returncode == 1 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert status.returncode == 1, status.stdout[-4000:]
    assert "lab4" in status.stdout
    assert "trtllm-serve" in status.stdout
    restarted = k2("restart", str(inventory), "--limit", "lab5", "--yes", runs=runs)
    assert restarted.returncode == 0, restarted.stdout[-5000:] + restarted.stderr[-2000:]
    assert "lab4 added: the ranks of one instance restart together" in restarted.stdout
    status = k2("status", str(inventory), runs=runs)
    assert status.returncode == 0, status.stdout[-4000:]
    heads = [f"http://{state.host(h).address}:{TRTLLM_PORT}" for h in ("lab2", "lab4")]
    assert router_health(state) == dict.fromkeys(heads, True)


def test_bench_runs_trtllm_s_own_client_on_the_router_host(
    fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    _, inventory = fleet
    runs = tmp_path / "runs"
    out = k2(
        "bench",
        str(inventory),
        "--num-prompts",
        "8",
        "--workload",
        "custom",
        "--input-len",
        "32",
        "--output-len",
        "8",
        runs=runs,
    )
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 0, said[-4000:]
    assert "the client exited 0 on lab1" in said
    [record] = [p for p in runs.iterdir() if p.name.endswith("-bench")]
    doc = json.loads((record / "bench.json").read_text())
    assert doc["ok"] is True, doc["problems"]
    assert doc["client"]["kind"] == "trtllm"
    assert doc["client"]["command"] == "python -m tensorrt_llm.serve.scripts.benchmark_serving"
    assert doc["nodes"] == 4
    [point] = doc["points"]
    assert (point["completed"], point["failed"]) == (8, 0)
    assert point["output_tokens"] == 8 * 8
    for metric in ("ttft", "itl", "e2e"):
        q = point["latency_ms"][metric]
        assert 0 <= q["p50"] <= q["p90"] <= q["p99"], (metric, q)


@pytest.fixture(scope="module")
def kt_fleet(fleet: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The same lab's lab1-lab3 as a KTransformers fleet: the router on lab1, a replica on
    each of lab2 and lab3 (lab4 and lab5 outside its inventory); applied."""
    state, trtllm = fleet
    remove_engine_containers(state)
    text = trtllm.read_text()
    for old, new in (("k2_engine=trtllm", "k2_engine=ktransformers"),
                     ("k2_layout=tp_ep", "k2_layout=single")):  # fmt: skip
        assert old in text
        text = text.replace(old, new)
    lines = [x for x in text.splitlines() if not x.startswith(("lab4 ", "lab5 "))]
    inventory = tmp_path_factory.mktemp("kt-fleet") / "kt-fleet.ini"
    inventory.write_text("\n".join(lines) + "\n")
    # The hosts are prepared (the TensorRT-LLM apply's), the model directory in place: the
    # fleet needs its launch and verify phases (a whole apply would re-run prepare for the
    # engine change, which the other fleets' modules already cover).
    first = k2(
        "apply", str(inventory), "--tags", "launch,verify",
        runs=tmp_path_factory.mktemp("kt-first"),
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    return state, inventory


def test_the_router_serves_both_ktransformers_replicas(
    kt_fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = kt_fleet
    replicas = ("lab2", "lab3")
    urls = [f"http://{state.host(h).address}:{SGLANG_PORT}" for h in replicas]
    assert router_health(state) == dict.fromkeys(urls, True)
    serves_through_the_router(state, inventory, tmp_path / "runs", replicas, SGLANG_PORT)


def test_restarting_one_ktransformers_replica_rolls_it_through_the_router(
    kt_fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = kt_fleet
    restart_rolls_replica_1(state, inventory, tmp_path, "k2-ktransformers")
