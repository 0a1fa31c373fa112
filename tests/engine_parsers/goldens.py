"""The golden cases' engine launches, each checked once per test session by the real parsers.

Both the flag checks (test_*_renders.py) and the semantic checks (test_semantics.py) read the
same verdicts: every SGLang server through `ServerArgs` resolution and SGLang's own expert
placement, every router through sglang-router's parser and config build, every `vllm serve`
through EngineArgs and the engine config of its node. A process whose launch script finds
values on its host (the socket interface, CPU cores) is checked with sample host values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from k2provision.core.records import Cluster, Plan, PoolPlan, Process
from k2provision.core.templating import with_host_values
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

from .runner import ParseResult, check

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SGLANG_SERVER = ("python3", "-m", "sglang.launch_server")
SGLANG_ROUTER = ("python3", "-m", "sglang_router.launch_router")
VLLM_SERVE = ("vllm", "serve")

# What a launch script would find on a typical host.
SAMPLE_HOST_VALUES = {
    "K2_SOCKET_IFNAME": "bond0",
    "K2_SOCKET_SUBNET": "10.0.0.0/16",
    "K2_KT_CPUINFER": "56",
    "K2_NUMA_NODES": "2",
}

# How far each checker goes for a golden launch.
OPTIONS: dict[str, dict[str, Any]] = {
    "sglang": {"expert_location": True},
    "sglang-kt": {},
    "sglang-router": {},
    "vllm": {"engine_config": True},
}


@dataclass(frozen=True)
class Launch:
    """One process of one host of one golden case."""

    case: str
    host: str
    name: str

    def __str__(self) -> str:
        return f"{self.case}/{self.host}/{self.name}"


def cases(prefix: str = "") -> list[str]:
    return sorted(
        p.name
        for p in GOLDEN.iterdir()
        if (p / "inventory.ini").exists() and p.name.startswith(prefix)
    )


@cache
def cluster(case: str) -> Cluster:
    return load_cluster(GOLDEN / case / "inventory.ini")


@cache
def plan(case: str) -> Plan:
    return build_plan(cluster(case))


def launches(case_names: Iterable[str], program: tuple[str, ...]) -> list[Launch]:
    """Every process of the cases whose argv starts with `program`."""
    return [
        Launch(case, host.name, proc.name)
        for case in case_names
        for host in plan(case).hosts
        for proc in host.processes
        if proc.argv[: len(program)] == program
    ]


def process(launch: Launch) -> Process:
    """The process as its launch script runs it, with sample host values."""
    proc = next(p for p in plan(launch.case).host(launch.host).processes if p.name == launch.name)
    return with_host_values(proc, SAMPLE_HOST_VALUES)


def pool_of(launch: Launch) -> PoolPlan:
    return next(p for p in plan(launch.case).pools if launch.host in p.hosts)


def engine_of(proc: Process) -> str:
    if proc.argv[:3] == SGLANG_SERVER:
        return "sglang"
    if proc.argv[:3] == SGLANG_ROUTER:
        return "sglang-router"
    if proc.argv[:2] == VLLM_SERVE:
        return "vllm"
    raise ValueError(f"no checker for {proc.argv[:3]}")


@cache
def verdict(launch: Launch) -> ParseResult:
    """The checker's verdict on one golden launch (once per session)."""
    proc = process(launch)
    # KTransformers launches sglang-kt's server, which its own parser checks.
    engine = "sglang-kt" if plan(launch.case).engine == "ktransformers" else engine_of(proc)
    return check(engine, list(proc.argv), dict(proc.env), options=OPTIONS[engine])
