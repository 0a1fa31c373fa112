"""status and logs on real lab hosts: a 2-prefill / 2-decode SGLang PD cluster of stand-ins
behind the real pinned router, asked over real SSH. Faults: a removed container, a drifted
spec; then apply restores and status is 0 again."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k2provision.inventory import load_cluster
from k2provision.plan import build_plan
from tests.integration.pd_lab import (
    BIN,
    ROOT,
    k2,
    on_host,
    pd_cluster_up,
    remove_engine_containers,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    """4 lab hosts as a converged 2-prefill / 2-decode PD cluster (state, inventory, runs)."""
    inventory = tmp_path_factory.mktemp("inv") / "pd.ini"
    runs = tmp_path_factory.mktemp("runs")
    state = pd_cluster_up(inventory)
    applied = k2("apply", str(inventory), runs=runs)
    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    yield state, inventory, runs
    remove_engine_containers(state)


def newest_record(runs: Path) -> Path:
    return max(runs.iterdir(), key=lambda p: p.stat().st_mtime)


def test_status_is_0_lists_every_planned_process_and_records_nothing_secret(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, runs = cluster
    out = k2("status", str(inventory), runs=runs)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    plan = build_plan(load_cluster(inventory))
    for host in plan.hosts:
        for process in host.processes:
            row = re.search(rf"│ {host.name} +│ {process.name} .*", out.stdout) or re.search(
                rf"│ +│ {process.name} .*", out.stdout
            )
            assert row, (host.name, process.name, out.stdout)
            assert "running" in row.group(0)
            assert "current" in row.group(0)
    assert "no nvidia-smi" in out.stdout  # the lab has no GPUs: said, not an error
    assert "endpoint http://" in out.stdout
    assert "router readiness: ready" in out.stdout
    record = newest_record(runs)
    assert json.loads((record / "summary.json").read_text())["rc"] == 0
    key_body = Path(state.private_key).read_text().splitlines()[1]
    for path in record.rglob("*"):
        if path.is_file():
            assert key_body not in path.read_text(errors="replace"), path


def test_status_json_is_the_documented_schema(cluster: tuple[Any, Path, Path]) -> None:
    _, inventory, runs = cluster
    out = k2("status", str(inventory), "--format", "json", runs=runs)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    plan = build_plan(load_cluster(inventory))
    assert doc["schema"] == 1
    assert doc["ok"] is True
    assert doc["problems"] == []
    assert [h["host"] for h in doc["hosts"]] == [h.name for h in plan.hosts]
    for entry, host in zip(doc["hosts"], plan.hosts, strict=True):
        assert entry["reachable"] is True
        assert entry["gpus"] is None
        assert [p["process"] for p in entry["processes"]] == [p.name for p in host.processes]
        assert {p["state"] for p in entry["processes"]} == {"running"}
        assert {p["spec"] for p in entry["processes"]} == {"current"}
    assert doc["endpoint"]["answers"] is True
    assert doc["endpoint"]["models"] == ["kimi-k2"]
    kinds = {w["kind"] for w in doc["endpoint"]["router"]["workers"]}
    assert kinds == {"prefill", "decode"}
    recorded = json.loads((Path(doc["record"]) / "status.json").read_text())
    assert recorded["hosts"] == doc["hosts"]


def test_logs_tail_and_grep(cluster: tuple[Any, Path, Path]) -> None:
    _, inventory, runs = cluster
    out = k2("logs", str(inventory), "decode", "--tail", "5", runs=runs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for label in ("lab3/sglang-decode | ", "lab4/sglang-decode | "):
        mine = [line for line in lines if line.startswith(label)]
        assert 1 <= len(mine) <= 5, (label, out.stdout)
    assert all(line.startswith(("lab3/", "lab4/")) for line in lines)
    grepped = k2("logs", str(inventory), "--tail", "50", "--grep", r"rank \d", runs=runs)
    assert grepped.returncode == 0, grepped.stderr
    assert grepped.stdout.strip()
    for line in grepped.stdout.splitlines():
        assert re.search(r"rank \d", line.split(" | ", 1)[1]), line


def remote_log_readers(state: Any, host: str) -> list[str]:
    ps = on_host(state, host, "ps -eo args")
    return [line for line in ps.splitlines() if re.match(r"^\S*podman logs", line)]


def test_follow_streams_and_ends_cleanly_on_ctrl_c(cluster: tuple[Any, Path, Path]) -> None:
    state, inventory, runs = cluster
    follower = subprocess.Popen(
        [str(BIN / "k2provision"), "logs", str(inventory), "decode", "--follow", "--tail", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "K2_RUNS_DIR": str(runs)},
    )
    try:
        assert follower.stdout is not None
        ready, _, _ = select.select([follower.stdout], [], [], 30)
        assert ready, "no line within 30 s"
        first = follower.stdout.readline()
        assert first.startswith(("lab3/sglang-decode | ", "lab4/sglang-decode | ")), first
        assert remote_log_readers(state, "lab3")
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=10)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while remote_log_readers(state, "lab3") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert remote_log_readers(state, "lab3") == []


def test_drift_is_named(cluster: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _, inventory, runs = cluster
    changed = tmp_path / "pd.ini"
    changed.write_text(
        inventory.read_text().replace("k2_context_length=32768", "k2_context_length=16384")
    )
    out = k2("status", str(changed), runs=runs)
    assert out.returncode == 1, out.stdout[-4000:]
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem: ")]
    assert {p.split()[1] for p in problems} == {"lab1:", "lab2:", "lab3:", "lab4:"}
    assert all("drift: container runs spec" in p for p in problems)


def test_an_unreachable_host_is_a_line_of_the_answer(
    cluster: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    _, inventory, runs = cluster
    closed = tmp_path / "pd.ini"  # lab4's SSH on a port nothing listens on
    closed.write_text(
        re.sub(
            r"^(lab4 ansible_host=\S+) ansible_port=\d+",
            r"\1 ansible_port=2",
            inventory.read_text(),
            flags=re.MULTILINE,
        )
    )
    assert closed.read_text() != inventory.read_text()
    out = k2("status", str(closed), "--format", "json", runs=runs)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    lab4 = next(h for h in doc["hosts"] if h["host"] == "lab4")
    assert lab4["reachable"] is False
    assert lab4["unreachable"]
    assert doc["problems"] == [f"lab4: unreachable: {lab4['unreachable']}"]
    assert "Traceback" not in out.stderr


def test_a_removed_container_is_named_and_apply_restores(cluster: tuple[Any, Path, Path]) -> None:
    state, inventory, runs = cluster
    on_host(state, "lab4", "docker rm -f k2-sglang")
    out = k2("status", str(inventory), runs=runs)
    assert out.returncode == 1, out.stdout[-4000:]
    assert "problem: lab4: sglang-decode (k2-sglang): container is missing" in out.stdout
    assert json.loads((newest_record(runs) / "summary.json").read_text())["rc"] == 1
    again = k2("apply", str(inventory), runs=runs)
    assert again.returncode == 0, again.stdout[-4000:]
    restored = k2("status", str(inventory), runs=runs)
    assert restored.returncode == 0, restored.stdout[-4000:]
