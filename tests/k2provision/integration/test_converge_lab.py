"""Converge by difference on real lab hosts (the `lab` stream): a no-op apply changes nothing;
state drifted on one host (a rendered file's content or mode, a container removed or stopped)
is listed by --check and put back by a plain apply on that host only, through both doors
(`k2provision apply` and `ansible-playbook playbooks/site.yml`); the next apply is a no-op.
The drift runs take `--tags launch`: a decode rank's container replaced takes its instance
down for a moment, and the router's circuits to it stay open for a while after, so the smoke
test would judge the router's back-off, not the apply."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.pd_lab import k2
from tests.runners import BIN, ROOT, on_host

pytestmark = pytest.mark.lab

SCRIPTS = "/etc/k2provision/launch"


@pytest.fixture(scope="module")
def cluster(
    lab_cluster: Callable[[str], tuple[Any, Path]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path]:
    """The session's PD cluster, converged by an apply."""
    state, inventory = lab_cluster("pd")
    first = k2("apply", str(inventory), runs=tmp_path_factory.mktemp("first"))
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    return state, inventory


def changed_by_host(runs: Path) -> dict[str, int]:
    newest = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    summary = json.loads((newest / "summary.json").read_text())
    return {name: int(h.get("changed", 0)) for name, h in summary["hosts"].items()}


def recap_changed_by_host(stdout: str) -> dict[str, int]:
    recap = stdout[stdout.rindex("PLAY RECAP") :]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\S+)\s*:.*\bchanged=(\d+)", recap, re.M)}


def script_and_container(state: Any, host: str) -> tuple[str, str]:
    """One launch script of `host` and its router's container (the one container whose loss
    takes no other host's engine down: a PD instance's ranks span two hosts)."""
    script = on_host(state, host, f"ls {SCRIPTS}/*.sh | head -1").strip()
    container = on_host(
        state, host, "docker ps --format '{{.Names}}' --filter name=k2- | grep router"
    ).strip()
    assert script, f"{host} has no launch script"
    assert container, f"{host} runs no k2 container"
    return script, container


def fingerprint(state: Any) -> dict[str, str]:
    """Per host: the launch files' hashes and modes, and each running k2 container's id."""
    return {
        host.name: on_host(
            state,
            host.name,
            f"cd {SCRIPTS} && stat -c '%n %a' * && sha256sum *; "
            "docker ps --filter name=k2- --format '{{.ID}} {{.Names}} running' | sort",
        )
        for host in state.hosts
    }


def file_lines(text: str) -> list[str]:
    """The file lines of a fingerprint (`name mode` and `sha256  name`), not the containers'."""
    return [line for line in text.splitlines() if line.count(" ") == 1 or "  " in line]


def assert_put_back(state: Any, host: str, before: dict[str, str], container: str) -> None:
    """`host`'s files are as before and `container` runs again (a new one); nothing else on
    any host changed."""
    after = fingerprint(state)
    for name, text in before.items():
        if name != host:
            assert after[name] == text, f"{name} changed though it had not drifted"
    assert file_lines(after[host]) == file_lines(before[host]), after[host]
    assert re.search(rf"\S+ {re.escape(container)} running$", after[host], re.M), after[host]


def test_a_no_op_apply_changes_nothing(cluster: tuple[Any, Path], tmp_path: Path) -> None:
    _, inventory = cluster
    again = k2("apply", str(inventory), runs=tmp_path)
    assert again.returncode == 0, again.stdout[-4000:]
    assert set(changed_by_host(tmp_path).values()) == {0}


def test_apply_puts_back_a_changed_file_and_a_removed_container_there_only(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    host = state.hosts[0].name  # the router's host
    script, container = script_and_container(state, host)
    before = fingerprint(state)
    on_host(state, host, f"echo '# drifted' >> {script}; docker rm --force {container}")

    check = k2("apply", str(inventory), "--check", "--tags", "launch", runs=tmp_path / "check")
    assert check.returncode == 0, check.stdout[-4000:]
    assert f"file {script}: content differs from the plan" in check.stdout
    assert f"container {container}: missing" in check.stdout

    fix = k2("apply", str(inventory), "--tags", "launch", runs=tmp_path / "fix")
    assert fix.returncode == 0, fix.stdout[-4000:]
    changed = changed_by_host(tmp_path / "fix")
    assert changed[host] > 0
    assert {n: c for n, c in changed.items() if n != host} == dict.fromkeys(
        [h.name for h in state.hosts if h.name != host], 0
    )
    assert_put_back(state, host, before, container)

    again = k2("apply", str(inventory), "--tags", "launch", runs=tmp_path / "again")
    assert again.returncode == 0, again.stdout[-4000:]
    assert set(changed_by_host(tmp_path / "again").values()) == {0}


def test_ansible_playbook_puts_back_a_file_mode_and_a_stopped_container_there_only(
    cluster: tuple[Any, Path],
) -> None:
    state, inventory = cluster
    host = state.hosts[0].name  # the router's host
    script, container = script_and_container(state, host)
    before = fingerprint(state)
    on_host(state, host, f"chmod 0600 {script}; docker stop --time 1 {container}")

    def playbook(*extra: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml",
             "--tags", "launch", *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        return out

    check = playbook("--check")
    assert f"file {script}: mode 0600, planned 0755" in " ".join(check.stdout.split())
    assert f"container {container}: not running" in check.stdout

    fix = playbook()
    changed = recap_changed_by_host(fix.stdout)
    assert changed[host] > 0
    assert [n for n, c in changed.items() if c and n != host] == []
    assert_put_back(state, host, before, container)
    assert recap_changed_by_host(playbook().stdout) == dict.fromkeys(changed, 0)
