"""One lab host: its files, its namespaces, its processes.

A host is a process tree: ``unshare --uts --ipc --mount --pid --fork`` inside the host's
network namespace; its PID 1 mounts an overlay (shared rootfs below, the host's own upper
dir above) plus /proc, a fresh /sys (showing the host's own interfaces) with the
controller's cgroup mounts bound in, /dev, a private /dev/shm and /run, the host's
container storage (a real directory on the lab dir's filesystem, never overlay) and the
shared image store read-only; then it chroots and runs ``tini -- sshd -D``.
All those mounts live in the host's private mount namespace and vanish with it.
"""

from __future__ import annotations

import shlex
import socket
import stat
import time
import uuid
from pathlib import Path

from k2lab.config import PROXY_NAME, LabConfig
from k2lab.errors import LabError
from k2lab.fs import fs_type, write_file
from k2lab.inventory import hosts_block, update_hosts_file
from k2lab.proc import (
    ProcRef,
    children_of,
    is_alive,
    kill,
    proc_ref,
    run,
    spawn_detached,
    wait_gone,
)
from k2lab.state import HostState

BASE_HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)
AUTHORIZED_KEYS = "/etc/ssh/k2lab_authorized_keys"
IMAGES_MOUNT = "/var/lib/k2lab-images"
NATIVE_OVERLAY_FS = ("ext4", "xfs", "btrfs")
# Debian's directory for Python packages of every python3 on the host, and the lab's bytecode
# cache for modules imported from zip files, which a .pth line there loads (host_python/).
HOST_DIST_PACKAGES = "usr/lib/python3/dist-packages"
ZIPCACHE = Path(__file__).resolve().parent / "host_python" / "k2lab_zipcache.py"


def storage_driver(cfg: LabConfig) -> str:
    """overlay when the lab dir is on a filesystem that can hold overlay layers, else vfs."""
    return "overlay" if fs_type(cfg.lab_dir) in NATIVE_OVERLAY_FS else "vfs"


def sshd_dropin(port: int) -> str:
    return (
        "# k2provision lab: the management sshd. Key only, root by key.\n"
        f"Port {port}\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        f"AuthorizedKeysFile .ssh/authorized_keys {AUTHORIZED_KEYS}\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "UseDNS no\n"
        "MaxStartups 200:30:400\n"
        "MaxSessions 200\n"
    )


def storage_conf(driver: str) -> str:
    return (
        "# k2provision lab: per-host storage, plus the controller's images, read-only.\n"
        "[storage]\n"
        f'driver = "{driver}"\n'
        'runroot = "/run/containers/storage"\n'
        'graphroot = "/var/lib/containers/storage"\n'
        "\n[storage.options]\n"
        f'additionalimagestores = ["{IMAGES_MOUNT}"]\n'
    )


def _upper_write(upper: Path, lower: Path, rel: str, text: str, mode: int = 0o644) -> None:
    """Write a file into an overlay's upper dir, creating parents with the lower dir's modes
    (an upper dir created 0755 would otherwise change e.g. /root's mode in the merged view)."""
    parts = Path(rel).parts
    for depth in range(1, len(parts)):
        sub = Path(*parts[:depth])
        target = upper / sub
        if target.exists():
            continue
        target.mkdir()
        source = lower / sub
        if source.is_dir():
            st = source.stat()
            target.chmod(stat.S_IMODE(st.st_mode))
    write_file(upper / rel, text, mode)


def ensure_host_key(host_dir: Path, name: str) -> str:
    """The host's ed25519 key pair (made once per host dir); returns "ssh-ed25519 BASE64"."""
    key = host_dir / "ssh_host_ed25519_key"
    if not key.exists() or not key.with_suffix(".pub").exists():
        host_dir.mkdir(parents=True, exist_ok=True)
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def hosts_file_text(existing: str | None, cfg: LabConfig, entries: list[tuple[str, str]]) -> str:
    block = hosts_block(entries, (f"{cfg.name}-controller {PROXY_NAME}", cfg.controller_ip))
    return update_hosts_file(existing if existing is not None else BASE_HOSTS, block)


