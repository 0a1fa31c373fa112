"""The lab network: one bridge on the controller, one namespace and veth pair per host, tc shaping.

Hosts reach each other and the controller (bridge address) only; nothing is routed out.
Commands into a namespace use `ip -n` / `tc -n`, which do not remount /sys (`ip netns exec`
does, and that hides the cgroup mounts podman needs).
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path

from k2lab.config import LabConfig
from k2lab.errors import LabError
from k2lab.proc import run


def link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", name]
    return run(argv, check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def subnet_users(cfg: LabConfig) -> list[str]:
    """Interfaces other than this lab's bridge that hold an address in the lab's subnet."""
    net = ipaddress.ip_network(cfg.subnet)
    users = []
    for line in run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] != cfg.bridge:
            address = ipaddress.ip_interface(fields[3]).ip
            if address in net:
                users.append(fields[1])
    return users


def ensure_bridge(cfg: LabConfig) -> bool:
    """Create the bridge with the controller address; True when it was created now.

    Refuses a subnet that another interface (another lab instance, say) already uses: two labs
    on one subnet answer each other's addresses with the wrong host keys.
    """
    users = subnet_users(cfg)
    if users:
        raise LabError(
            f"lab {cfg.name}: subnet {cfg.subnet} is already used by {', '.join(users)}; "
            "fix: pick another subnet for this lab instance, or take the other one down"
        )
    created = False
    if not link_exists(cfg.bridge):
        run(["ip", "link", "add", cfg.bridge, "type", "bridge"])
        created = True
    addr = f"{cfg.controller_ip}/{cfg.prefix_len}"
    shown = run(["ip", "-o", "-4", "addr", "show", "dev", cfg.bridge]).stdout
    if f" {addr} " not in shown:
        run(["ip", "addr", "add", addr, "dev", cfg.bridge])
    run(["ip", "link", "set", cfg.bridge, "up"])
    return created


def delete_bridge(name: str) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name])


def ensure_host_net(cfg: LabConfig, index: int) -> None:
    """Namespace + veth pair for host `index`: eth0, its address, a default route to the bridge."""
    ns, veth, tmp = cfg.netns(index), cfg.veth(index), cfg.veth_peer_tmp(index)
    if not netns_exists(ns):
        run(["ip", "netns", "add", ns])
    if not link_exists("eth0", ns):
        if link_exists(veth):  # a half-made pair from an interrupted run
            run(["ip", "link", "del", veth])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", tmp])
        run(["ip", "link", "set", tmp, "netns", ns])
        run(["ip", "-n", ns, "link", "set", tmp, "name", "eth0"])
    elif not link_exists(veth):
        raise LabError(f"namespace {ns} has eth0 but {veth} is missing; fix: run `lab down`")
    run(["ip", "link", "set", veth, "master", cfg.bridge])
    run(["ip", "link", "set", veth, "up"])
    addr = f"{cfg.host_ip(index)}/{cfg.prefix_len}"
    shown = run(["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", "eth0"]).stdout
    if f" {addr} " not in shown:
        run(["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "-n", ns, "route", "replace", "default", "via", cfg.controller_ip])


def cut_host_link(cfg: LabConfig, index: int) -> None:
    """Host `index`'s link down and its eth0 without addresses, as a machine without power:
    nothing answers for it (ensure_host_net gives both back)."""
    run(["ip", "link", "set", cfg.veth(index), "down"])
    run(["ip", "-n", cfg.netns(index), "addr", "flush", "dev", "eth0"])


def delete_host_net(netns: str, veth: str) -> None:
    """Remove a host's namespace (its eth0 goes with it) and the controller-side veth."""
    if netns_exists(netns):
        run(["ip", "netns", "del", netns])
    # Deleting the namespace destroys the pair asynchronously: delete, tolerate "gone", verify.
    deadline = time.monotonic() + 5
    while link_exists(veth):
        run(["ip", "link", "del", veth], check=False)
        if time.monotonic() > deadline:
            raise LabError(f"could not remove veth {veth}")
        time.sleep(0.02)


def tbf_args(mbit: float) -> list[str]:
    """A token bucket for `mbit` Mbit/s: a burst of ~10 ms of traffic, at least 32 KiB."""
    if mbit <= 0:
        raise LabError(f"shape rate must be positive, got {mbit} Mbit/s")
    rate_bytes = mbit * 1_000_000 / 8
    burst = max(32 * 1024, int(rate_bytes / 100))
    return ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms"]


def shape_host(cfg: LabConfig, index: int, mbit: float | None) -> None:
    """Limit host `index`'s link to `mbit` each way (egress of both veth ends); None removes it."""
    ends = [(["tc"], cfg.veth(index)), (["tc", "-n", cfg.netns(index)], "eth0")]
    for tc, dev in ends:
        if mbit is None:
            run([*tc, "qdisc", "del", "dev", dev, "root"], check=False)
        else:
            run([*tc, "qdisc", "replace", "dev", dev, "root", *tbf_args(mbit)])
