"""The lab itself on real hosts: identity, isolation, Ansible over SSH, docker with host
IPC, apt through the proxy, images without a registry, a host dying and coming back,
idempotent up, link shaping, and a down that leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import ansible_runner
import pytest

import k2lab as labapi
from k2lab.fs import mounts_under
from k2lab.hosts import port_open
from k2lab.images import BASE_IMAGE
from k2lab.proc import is_alive, quiet_log
from tests.lab_support import ROOT, ansible_env, side_instance
from tests.runners import on_host as sh

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]


def test_hosts_have_their_own_names_and_addresses(lab: labapi.LabState) -> None:
    seen = {}
    for host in lab.hosts:
        name, addr = sh(lab, host.name, "hostname; ip -4 -o addr show dev eth0").splitlines()
        assert name == host.name
        assert f" {host.address}/24 " in addr
        seen[name] = host.address
        hosts_file = sh(lab, host.name, "getent hosts " + " ".join(lab.host_names))
        for other in lab.hosts:
            assert f"{other.address}" in hosts_file
    assert len(set(seen.values())) == len(lab.hosts) >= 4


def test_ansible_ping_through_ansible_runner(lab: labapi.LabState, tmp_path: Path) -> None:
    assert lab.inventory is not None
    result = ansible_runner.run(
        private_data_dir=str(tmp_path),
        inventory=lab.inventory,
        host_pattern="all",
        module="ping",
        envvars={"PATH": ansible_env()["PATH"], "ANSIBLE_HOST_KEY_CHECKING": "True"},
        quiet=True,
    )
    assert result.status == "successful", result.stdout.read()
    assert set(result.stats["ok"]) == set(lab.host_names)
    assert not result.stats["dark"]
    assert not result.stats["failures"]


def test_a_host_with_an_unpinned_key_is_refused(lab: labapi.LabState, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = [a.replace(lab.known_hosts, str(empty)) for a in labapi.ssh_command(lab, "lab1", "true")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode != 0
    assert "Host key verification failed" in out.stderr


def test_filesystems_are_separate(lab: labapi.LabState) -> None:
    token = uuid.uuid4().hex
    sh(lab, "lab1", f"echo {token} > /etc/k2lab-isolation && echo {token} > /root/isolation")
    try:
        for other in lab.host_names[1:]:
            out = sh(lab, other, "cat /etc/k2lab-isolation /root/isolation 2>/dev/null || true")
            assert token not in out, other
        assert token in sh(lab, "lab1", "cat /etc/k2lab-isolation")
    finally:
        sh(lab, "lab1", "rm -f /etc/k2lab-isolation /root/isolation")
    assert sh(lab, "lab1", "stat -c %a /root").strip() == "700"


def test_docker_run_with_host_network_and_ipc(lab: labapi.LabState) -> None:
    out = sh(
        lab,
        "lab2",
        "readlink /proc/self/ns/ipc /proc/self/ns/net; "
        f"docker run --rm --network host --ipc host {BASE_IMAGE} "
        "readlink /proc/self/ns/ipc /proc/self/ns/net",
    ).split()
    host_ipc, host_net, ctr_ipc, ctr_net = out
    assert (ctr_ipc, ctr_net) == (host_ipc, host_net)
    other_ipc = sh(lab, "lab3", "readlink /proc/self/ns/ipc").strip()
    assert other_ipc != host_ipc  # each lab host has its own IPC namespace
    sh(lab, "lab2", f"docker run --rm --network host --ipc host {BASE_IMAGE} true")


def test_apt_works_through_the_proxy(lab: labapi.LabState) -> None:
    out = sh(lab, "lab3", "apt-get update 2>&1 && apt-config dump | grep -i proxy", timeout=300)
    assert "k2lab-proxy:3142" in out
    # Without the proxy there is no way out: hosts reach only the bridge.
    direct = subprocess.run(
        labapi.ssh_command(
            lab, "lab3", "curl -sS --noproxy '*' --max-time 3 http://deb.debian.org/"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert direct.returncode != 0


def test_an_image_built_on_the_controller_runs_in_every_host(
    lab: labapi.LabState, tmp_path: Path
) -> None:
    tag = f"localhost/k2labtest:{uuid.uuid4().hex[:8]}"
    (tmp_path / "Containerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo built-for-the-lab > /k2-marker\n"
    )
    labapi.build_image(tag, tmp_path, log=quiet_log)
    try:
        for name in lab.host_names[:2]:
            assert sh(lab, name, f"docker run --rm --network host {tag} cat /k2-marker") == (
                "built-for-the-lab\n"
            )
    finally:
        from k2lab.images import remove_image

        remove_image(labapi.LabConfig.default(), tag)


def test_a_stopped_host_is_unreachable_and_comes_back_with_its_disk(lab: labapi.LabState) -> None:
    victim = lab.host_names[-1]
    address = lab.host(victim).address
    token = uuid.uuid4().hex
    sh(lab, victim, f"echo {token} > /root/survives-restart")
    stopped = labapi.stop_host(victim, log=quiet_log)
    try:
        assert not is_alive(stopped.host(victim).init)
        assert not port_open(address, lab.ssh_port, timeout=2)
        assert not labapi.status().healthy
    finally:
        started = labapi.start_host(victim, log=quiet_log)
    assert is_alive(started.host(victim).init)
    assert sh(started, victim, "cat /root/survives-restart; hostname").split() == [token, victim]
    sh(started, victim, "rm -f /root/survives-restart")
    assert labapi.status().healthy


def _shaped_seconds(state: labapi.LabState, megabytes: int) -> float:
    started = time.monotonic()
    subprocess.run(
        labapi.ssh_command(state, "lab1", "cat > /dev/null"),
        input=b"\0" * (megabytes * 1_000_000),
        capture_output=True,
        timeout=120,
        check=True,
    )
    return time.monotonic() - started


def test_second_instance_up_is_idempotent_shapes_and_down_leaves_nothing(tmp_path: Path) -> None:
    cfg = side_instance("t", 100)
    inventory = tmp_path / "t.ini"
    if labapi.status(cfg).up:
        labapi.down(cfg, log=quiet_log)
    messages: list[str] = []
    state = labapi.up(2, inventory=inventory, shape_mbit=10, cfg=cfg, log=messages.append)
    try:
        assert state.host_names == ("lab1", "lab2")
        assert f" ansible_host={cfg.host_ip(1)} " in inventory.read_text()

        # 5 MB at 10 Mbit/s takes 4 s at least (the shaper's floor, whatever the load).
        shaped = _shaped_seconds(state, 5)
        assert shaped > 3.6
        # Unshaped, the same 5 MB goes faster (measured in this run: the SSH round trip and
        # the ciphers' CPU time, which a loaded machine stretches, are in both; the shaper's
        # 4 s only in the first).
        labapi.shape(None, cfg=cfg, log=quiet_log)
        unshaped = _shaped_seconds(state, 5)
        assert unshaped < shaped, (unshaped, shaped)

        messages.clear()
        again = labapi.up(2, inventory=inventory, cfg=cfg, log=messages.append)
        assert [h.init for h in again.hosts] == [h.init for h in state.hosts]
        assert messages == [f"lab {cfg.name} is already up with 2 hosts; nothing changed"]

        dead = again.host("lab2")
        subprocess.run(["kill", "-9", str(dead.init.pid if dead.init else 0)], check=True)
        healed = labapi.up(2, inventory=inventory, cfg=cfg, log=quiet_log)
        assert healed.host("lab2").init != dead.init
        assert is_alive(healed.host("lab2").init)
        sh(healed, "lab2", "true")
    finally:
        final = labapi.current_state(cfg) or state
        labapi.down(cfg, log=quiet_log)

    assert not cfg.state_file.exists()
    assert not inventory.exists()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert f"{cfg.name}-" not in netns.stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert cfg.name not in links.stdout
    assert not mounts_under(cfg.instance_dir)
    assert final.proxy is not None
    assert not is_alive(final.proxy.proc)
    for host in final.hosts:
        assert not is_alive(host.init)
        assert not is_alive(host.outer)
        assert not Path(host.dir).exists()
    labapi.down(cfg, log=quiet_log)  # a second down is a no-op


def test_lab_up_from_another_directory_writes_that_directory_s_inventory(tmp_path: Path) -> None:
    """A second checkout (any directory) gets its own inventory/lab.ini, one that plans, and
    the package's own checkout is left alone."""
    cfg = side_instance("c", 110)
    clone = tmp_path / "second-clone"
    clone.mkdir()
    ours = ROOT / "inventory" / "lab.ini"
    before = ours.read_text() if ours.exists() else None
    env = {
        **ansible_env(),
        "K2_LAB_NAME": cfg.name,
        "K2_LAB_SUBNET": cfg.subnet,
        "K2_LAB_DIR": str(cfg.lab_dir),
    }
    k2 = str(Path(sys.executable).parent / "k2provision")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [k2, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=900
        )

    try:
        up = run("lab", "up", "3")
        assert up.returncode == 0, up.stderr[-3000:]
        written = clone / "inventory" / "lab.ini"
        assert written.is_file()
        assert f" ansible_host={cfg.host_ip(3)} " in written.read_text()
        plan = run("plan", "inventory/lab.ini", "--format", "json")
        assert plan.returncode == 0, plan.stderr
        assert {h["name"] for h in json.loads(plan.stdout)["hosts"]} == {"lab1", "lab2", "lab3"}
        assert "layout: " in up.stdout
        assert (ours.read_text() if ours.exists() else None) == before
    finally:
        down = run("lab", "down")
    assert down.returncode == 0, down.stderr
    assert not (clone / "inventory" / "lab.ini").exists()
    assert not cfg.state_file.exists()
