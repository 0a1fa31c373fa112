"""Pytest plugin: what the lab tests of a whole deployment share: the CLI as a user runs it and
the lab's clusters, one per layout, brought up once per session and reused by every module
that needs that layout (``lab_cluster(layout)``; ``pd_cluster`` is the 4-host 2-prefill /
2-decode SGLang PD cluster of stand-ins, real SSH, real router).

A module states the engine state it needs at its start (``remove_engine_containers`` for none,
an apply for a converged one), so modules pass in any order on the one cluster."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.standin import build_standin
from k2lab.traffic import Traffic
from tests import runners
from tests.runners import on_host

MODEL_DIR = "/models/Kimi-K2-Instruct"
# Every CLI run of the lab tests has a Hugging Face token in its environment, as a user's
# shell would: no run record may hold it.
LAB_HF_TOKEN = "hf_" + "LabTokenNeverRecorded" * 2
LAB_VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}
# The CLI as a user runs it: the installed console script, a terminal wide enough for status's
# table, a Hugging Face token in the environment.
k2 = partial(runners.k2, installed=True, timeout=600, COLUMNS="250", HF_TOKEN=LAB_HF_TOKEN)


@dataclass(frozen=True)
class Layout:
    """A lab cluster's shape: host count, inventory groups and variables."""

    hosts: int
    groups: dict[str, int]
    all_vars: dict[str, lab_api.VarValue]


LAYOUTS: dict[str, Layout] = {
    "pd": Layout(hosts=4, groups={"prefill": 2, "decode": 2}, all_vars=LAB_VARS),
}


def pd_cluster_up(inventory: Path) -> Any:
    """4 lab hosts as prefill 2 / decode 2, the stand-in image built, a model dir on each."""
    layout = LAYOUTS["pd"]
    state = lab_api.up(
        layout.hosts, inventory=inventory, groups=layout.groups, all_vars=layout.all_vars
    )
    build_standin()
    for host in state.hosts:
        on_host(state, host.name, f"mkdir -p {MODEL_DIR} && echo '{{}}' > {MODEL_DIR}/config.json")
    return state


UP_BY_LAYOUT: dict[str, Callable[[Path], Any]] = {"pd": pd_cluster_up}


@pytest.fixture(scope="session")
def lab_cluster(
    lab: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], tuple[Any, Path]]]:
    """``lab_cluster(layout)``: that layout's cluster (lab state, inventory), brought up on the
    first request of the session and the same one for every later request. The session's
    end removes the engine containers it left."""
    clusters: dict[str, tuple[Any, Path]] = {}

    def cluster(layout: str) -> tuple[Any, Path]:
        if layout not in clusters:
            inventory = tmp_path_factory.mktemp(f"cluster-{layout}") / f"{layout}.ini"
            clusters[layout] = (UP_BY_LAYOUT[layout](inventory), inventory)
        return clusters[layout]

    yield cluster
    for state, _ in clusters.values():
        remove_engine_containers(state)


@pytest.fixture(scope="session")
def pd_cluster(lab_cluster: Callable[[str], tuple[Any, Path]]) -> tuple[Any, Path]:
    """The session's PD cluster (lab state, inventory), engines in whatever state the last
    module left them."""
    return lab_cluster("pd")


def remove_engine_containers(state: Any) -> None:
    """Every k2- container on every lab host removed (best effort, for teardown): killed first
    (a removal alone stops each with the runtime's 10 s grace), every host at once."""
    remove = (
        'ids=$(docker ps -aq --filter name=k2-); [ -z "$ids" ] || '
        "{ docker kill $ids >/dev/null 2>&1; docker rm -f $ids >/dev/null 2>&1; }; true"
    )
    with ThreadPoolExecutor(max_workers=max(1, len(state.hosts))) as pool:
        list(pool.map(lambda h: on_host(state, h.name, remove, check=False), state.hosts))


