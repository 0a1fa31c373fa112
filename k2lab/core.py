"""up / down / status / stop_host / start_host / shape: the lab's operations.

Each operation takes the instance's lock, reads the state file, does its work and records
every namespace, veth, process and mount as soon as it exists, so an interrupted run
leaves a state that `down` can clean.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import k2lab.hosts as hostmod
from k2lab.config import (
    BASTION_INDEX,
    BASTION_NAME,
    MAX_HOSTS,
    PROXY_PORT,
    LabConfig,
    default_inventory_path,
)
from k2lab.errors import LabError
from k2lab.fs import fs_type, mounts_under, safe_rmtree, unmount_under, write_file
from k2lab.images import ensure_base_image
from k2lab.inventory import (
    INVENTORY_HEADER,
    InventoryHost,
    VarValue,
    bastion_ssh_config,
    known_hosts_text,
    layout_groups,
    render_inventory,
)
from k2lab.net import (
    cut_host_link,
    delete_bridge,
    delete_host_net,
    ensure_bridge,
    ensure_host_net,
    link_exists,
    netns_exists,
    shape_host,
)
from k2lab.proc import Log, is_alive, require_root, require_tools, run, stderr_log
from k2lab.proxy import start_proxy
from k2lab.registry import stop_stale as stop_stale_registry
from k2lab.rootfs import ensure_rootfs, is_current
from k2lab.state import HostState, LabState, ProxyState, load_state, save_state


@contextmanager
def _locked(cfg: LabConfig) -> Iterator[None]:
    cfg.lab_dir.mkdir(parents=True, exist_ok=True)
    with cfg.lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cfg(cfg: LabConfig | None) -> LabConfig:
    return cfg if cfg is not None else LabConfig.default()


def _new_state(cfg: LabConfig) -> LabState:
    return LabState(
        name=cfg.name,
        lab_dir=str(cfg.lab_dir),
        subnet=cfg.subnet,
        bridge=cfg.bridge,
        controller_ip=cfg.controller_ip,
        ssh_port=cfg.ssh_port,
        private_key=str(cfg.private_key),
        known_hosts=str(cfg.known_hosts),
    )


def _check_matches(cfg: LabConfig, state: LabState) -> None:
    if (state.subnet, state.ssh_port) != (cfg.subnet, cfg.ssh_port):
        raise LabError(
            f"lab {cfg.name} is up on {state.subnet} port {state.ssh_port}, not {cfg.subnet} "
            f"port {cfg.ssh_port}; fix: run `lab down` first"
        )


def _running_hosts_anywhere(cfg: LabConfig) -> list[str]:
    """Live hosts of every instance sharing this lab dir (they use the rootfs)."""
    running: list[str] = []
    for state_file in sorted((cfg.lab_dir / "instances").glob("*/state.json")):
        state = load_state(state_file)
        if state is not None:
            running.extend(f"{state.name}/{h.name}" for h in state.hosts if is_alive(h.init))
    return running


def ensure_lab_key(cfg: LabConfig) -> str:
    """The lab's SSH key pair (made once, never printed); returns the public key line."""
    key = cfg.private_key
    if not key.exists() or not key.with_suffix(".pub").exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.parent.chmod(0o700)
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k2provision-lab", "-f", str(key)]
        )
    return key.with_suffix(".pub").read_text()


def prepare(cfg: LabConfig | None = None, log: Log = stderr_log) -> None:
    """Build what `up` needs once (rootfs, base image, key) without starting hosts."""
    cfg = _cfg(cfg)
    require_root()
    require_tools()
    with _locked(cfg):
        _prepare_locked(cfg, log)


def _prepare_locked(cfg: LabConfig, log: Log) -> None:
    kind = fs_type(cfg.lab_dir)
    if kind in ("overlay", "aufs"):
        raise LabError(
            f"the lab dir {cfg.lab_dir} is on {kind}, which cannot hold the hosts' overlay "
            "layers; fix: set K2_LAB_DIR to a directory on ext4 or xfs"
        )
    if not is_current(cfg):
        running = _running_hosts_anywhere(cfg)
        if running:
            raise LabError(
                f"the lab rootfs must be rebuilt but hosts run on it: {', '.join(running)}; "
                "fix: run `lab down` first"
            )
        ensure_rootfs(cfg, log)
    ensure_base_image(cfg, log)
    ensure_lab_key(cfg)


