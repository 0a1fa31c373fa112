"""The shared root filesystem: Debian bookworm from debootstrap, built once, cached, marked.

Every lab host mounts it read-only as the lower layer of its own overlay. The build runs in
``rootfs.partial`` and is renamed into place only when complete; ``rootfs.json`` records the
recipe it was built from. A missing or different marker means the rootfs is (re)built; a
half-built tree is discarded (the downloaded .debs are kept in ``cache/debs`` so a retry
does not fetch them again).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from k2lab.config import PROXY_NAME, PROXY_PORT, LabConfig
from k2lab.errors import LabError
from k2lab.fs import safe_rmtree, write_file
from k2lab.proc import Log, run

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

PACKAGES: tuple[str, ...] = (
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "iputils-ping",
    "procps",
    "ca-certificates",
    "podman",
    "runc",
    "podman-docker",
    "curl",
    "rsync",
    "less",
    "tini",
    "iptables",  # netavark's NAT for podman's default (non-host) network
    "netavark",  # provides container-network-stack, which debootstrap cannot resolve itself
)
"""Packages beyond debootstrap's minbase (their dependencies come along)."""

# Files every host sees from the lower layer. Per-host files (hostname, /etc/hosts, sshd
# drop-in, host key, storage.conf) are written into each host's upper dir at start.
STATIC_FILES: dict[str, str] = {
    "etc/apt/apt.conf.d/80proxy": (
        "// Lab hosts reach Debian through the proxy on their bridge (k2provision lab).\n"
        f'Acquire::http::Proxy "http://{PROXY_NAME}:{PROXY_PORT}";\n'
    ),
    "etc/apt/apt.conf.d/80k2lab-noextras": (
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
    ),
    "etc/containers/containers.conf": (
        "# Lab hosts: runc (crun refuses this kernel's hybrid cgroup layout), cgroupfs (no\n"
        "# systemd), and default ulimits within what the lab may grant (no CAP_SYS_RESOURCE).\n"
        "# Any --ulimit flag replaces these defaults: pass nofile/nproc again with it.\n"
        "[containers]\n"
        'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n'
        "\n[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        "\n[network]\n"
        'network_backend = "netavark"\n'
    ),
    "etc/containers/nodocker": "",
    "etc/resolv.conf": (
        "# Lab hosts have no route out: names come from /etc/hosts, the rest via the proxy.\n"
    ),
    "etc/apt/sources.list": (
        f"deb {DEFAULT_MIRROR} {SUITE} main\n"
        f"deb {DEFAULT_MIRROR} {SUITE}-updates main\n"
        f"deb http://deb.debian.org/debian-security {SUITE}-security main\n"
    ),
}
MOUNT_POINTS: tuple[str, ...] = ("var/lib/containers", "var/lib/k2lab-images")


def mirror() -> str:
    return os.environ.get("K2_LAB_MIRROR", DEFAULT_MIRROR)


def _base_recipe() -> dict[str, object]:
    return {"suite": SUITE, "variant": "minbase", "packages": list(PACKAGES)}


def recipe() -> dict[str, object]:
    return {**_base_recipe(), "files": STATIC_FILES, "mount_points": list(MOUNT_POINTS)}


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def base_hash() -> str:
    """What debootstrap installs; a change means a new debootstrap."""
    return _digest(_base_recipe())


def recipe_hash() -> str:
    """Everything in the rootfs; a change of files alone is re-applied in place."""
    return _digest(recipe())


def _marker(cfg: LabConfig) -> dict[str, object]:
    if not cfg.rootfs.is_dir() or not cfg.rootfs_marker.exists():
        return {}
    try:
        marker = json.loads(cfg.rootfs_marker.read_text())
    except ValueError:
        return {}
    return marker if isinstance(marker, dict) else {}


def is_current(cfg: LabConfig) -> bool:
    """True when a complete rootfs built from this recipe is in place."""
    return _marker(cfg).get("recipe") == recipe_hash()


def _debootstrap(cfg: LabConfig, target: Path, log: Log) -> None:
    cfg.deb_cache.mkdir(parents=True, exist_ok=True)
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        f"--cache-dir={cfg.deb_cache}",
        SUITE,
        str(target),
        mirror(),
    ]
    log(f"rootfs: debootstrap {SUITE} into {target} (about a minute, once)")
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    assert proc.stdout is not None
    phase, count = "", 0
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-19:], line.rstrip()]
        if not line.startswith("I: "):
            continue
        word = line[3:].split(" ", 1)[0]
        word = "Retrieving" if word == "Validating" else word
        if word != phase:
            if phase and count > 1:
                log(f"rootfs:   ... {count} x {phase}")
            phase, count = word, 0
            log(f"rootfs: {line[3:].strip()}")
        count += 1
    if proc.wait() != 0:
        last = " | ".join(t for t in tail[-5:] if t)
        raise LabError(
            f"debootstrap failed (exit {proc.returncode}): {last}; fix: check the network to "
            f"{mirror()} (or set K2_LAB_MIRROR) and run `lab up` again"
        )


def _configure(target: Path) -> None:
    for rel, text in STATIC_FILES.items():
        write_file(target / rel, text)
    for rel in MOUNT_POINTS:
        (target / rel).mkdir(parents=True, exist_ok=True)
    for key in (target / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # each host gets its own key at start
    (target / "etc" / "hostname").unlink(missing_ok=True)
    run(["chroot", str(target), "apt-get", "clean"])


def ensure_rootfs(cfg: LabConfig, log: Log) -> bool:
    """Build the rootfs unless a complete one from this recipe exists; True when built."""
    marker = _marker(cfg)
    if marker.get("recipe") == recipe_hash():
        return False
    started = time.monotonic()
    if marker.get("base") == base_hash():
        log("rootfs: re-applying the lab's files (the package set is unchanged)")
        cfg.rootfs_marker.unlink()
        _configure(cfg.rootfs)
        _write_marker(cfg, started)
        return True
    partial = cfg.lab_dir / "rootfs.partial"
    if partial.exists():
        log("rootfs: discarding a half-built rootfs")
        safe_rmtree(partial)
    cfg.lab_dir.mkdir(parents=True, exist_ok=True)
    _debootstrap(cfg, partial, log)
    log("rootfs: configuring (apt proxy, podman runtime, sshd keys)")
    _configure(partial)
    cfg.rootfs_marker.unlink(missing_ok=True)
    if cfg.rootfs.exists():
        log("rootfs: replacing the previous rootfs (recipe changed)")
        safe_rmtree(cfg.rootfs)
    os.rename(partial, cfg.rootfs)
    _write_marker(cfg, started)
    log(f"rootfs: ready in {time.monotonic() - started:.1f} s")
    return True


def _write_marker(cfg: LabConfig, started: float) -> None:
    marker = {
        "recipe": recipe_hash(),
        "base": base_hash(),
        **recipe(),
        "built_at": time.time(),
        "seconds": round(time.monotonic() - started, 1),
    }
    cfg.rootfs_marker.write_text(json.dumps(marker, indent=2) + "\n")
