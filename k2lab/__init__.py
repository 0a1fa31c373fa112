"""The test lab: N real SSH hosts on one Debian machine, for tests and demos.

A package of its own beside the product (k2provision never imports it): it uses the product's
planner and registers itself as `k2provision lab` through the `k2provision.commands` entry
point. It works from the current directory, from a checkout or a wheel alike.

Each host has its own network namespace (a veth on the bridge ``k2lab0``, controller at
10.77.0.1, hosts lab1..labN at 10.77.0.11...), its own UTS/IPC/mount/PID namespaces, its
own root filesystem (an overlay over one shared debootstrapped Debian bookworm), a
management sshd (port 22, key only, root by key) and podman with the ``docker`` command
(``docker run --network host --ipc host`` works). apt and pip reach the outside through a
tinyproxy on the bridge address. The rootfs, image store and key are cached under
``$K2_LAB_DIR`` (default ``./.lab``); the first ``up`` builds them.

Python API (root required)::

    import k2lab as lab
    state = lab.up(4)                       # ./inventory/lab.ini, all hosts in [nodes]
    state = lab.up(4, groups={"prefill": 1, "decode": 3}, all_vars={"k2_engine": "sglang"})
    lab.stop_host("lab2"); lab.start_host("lab2")   # a host dies and comes back, disk kept
    lab.shape(100)                          # 100 Mbit/s each way on every host link
    lab.build_image("localhost/k2stub:test", Path("containers/stub"))  # FROM localhost/k2host:test
    lab.down()

Command line: ``k2provision lab up 4 [--shape-mbit R]``, ``lab status``, ``lab shape R|off``,
``lab down`` (or ``python -m k2lab.cli ...``); without
``--group``/``--var``, ``up`` writes the first layout that plans (k2lab/demo.py).

Lab profile limits (the machine, not the lab): no GPUs or InfiniBand; ``--ulimit memlock=-1``
cannot be granted and podman rejects ``--shm-size`` with ``--ipc host``; ``docker inspect``
under podman shows IpcMode "shareable" even with host IPC (compare /proc/PID/ns/ipc).
"""

from __future__ import annotations

from pathlib import Path

from k2lab import images as _images
from k2lab.config import LabConfig, default_inventory_path, default_lab_dir
from k2lab.core import (
    HostStatus,
    LabStatus,
    current_state,
    down,
    heal,
    host_root,
    prepare,
    shape,
    ssh_command,
    start_host,
    status,
    stop_host,
    up,
)
from k2lab.errors import LabError, NotRootError
from k2lab.images import BASE_IMAGE
from k2lab.inventory import VarValue
from k2lab.proc import Log, quiet_log, stderr_log
from k2lab.state import HostState, LabState


def build_image(
    tag: str,
    containerfile_dir: Path,
    *,
    containerfile: Path | None = None,
    build_args: dict[str, str] | None = None,
    cfg: LabConfig | None = None,
    log: Log = stderr_log,
) -> None:
    """Build an image (FROM localhost/k2host:test) that every lab host can run at once."""
    _images.build_image(
        cfg or LabConfig.default(),
        tag,
        containerfile_dir,
        containerfile=containerfile,
        build_args=build_args,
        log=log,
    )


def import_image(tag: str, tarball: Path, cfg: LabConfig | None = None) -> None:
    """Import a root filesystem tarball as image `tag` for every lab host."""
    _images.import_image(cfg or LabConfig.default(), tag, tarball)


def load_image(archive: Path, cfg: LabConfig | None = None) -> str:
    """Load a `docker save` archive into the store every lab host reads."""
    return _images.load_image(cfg or LabConfig.default(), archive)


__all__ = [
    "BASE_IMAGE",
    "HostState",
    "HostStatus",
    "LabConfig",
    "LabError",
    "LabState",
    "LabStatus",
    "NotRootError",
    "VarValue",
    "build_image",
    "current_state",
    "default_inventory_path",
    "default_lab_dir",
    "down",
    "heal",
    "host_root",
    "import_image",
    "load_image",
    "prepare",
    "quiet_log",
    "shape",
    "ssh_command",
    "start_host",
    "status",
    "stderr_log",
    "stop_host",
    "up",
]
