"""Pytest plugin: what the lab tests of a whole deployment share: the CLI as a user runs it and
the lab's clusters, one per layout, brought up once per session and reused by every module
that needs that layout (``lab_cluster(layout)``; ``pd_cluster`` is the 4-host 2-prefill /
2-decode SGLang PD cluster of stand-ins, real SSH, real router).

A module states the engine state it needs at its start (``remove_engine_containers`` for none,
an apply for a converged one), so modules pass in any order on the one cluster."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.standin import build_standin
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
    """Every k2- container on every lab host removed (best effort, for teardown)."""
    for host in state.hosts:
        on_host(state, host.name, "docker rm -f $(docker ps -aq --filter name=k2-) || true",
                check=False)


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
    router, *engine_hosts = state.host_names
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
