"""Pytest plugin for tests on the lab's real SSH hosts (load it with
``pytest_plugins = ["tests.lab_support"]`` in tests/conftest.py).

- ``lab``: a session fixture with 4 running lab hosts (the `k2lab` instance). It reuses a lab
  that is already up (and heals dead hosts) and then leaves it up; a lab it brought up
  itself it takes down at the end of the session.
- ``lab_env``: environment for ansible-runner / ansible-playbook (this venv's bin on PATH).
- ``side_instance(tag, offset)``: a second lab instance derived from the session's own
  (name + tag, subnet shifted), so tests that need one never collide with the main lab or
  with another checkout's.

The lab dir is ``$K2_LAB_DIR``, else this checkout's ``.lab`` (whatever directory pytest
runs from), so every test shares one rootfs and image store.

Tests marked ``@pytest.mark.lab`` need root. Without root they FAIL with the reason, so a
missing lab never passes quietly; ``K2_LAB=0`` in the environment skips them explicitly.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import k2lab as labmod
from k2lab.proc import proc_ref

LAB_HOSTS = 4
ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("K2_LAB_DIR", str(ROOT / ".lab"))


def side_instance(tag: str, offset: int) -> labmod.LabConfig:
    """A lab instance beside the session's: its name with `tag` appended (at most 8
    characters), its /24 with the second octet moved by `offset`."""
    main = labmod.LabConfig.default()
    net = ipaddress.ip_network(main.subnet)
    octets = str(net.network_address).split(".")
    octets[1] = str((int(octets[1]) + offset) % 256)
    return labmod.LabConfig(
        lab_dir=main.lab_dir,
        name=f"{main.name[: 8 - len(tag)]}{tag}",
        subnet=f"{'.'.join(octets)}/24",
    )


def lab_skip_reason() -> str | None:
    """Why lab tests are skipped (K2_LAB=0), or None when they run."""
    if os.environ.get("K2_LAB", "").strip() == "0":
        return "K2_LAB=0: lab tests disabled explicitly"
    return None


def require_lab() -> None:
    """Skip when disabled, fail when the lab cannot run (not root)."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.fail(
            "lab tests need root (they create network namespaces, a bridge and sshd hosts); "
            "run the tests as root, or set K2_LAB=0 to skip them explicitly",
            pytrace=False,
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        require_lab()


def ansible_env() -> dict[str, str]:
    """os.environ with this interpreter's bin first on PATH (ansible-runner runs
    `ansible-playbook` / `ansible` from PATH; without them it fails with rc 127)."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="session")
def lab_env() -> dict[str, str]:
    return ansible_env()


def _leases_dir() -> Path:
    return labmod.LabConfig.default().instance_dir / "pytest-leases"


def _live_leases() -> list[Path]:
    """Lease files of pytest sessions that still run (a PID and its start time)."""
    live = []
    for lease in _leases_dir().glob("[0-9]*-[0-9]*"):
        pid, _, start = lease.name.partition("-")
        ref = proc_ref(int(pid)) if pid.isdigit() else None
        if ref is not None and str(ref.start_time) == start:
            live.append(lease)
        else:
            lease.unlink(missing_ok=True)
    return live


@pytest.fixture(scope="session")
def lab() -> Iterator[labmod.LabState]:
    """A running lab of (at least) 4 hosts: inventory, host names/addresses, key paths.

    Sessions running at the same time share it: each holds a lease file while it runs,
    and the last one to finish takes the lab down if a test session brought it up.
    """
    require_lab()
    me = proc_ref(os.getpid())
    assert me is not None
    leases = _leases_dir()
    marker = leases.parent / "pytest-started-this-lab"
    leases.mkdir(parents=True, exist_ok=True)
    lease = leases / f"{me.pid}-{me.start_time}"
    lease.touch()
    try:
        before = labmod.status()
        if before.up and before.state is not None and len(before.state.hosts) >= LAB_HOSTS:
            # Already up: restart whatever died, keep its size and layout.
            state = before.state if before.healthy else labmod.heal()
        else:
            if not before.up:
                marker.touch()
            state = labmod.up(LAB_HOSTS)
        yield state
    finally:
        lease.unlink(missing_ok=True)
        others = [p for p in _live_leases() if p != lease]
        if not others and marker.exists():
            marker.unlink()
            labmod.down()