def _wait_ready(cfg: LabConfig, state: LabState, hosts: list[HostState]) -> None:
    """Wait for the hosts' sshd: the bastion first, the hosts behind it asked from its
    network namespace (they refuse the controller)."""
    if state.bastion is None:
        hostmod.wait_ready(cfg, hosts)
        return
    hostmod.wait_ready(cfg, [h for h in hosts if h.name == state.bastion])
    behind = [h for h in hosts if h.name != state.bastion]
    hostmod.wait_ready(cfg, behind, via_netns=cfg.netns(BASTION_INDEX))


def _remove_host(cfg: LabConfig, host: HostState, problems: list[str]) -> None:
    try:
        hostmod.stop(host)
    except LabError as exc:
        problems.extend(exc.problems)
    try:
        delete_host_net(host.netns, host.veth)
    except LabError as exc:
        problems.extend(exc.problems)
    for point in host.mounts:  # normally gone with the host's mount namespace
        if mounts_under(Path(point)):
            unmount_under(Path(point))
    try:
        safe_rmtree(Path(host.dir))
    except (LabError, OSError) as exc:
        problems.append(f"{host.name}: could not remove {host.dir}: {exc}")


def _start_host(
    cfg: LabConfig, state: LabState, host: HostState, entries: list[tuple[str, str]], pub: str
) -> LabState:
    ensure_host_net(cfg, host.index)
    if is_alive(host.outer) or is_alive(host.init):
        hostmod.stop(host)  # a half-dead host (one of its processes or its namespace is gone)
    hostmod.write_host_files(cfg, host.name, entries, pub)
    behind = state.bastion is not None and host.name != state.bastion
    ssh_from = cfg.host_ip(BASTION_INDEX) if behind else None
    outer, init = hostmod.launch(cfg, host.name, host.netns, ssh_from)
    host = host.model_copy(
        update={"outer": outer, "init": init, "mounts": hostmod.mount_points(cfg, host.name)}
    )
    state = state.with_host(host)
    save_state(cfg.state_file, state)
    return state


def _write_access_files(
    cfg: LabConfig,
    state: LabState,
    inventory: Path,
    groups: Mapping[str, int] | None,
    children: Mapping[str, Sequence[str]] | None,
    all_vars: Mapping[str, VarValue] | None,
) -> bool:
    """known_hosts and the inventory; True when the inventory text changed."""
    triples = [(h.name, h.address, h.host_key) for h in state.hosts]
    write_file(cfg.known_hosts, known_hosts_text(triples, cfg.ssh_port))
    jump = None
    if state.bastion is not None:
        address = state.host(state.bastion).address
        write_file(
            cfg.ssh_config,
            bastion_ssh_config(
                state.bastion, address, cfg.ssh_port, str(cfg.private_key), str(cfg.known_hosts)
            ),
        )
        jump = (str(cfg.ssh_config), state.bastion)
    members = [h for h in state.hosts if h.name != state.bastion]
    text = render_inventory(
        [InventoryHost(h.name, h.address) for h in members],
        instance=cfg.name,
        ssh_port=cfg.ssh_port,
        private_key=str(cfg.private_key),
        known_hosts=str(cfg.known_hosts),
        groups=layout_groups(tuple(h.name for h in members), groups),
        children=children,
        all_vars=all_vars,
        proxy_url=cfg.proxy_url,
        jump=jump,
    )
    if inventory.exists() and inventory.read_text() == text:
        return False
    write_file(inventory, text)
    return True


