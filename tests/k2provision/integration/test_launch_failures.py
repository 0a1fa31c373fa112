"""Launch failures on real lab hosts: a 2-prefill / 2-decode SGLang PD cluster of stand-ins
behind the real pinned router, one cluster for the whole file. Each case sets a stand-in fault
(`k2_lab_fault`) on one host through host_vars/ beside the inventory, as a user would, and runs
`k2provision apply` (after the first, only the launch phase and where it matters verify).

Cases, in order: the model directory absent on one host (preflight stops the run before any
container starts); a decode rank that exits at start (stage stopped; with --keep-failed left
running); a health gate that never passes (named, after a short cap); SIGTERM while a stage
waits on its gates (stopped as a failed stage is, then a plain re-run); an endpoint answering
a wrong chat completion (verify shows it); a rank that dies after a good apply (status 1); a
changed spec of the running instance, refused without --yes (the outage it is) and changing
nothing."""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pd_lab import (
    LAB_HF_TOKEN,
    MODEL_DIR,
    k2,
    remove_engine_containers,
)
from tests.runners import controller_leftovers, newest_record, on_host, start

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]

GATE_CAP_S = 20


class Cluster:
    """The lab cluster, its inventory and run records, and its hosts' variables."""

    def __init__(self, state: Any, inventory: Path, runs: Path) -> None:
        self.state = state
        self.inventory = inventory
        self.runs = runs
        self.names = [h.name for h in state.hosts]

    @property
    def decode0(self) -> str:
        """The first decode host: decode rank 0, whose server answers its pool's gate."""
        return self.names[2]

    def host_vars(self, host: str, **variables: object) -> None:
        """host_vars/HOST.yml beside the inventory holds exactly `variables`."""
        directory = self.inventory.parent / "host_vars"
        directory.mkdir(exist_ok=True)
        path = directory / f"{host}.yml"
        if variables:
            path.write_text(yaml.safe_dump(variables))
        else:
            path.unlink(missing_ok=True)

    def all_vars(self, **variables: object) -> None:
        directory = self.inventory.parent / "group_vars"
        directory.mkdir(exist_ok=True)
        (directory / "all.yml").write_text(yaml.safe_dump(variables) if variables else "{}\n")

    def apply(self, *args: str, yes: bool = True) -> tuple[int, str]:
        """`apply` with `args`; with --yes unless told otherwise: the cases change the one PD
        instance's spec, an outage apply runs only when accepted."""
        out = k2("apply", str(self.inventory), *(("--yes",) if yes else ()), *args, runs=self.runs)
        return out.returncode, out.stdout + out.stderr

    def containers(self, host: str, *, running_only: bool = False) -> list[str]:
        """The k2- containers on a host (running ones only, when asked)."""
        flag = "" if running_only else "-a"
        listed = on_host(
            self.state, host, f"docker ps {flag} --filter name=k2- --format '{{{{.Names}}}}'"
        )
        return sorted(listed.split())

    def container_state_or_none(self, host: str, name: str) -> str | None:
        """The container's state, or None while it does not exist."""
        state = on_host(
            self.state,
            host,
            f"docker container inspect -f '{{{{.State.Status}}}}' {name} 2>/dev/null || true",
        ).strip()
        return state or None

    def container_state(self, host: str, name: str) -> str:
        return on_host(
            self.state, host, f"docker container inspect -f '{{{{.State.Status}}}}' {name}"
        ).strip()


