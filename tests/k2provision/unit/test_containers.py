"""docker argv of planned processes: production options, lab profile, change detection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import LABEL_HASH, exec_argv, run_argv, spec_hash
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]


def test_production_container_gets_host_network_ipc_gpus_rdma_and_memlock() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    host = plan.hosts[4]
    argv = run_argv(plan.container, host.processes[0], plan.config_dir, host.files)
    joined = " ".join(argv)
    for expected in (
        "--network host",
        "--ipc host",
        "--gpus all",
        "--device /dev/infiniband",
        "--ulimit memlock=-1:-1",
        "--cap-add IPC_LOCK",
        "--volume /models/Kimi-K2-Instruct:/models/Kimi-K2-Instruct:ro",
    ):
        assert expected in joined, expected
    assert argv[-2:] == ["sh", f"/etc/k2provision/launch/{host.processes[0].name}.sh"]
    assert any(a.startswith(f"{LABEL_HASH}=") for a in argv)


def test_lab_container_drops_what_lab_hosts_cannot_grant(tmp_path: Path) -> None:
    inv = tmp_path / "lab.ini"
    inv.write_text((ROOT / "inventory" / "prod.ini").read_text() + "k2_lab=true\n")
    plan = build_plan(load_cluster(inv))
    host = plan.hosts[0]
    joined = " ".join(run_argv(plan.container, host.processes[0], plan.config_dir, host.files))
    assert "--gpus" not in joined
    assert "memlock" not in joined
    assert "/dev/infiniband" not in joined
    assert "--network host --ipc host" in joined


def test_hash_is_the_label_and_the_same_for_the_same_spec() -> None:
    """Two plans built apart from the same inventory give each container the same label, so a
    converged host is left alone; the label a started container carries is that hash."""
    first = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    again = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    hashes = {
        (host.name, proc.name): spec_hash(first.container, proc, host.files)
        for host in first.hosts
        for proc in host.processes
    }
    assert hashes == {
        (host.name, proc.name): spec_hash(again.container, proc, host.files)
        for host in again.hosts
        for proc in host.processes
    }
    assert all(re.fullmatch(r"[0-9a-f]{16}", h) for h in hashes.values())
    # Processes of different shape differ: prefill rank 0, its router, a decode rank.
    assert (
        len(
            {
                hashes[("gpu-p01", "sglang-prefill")],
                hashes[("gpu-p01", "sglang-router")],
                hashes[("gpu-d01", "sglang-decode")],
            }
        )
        == 3
    )
    host = first.hosts[0]
    proc = host.processes[0]
    argv = run_argv(first.container, proc, first.config_dir, host.files)
    assert f"{LABEL_HASH}={hashes[(host.name, proc.name)]}" in argv


def test_hash_changes_with_any_file_of_the_host() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    host = plan.hosts[0]
    proc = host.processes[0]
    base = spec_hash(plan.container, proc, host.files)
    edited = {**host.files, "/etc/k2provision/extra.yml": "x: 1\n"}
    assert spec_hash(plan.container, proc, edited) != base
    assert (
        spec_hash(plan.container.model_copy(update={"privileged": True}), proc, host.files) != base
    )


def test_exec_records_a_pid_file() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    proc = plan.hosts[0].processes[0]
    argv = exec_argv(proc, "/etc/k2provision")
    assert argv[:4] == ["docker", "exec", "--detach", proc.container]
    assert f"/run/k2-{proc.name}.pid" in argv[-1]
    assert argv[-1].endswith(f">> /run/k2-{proc.name}.log 2>&1")


def test_router_container_asks_for_no_gpus_or_rdma() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    router = next(p for p in plan.hosts[0].processes if p.name == "sglang-router")
    joined = " ".join(run_argv(plan.container, router, plan.config_dir, plan.hosts[0].files))
    assert "--gpus" not in joined
    assert "/dev/infiniband" not in joined
    assert "--network host" in joined


def test_identical_processes_on_two_hosts_hash_each_hosts_own_files() -> None:
    """Every rank's sshd in an mpirun world is the same process; only its host's rendered files
    differ. The launch filters take the host the tasks run for, so each container's label is
    its own host's hash, the one status computes."""
    from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
        docker_spec_hash,
    )

    plan = build_plan(load_cluster(ROOT / "tests" / "golden" / "trtllm-tp16-ep8" / "inventory.ini"))
    doc = plan.model_dump(mode="json")
    first, second = plan.hosts[0], plan.hosts[1]
    twin = next(p for p in second.processes if p in first.processes)
    assert first.files != second.files
    process = twin.model_dump(mode="json")
    for host in (first, second):
        assert docker_spec_hash(process, doc, host.name) == spec_hash(
            plan.container, twin, host.files
        )
    with pytest.raises(ValueError, match="name the host") as refused:
        docker_spec_hash(process, doc)
    assert first.name in str(refused.value)
    assert second.name in str(refused.value)


def test_a_failed_stage_names_its_containers_on_the_hosts_left_out_of_the_run() -> None:
    """stop_stage.yml stops, from a host in the run, the failed stage's containers on the hosts
    the look left out: exactly those of that stage on those hosts, no exec'd process (its
    container is the one stopped), no other stage's container, no other host's."""
    from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter import (
        k2 as k2_filters,
    )

    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini")).model_dump(mode="json")
    hosts = [h["name"] for h in plan["hosts"]]
    by_stage: dict[int, list[dict[str, str]]] = {}
    for stage in k2_filters.plan_stages(plan):
        by_stage[stage] = k2_filters.stage_containers_on(plan, str(stage), hosts[1:])
    expected = {
        stage: [
            {"host": h["name"], "container": p["container"]}
            for h in plan["hosts"][1:]
            for p in h["processes"]
            if p["stage"] == stage and not p["exec_in"]
        ]
        for stage in by_stage
    }
    assert by_stage == expected
    assert all(pair["host"] != hosts[0] for pairs in by_stage.values() for pair in pairs)
    assert sum(map(len, by_stage.values())) > 0
    assert k2_filters.stage_containers_on(plan, 0, []) == []
