"""A private cluster behind a bastion: `lab up 2 --bastion` (the hosts accept SSH only from the
bastion; the inventory reaches them with ProxyJump), then apply, status, logs, restart --limit
and verify, each reaching the hosts through the bastion as Ansible does. A host that cannot be
reached is named with the setting that failed.

Stream `lab` (scripts/test). Its own lab instance (the stream's name with a `j`, the stream's
subnet with 1 as the third octet), so the stream's other modules keep their hosts; about three
minutes, most of it the apply.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.standin import build_standin
from tests.pd_lab import k2
from tests.runners import on_host

pytestmark = pytest.mark.lab

# The lab's 2-host layout (k2lab/demo.py): an INT4 model that fits one prefill and one decode
# host, synthetic weights written by the weights phase.
LAB_VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_model": "moonshotai/Kimi-K2-Thinking",
    "k2_context_length": 32768,
    "k2_weights_source": "synthetic",
}


def instance() -> lab_api.LabConfig:
    """The bastion lab's instance, beside the stream's own."""
    base = lab_api.LabConfig.default()
    octets = ipaddress.ip_network(base.subnet).network_address.packed
    return lab_api.LabConfig(
        lab_dir=base.lab_dir,
        name=f"{base.name[:7]}j",
        subnet=f"{octets[0]}.{octets[1]}.{(octets[2] + 1) % 256}.0/24",
    )


def cli(work: Path, *args: str, masters: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI on the bastion cluster, with its own fact cache and SSH control masters (other
    instances name their hosts lab1, lab2 too)."""
    return k2(
        *args,
        runs=work / "runs",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(work / "facts"),
        ANSIBLE_SSH_CONTROL_PATH_DIR=str(masters or work / "cp"),
    )


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, Path, Path]]:
    """Two hosts (prefill, decode) behind a bastion, applied once: (state, inventory, work)."""
    cfg = instance()
    work = tmp_path_factory.mktemp("bastion")
    inventory = work / "lab.ini"
    state = lab_api.up(
        2,
        bastion=True,
        inventory=inventory,
        groups={"prefill": 1, "decode": 1},
        all_vars=LAB_VARS,
        cfg=cfg,
    )
    try:
        build_standin()
        applied = cli(work, "apply", str(inventory))
        assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
        yield state, inventory, work
    finally:
        lab_api.down(cfg)


def test_the_hosts_refuse_ssh_from_the_controller_and_answer_through_the_bastion(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, _ = cluster
    assert "-o ProxyJump=bastion" in inventory.read_text()
    argv = lab_api.ssh_command(state, "lab1", "hostname")
    assert argv[1:5] == ["-F", str(state.ssh_config), "-o", "ProxyJump=bastion"]
    refused = subprocess.run([argv[0], *argv[5:]], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    assert on_host(state, "lab1", "hostname").strip() == "lab1"


def test_status_logs_restart_and_verify_reach_the_hosts_through_the_bastion(
    cluster: tuple[Any, Path, Path],
) -> None:
    _, inventory, work = cluster
    status = cli(work, "status", str(inventory))
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-2000:]
    assert "router readiness: ready (2/2 workers healthy)" in status.stdout
    logs = cli(work, "logs", str(inventory), "decode", "--tail", "3")
    assert logs.returncode == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "lab2/sglang-decode | " in logs.stdout
    restarted = cli(work, "restart", str(inventory), "--limit", "lab2", "--yes")
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-2000:]
    verified = cli(work, "verify", str(inventory))
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-2000:]
    assert "tool call: ok" in verified.stdout


def test_a_host_reached_without_the_bastion_is_named_with_the_setting_that_failed(
    cluster: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    state, inventory, work = cluster
    direct = tmp_path / "direct.ini"
    jump = f"-F {state.ssh_config} -o ProxyJump=bastion "
    direct.write_text(inventory.read_text().replace(jump, ""))
    status = cli(work, "status", str(direct), masters=tmp_path / "cp")  # no master to reuse
    assert status.returncode == 1, status.stdout[-3000:] + status.stderr[-2000:]
    address = state.host("lab1").address
    said = " ".join(status.stdout.split())
    assert (
        f"lab1: unreachable: cannot connect to ansible_host={address} ansible_port=22: "
        "Connection refused"
    ) in said