def applied_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    groups: dict[str, int],
    all_vars: dict[str, lab_api.VarValue],
) -> Iterator[tuple[Any, Path]]:
    """A fleet module's lab (the body of its module fixture): hosts up in `groups` with the
    router alone on lab1, the weights' stand-in on every other host (the router's host gets
    none: the launch gives it the empty directory its container mounts), applied. Afterwards
    the engine containers go, and the lab too when this brought it up."""
    inventory = tmp_path_factory.mktemp(name) / f"{name}.ini"
    was_up = lab_api.status().up
    state = lab_api.up(sum(groups.values()), inventory=inventory, groups=groups, all_vars=all_vars)
    build_standin()
    remove_engine_containers(state)
    routers = groups.get("router", 1)
    router_hosts, engine_hosts = state.host_names[:routers], state.host_names[routers:]
    for router in router_hosts:
        on_host(state, router, f"rm -rf {MODEL_DIR}")
    for host in engine_hosts:
        on_host(state, host, f"mkdir -p {MODEL_DIR} && echo '{{}}' > {MODEL_DIR}/config.json")
    first = k2("apply", str(inventory), runs=tmp_path_factory.mktemp("first"))
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    yield state, inventory
    remove_engine_containers(state)
    if not was_up:  # this module brought the lab up: it leaves nothing running
        lab_api.down()


def max_model_len(state: Any, router: str, host: str) -> int:
    """The context length the server on `host` reports (/v1/models), asked from `router`."""
    models = on_host(state, router, f"curl -s http://{state.host(host).address}:30000/v1/models")
    return int(json.loads(models)["data"][0]["max_model_len"])


# ---------------------------------------------------------------- a fleet's router, asked
# Every fleet module puts the router alone on lab1 and asks it from there.
FLEET_ROUTER = "lab1"


def fleet_endpoint(state: Any) -> str:
    """The fleet's endpoint: the router on lab1."""
    return f"http://{state.host(FLEET_ROUTER).address}:8000"


def router_listing(
    state: Any, host: str = FLEET_ROUTER, url: str = "http://127.0.0.1:8000"
) -> dict[str, dict[str, Any]]:
    """The `GET /workers` of the router at `url` (asked on `host`), by worker URL."""
    listed = json.loads(on_host(state, host, f"curl -s {url}/workers"))
    return {w["url"]: w for w in listed["workers"]}


def router_health(
    state: Any, host: str = FLEET_ROUTER, url: str = "http://127.0.0.1:8000"
) -> dict[str, bool]:
    """Whether the router at `url` (asked on `host`) takes each worker (URL) as healthy."""
    return {u: bool(w["is_healthy"]) for u, w in router_listing(state, host, url).items()}


def metric_sum(state: Any, url: str, name: str) -> float:
    """The sum of the samples of metric `name` at `url`/metrics, asked from the router host."""
    text = on_host(state, FLEET_ROUTER, f"curl -s {url}/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def container_id(state: Any, host: str, name: str) -> str:
    """The ID of container `name` on `host`."""
    return on_host(state, host, f"docker inspect --format '{{{{.Id}}}}' {name}").strip()


def restart_rolls_replica_1(
    state: Any,
    inventory: Path,
    tmp_path: Path,
    engine_container: str,
    routers: tuple[str, ...] = (FLEET_ROUTER,),
    replicas: tuple[str, str] = ("lab2", "lab3"),
    endpoint: str | None = None,
    router_urls: tuple[str, ...] = ("http://127.0.0.1:8000",),
) -> None:
    """`restart --limit REPLICA-1` on a fleet of two replicas behind its routers, under
    traffic (through `endpoint`, default lab1's router): replica-1 rolls through every router,
    every request is answered 200, only replica-1's container is new, and each router (at
    `router_urls`, asked on its host) takes both workers as healthy again."""
    first, second = replicas

    def containers() -> dict[str, str]:
        return {
            h: container_id(state, h, "k2-router" if h in routers else engine_container)
            for h in (*routers, *replicas)
        }

    before = containers()
    with Traffic(endpoint or fleet_endpoint(state)) as client:
        run = k2("restart", str(inventory), "--limit", first, "--yes", runs=tmp_path / "runs")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"rolling, the endpoint serving: 1. replica-1 on {first}" in run.stdout
    assert client.failures == [], client.counts
    assert client.counts["200"] > 10
    after = containers()
    assert after[first] != before[first]  # replica-1 runs in a new container
    assert after[second] == before[second]
    for router, url in zip(routers, router_urls, strict=True):
        assert after[router] == before[router]
        assert list(router_health(state, router, url).values()) == [True, True]