def up(
    n: int,
    *,
    shape_mbit: float | None = None,
    inventory: Path | None = None,
    groups: Mapping[str, int] | None = None,
    children: Mapping[str, Sequence[str]] | None = None,
    all_vars: Mapping[str, VarValue] | None = None,
    cfg: LabConfig | None = None,
    log: Log = stderr_log,
    bastion: bool = False,
) -> LabState:
    """Bring the lab to exactly `n` running hosts and write their inventory.

    bastion: one more host, `bastion`, that the others accept SSH from alone (a firewall rule
    in each one's namespace); the inventory reaches them through it (ProxyJump). Switching a
    running lab to or from a bastion restarts its hosts.
    groups: host counts per inventory group, assigned in order (default: all in [nodes]);
    children: `[parent:children]` sections; all_vars: extra `[all:vars]` (k2_lab=true is
    always set). Hosts already running are left alone, dead ones restarted, extra ones
    removed. shape_mbit limits every host link to that rate each way (None: unshaped).
    """
    cfg = _cfg(cfg)
    require_root()
    top = BASTION_INDEX - 1 if bastion else MAX_HOSTS
    if not 1 <= n <= top:
        raise LabError(f"lab up {n}: expected 1..{top} hosts")
    require_tools()
    started_at = time.monotonic()
    inventory = (inventory or default_inventory_path()).resolve()
    layout_groups([cfg.host_name(i) for i in range(1, n + 1)], groups)  # validate early
    with _locked(cfg):
        _prepare_locked(cfg, log)
        pub = ensure_lab_key(cfg)
        state = load_state(cfg.state_file) or _new_state(cfg)
        _check_matches(cfg, state)
        written = tuple(dict.fromkeys([*state.inventories, str(inventory)]))
        state = state.model_copy(update={"inventory": str(inventory), "inventories": written})
        save_state(cfg.state_file, state)
        changes: list[str] = []

        bridge_new = ensure_bridge(cfg)
        if bridge_new or not state.bridge_created:
            state = state.model_copy(update={"bridge_created": True})
            save_state(cfg.state_file, state)
            changes.append(f"bridge {cfg.bridge} {cfg.controller_ip}/24")
        if state.proxy is None or not is_alive(state.proxy.proc):
            ref = start_proxy(cfg)
            state = state.model_copy(
                update={"proxy": ProxyState(address=cfg.controller_ip, port=PROXY_PORT, proc=ref)}
            )
            save_state(cfg.state_file, state)
            changes.append(f"proxy {cfg.proxy_url}")

        jump_host = BASTION_NAME if bastion else None
        indices = [*([BASTION_INDEX] if bastion else []), *range(1, n + 1)]
        entries = [(cfg.host_name(i), cfg.host_ip(i)) for i in indices]
        hosts_changed = {h.name for h in state.hosts} != {name for name, _ in entries}
        problems: list[str] = []
        switched = state.bastion != jump_host
        if switched:
            state = state.model_copy(update={"bastion": jump_host})
            save_state(cfg.state_file, state)
        for extra in [h for h in state.hosts if switched or h.index not in indices]:
            _remove_host(cfg, extra, problems)
            state = state.without_host(extra.name)
            save_state(cfg.state_file, state)
            changes.append(f"removed {extra.name}")
        if problems:
            raise LabError("; ".join(problems))

        started: list[HostState] = []
        for index in indices:
            name = cfg.host_name(index)
            known = {h.name: h for h in state.hosts}
            host = known.get(name) or HostState(
                name=name,
                index=index,
                address=cfg.host_ip(index),
                netns=cfg.netns(index),
                veth=cfg.veth(index),
                dir=str(cfg.host_dir(name)),
            )
            host = host.model_copy(
                update={"host_key": hostmod.ensure_host_key(cfg.host_dir(name), name)}
            )
            state = state.with_host(host)
            save_state(cfg.state_file, state)
            if is_alive(host.init) and netns_exists(host.netns):
                if bridge_new:  # a bridge recreated under running hosts: plug them in again
                    ensure_host_net(cfg, host.index)
                if hosts_changed:
                    hostmod.update_running_hosts_file(host, cfg, entries)
                continue
            state = _start_host(cfg, state, host, entries, pub)
            started.append(state.host(name))
            changes.append(f"started {name}")
        _wait_ready(cfg, state, started)

        if shape_mbit != state.shape_mbit or (shape_mbit is not None and started):
            for host in state.hosts:
                shape_host(cfg, host.index, shape_mbit)
            if shape_mbit != state.shape_mbit:
                changes.append(f"shaping {shape_mbit} Mbit/s" if shape_mbit else "shaping off")
            state = state.model_copy(update={"shape_mbit": shape_mbit})
            save_state(cfg.state_file, state)

        if _write_access_files(cfg, state, inventory, groups, children, all_vars):
            changes.append(f"inventory {inventory}")
    took = time.monotonic() - started_at
    if not changes:
        log(f"lab {cfg.name} is already up with {n} hosts; nothing changed")
    else:
        more = " and a bastion" if bastion else ""
        log(f"lab {cfg.name}: {n} hosts{more} up in {took:.1f} s ({'; '.join(changes)})")
        log(f"inventory: {inventory}")
    return state