def write_host_files(
    cfg: LabConfig, name: str, entries: list[tuple[str, str]], public_key: str
) -> None:
    """The per-host files, written into the upper dir before the overlay is mounted."""
    hdir = cfg.host_dir(name)
    upper, lower = hdir / "upper", cfg.rootfs
    upper.mkdir(parents=True, exist_ok=True)
    key = hdir / "ssh_host_ed25519_key"
    current_hosts = upper / "etc" / "hosts"
    existing = current_hosts.read_text() if current_hosts.exists() else None
    files = {
        "etc/hostname": (f"{name}\n", 0o644),
        "etc/hosts": (hosts_file_text(existing, cfg, entries), 0o644),
        "etc/ssh/ssh_host_ed25519_key": (key.read_text(), 0o600),
        "etc/ssh/ssh_host_ed25519_key.pub": (key.with_suffix(".pub").read_text(), 0o644),
        "etc/ssh/sshd_config.d/00-k2lab.conf": (sshd_dropin(cfg.ssh_port), 0o644),
        AUTHORIZED_KEYS.lstrip("/"): (public_key, 0o644),
        "etc/containers/storage.conf": (storage_conf(storage_driver(cfg)), 0o644),
        # The lab registry (k2lab/registry.py) speaks plain HTTP on the bridge address.
        "etc/containers/registries.conf.d/50-k2lab-registry.conf": (
            f'[[registry]]\nlocation = "{cfg.registry}"\ninsecure = true\n',
            0o644,
        ),
        # The hosts' Python keeps what it compiles from zip files (Ansible's module payloads).
        f"{HOST_DIST_PACKAGES}/{ZIPCACHE.name}": (ZIPCACHE.read_text(), 0o644),
        f"{HOST_DIST_PACKAGES}/k2lab_zipcache.pth": ("import k2lab_zipcache\n", 0o644),
    }
    if not (upper / "etc" / "machine-id").exists():
        files["etc/machine-id"] = (uuid.uuid4().hex + "\n", 0o444)  # one per host, kept
    for rel, (text, mode) in files.items():
        _upper_write(upper, lower, rel, text, mode)


def update_running_hosts_file(
    host: HostState, cfg: LabConfig, entries: list[tuple[str, str]]
) -> None:
    """Rewrite the lab block of /etc/hosts in a running host (through its root)."""
    if host.init is None or not is_alive(host.init):
        return
    path = Path(f"/proc/{host.init.pid}/root/etc/hosts")
    text = hosts_file_text(path.read_text() if path.exists() else None, cfg, entries)
    path.write_text(text)


def mount_points(cfg: LabConfig, name: str) -> tuple[str, ...]:
    root = cfg.host_dir(name) / "root"
    subs = (
        "",
        "proc",
        "sys",
        "sys/fs/cgroup",
        "dev",
        "dev/shm",
        "run",
        "var/lib/containers",
        IMAGES_MOUNT.lstrip("/"),
    )
    return tuple(str(root / s) if s else str(root) for s in subs)


def ssh_only_from(address: str, port: int) -> str:
    """The host's firewall rule (in its own network namespace) that refuses SSH from anywhere
    but `address` (the bastion) with a TCP reset, so a direct attempt fails at once."""
    return (
        f"iptables -A INPUT -p tcp --dport {port} ! -s {address} -j REJECT --reject-with tcp-reset"
    )


STORE_LOCKS = ("overlay-images/images.lock", "overlay-layers/layers.lock")
"""The lock files of the shared image store that a host's podman takes when it reads the store
(an additional, read-only image store there)."""


def private_store_locks(cfg: LabConfig, name: str) -> list[tuple[Path, str]]:
    """(the host's own lock file, the store's lock file relative to the store) for each of
    STORE_LOCKS; `launch` makes both.

    A host mounts its own files over the store's lock files. Without them, a host's podman
    reading the store (images.lock, then layers.lock, for reading) and the controller's podman
    writing it (a build's commit, an image removal: layers.lock, then images.lock, for writing)
    can each hold the lock the other waits for, and both wait for ever; seen when a host ran a
    container while the controller built an image. With its own lock files a host never waits
    for the controller: the store's metadata files are replaced whole (written aside, renamed),
    each `docker` command on a host reads them afresh, and a host runs only images whose build
    has ended."""
    own = cfg.host_dir(name) / "store-locks"
    return [(own / Path(rel).name, rel) for rel in STORE_LOCKS]


