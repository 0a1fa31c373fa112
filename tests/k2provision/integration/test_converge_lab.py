"""Converge by difference on real lab hosts (the `lab` stream): each kind of state drifted on one
host is listed and put back by a plain apply on that host only, through both doors (`k2provision
apply` and `ansible-playbook playbooks/site.yml`), and the next apply is a no-op (test_apply.py
finds the same right after a first apply, on the lab-pd cluster). One apply per door drifts
several kinds at once, each on its own host, the fourth host untouched: a rendered launch script
(content, mode) and the router's container (removed, stopped) on the router's host, a package
the prepare phase holds (`ibverbs-utils`, removed), a mesh key (authorized_keys replaced, the
private key's mode) and a weight shard of the synthetic checkpoint (deleted, a byte
overwritten). The run's events (and ansible-playbook's output) name which tasks changed on which
host. No role sets a sysctl, and lab hosts load no kernel module (hardware only), so neither
drifts here (the unit tests judge a missing module). The router's host carries the container
drift, so the smoke test, which asks the router, runs as part of the plain apply."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.pd_lab import MODEL_DIR, k2
from tests.runners import BIN, ROOT, newest_record, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

SCRIPT = "/etc/k2provision/launch/sglang-router.sh"
ROUTER = "k2-router"
PACKAGE = "ibverbs-utils"
MESH = "/etc/k2provision/ssh"
SHARD = f"{MODEL_DIR}/model-2-of-2.safetensors"
# The synthetic checkpoint the weights phase streams to every engine host: two small shards.
WEIGHTS_VARS = (
    "k2_weights_source=synthetic\n"
    "k2_weights_synthetic_shards=2\n"
    "k2_weights_synthetic_shard_bytes=4194304\n"
    "k2_weights_poll_interval=1\n"
)
# The task that puts back each kind of drift.
WRITE_FILES = "Files | Write the files the look found off the plan (one call)"
REINSTALL = "Install | RDMA userspace from the distribution"
RESEND = (
    "Distribute | Follow every receiving relay to its summary (a dead host is reported, not fatal)"
)


@pytest.fixture(scope="module")
def cluster(
    lab_cluster: Callable[[str], tuple[Any, Path]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    """The session's PD cluster with synthetic weights ([all:vars] is the inventory's last
    section), converged by an apply."""
    state, shared = lab_cluster("pd")
    inventory = tmp_path_factory.mktemp("converge") / "converge.ini"
    inventory.write_text(shared.read_text() + WEIGHTS_VARS)
    first = k2("apply", str(inventory), runs=tmp_path_factory.mktemp("first"))
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    return state, inventory


def changed_by_host(runs: Path) -> dict[str, int]:
    summary = json.loads((newest_record(runs) / "summary.json").read_text())
    return {name: int(h.get("changed", 0)) for name, h in summary["hosts"].items()}


def changed_tasks(runs: Path, hosts: list[str]) -> dict[str, set[str]]:
    """Per host, the tasks that changed something there (the run's events)."""
    found: dict[str, set[str]] = {host: set() for host in hosts}
    for path in (newest_record(runs) / "artifacts").glob("*/job_events/*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        if event.get("event") in {"runner_on_ok", "runner_item_on_ok"} and (
            (data.get("res") or {}).get("changed")
        ):
            found[str(data["host"])].add(str(data["task"]))
    return found


def changed_tasks_in_output(stdout: str, hosts: list[str]) -> dict[str, set[str]]:
    """Per host, the tasks ansible-playbook reported `changed` for."""
    found: dict[str, set[str]] = {host: set() for host in hosts}
    task = ""
    for line in stdout.splitlines():
        header = re.match(r"^TASK \[(?:[\w.]+ : )?(.*)\] \**$", line)
        if header:
            task = header[1]
        changed = re.match(r"^changed: \[([^\]\s]+)", line)
        if changed:
            found[changed[1]].add(task)
    return found


def fingerprint(state: Any) -> dict[str, str]:
    """Per host: what the drifts touch (the launch files, each running k2 container's id, the
    package, the mesh files, the model directory's files), by hash, mode or id."""
    return {
        host.name: on_host(
            state,
            host.name,
            f"cd /etc/k2provision/launch && stat -c '%n %a' * && sha256sum *; "
            "docker ps --filter name=k2- --format '{{.ID}} {{.Names}} running' | sort; "
            f"dpkg-query -W -f '${{Package}} ${{db:Status-Abbrev}}\\n' {PACKAGE}; "
            f"cd {MESH} && stat -c '%n %a' * && sha256sum *; "
            f"cd {MODEL_DIR} && sha256sum *",
        )
        for host in state.hosts
    }


def held_lines(text: str) -> list[str]:
    """A fingerprint without its containers' ids (a recreated container has a new one)."""
    return [line for line in text.splitlines() if not line.endswith(" running")]


def assert_put_back(state: Any, before: dict[str, str], container_host: str) -> None:
    """Every host holds what it held before the drift; the router's container runs again."""
    after = fingerprint(state)
    for name, text in before.items():
        if name == container_host:
            assert held_lines(after[name]) == held_lines(text), after[name]
            assert re.search(rf"\S+ {ROUTER} running$", after[name], re.M), after[name]
        else:
            assert after[name] == text, f"{name} is not as before:\n{after[name]}"


def test_apply_puts_back_each_drifted_kind_there_only(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    router, package_host, shard_host, untouched = (h.name for h in state.hosts)
    before = fingerprint(state)
    on_host(state, router, f"echo '# drifted' >> {SCRIPT}; docker rm --force {ROUTER}")
    on_host(
        state,
        package_host,
        f"dpkg --remove {PACKAGE}; "
        f"echo 'restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDrifted' > {MESH}/authorized_keys",
    )
    on_host(state, shard_host, f"rm {SHARD}")

    fix = k2("apply", str(inventory), runs=tmp_path / "fix")
    assert fix.returncode == 0, fix.stdout[-4000:]
    listed = " ".join(fix.stdout.split())
    for line in (
        f"{router}: launch: file {SCRIPT}: content differs from the plan",
        f"{router}: launch: container {ROUTER}: missing",
        f"{package_host}: prepare: package {PACKAGE}: not installed",
        f"{package_host}: ssh_mesh: mesh {MESH}/authorized_keys: does not hold the mesh key only",
        f"{shard_host}: weights: weights {SHARD}: missing",
    ):
        assert line in listed, line
    assert changed_tasks(tmp_path / "fix", [h.name for h in state.hosts]) == {
        router: {WRITE_FILES, "Stage | Replace stale containers (stage 1)"},
        package_host: {REINSTALL, "Configure | Root logs in with the mesh key only"},
        shard_host: {RESEND},
        untouched: set(),
    }
    assert_put_back(state, before, router)

    again = k2("apply", str(inventory), runs=tmp_path / "again")
    assert again.returncode == 0, again.stdout[-4000:]
    assert set(changed_by_host(tmp_path / "again").values()) == {0}


def test_ansible_playbook_puts_back_each_drifted_kind_there_only(
    cluster: tuple[Any, Path],
) -> None:
    state, inventory = cluster
    router, shard_host, package_host, untouched = (h.name for h in state.hosts)
    hosts = [h.name for h in state.hosts]
    before = fingerprint(state)
    on_host(state, router, f"chmod 0600 {SCRIPT}; docker stop --time 1 {ROUTER}")
    on_host(state, package_host, f"dpkg --remove {PACKAGE}; chmod 0644 {MESH}/id_ed25519")
    on_host(state, shard_host, f"printf x | dd of={SHARD} bs=1 seek=4096 conv=notrunc")

    def playbook(*extra: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml", *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        return out

    # The look lists every phase's differences whatever the tags run (only the launch here).
    check = " ".join(playbook("--check", "--tags", "launch").stdout.split())
    for line in (
        f"launch: file {SCRIPT}: mode 0600, planned 0755",
        f"launch: container {ROUTER}: not running",
        f"prepare: package {PACKAGE}: not installed",
        f"ssh_mesh: mesh {MESH}/id_ed25519: mode 0644, planned 0600",
        f"weights: weights {SHARD}: unverified",
    ):
        assert line in check, line

    fix = playbook()
    assert changed_tasks_in_output(fix.stdout, hosts) == {
        router: {WRITE_FILES, "Stage | Replace stale containers (stage 1)"},
        package_host: {REINSTALL, "Configure | The mesh's private key (never logged)"},
        shard_host: {RESEND},
        untouched: set(),
    }
    assert_put_back(state, before, router)
    assert set(re.findall(r"\bchanged=(\d+)", playbook().stdout)) == {"0"}