def down(cfg: LabConfig | None = None, log: Log = stderr_log) -> None:
    """Remove everything the state file names: hosts (processes, namespaces, veths, dirs),
    the proxy, the bridge, known_hosts, and the inventory if the lab wrote it."""
    cfg = _cfg(cfg)
    require_root()
    with _locked(cfg):
        state = load_state(cfg.state_file)
        if state is None:
            log(f"lab {cfg.name} is not up; nothing to remove")
            return
        problems: list[str] = []
        for host in state.hosts:
            before = len(problems)
            _remove_host(cfg, host, problems)
            if len(problems) == before:  # keep the record of anything that is still there
                state = state.without_host(host.name)
                save_state(cfg.state_file, state)
        stop_stale_registry(cfg)  # a test's registry an interrupted run left on the bridge
        if state.proxy is not None:
            hostmod.stop_listener(state.proxy.proc)
            state = state.model_copy(update={"proxy": None})
            save_state(cfg.state_file, state)
        if state.bridge_created:
            try:
                delete_bridge(state.bridge)
            except LabError as exc:
                problems.extend(exc.problems)
        for written in state.inventories:
            path = Path(written)
            if path.exists() and path.read_text().startswith(INVENTORY_HEADER):
                path.unlink()  # only a file the lab wrote and nobody rewrote since
        Path(state.known_hosts).unlink(missing_ok=True)
        state.ssh_config.unlink(missing_ok=True)
        if problems:
            save_state(cfg.state_file, state)
            raise LabError("lab down left something behind: " + "; ".join(problems))
        cfg.state_file.unlink()
        for leftover in ("tinyproxy.conf", "tinyproxy.pid", "tinyproxy.log"):
            (cfg.instance_dir / leftover).unlink(missing_ok=True)
        log(f"lab {cfg.name} is down")


def stop_host(
    name: str, cfg: LabConfig | None = None, log: Log = stderr_log, *, cut_link: bool = False
) -> LabState:
    """Kill one host at once, as if it lost power; its disk (upper dir) is kept. Its network
    namespace stays, so its kernel still refuses connections and answers ARP for its
    addresses; `cut_link` takes that away too (the link down, its addresses gone, as a dead
    machine's), so an address another host takes over (a front's floating address) is that
    host's alone. start_host gives the host its link and own address back."""
    cfg = _cfg(cfg)
    require_root()
    with _locked(cfg):
        state = _require_state(cfg)
        host = state.host(name)
        if cut_link:  # first: its dying processes send no reset, as a dead machine's do not
            cut_host_link(cfg, host.index)
        hostmod.stop(host)
        state = state.with_host(host.model_copy(update={"outer": None, "init": None}))
        save_state(cfg.state_file, state)
    log(f"{name} stopped")
    return state


def start_host(name: str, cfg: LabConfig | None = None, log: Log = stderr_log) -> LabState:
    """Start a stopped host again with the disk it had; no-op when it runs."""
    cfg = _cfg(cfg)
    require_root()
    with _locked(cfg):
        state = _require_state(cfg)
        host = state.host(name)
        if is_alive(host.init):
            log(f"{name} is already running")
            return state
        entries = [(h.name, h.address) for h in state.hosts]
        state = _start_host(cfg, state, host, entries, ensure_lab_key(cfg))
        _wait_ready(cfg, state, [state.host(name)])
        if state.shape_mbit is not None:
            shape_host(cfg, host.index, state.shape_mbit)
    log(f"{name} started")
    return state


