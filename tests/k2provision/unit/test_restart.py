"""The restart set over the golden plans: named hosts widened to whole instances, in stage
order; the router alone; unknown names refused; the filter the playbook reads; the command's
refusal without a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    restart_set as restart_filter,
)
from k2provision.commands.restart import set_document
from k2provision.core.records import Plan
from k2provision.errors import K2Error
from k2provision.ops.restart import NAMED, restart_set
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from k2provision.plan.shapes import sizes_text
from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"


def plan_of(case: str) -> Plan:
    return build_plan(load_cluster(GOLDEN / case / "inventory.ini"))


def rows(case: str, names: list[str] | None) -> list[tuple[int, str, str, bool]]:
    """(stage, host, process, named) of each step, in restart order."""
    chosen = restart_set(plan_of(case), names)
    return [(s.stage, s.host, s.process, s.reason == NAMED) for s in chosen.steps]


def test_a_decode_rank_restarts_its_whole_decode_instance_and_nothing_else() -> None:
    plan = plan_of("sglang-pd-4p12d")
    chosen = restart_set(plan, ["gpu-d03"])
    decode = next(p for p in plan.pools if p.name == "decode")
    assert chosen.named == ("gpu-d03",)
    assert chosen.hosts == decode.hosts
    assert {s.process for s in chosen.steps} == {"sglang-decode"}
    assert [s.host for s in chosen.steps if s.reason == NAMED] == ["gpu-d03"]
    widened = {s.host for s in chosen.widened}
    assert widened == set(decode.hosts) - {"gpu-d03"}
    assert all("same decode instance as gpu-d03" in s.reason for s in chosen.widened)
    assert all("its ranks only work together" in s.reason for s in chosen.widened)
    assert chosen.containers("gpu-d01") == ("k2-sglang",)


def test_the_colocated_router_restarts_alone() -> None:
    # The 4p12d router runs beside prefill rank 0: `router` must not take the prefill pool.
    assert rows("sglang-pd-4p12d", ["router"]) == [(1, "gpu-p01", "sglang-router", True)]


def test_naming_the_router_host_restarts_both_in_stage_order() -> None:
    steps = rows("sglang-pd-4p12d", ["gpu-p01"])
    assert steps[0] == (0, "gpu-p01", "sglang-prefill", True)
    assert {h for _, h, p, named in steps[1:-1]} == {"gpu-p02", "gpu-p03", "gpu-p04"}
    assert all(not named for *_, named in steps[1:-1])
    assert steps[-1] == (1, "gpu-p01", "sglang-router", True)
    assert [stage for stage, *_ in steps] == sorted(stage for stage, *_ in steps)


def test_a_pool_name_restarts_its_engine_ranks() -> None:
    chosen = restart_set(plan_of("sglang-pd-4p12d"), ["prefill"])
    assert chosen.hosts == ("gpu-p01", "gpu-p02", "gpu-p03", "gpu-p04")
    assert {s.process for s in chosen.steps} == {"sglang-prefill"}
    assert not chosen.widened


def test_one_node_pd_pools_restart_alone() -> None:
    assert rows("sglang-pd-1p1d", ["pd-d01"]) == [(0, "pd-d01", "sglang-decode", True)]


def test_an_mpirun_world_restarts_whole_with_its_execd_server() -> None:
    chosen = restart_set(plan_of("trtllm-tp16-ep8"), ["node-02"])
    assert [(s.stage, s.host, s.process, s.exec_in) for s in chosen.steps] == [
        (0, "node-01", "sshd", False),
        (0, "node-02", "sshd", False),
        (1, "node-01", "trtllm-serve", True),
    ]
    assert chosen.containers("node-01") == ("k2-trtllm",)


def test_a_ray_worker_restarts_its_head_and_the_server_in_stage_order() -> None:
    assert rows("vllm-tp16", ["gpu-a02"]) == [
        (0, "gpu-a01", "ray-head", False),
        (1, "gpu-a02", "ray-worker", True),
        (2, "gpu-a01", "vllm-serve", False),
    ]


def test_a_dp_ep_rank_restarts_its_instance() -> None:
    assert rows("vllm-dp16-ep", ["gpu-c02"]) == [
        (0, "gpu-c01", "vllm-serve", False),
        (0, "gpu-c02", "vllm-headless", True),
    ]


def test_no_names_is_every_process_of_the_plan() -> None:
    plan = plan_of("sglang-pd-1p1d")
    chosen = restart_set(plan, None)
    assert chosen.named == tuple(h.name for h in plan.hosts)
    assert len(chosen.steps) == sum(len(h.processes) for h in plan.hosts)
    assert not chosen.widened


def test_unknown_names_are_refused_each_named() -> None:
    with pytest.raises(K2Error) as refused:
        restart_set(plan_of("sglang-pd-1p1d"), ["pd-d01", "pd-d09", "gpus"])
    assert len(refused.value.problems) == 2
    assert "'pd-d09'" in refused.value.problems[0]
    assert "pd-p01, pd-d01, pd-router, prefill, decode, router" in refused.value.problems[0]
    assert "fix:" in refused.value.problems[1]
    with pytest.raises(K2Error, match="no host named"):
        restart_set(plan_of("sglang-pd-1p1d"), [" ", ""])


def test_a_layout_is_described_by_its_sizes_above_one() -> None:
    pools = {p.name: p for p in plan_of("trtllm-tp16-ep8").pools}
    assert sizes_text(pools["nodes"].parallel) == "tp 16, dp 16 (attn), ep 8"
    pools = {p.name: p for p in plan_of("vllm-tp8-pp2").pools}
    assert sizes_text(pools["nodes"].parallel) == "tp 8, pp 2, dcp 8"


def test_the_playbook_filter_reads_the_same_set_from_the_registered_plan() -> None:
    plan = plan_of("sglang-pd-4p12d").model_dump(mode="json")
    got = restart_filter(plan, "gpu-d03")
    assert got["hosts"] == [f"gpu-d{i:02d}" for i in range(1, 13)]
    assert got["containers"]["gpu-d07"] == ["k2-sglang"]
    assert restart_filter(plan, ["router"]) == {
        "hosts": ["gpu-p01"],
        "containers": {"gpu-p01": ["k2-router"]},
    }
    assert len(restart_filter(plan, None)["hosts"]) == 16
    with pytest.raises(ValueError, match="'nope'"):
        restart_filter(plan, "nope")


def test_without_a_terminal_or_yes_restart_shows_the_set_and_refuses(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = k2("restart", "inventory/prod.ini", "--limit", "gpu-d05", runs=runs, COLUMNS="250")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "gpu-d05" in out.stdout
    assert "gpu-d12" in out.stdout
    assert "restart 12 process(es) on 12 host(s)" in out.stdout
    assert "the ranks of one instance restart together" in out.stdout
    assert "pass --yes" in out.stderr
    assert not runs.exists()  # refused before any run record, let alone a host


def test_an_unknown_host_is_exit_2_naming_it(tmp_path: Path) -> None:
    out = k2(
        "restart", "inventory/prod.ini", "--limit", "gpu-x01", "--yes", runs=tmp_path, COLUMNS="250"
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "'gpu-x01'" in out.stderr
    assert "restart, in stage order" not in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_restart_json_keeps_the_set() -> None:
    doc = set_document(restart_set(plan_of("trtllm-tp16-ep8"), ["node-02"]))
    assert doc["named"] == ["node-02"]
    assert doc["hosts"] == ["node-01", "node-02"]
    assert [s["process"] for s in doc["steps"]] == ["sshd", "sshd", "trtllm-serve"]
    assert json.loads(json.dumps(doc)) == doc
