"""The front tier's rules: several [router] hosts share the endpoint behind one floating
address (keepalived moves it, HAProxy on each spreads requests over every router). Pure.

Each rule returns problem lines (variable or host, value, expectation, fix) and never raises;
``front_problems`` runs them all. A front is two or more [router] hosts; k2_front_address is
required there and refused elsewhere (one holder is no failover).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from k2provision.core.records import Cluster
from k2provision.core.variables import shorten_hosts

EXAMPLE = "10.10.0.100/24"


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def count_problems(routers: Sequence[str], value: object) -> list[str]:
    """A front needs two or more [router] hosts and k2_front_address, each with the other
    (`routers`: the [router] group; `value`: k2_front_address as the inventory sets it, None
    when unset). Checked with the groups, before the hosts' own values."""
    if len(routers) < 2:
        if value is None:
            return []
        holder = routers[0] if routers else "none"
        return [
            f"k2_front_address={value}: one router host ({holder}) would hold it alone, which "
            "is no failover; expected two or more hosts in [router], each running a router, "
            "HAProxy and keepalived; fix: add a second host to [router], or unset "
            "k2_front_address"
        ]
    if value is None:
        return [
            f"[router] has {len(routers)} hosts ({shorten_hosts(list(routers))}): several "
            "routers share the endpoint behind one floating address, and k2_front_address is "
            "unset; expected k2_front_address=ADDRESS/PREFIX in the network of their addresses; "
            f"fix: set it (e.g. k2_front_address={EXAMPLE}), or keep one host in [router]"
        ]
    return []


def front_problems(cluster: Cluster) -> list[str]:
    """What keeps the inventory's front tier from working (its address, TLS); the counts are
    :func:`count_problems`'."""
    t = cluster.tunables
    routers = cluster.router_hosts
    value = t.front_address
    if len(routers) < 2 or value is None:
        return []
    listed = shorten_hosts(list(routers))
    problems = _address_problems(cluster, value)
    if t.tls_cert_file:
        problems.append(
            f"k2_tls_cert_file={t.tls_cert_file} with a front tier ([router]: {listed}): "
            "HAProxy passes plain HTTP to the routers and serves no TLS in this release; "
            "expected no k2_tls_cert_file with several routers; fix: terminate TLS in front "
            "of the address (a load balancer of the site's), or keep one host in [router]"
        )
    if t.canary_percent and any(h.pool in ("prefill", "decode") for h in cluster.hosts):
        problems.append(canary_pd_problem(f"k2_canary_percent={t.canary_percent}"))
    return problems


def canary_pd_problem(given: str) -> str:
    """Why a canary is refused for a PD fleet (`given`: the variable or option that asks)."""
    return (
        f"{given}: a canary takes the first wave behind one router alone, and a PD fleet's "
        "router pairs any prefill it lists with any decode, so a canary of one pool would pair "
        "with the other's old spec; this release has no PD canary; expected no canary for a "
        "PD fleet (its changes move generation by generation, each router listing one spec); "
        "fix: unset k2_canary_percent, or apply without --canary"
    )


def _address_problems(cluster: Cluster, value: str) -> list[str]:
    """The floating address: IPv4 with its prefix, a host address of its network that no
    host has, and every router host's address inside that network."""
    if "/" not in value:
        return [
            f"k2_front_address={value} has no prefix; expected ADDRESS/PREFIX (the network "
            f"it moves in, e.g. {EXAMPLE}); fix: add the prefix of the routers' network"
        ]
    try:
        front = ipaddress.ip_interface(value)
    except ValueError:
        return [
            f"k2_front_address={value} is not an address with a prefix; expected "
            f"ADDRESS/PREFIX, e.g. {EXAMPLE}; fix: correct it"
        ]
    if not isinstance(front, ipaddress.IPv4Interface):
        return [
            f"k2_front_address={value} is IPv6; expected an IPv4 address (the front's VRRP "
            "is rendered for IPv4 only); fix: give an IPv4 address of the routers' network"
        ]
    network = front.network
    if network.prefixlen > 30:
        return [
            f"k2_front_address={value}: a /{network.prefixlen} network holds no other host; "
            "expected the prefix of the network the [router] hosts share (at most /30); "
            "fix: give that prefix"
        ]
    if front.ip in (network.network_address, network.broadcast_address):
        which = "network" if front.ip == network.network_address else "broadcast"
        return [
            f"k2_front_address={value} is the {which} address of {network}; expected a host "
            "address no host has; fix: pick a free address of that network"
        ]
    problems = []
    for host in cluster.hosts:
        local = f"k2_local_ip={host.local_ip}"
        settings = ((host.address_setting, host.address), (local, host.local_ip))
        for setting, address in settings:
            if _ip(address) == front.ip:
                problems.append(
                    f"{host.name}: {setting} is the front's floating address "
                    f"(k2_front_address={value}); expected an address no host has; fix: pick "
                    "a free address of the routers' network"
                )
                break
    for name in cluster.router_hosts:
        host = cluster.host(name)
        ip = _ip(host.address)
        if ip is None:
            problems.append(
                f"{name}: {host.address_setting} is a name, not an address; expected every "
                f"[router] host of a front (k2_front_address={value}) addressed by its IPv4 "
                "address in the network the address moves in (keepalived's peers and the "
                "interface that carries the address are found by it); fix: set "
                f"{host.address_setting} to that address"
            )
        elif ip not in network:
            problems.append(
                f"{name}: {host.address_setting} is outside {network}, the "
                f"network of k2_front_address={value}; expected every [router] host in the "
                "network the address moves in (VRRP moves it within one network); fix: give "
                "the address of the routers' network, or move the host"
            )
    return problems
