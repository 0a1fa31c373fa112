"""Which address families a cluster can be wired with. Pure, from the validated Cluster.

What each host listens on is the plan's (plan/ports.py, from what the engine renders); an
engine that cannot take IPv6 literals says so itself (its NO_IPV6, checked by the plan).
"""

from __future__ import annotations

import ipaddress

from k2provision.core.records import Cluster
from k2provision.core.variables import shorten_hosts


def ip_version(address: str) -> int | None:
    """4 or 6 for an IP literal, None for a name."""
    try:
        return ipaddress.ip_address(address).version
    except ValueError:
        return None


def address_family_problems(cluster: Cluster) -> list[str]:
    """IPv4 and IPv6 literals mixed in one cluster."""
    by_version: dict[int, list[str]] = {}
    for host in cluster.hosts:
        for address in dict.fromkeys((host.address, host.local_ip)):
            version = ip_version(address)
            if version:
                by_version.setdefault(version, []).append(host.name)
    problems = []
    if len(by_version) > 1:
        problems.append(
            f"{cluster.inventory}: IPv4 addresses ({shorten_hosts(by_version[4])}) and IPv6 "
            f"addresses ({shorten_hosts(by_version[6])}) in one cluster; expected one address "
            "family, since every host connects to every other; fix: give every host "
            "ansible_host and k2_local_ip of the same family"
        )
    return problems
