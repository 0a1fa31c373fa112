"""Rules over a whole Cluster that catch, at plan time, what would otherwise fail only on the
hosts: addresses that name no host (unspecified, broadcast, multicast) or that other hosts
cannot reach (loopback in a cluster of several hosts), one host under two spellings, a
firewall that would shut out the cluster's hosts or the operator (core/firewall.py), weights
settings that cannot work, and image references Docker would refuse (the engine's own rules,
tunables it never reads and ports it takes past the last, are the plan's: plan/support.py;
listeners that share a port or take the SSH port are plan/ports.py's).

Each rule returns problem lines (host or source, value, expectation, fix) and never raises;
`cluster_rule_problems` runs them all.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from k2provision.core.firewall import firewall_problems
from k2provision.core.records import Cluster
from k2provision.core.variables import shorten_hosts, show

# Docker's reference grammar: [registry[:port]/]path[:tag][@digest], the path lower case.
_IMAGE = re.compile(
    r"^(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[0-9a-f]{64})?$"
)


def _unreachable(value: str) -> str | None:
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if ip.is_unspecified:
        return "is the unspecified address, which names no host"
    if isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255"):
        return "is the broadcast address, which names no host"
    if ip.is_multicast:
        return "is a multicast address, which names no host"
    return None


def _loopback(value: str) -> bool:
    if value.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def unreachable_addresses(cluster: Cluster) -> list[str]:
    """Unspecified, broadcast or multicast addresses, and, in a cluster of several hosts, a
    loopback address the other hosts would reach (a one-host cluster may use loopback; a host
    reached over loopback, e.g. through an SSH tunnel, names its k2_local_ip instead)."""
    problems = []
    several = len(cluster.hosts) > 1
    for host in cluster.hosts:
        address_variable = host.address_from or "ansible_host"
        for variable, value in ((address_variable, host.address), ("k2_local_ip", host.local_ip)):
            if why := _unreachable(value):
                problems.append(
                    f"{host.name}: {variable}={value} {why}; expected an address every host "
                    f"of the cluster reaches; fix: set {variable} to the host's own address"
                )
                break
        else:
            if several and _loopback(host.local_ip):
                variable = address_variable if host.local_ip == host.address else "k2_local_ip"
                problems.append(
                    f"{host.name}: {variable}={host.local_ip} is a loopback address, which the "
                    f"other {len(cluster.hosts) - 1} host(s) of the cluster cannot reach; "
                    "expected an address every host reaches (loopback only in a one-host "
                    "cluster); fix: set k2_local_ip (or ansible_host) to the host's own address"
                )
    return problems


def _normal_name(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")


def same_host_twice(cluster: Cluster) -> list[str]:
    """One address under two spellings (DNS names differing in case or a trailing dot, IPv6
    written two ways); the exact repeats are inventory.py's."""
    seen: dict[str, tuple[str, str]] = {}
    problems = []
    for host in cluster.hosts:
        key = _normal_name(host.address)
        if key in seen and seen[key][1] != host.address:
            other, spelled = seen[key]
            problems.append(
                f"{host.name}: address {host.address} is {other}'s {spelled} spelt another "
                "way (DNS names ignore case and a trailing dot); expected one address per "
                f"host; fix: correct {host.address_from or 'ansible_host'} of one of them"
            )
        seen.setdefault(key, (host.name, host.address))
    return problems


def _role(cluster: Cluster, name: str) -> str:
    return f"the router {name}" if name == cluster.router else name


def local_ip_clashes(cluster: Cluster) -> list[str]:
    """A host's k2_local_ip that is another host's address or k2_local_ip (any spelling):
    the engine would bind and advertise an address another host (the router's included)
    answers on. A pair of hosts is named once; a repeated ansible_host is inventory.py's."""
    problems = []
    named: set[frozenset[str]] = set()
    for host in cluster.hosts:
        if host.local_ip == host.address:
            continue  # k2_local_ip unset: the rules of repeated addresses judge ansible_host
        own = _normal_name(host.local_ip)
        for other in cluster.hosts:
            pair = frozenset((host.name, other.name))
            if other is host or pair in named:
                continue
            for variable, value in (
                (other.address_from or "ansible_host", other.address),
                ("k2_local_ip", other.local_ip),
            ):
                if _normal_name(value) != own or (
                    variable == "k2_local_ip" and other.local_ip == other.address
                ):
                    continue
                named.add(pair)
                whose = "k2_local_ip" if variable == "k2_local_ip" else "address"
                problems.append(
                    f"{host.name}: k2_local_ip={host.local_ip} is {_role(cluster, other.name)}'s "
                    f"{whose} ({variable}={value}); expected an address of {host.name}'s own, "
                    "since the engine binds and advertises it and the other hosts connect to "
                    f"it there; fix: set {host.name}'s k2_local_ip to its own address (e.g. "
                    f"its RDMA network's), or correct {other.name}'s {variable}"
                )
                break
    return problems


def weights_problems(cluster: Cluster, values: Mapping[str, Any]) -> list[str]:
    """Weights settings the k2_weights role would refuse only on the hosts."""
    source = str(values.get("k2_weights_source", "") or "")
    problems = []
    seed = str(values.get("k2_weights_source_host", "") or "")
    names = {h.name for h in cluster.hosts}
    if seed and seed not in names and seed != "localhost":
        problems.append(
            f"{cluster.inventory}: k2_weights_source_host={show(seed)} is not a host of the "
            "cluster; expected an inventory host or localhost (the controller); fix: name one "
            "of " + shorten_hosts(sorted(names))
        )
    if source == "hub" and not str(values.get("k2_weights_revision", "") or "").strip():
        problems.append(
            f"{cluster.inventory}: k2_weights_source=hub without k2_weights_revision; expected "
            "the hub commit to fetch (roles/k2_weights/meta/argument_specs.yml requires it for "
            "hub); fix: set k2_weights_revision to the model's commit hash"
        )
    if source == "synthetic" and not cluster.lab:
        problems.append(
            f"{cluster.inventory}: k2_weights_source=synthetic on an inventory that is not a "
            "lab's (k2_lab is false); expected synthetic weights only in labs and tests; fix: "
            "set k2_weights_source=hub or dir"
        )
    return problems


def image_problems(cluster: Cluster) -> list[str]:
    """Image overrides Docker would refuse as references."""
    problems = []
    for variable, image in (
        ("k2_image", cluster.tunables.image),
        ("k2_router_image", cluster.tunables.router_image),
    ):
        if image is not None and (len(image) > 255 or not _IMAGE.match(image)):
            problems.append(
                f"{cluster.inventory}: {variable}={show(image)} is not an image reference; "
                "expected [registry[:port]/]name[:tag][@sha256:digest] with a lower-case "
                f"name (docker pull's form); fix: correct {variable}"
            )
    return problems


def cluster_rule_problems(
    cluster: Cluster,
    values: Mapping[str, Any],
    host_vars: Mapping[str, Mapping[str, Any]],
) -> list[str]:
    """Every rule of this module over one cluster (`values`: the cluster's variables,
    `host_vars`: each host's, as Ansible resolved them)."""
    return [
        *unreachable_addresses(cluster),
        *firewall_problems(cluster, host_vars),
        *same_host_twice(cluster),
        *local_ip_clashes(cluster),
        *weights_problems(cluster, values),
        *image_problems(cluster),
    ]