def make_store_locks(cfg: LabConfig, name: str) -> None:
    """The host's own lock files and the store's (before podman first made them), empty."""
    for own, rel in private_store_locks(cfg, name):
        for path in (own, cfg.image_store / rel):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)


def init_script(cfg: LabConfig, name: str, ssh_from: str | None = None) -> str:
    """What PID 1 of the host's namespaces runs: mount its world, pivot into it, exec sshd
    (reachable only from `ssh_from` when given)."""
    firewall = f"{ssh_only_from(ssh_from, cfg.ssh_port)} && " if ssh_from else ""
    hdir = cfg.host_dir(name)
    q = {
        k: shlex.quote(str(v))
        for k, v in {
            "root": hdir / "root",
            "lower": cfg.rootfs,
            "upper": hdir / "upper",
            "work": hdir / "work",
            "containers": hdir / "containers",
            "images": cfg.image_store,
        }.items()
    }
    r = q["root"]
    return "\n".join(
        [
            "set -eu",
            f"mount -t overlay {cfg.name}-{name} "
            f"-o lowerdir={q['lower']},upperdir={q['upper']},workdir={q['work']} {r}",
            f"mount -t proc proc {r}/proc",
            f"mount -t sysfs sysfs {r}/sys",
            f"mount --rbind /sys/fs/cgroup {r}/sys/fs/cgroup",
            f"mount --rbind /dev {r}/dev",
            f"mount -t tmpfs -o mode=1777,nosuid,nodev shm {r}/dev/shm",
            f"mount -t tmpfs -o mode=755,nosuid,nodev run {r}/run",
            f"mkdir -p {r}/run/sshd {r}/run/lock",
            f"mount --bind {q['containers']} {r}/var/lib/containers",
            f"mount --bind {q['images']} {r}{IMAGES_MOUNT}",
            f"mount -o remount,bind,ro {r}{IMAGES_MOUNT}",
            *(
                f"mount --bind {shlex.quote(str(own))} {r}{shlex.quote(f'{IMAGES_MOUNT}/{shared}')}"
                for own, shared in private_store_locks(cfg, name)
            ),
            f"hostname {shlex.quote(name)}",
            # pivot_root, not chroot: the overlay becomes the namespace's real root, so runc
            # inside can pivot too and `docker exec` sees the container's filesystem.
            "mount --make-rprivate /",
            f"mkdir -p {r}/.oldroot",
            f"cd {r}",
            "pivot_root . .oldroot",
            "exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
            "LANG=C.UTF-8 /usr/sbin/chroot . /bin/sh -c "
            f"'umount -l /.oldroot && rmdir /.oldroot && {firewall}"
            "exec /usr/bin/tini -- /usr/sbin/sshd -D -e'",
        ]
    )


