"""Where the lab keeps its files and how one lab instance is named and addressed.

Shared by every instance, under the lab dir (`$K2_LAB_DIR`, else `./.lab`):
``rootfs/`` (one debootstrapped Debian bookworm, the lower layer of every host),
``rootfs.json`` (its completion marker), ``cache/`` (downloaded .debs), ``images/``
(the controller's podman store that hosts mount read-only), ``ssh/`` (the lab key).

Per instance, under ``instances/<name>/``: ``state.json``, ``known_hosts``, the proxy's
config and log, and ``hosts/<host>/`` (overlay upper/work dirs, container storage,
SSH host key, console log).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from k2lab.errors import LabError

_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# Characters that would break an overlayfs mount option string or a shell word.
_UNSAFE_PATH_RE = re.compile(r"[^A-Za-z0-9_./+-]")
MAX_HOSTS = 200
# `lab up N --bastion`: the jump host, on the subnet's last lab address; the other hosts
# accept SSH only from it.
BASTION_INDEX = MAX_HOSTS
BASTION_NAME = "bastion"
PROXY_PORT = 3142
PROXY_NAME = "k2lab-proxy"
"""The name every host (and image build) resolves to its instance's proxy address."""
REGISTRY_PORT = 5000
"""The lab registry's port on the bridge address (k2lab/registry.py), plain HTTP."""


def default_lab_dir() -> Path:
    """`$K2_LAB_DIR`, else `.lab` in the current directory (never the package's location, so
    the lab works the same from a wheel and from any checkout)."""
    env = os.environ.get("K2_LAB_DIR")
    return Path(env).resolve() if env else Path.cwd() / ".lab"


def default_inventory_path() -> Path:
    """Where `up` writes the lab inventory unless told otherwise: `inventory/lab.ini` in the
    current directory."""
    return Path.cwd() / "inventory" / "lab.ini"


@dataclass(frozen=True)
class LabConfig:
    """One lab instance. The default instance is `k2lab` on 10.77.0.0/24.

    A second instance (another name and subnet) may run beside it, sharing the rootfs
    and the image store; the integration tests use one to prove `down` cleans up.
    """

    lab_dir: Path
    name: str = "k2lab"
    subnet: str = "10.77.0.0/24"
    ssh_port: int = 22

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise LabError(
                f"lab name {self.name!r} is not valid; expected 1-8 lowercase letters/digits "
                "starting with a letter (it prefixes interface names, at most 15 characters)"
            )
        net = ipaddress.ip_network(self.subnet, strict=True)
        if net.version != 4 or net.prefixlen != 24:
            raise LabError(f"lab subnet {self.subnet} must be an IPv4 /24, e.g. 10.77.0.0/24")
        if _UNSAFE_PATH_RE.search(str(self.lab_dir)):
            raise LabError(
                f"lab dir {self.lab_dir} contains characters overlayfs options cannot carry; "
                "fix: set K2_LAB_DIR to a plain path"
            )
        if not 1 <= self.ssh_port <= 65535 or self.ssh_port == 2233:
            raise LabError(
                f"ssh_port={self.ssh_port}: expected 1-65535 and not 2233 "
                "(2233 belongs to the sshd inside engine containers)"
            )

    @classmethod
    def default(cls) -> LabConfig:
        """The default instance, or the one `$K2_LAB_NAME` / `$K2_LAB_SUBNET` name (so two
        checkouts on one machine can each run their own lab)."""
        return cls(
            lab_dir=default_lab_dir(),
            name=os.environ.get("K2_LAB_NAME") or "k2lab",
            subnet=os.environ.get("K2_LAB_SUBNET") or "10.77.0.0/24",
        )

    # ---------------------------------------------------------------- names and addresses
    @property
    def bridge(self) -> str:
        return f"{self.name}0"

    @property
    def prefix_len(self) -> int:
        return 24

    @property
    def controller_ip(self) -> str:
        return str(ipaddress.ip_network(self.subnet).network_address + 1)

    def host_name(self, index: int) -> str:
        """lab1, lab2, ... (1-based); the bastion (index BASTION_INDEX) is `bastion`."""
        return BASTION_NAME if index == BASTION_INDEX else f"lab{index}"

    def host_ip(self, index: int) -> str:
        if not 1 <= index <= MAX_HOSTS:
            raise LabError(f"host index {index} out of range 1..{MAX_HOSTS}")
        return str(ipaddress.ip_network(self.subnet).network_address + 10 + index)

    def floating_address(self) -> str:
        """An address of the subnet that no host takes (they are .11 to .210), with its prefix:
        a front's floating address (k2_front_address) on the lab."""
        network = ipaddress.ip_network(self.subnet)
        return f"{network.network_address + 250}/{self.prefix_len}"

    def netns(self, index: int) -> str:
        return f"{self.name}-lab{index}"

    def veth(self, index: int) -> str:
        """Controller side of host `index`'s veth pair (on the bridge)."""
        return f"{self.name}v{index}"

    def veth_peer_tmp(self, index: int) -> str:
        """The host side's name before it moves into the namespace and becomes eth0."""
        return f"{self.name}p{index}"

    @property
    def proxy_url(self) -> str:
        return f"http://{self.controller_ip}:{PROXY_PORT}"

    @property
    def registry(self) -> str:
        """HOST:PORT of the lab registry (k2lab/registry.py), when one is started."""
        return f"{self.controller_ip}:{REGISTRY_PORT}"

    # ---------------------------------------------------------------- shared paths
    @property
    def rootfs(self) -> Path:
        return self.lab_dir / "rootfs"

    @property
    def rootfs_marker(self) -> Path:
        return self.lab_dir / "rootfs.json"

    @property
    def deb_cache(self) -> Path:
        return self.lab_dir / "cache" / "debs"

    @property
    def image_store(self) -> Path:
        return self.lab_dir / "images" / "storage"

    @property
    def image_runroot(self) -> Path:
        return self.lab_dir / "images" / "run"

    @property
    def controller_containers_conf(self) -> Path:
        return self.lab_dir / "images" / "containers.conf"

    @property
    def private_key(self) -> Path:
        return self.lab_dir / "ssh" / "id_ed25519"

    @property
    def lock_file(self) -> Path:
        return self.lab_dir / "lock"

    # ---------------------------------------------------------------- per-instance paths
    @property
    def instance_dir(self) -> Path:
        return self.lab_dir / "instances" / self.name

    @property
    def state_file(self) -> Path:
        return self.instance_dir / "state.json"

    @property
    def ssh_config(self) -> Path:
        """The OpenSSH config naming the bastion (`-F` in the inventory's SSH arguments)."""
        return self.instance_dir / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.instance_dir / "known_hosts"

    def host_dir(self, name: str) -> Path:
        return self.instance_dir / "hosts" / name
