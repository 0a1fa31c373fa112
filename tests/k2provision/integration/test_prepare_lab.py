"""preflight, prepare and ssh_mesh on 4 fresh lab hosts, through `k2provision apply`.

On a lab instance of its own (never prepared before), as a 2-prefill/2-decode SGLang cluster:
`--check` first, then the real run, a second run and `--check` again. The check must predict
exactly the changes of the real run, host by host and task by task; the second run and the
last check must change nothing; the hosts must then hold what the phases promise (RDMA
packages, memlock limits, the ssh mesh with every host's real key pinned, its files checked);
and no run record may hold the mesh's private key.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin
from tests.lab_support import require_lab
from tests.runners import on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PHASES = "preflight,prepare,ssh_mesh"
INSTANCE = LabConfig(lab_dir=default_lab_dir(), name="k2prep", subnet="10.200.0.0/24")
LAB_VARS: dict[str, lab.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_model_dir": "/models/Kimi-K2-Instruct",
    "k2_context_length": 32768,
}
MESH = "/etc/k2provision/ssh"
CHECK_MODE_SUFFIX = re.compile(r" \(check mode: [^)]*\)$")


def apply(
    inventory: Path, runs: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`k2provision apply` as a user runs it; returns the process and its run record."""
    before = set(runs.iterdir()) if runs.exists() else set()
    done = subprocess.run(
        [str(BIN / "k2provision"), "apply", str(inventory), "--tags", PHASES, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "K2_RUNS_DIR": str(runs),
            "COLUMNS": "200",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    (record,) = set(runs.iterdir()) - before
    return done, record


def changed_tasks(record: Path) -> set[tuple[str, str]]:
    """(host, task) of every task that reported a change, check-mode stand-ins named as the
    tasks they stand for."""
    changed = set()
    for path in record.glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("res", {}).get("changed"):
            changed.add((data["host"], CHECK_MODE_SUFFIX.sub("", data["task"])))
    return changed


def summary(record: Path) -> dict[str, Any]:
    return dict(json.loads((record / "summary.json").read_text()))


@pytest.fixture(scope="module")
def fresh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[lab.LabState, Path]]:
    require_lab()
    inventory = tmp_path_factory.mktemp("inventory") / "prep-lab.ini"
    lab.down(cfg=INSTANCE, log=lab.quiet_log)  # hosts that were never prepared
    state = lab.up(
        4,
        inventory=inventory,
        groups={"prefill": 2, "decode": 2},
        all_vars=LAB_VARS,
        cfg=INSTANCE,
        log=lab.quiet_log,
    )
    build_standin()
    yield state, inventory
    lab.down(cfg=INSTANCE, log=lab.quiet_log)


@pytest.fixture(scope="module")
def runs(
    fresh_lab: tuple[lab.LabState, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """--check, the first run, the second, and --check again, in that order, on the fresh
    hosts."""
    _, inventory = fresh_lab
    records = tmp_path_factory.mktemp("runs")
    out = {}
    steps = (("check", ("--check",)), ("first", ()), ("second", ()), ("recheck", ("--check",)))
    for name, extra in steps:
        done, record = apply(inventory, records, *extra)
        assert done.returncode == 0, f"{name}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        out[name] = (done, record)
    return out


def test_first_run_converges_the_hosts(runs: dict[str, Any]) -> None:
    done, record = runs["first"]
    assert "LAB PROFILE" in done.stdout
    hosts = summary(record)["hosts"]
    assert sorted(hosts) == ["lab1", "lab2", "lab3", "lab4"]
    assert all(h.get("changed", 0) > 0 for h in hosts.values())
    assert summary(record)["failures"] == {}


def test_check_predicts_the_first_run_exactly(runs: dict[str, Any]) -> None:
    predicted = changed_tasks(runs["check"][1])
    happened = changed_tasks(runs["first"][1])
    assert predicted, "check mode predicted nothing on fresh hosts"
    assert predicted == happened, {
        "predicted only": sorted(predicted - happened),
        "happened only": sorted(happened - predicted),
    }
    check_hosts = summary(runs["check"][1])["hosts"]
    first_hosts = summary(runs["first"][1])["hosts"]
    assert {h: v.get("changed", 0) for h, v in check_hosts.items()} == {
        h: v.get("changed", 0) for h, v in first_hosts.items()
    }


@pytest.mark.parametrize("run", ["second", "recheck"])
def test_a_converged_cluster_has_nothing_to_change(runs: dict[str, Any], run: str) -> None:
    hosts = summary(runs[run][1])["hosts"]
    assert {h: v.get("changed", 0) for h, v in hosts.items()} == dict.fromkeys(hosts, 0)
    assert changed_tasks(runs[run][1]) == set()


def test_hosts_hold_what_the_phases_promise(
    fresh_lab: tuple[lab.LabState, Path], runs: dict[str, Any]
) -> None:
    state, _ = fresh_lab
    for host in state.hosts:
        packages = on_host(
            state,
            host.name,
            "dpkg-query -W -f='${Package} ${Status}\\n' rdma-core ibverbs-utils infiniband-diags",
        )
        assert packages.count("install ok installed") == 3, packages
        limits = on_host(state, host.name, "cat /etc/security/limits.d/90-k2-memlock.conf")
        assert re.search(r"(?m)^root\s+hard\s+memlock\s+unlimited$", limits)
        known = on_host(state, host.name, f"cat {MESH}/known_hosts")
        for peer in state.hosts:
            key = on_host(state, peer.name, f"cut -d' ' -f1,2 {MESH}/ssh_host_ed25519_key.pub")
            assert f"[{peer.address}]:2233,[{peer.name}]:2233 {key.strip()}" in known
        private = f"{MESH}/id_ed25519 {MESH}/ssh_host_ed25519_key {MESH}/authorized_keys"
        modes = on_host(state, host.name, f"stat -c '%a %U %n' {private}")
        assert [line.split()[:2] for line in modes.splitlines()] == [["600", "root"]] * 3
        left = on_host(state, host.name, "docker ps -a --format '{{.Names}}'")
        assert "k2-ssh-mesh-check" not in left
    first = runs["first"][0].stdout + runs["second"][0].stdout
    assert "StrictHostKeyChecking=no" not in first


def test_the_mesh_was_checked_then_judged_converged_changing_nothing(
    runs: dict[str, Any],
) -> None:
    """Before launch no engine container serves the mesh: on the first run each host's key pair
    and sshd configuration are checked instead, and no container is started for it. On the
    second the look finds the mesh as the first left it on every host, so the mesh's play
    ends every host at its start (converge by difference) and nothing changes."""
    mesh_checks: dict[str, set[str]] = {}
    converged: dict[str, set[str]] = {}
    for name in ("first", "second"):
        mesh_checks[name], converged[name] = set(), set()
        for path in runs[name][1].glob("artifacts/*/job_events/*.json"):
            event = json.loads(path.read_text())
            data = event.get("event_data", {})
            if event.get("event") != "runner_on_ok":
                continue
            res = data.get("res", {})
            msg = str(res.get("msg", ""))
            if data.get("task", "").startswith("Verify | The mesh is sound"):
                assert msg == (
                    f"{data['host']}: the mesh key is the authorized one and sshd accepts the "
                    "configuration on port 2233; all pairs are checked once the engine "
                    "containers serve the mesh (launch)"
                ), msg
                mesh_checks[name].add(data["host"])
            if data.get("task") == "What differs from the plan" and "ssh_mesh" in res.get(
                "skipped_phases", []
            ):
                converged[name].add(data["host"])
    every = {"lab1", "lab2", "lab3", "lab4"}
    assert mesh_checks["first"] == every
    assert converged["first"] == set()
    assert mesh_checks["second"] == set()
    assert converged["second"] == every
    assert changed_tasks(runs["second"][1]) == set()


def test_no_record_holds_the_private_key(runs: dict[str, Any]) -> None:
    key = (ROOT / ".cache" / "k2-ssh" / "prep-lab" / "id_ed25519").read_text()
    body = [line for line in key.splitlines() if line and not line.startswith("-----")]
    assert body
    for _, record in runs.values():
        for path in record.rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert "PRIVATE KEY" not in text, path
                assert not any(line in text for line in body), path