@pytest.fixture(scope="module")
def cluster(
    pd_cluster: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The session's PD cluster (2 prefill + 2 decode), nothing launched yet, through a copy of
    its inventory: the host_vars/ and group_vars/ these tests write stay beside the copy."""
    state, shared = pd_cluster
    inventory = tmp_path_factory.mktemp("inv") / "pd.ini"
    shutil.copyfile(shared, inventory)
    runs = tmp_path_factory.mktemp("runs")
    remove_engine_containers(state)
    yield Cluster(state, inventory, runs)
    remove_engine_containers(state)


def test_weights_not_in_place_stop_apply_before_any_container(cluster: Cluster) -> None:
    """k2_weights_source unset and k2_model_dir absent on one host: apply fails in the launch
    preflight, naming the host and the path, and no engine container exists anywhere."""
    host = cluster.names[1]
    on_host(cluster.state, host, f"rm -rf {MODEL_DIR}")
    try:
        rc, out = cluster.apply()
    finally:
        restore = f"mkdir -p {MODEL_DIR} && echo '{{}}' > {MODEL_DIR}/config.json"
        on_host(cluster.state, host, restore)
    assert rc == 1, out[-4000:]
    assert f"{host}: k2_model_dir {MODEL_DIR}: {MODEL_DIR} does not exist" in out, out[-4000:]
    assert "k2provision weights" in out
    assert "statfs" not in out  # not docker's own error: nothing reached docker run
    for name in cluster.names:
        assert cluster.containers(name) == [], name


def test_a_rank_that_exits_at_start_stops_its_stage(cluster: Cluster) -> None:
    host = cluster.decode0
    cluster.host_vars(host, k2_lab_fault="exit_at_start")
    rc, out = cluster.apply("--tags", "launch")
    assert rc == 1, out[-4000:]
    # One line naming host, process and reason, in the failure and in the summary.
    assert f"{host}: sglang-decode: exited with code 1 before passing its health gate" in out
    summary = re.search(rf"│ {host} +│ \d+ +│.*", out)  # its row of the run summary
    assert summary, out[-3000:]
    assert "sglang-decode: exited with code 1" in summary.group(0)
    # The gate it missed and the process's own last log lines.
    assert "gate: GET http://" in out
    assert ":30000/ready answering 200" in out  # /ready: liveness, no generation queued
    assert "log lines (docker logs k2-sglang):" in out
    assert "fault injected (K2_LAB_FAULT=exit_at_start): exiting 1 at start" in out
    assert "stage 0's containers stopped" in out
    for name in cluster.names:  # stage 0 stopped everywhere; the router (stage 1) never ran
        assert cluster.containers(name, running_only=True) == [], name
    assert "k2-router" not in cluster.containers(cluster.names[0])


def test_keep_failed_leaves_the_stage_running(cluster: Cluster) -> None:
    host = cluster.decode0
    rc, out = cluster.apply("--tags", "launch", "--keep-failed")
    assert rc == 1, out[-4000:]
    assert f"{host}: sglang-decode: exited with code 1" in out
    assert "left running for debugging (k2_launch_keep_failed)" in out
    for prefill in cluster.names[:2]:
        assert cluster.containers(prefill, running_only=True) == ["k2-sglang"], prefill
    assert cluster.container_state(host, "k2-sglang") == "exited"  # kept, for its logs


def test_a_gate_that_never_passes_is_named(cluster: Cluster) -> None:
    host = cluster.decode0
    cluster.host_vars(host, k2_lab_fault="never_healthy")
    cluster.all_vars(k2_launch_gate_timeout_s=GATE_CAP_S)
    try:
        rc, out = cluster.apply("--tags", "launch")
    finally:
        cluster.all_vars()
    assert rc == 1, out[-4000:]
    assert (
        f"{host}: sglang-decode: did not pass its health gate within {GATE_CAP_S} s "
        "(last answer: 503)"
    ) in out, out[-4000:]
    assert f"answering 200, timeout {GATE_CAP_S} s" in out
    for name in cluster.names:
        assert cluster.containers(name, running_only=True) == [], name


def test_sigterm_during_a_launch_stops_the_stage_as_a_failure_would(cluster: Cluster) -> None:
    """SIGTERM to `apply` while a stage waits on its gates: exit 143, the record says
    cancelled, the stage's containers are stopped as a failed stage's are, no playbook or SSH
    master of the run is left, and a plain re-run launches."""
    host = cluster.decode0
    cluster.host_vars(host, k2_lab_fault="never_healthy")
    try:
        proc = start("apply", str(cluster.inventory), "--tags", "launch", runs=cluster.runs,
                     COLUMNS="250", HF_TOKEN=LAB_HF_TOKEN)  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while cluster.container_state_or_none(host, "k2-sglang") != "running":
                assert proc.poll() is None, proc.communicate()[0][-4000:]
                assert time.monotonic() < deadline, "the decode stage never started"
                time.sleep(1)
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        cluster.host_vars(host)
    assert proc.returncode == 143, out[-4000:]
    assert "cancelled (SIGTERM)" in out, out[-4000:]
    run = newest_record(cluster.runs)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "cancelled"
    assert summary["cancelled"] == "SIGTERM"
    while controller_leftovers(run) and time.monotonic() < stopped + 30:
        time.sleep(1)
    assert controller_leftovers(run) == []
    for name in cluster.names:  # stage 0 holds every server: none is left running
        assert cluster.containers(name, running_only=True) == [], name
    rc, again = cluster.apply("--tags", "launch")
    assert rc == 0, again[-4000:]
    remove_engine_containers(cluster.state)  # the next case starts from no engine, as before


def test_a_wrong_answer_fails_verify_showing_it(cluster: Cluster) -> None:
    host = cluster.decode0
    cluster.host_vars(host, k2_lab_fault="wrong_answer")
    rc, out = cluster.apply("--tags", "launch,verify")
    assert rc == 1, out[-4000:]
    assert "/v1/chat/completions" in out, out[-4000:]
    assert "K2_LAB_FAULT=wrong_answer" in out, out[-4000:]  # what came back is shown
    assert "Launch failed" not in out  # the launch passed: verify is what failed


def test_a_rank_that_dies_after_a_good_apply_fails_status(cluster: Cluster) -> None:
    host = cluster.decode0
    remove_engine_containers(cluster.state)  # a clean start: no rank left from the last case
    cluster.host_vars(host, k2_lab_fault="die_after=60")
    rc, out = cluster.apply("--tags", "launch")
    assert rc == 0, out[-4000:]
    deadline = time.monotonic() + 180
    while cluster.container_state(host, "k2-sglang") == "running":
        assert time.monotonic() < deadline, "the die_after fault never fired"
        time.sleep(5)
    status = k2("status", str(cluster.inventory), runs=cluster.runs)
    assert status.returncode == 1, status.stdout[-3000:]
    assert re.search(rf"{host}.*sglang-decode", status.stdout), status.stdout[-3000:]
    cluster.host_vars(host)


def test_a_change_of_the_one_pd_instance_runs_only_with_yes(cluster: Cluster) -> None:
    host = cluster.decode0
    rc, out = cluster.apply("--tags", "launch")
    assert rc == 0, out[-4000:]
    running = {name: cluster.containers(name, running_only=True) for name in cluster.names}
    assert running[host] == ["k2-sglang"], running
    ids = on_host(cluster.state, host, "docker inspect --format '{{.Id}}' k2-sglang")
    cluster.host_vars(host, k2_lab_fault="wrong_answer")  # another spec for decode's ranks
    try:
        rc, out = cluster.apply("--tags", "launch", yes=False)
    finally:
        cluster.host_vars(host)
    assert rc == 1, out[-4000:]
    said = " ".join(out.split())
    assert "rollout outage: this change replaces the only prefill and decode instance" in said
    assert "fix: apply --yes (k2_accept_outage=true) to accept the outage" in said
    assert on_host(cluster.state, host, "docker inspect --format '{{.Id}}' k2-sglang") == ids
    assert {n: cluster.containers(n, running_only=True) for n in cluster.names} == running
