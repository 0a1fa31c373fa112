"""Stopping a command on real lab hosts: SIGTERM to `k2provision weights`, and to `apply`
during its weights phase, while the relays move data. Within 30 s no
ansible-playbook, ssh or relay process of that run remains on the controller or any lab host,
the record says cancelled, and a plain re-run completes, the weights resuming from their last
checkpoint."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from tests.runners import controller_leftovers, k2, newest_record, on_host, start

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = "/models/k2-cancel-test"
STATE_DIR = "/var/lib/k2provision/weights"
SHARDS = 2
SHARD_BYTES = 32 << 20
VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_context_length": 32768,
    "k2_weights_source": "synthetic",
    "k2_weights_synthetic_shards": SHARDS,
    "k2_weights_synthetic_shard_bytes": SHARD_BYTES,
    "k2_weights_poll_interval": 1,
    "k2_weights_checkpoint_bytes": 1 << 20,
    "k2_model_dir": MODEL_DIR,
}
WITHIN_S = 30


@pytest.fixture(scope="module")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The lab's 4 hosts (2 prefill, 2 decode), a synthetic source seeded at lab1."""
    inventory = tmp_path_factory.mktemp("cancel-inv") / "cancel.ini"
    state = lab_api.up(4, inventory=inventory, groups={"prefill": 2, "decode": 2}, all_vars=VARS)
    for host in state.hosts:
        on_host(state, host.name, f"rm -rf {MODEL_DIR} {STATE_DIR}")
    yield state, inventory
    lab_api.shape(None)
    for host in state.hosts:
        on_host(state, host.name, f"rm -rf {MODEL_DIR}")


def wait_for_bytes(state: Any, host: str, at_least: int, timeout: float = 300) -> None:
    """Until a file being received on ``host`` holds ``at_least`` bytes."""
    partial = f"stat -c %s {MODEL_DIR}/.*.partial 2>/dev/null | sort -n | tail -1"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        size = on_host(state, host, partial).strip()
        if size.isdigit() and int(size) >= at_least:
            return
        time.sleep(0.3)
    raise AssertionError(f"{host} never got past {at_least} bytes")


def host_leftovers(state: Any) -> dict[str, str]:
    """Relay processes still running on the lab hosts."""
    found = {}
    for host in state.hosts:
        out = on_host(state, host.name, "pgrep -af relay.pyz | grep -v pgrep || true").strip()
        if out:
            found[host.name] = out
    return found


def stop_during_weights(state: Any, args: tuple[str, ...], runs: Path) -> tuple[Path, str]:
    """Run `args` on shaped links, SIGTERM it while lab3 receives; what it left, within 30 s."""
    for host in ("lab2", "lab3", "lab4"):
        on_host(state, host, f"rm -rf {MODEL_DIR}")
    lab_api.shape(8)  # about 1 MB/s per link: a 32 MiB shard outlasts the stop by far
    try:
        proc = start(*args, runs=runs, COLUMNS="200")
        try:
            wait_for_bytes(state, "lab3", 2 << 20)
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        lab_api.shape(None)
    assert proc.returncode == 143, output[-4000:]
    print(f"stopped in {time.monotonic() - stopped:.1f} s:\n{output[-3000:]}")
    run = newest_record(runs)
    deadline = stopped + WITHIN_S
    while time.monotonic() < deadline:
        if not controller_leftovers(run) and not host_leftovers(state):
            break
        time.sleep(1)
    assert controller_leftovers(run) == []
    assert host_leftovers(state) == {}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "cancelled"
    assert summary["cancelled"] == "SIGTERM"
    assert "resumes" in summary["ended"]["relays"], summary["ended"]
    assert "cancelled (SIGTERM)" in output
    points = on_host(state, "lab3", f"ls -A {MODEL_DIR}")
    assert ".k2-resume." in points, points  # what lab3 had received stays, resumable
    return run, output


def rerun_resumes(inventory: Path, runs: Path) -> None:
    """A plain `weights` completes, lab3 continuing from its resume point."""
    done = k2("weights", str(inventory), runs=runs, timeout=600, COLUMNS="200")
    assert done.returncode == 0, done.stdout[-4000:]
    weights = json.loads((newest_record(runs) / "weights.json").read_text())
    lab3 = next(h for h in weights["hosts"] if h["host"] == "lab3")
    assert lab3["status"] == "ok"
    assert lab3["resumed"], lab3


def test_sigterm_to_weights_stops_its_playbook_masters_and_relays(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, _ = cluster
    stop_during_weights(state, ("weights", str(cluster[1])), tmp_path / "runs")


def test_a_plain_rerun_after_a_stopped_weights_resumes_everywhere(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    assert ".k2-resume." in on_host(state, "lab3", f"ls -A {MODEL_DIR}")  # left by the stop
    rerun_resumes(inventory, tmp_path / "runs")


def test_sigterm_to_apply_during_weights_stops_it_the_same_way(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    runs = tmp_path / "runs"
    run, _ = stop_during_weights(state, ("apply", str(inventory), "--tags", "weights"), runs)
    assert run.name.endswith("-apply")
    rerun_resumes(inventory, runs)
