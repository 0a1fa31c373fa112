"""The lab's record of what it created: a JSON file per instance, written as each thing is made.

`down` removes exactly what this file names (processes by PID and start time, namespaces,
veths, the bridge, mounts), so a crash half-way through `up` still leaves a state that
`down` can clean. Each record is frozen and rejects unknown keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from k2lab.errors import LabError
from k2lab.proc import ProcRef

STATE_VERSION: Literal[1] = 1


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostState(_Record):
    """One lab host."""

    name: str
    index: int
    address: str
    netns: str
    veth: str
    dir: str
    host_key: str = ""
    """The host's SSH public key ("ssh-ed25519 AAAA..."), pinned in known_hosts."""
    outer: ProcRef | None = None
    """The `unshare` process, in the controller's PID namespace."""
    init: ProcRef | None = None
    """PID 1 of the host's own PID namespace (tini, then sshd), as the controller sees it."""
    mounts: tuple[str, ...] = ()
    """Mount points made inside the host's private mount namespace (gone with it)."""


class ProxyState(_Record):
    """The HTTP proxy on the bridge address that gives hosts apt and pip."""

    address: str
    port: int
    proc: ProcRef | None = None


class LabState(_Record):
    """Everything one lab instance created, and what a test needs to reach it."""

    version: Literal[1] = STATE_VERSION
    name: str
    lab_dir: str
    subnet: str
    bridge: str
    controller_ip: str
    ssh_port: int
    private_key: str
    known_hosts: str
    inventory: str | None = None
    """The inventory the latest `up` wrote."""
    inventories: tuple[str, ...] = ()
    """Every inventory file `up` wrote for this lab; `down` removes them."""
    bridge_created: bool = False
    proxy: ProxyState | None = None
    shape_mbit: float | None = None
    hosts: tuple[HostState, ...] = ()
    bastion: str | None = None
    """The jump host's name when the lab was brought up with --bastion."""

    @property
    def ssh_config(self) -> Path:
        """The OpenSSH config naming the bastion (next to known_hosts)."""
        return Path(self.known_hosts).with_name("ssh_config")

    def host(self, name: str) -> HostState:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise LabError(f"no lab host named {name!r}; lab hosts: {known}")

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def addresses(self) -> dict[str, str]:
        return {h.name: h.address for h in self.hosts}

    def with_host(self, host: HostState) -> LabState:
        """This state with `host` replaced (by name) or appended, hosts kept in index order."""
        others = [h for h in self.hosts if h.name != host.name]
        merged = sorted([*others, host], key=lambda h: h.index)
        return self.model_copy(update={"hosts": tuple(merged)})

    def without_host(self, name: str) -> LabState:
        return self.model_copy(update={"hosts": tuple(h for h in self.hosts if h.name != name)})


def load_state(path: Path) -> LabState | None:
    """The recorded state, or None when there is none."""
    if not path.exists():
        return None
    try:
        return LabState.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as exc:
        raise LabError(
            f"{path}: unreadable lab state ({exc.__class__.__name__}); fix: inspect it, remove "
            "what it lists by hand (ip netns, ip link), then delete the file"
        ) from exc


def save_state(path: Path, state: LabState) -> None:
    """Write the state atomically (write a temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.model_dump(mode="json"), indent=2) + "\n")
    os.replace(tmp, path)