def launch(
    cfg: LabConfig, name: str, netns: str, ssh_from: str | None = None
) -> tuple[ProcRef, ProcRef]:
    """Start the host's process tree; returns (outer unshare process, the host's PID 1)."""
    hdir = cfg.host_dir(name)
    for sub in ("upper", "work", "root", "containers"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    cfg.image_store.mkdir(parents=True, exist_ok=True)
    make_store_locks(cfg, name)
    inner = init_script(cfg, name, ssh_from)
    script = (
        'echo $$ > "$K2_PIDFILE"; exec nsenter --net=/run/netns/'
        + shlex.quote(netns)
        + " unshare --uts --ipc --mount --pid --fork --kill-child --propagation private"
        + " sh -c "
        + shlex.quote(inner)
    )
    log_file = hdir / "console.log"
    outer = spawn_detached(script, pid_file=hdir / "pid", log_file=log_file)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = [r for r in (proc_ref(p) for p in children_of(outer.pid)) if r is not None]
        if kids:
            return outer, kids[0]
        if not is_alive(outer):
            break
        time.sleep(0.01)
    kill(outer)
    raise LabError(f"{name}: did not start; see {log_file}: {console_tail(log_file)}")


def console_tail(log_file: Path, lines: int = 3) -> str:
    if not log_file.exists():
        return "no output"
    tail = log_file.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(tail) or "no output"


def stop(host: HostState, timeout: float = 10.0) -> None:
    """Kill the host's PID 1 (the kernel then kills everything in its PID namespace, and its
    mount namespace with the overlay goes away), then the outer process."""
    kill(host.init)
    # The outer unshare reaps its child and exits by itself; kill it only if it lingers.
    if not wait_gone([host.init, host.outer], min(timeout, 2.0)):
        kill(host.outer)
    if not wait_gone([host.init, host.outer], timeout):
        raise LabError(f"{host.name}: processes {host.outer}, {host.init} did not exit")


def port_open(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn_listener(
    program: str, argv: str, *, run_dir: Path, address: str, port: int, timeout: float = 10.0
) -> ProcRef:
    """Start ``program argv`` (a shell-quoted argument string) detached, its pid and log in
    `run_dir` (<program>.pid, <program>.log); returns it once it listens on address:port,
    else kills it and says why (the log's last lines)."""
    log_file = run_dir / f"{program}.log"
    ref = spawn_detached(
        f'echo $$ > "$K2_PIDFILE"; exec {program} {argv}',
        pid_file=run_dir / f"{program}.pid",
        log_file=log_file,
    )
    deadline = time.monotonic() + timeout
    while not port_open(address, port, timeout=0.2):
        if not is_alive(ref) or time.monotonic() > deadline:
            kill(ref)
            raise LabError(
                f"{program} did not listen on {address}:{port}: {console_tail(log_file)}"
            )
        time.sleep(0.05)
    return ref


def stop_listener(ref: ProcRef | None) -> None:
    """Stop what spawn_listener started (None: nothing), and wait until it is gone."""
    kill(ref)
    wait_gone([ref], timeout=5)


def scan_host_key(address: str, port: int, from_netns: str | None = None) -> str | None:
    """The ed25519 key the host's sshd serves ("ssh-ed25519 BASE64"), or None; asked from
    the network namespace `from_netns` (the bastion's) when given."""
    inside = ["ip", "netns", "exec", from_netns] if from_netns else []
    out = run(
        [*inside, "ssh-keyscan", "-T", "3", "-t", "ed25519", "-p", str(port), address],
        check=False,
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#"):
            return f"{fields[1]} {fields[2]}"
    return None


def wait_ready(
    cfg: LabConfig, hosts: list[HostState], timeout: float = 30.0, via_netns: str | None = None
) -> None:
    """Wait until every host's sshd answers and serves exactly the host key the lab made
    (asked from the bastion's network namespace `via_netns` when hosts sit behind it)."""
    pending = {h.name: h for h in hosts}
    deadline = time.monotonic() + timeout
    while pending:
        for name, host in list(pending.items()):
            if not is_alive(host.init):
                log_file = cfg.host_dir(name) / "console.log"
                raise LabError(f"{name}: exited at start; see {log_file}: {console_tail(log_file)}")
            if via_netns is None and not port_open(host.address, cfg.ssh_port):
                continue
            served = scan_host_key(host.address, cfg.ssh_port, via_netns)
            if served is None:
                continue
            if served != host.host_key:
                raise LabError(
                    f"{name} ({host.address}:{cfg.ssh_port}) serves a host key other than the "
                    "one the lab made; is another machine using this address?"
                )
            del pending[name]
        if pending and time.monotonic() > deadline:
            raise LabError(
                f"sshd did not answer within {timeout:.0f} s on: {', '.join(sorted(pending))}; "
                f"see {cfg.instance_dir}/hosts/*/console.log"
            )
        if pending:
            time.sleep(0.05)
