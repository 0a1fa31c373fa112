"""k2_lab_fault: carried by a lab plan to that host's engine containers as K2_LAB_FAULT, and
nowhere else."""

from __future__ import annotations

from pathlib import Path

from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import run_argv, spec_hash
from k2provision.plan.inventory import load_cluster

PD = (
    "[prefill]\np1 ansible_host=10.0.0.11\np2 ansible_host=10.0.0.12\n"
    "[decode]\nd1 ansible_host=10.0.0.21 {fault}\nd2 ansible_host=10.0.0.22\n"
    "[all:vars]\nk2_lab=true\nk2_engine=sglang\nk2_layout=pd\nk2_context_length=32768\n"
)


def argvs(tmp_path: Path, fault: str) -> dict[str, list[str]]:
    inventory = tmp_path / "pd.ini"
    inventory.write_text(PD.format(fault=fault))
    plan = build_plan(load_cluster(inventory))
    return {
        f"{h.name}/{p.name}": run_argv(plan.container, p, plan.config_dir, dict(h.files))
        for h in plan.hosts
        for p in h.processes
    }


def without_hash(argv: list[str]) -> list[str]:
    return [item for item in argv if not item.startswith("io.k2provision.hash=")]


def test_the_fault_reaches_only_its_hosts_containers(tmp_path: Path) -> None:
    plain = argvs(tmp_path, "")
    faulty = argvs(tmp_path, "k2_lab_fault=die_after=20")
    assert "--env" in faulty["d1/sglang-decode"]
    assert "K2_LAB_FAULT=die_after=20" in faulty["d1/sglang-decode"]
    assert faulty["d1/sglang-decode"] != plain["d1/sglang-decode"]  # a new spec: recreated
    # d2 runs the other rank of d1's decode instance: a new spec of one rank is a new spec of
    # the whole instance (its hash label changes, nothing else); the prefill is untouched.
    assert faulty["d2/sglang-decode"] != plain["d2/sglang-decode"]
    assert without_hash(faulty["d2/sglang-decode"]) == without_hash(plain["d2/sglang-decode"])
    for key in plain:
        if key not in ("d1/sglang-decode", "d2/sglang-decode"):
            assert faulty[key] == plain[key], key
        if key != "d1/sglang-decode":
            assert not any("K2_LAB_FAULT" in item for item in faulty[key]), key


def test_without_a_fault_the_spec_hash_is_unchanged(tmp_path: Path) -> None:
    """A process without a fault serializes (and hashes) as before the field existed."""
    inventory = tmp_path / "pd.ini"
    inventory.write_text(PD.format(fault=""))
    plan = build_plan(load_cluster(inventory))
    process = plan.hosts[0].processes[0]
    assert "lab_fault" not in process.model_dump(mode="json")
    faulty = process.model_copy(update={"lab_fault": "never_healthy"})
    assert spec_hash(plan.container, faulty, {}) != spec_hash(plan.container, process, {})
