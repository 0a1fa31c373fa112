"""apply on real lab hosts: converge, zero changes on re-apply, --check, parity with plain
ansible-playbook, and faults (bad inventory, a host that is down)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.pd_lab import (
    k2,
    remove_engine_containers,
)
from tests.runners import BIN, ROOT, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]


def last_summary(runs: Path) -> dict[str, Any]:
    newest = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    return dict(json.loads((newest / "summary.json").read_text()))


def changed(summary: dict[str, Any]) -> int:
    return sum(int(h.get("changed", 0)) for h in summary["hosts"].values())


@pytest.fixture(scope="module")
def cluster(pd_cluster: tuple[Any, Path]) -> Iterator[tuple[Any, Path]]:
    """The session's 2-prefill / 2-decode SGLang PD cluster, stand-in engines, none running:
    the first apply has work to do."""
    state, _ = pd_cluster
    remove_engine_containers(state)
    yield pd_cluster
    remove_engine_containers(state)


def served_models(address: str, port: int) -> list[str]:
    with urllib.request.urlopen(f"http://{address}:{port}/v1/models", timeout=10) as reply:
        return [m["id"] for m in json.loads(reply.read())["data"]]


def test_apply_converges_serves_and_reapplies_with_zero_changes(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    first = k2("apply", str(inventory), runs=tmp_path)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert "LAB PROFILE" in first.stdout
    assert changed(last_summary(tmp_path)) > 0
    router = state.hosts[0].address
    assert served_models(router, 8000) == ["kimi-k2"]

    again = k2("apply", str(inventory), runs=tmp_path)
    assert again.returncode == 0, again.stdout[-4000:]
    assert changed(last_summary(tmp_path)) == 0

    check = k2("apply", str(inventory), "--check", runs=tmp_path)
    assert check.returncode == 0, check.stdout[-4000:]
    assert changed(last_summary(tmp_path)) == 0


def test_check_predicts_a_changed_launch_script(cluster: tuple[Any, Path], tmp_path: Path) -> None:
    state, inventory = cluster
    decode0 = state.hosts[2].name
    on_host(state, decode0, "echo '# edited by hand' >> /etc/k2provision/launch/sglang-decode.sh")
    check = k2("apply", str(inventory), "--check", "--tags", "launch", runs=tmp_path)
    assert check.returncode == 0, check.stdout[-4000:]
    summary = last_summary(tmp_path)
    assert summary["hosts"][decode0]["changed"] >= 1
    assert "edited by hand" in on_host(state, decode0, "cat /etc/k2provision/launch/*.sh")
    fix = k2("apply", str(inventory), "--tags", "launch", runs=tmp_path)
    assert fix.returncode == 0, fix.stdout[-4000:]
    assert "edited by hand" not in on_host(state, decode0, "cat /etc/k2provision/launch/*.sh")


def rendered_paths(inventory: Path) -> dict[str, list[str]]:
    """Per host, the files the plan renders (keys made by the ssh mesh are not the plan's)."""
    plan = build_plan(load_cluster(inventory))
    return {h.name: sorted(h.files) for h in plan.hosts}


def files_on_hosts(state: Any, paths: dict[str, list[str]]) -> dict[str, str]:
    return {
        host.name: on_host(state, host.name, "sha256sum " + " ".join(paths[host.name]))
        for host in state.hosts
    }


def recap_changed(stdout: str) -> int:
    """Total `changed=N` over ansible-playbook's PLAY RECAP lines."""
    recap = stdout[stdout.rindex("PLAY RECAP") :]
    return sum(int(n) for n in re.findall(r"\bchanged=(\d+)", recap))


def test_ansible_playbook_does_the_same_work_with_the_main_install_alone(
    cluster: tuple[Any, Path], tmp_path: Path, main_install: Path
) -> None:
    """Plain ansible-playbook from a venv holding only `pip install -e .` (no test extra)
    converges the same files as the wrapper, then re-applies with zero changes."""
    state, inventory = cluster
    paths = rendered_paths(inventory)
    assert sum(len(p) for p in paths.values()) >= len(state.hosts)
    assert k2("apply", str(inventory), runs=tmp_path).returncode == 0
    via_wrapper = files_on_hosts(state, paths)
    assert k2("stop", str(inventory), runs=tmp_path).returncode == 0
    for host in state.hosts:
        on_host(state, host.name, "rm -f " + " ".join(paths[host.name]))
    env = {**os.environ, "PATH": f"{main_install}:{os.environ['PATH']}"}

    def plain_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(main_install / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    first = plain_run()
    assert first.returncode == 0, first.stdout[-4000:]
    assert recap_changed(first.stdout) > 0
    assert files_on_hosts(state, paths) == via_wrapper
    assert served_models(state.hosts[0].address, 8000) == ["kimi-k2"]
    again = plain_run()
    assert again.returncode == 0, again.stdout[-4000:]
    assert recap_changed(again.stdout) == 0, again.stdout[-4000:]


def test_bad_inventory_touches_no_host(cluster: tuple[Any, Path], tmp_path: Path) -> None:
    _, inventory = cluster
    bad = tmp_path / "bad.ini"
    # 96 GB GPUs: each pool needs more nodes than the lab has (the fix names how many).
    text = inventory.read_text().replace("k2_layout=pd", "k2_layout=pd\nk2_gpu=h20")
    bad.write_text(text)
    started = time.monotonic()
    out = k2("apply", str(bad), runs=tmp_path / "runs")
    assert out.returncode == 2
    assert "error: [decode]" in out.stderr
    assert "fix:" in out.stderr
    assert not (tmp_path / "runs").exists()  # refused before any run began
    assert time.monotonic() - started < 30

    via_ansible = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(bad), "playbooks/site.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )
    assert via_ansible.returncode != 0
    assert "fix: sglang pd [decode] fits on" in via_ansible.stdout
    assert "TASK [k2_launch" not in via_ansible.stdout


def test_a_down_host_stops_the_run_before_launch_and_rerun_converges(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    assert k2("stop", str(inventory), runs=tmp_path).returncode == 0
    victim = state.hosts[3].name
    lab_api.stop_host(victim)
    try:
        out = k2("apply", str(inventory), runs=tmp_path)
        assert out.returncode == 1
        summary = last_summary(tmp_path)
        assert victim in summary["failures"]
        assert victim in out.stdout
        for host in state.hosts[:3]:
            running = on_host(state, host.name, "docker ps --format '{{.Names}}'").split()
            # No engine started; the monitoring phase's exporters outlive `stop` by design.
            engines = [n for n in running if n.startswith("k2-") and not n.endswith("-exporter")]
            assert engines == [], (host.name, running)
    finally:
        lab_api.start_host(victim)
    rerun = k2("apply", str(inventory), runs=tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert served_models(state.hosts[0].address, 8000) == ["kimi-k2"]


def test_hub_token_in_the_environment_never_reaches_the_run_record(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    _, inventory = cluster
    token = "hf_" + "Q" * 34
    out = subprocess.run(
        [str(BIN / "k2provision"), "apply", str(inventory), "--tags", "verify"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "K2_RUNS_DIR": str(tmp_path), "HF_TOKEN": token},
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert token not in out.stdout + out.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files)  # ansible-runner's env dump exists
    for path in files:
        assert token not in path.read_text(errors="replace"), path