def heal(cfg: LabConfig | None = None, log: Log = stderr_log) -> LabState:
    """Bring back whatever of a running lab died (bridge, proxy, hosts), changing nothing
    else: the inventory, the host count and the shaping stay as they are."""
    cfg = _cfg(cfg)
    require_root()
    with _locked(cfg):
        state = _require_state(cfg)
        if ensure_bridge(cfg):
            log(f"bridge {cfg.bridge} recreated")
        if state.proxy is None or not is_alive(state.proxy.proc):
            ref = start_proxy(cfg)
            state = state.model_copy(
                update={"proxy": ProxyState(address=cfg.controller_ip, port=PROXY_PORT, proc=ref)}
            )
            save_state(cfg.state_file, state)
            log("proxy restarted")
        entries = [(h.name, h.address) for h in state.hosts]
        pub = ensure_lab_key(cfg)
        started: list[HostState] = []
        for host in state.hosts:
            ensure_host_net(cfg, host.index)
            if not is_alive(host.init):
                state = _start_host(cfg, state, host, entries, pub)
                started.append(state.host(host.name))
                log(f"{host.name} restarted")
        _wait_ready(cfg, state, started)
        if state.shape_mbit is not None:
            for host in state.hosts:
                shape_host(cfg, host.index, state.shape_mbit)
    return state


def shape(mbit: float | None, cfg: LabConfig | None = None, log: Log = stderr_log) -> LabState:
    """Limit (or, with None, unlimit) every host link of a running lab."""
    cfg = _cfg(cfg)
    require_root()
    with _locked(cfg):
        state = _require_state(cfg)
        for host in state.hosts:
            shape_host(cfg, host.index, mbit)
        state = state.model_copy(update={"shape_mbit": mbit})
        save_state(cfg.state_file, state)
    log(f"shaping {'off' if mbit is None else f'{mbit} Mbit/s per host link'}")
    return state


def _require_state(cfg: LabConfig) -> LabState:
    state = load_state(cfg.state_file)
    if state is None:
        raise LabError(f"lab {cfg.name} is not up; fix: run `k2provision lab up N`")
    return state


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    alive: bool
    pid: int | None


@dataclass(frozen=True)
class LabStatus:
    name: str
    up: bool
    state: LabState | None
    hosts: tuple[HostStatus, ...]
    bridge: bool
    proxy: bool

    @property
    def healthy(self) -> bool:
        return self.up and self.bridge and self.proxy and all(h.alive for h in self.hosts)


def status(cfg: LabConfig | None = None) -> LabStatus:
    """What runs now, from the state file and the live processes (needs no lock, no root)."""
    cfg = _cfg(cfg)
    state = load_state(cfg.state_file)
    if state is None:
        return LabStatus(cfg.name, False, None, (), link_exists(cfg.bridge), False)
    hosts = tuple(
        HostStatus(h.name, h.address, is_alive(h.init), h.init.pid if h.init else None)
        for h in state.hosts
    )
    return LabStatus(
        name=cfg.name,
        up=True,
        state=state,
        hosts=hosts,
        bridge=link_exists(state.bridge),
        proxy=state.proxy is not None and is_alive(state.proxy.proc),
    )


def current_state(cfg: LabConfig | None = None) -> LabState | None:
    """The recorded state of the lab, or None when it is not up."""
    return load_state(_cfg(cfg).state_file)


def ssh_command(state: LabState, name: str, command: str) -> list[str]:
    """argv that runs `command` on a lab host over SSH with the lab key and pinned host keys."""
    host = state.host(name)
    behind = state.bastion is not None and name != state.bastion
    jump = ["-F", str(state.ssh_config), "-o", f"ProxyJump={state.bastion}"] if behind else []
    return [
        "ssh",
        *jump,
        "-i",
        state.private_key,
        "-p",
        str(state.ssh_port),
        "-o",
        f"UserKnownHostsFile={state.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ConnectTimeout=10",
        f"root@{host.address}",
        command,
    ]


def host_root(state: LabState, name: str) -> Path:
    """The running host's root filesystem as the controller can read it (/proc/PID/root)."""
    host = state.host(name)
    if host.init is None or not is_alive(host.init):
        raise LabError(f"{name} is not running; fix: `start_host({name!r})` or `lab up`")
    return Path(f"/proc/{host.init.pid}/root")
