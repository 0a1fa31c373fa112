"""The optional host firewall's nftables ruleset (the k2_firewall role). Pure.

One table of its own, `inet k2provision`, replaced whole on every load (so loading it twice
is loading it once): on a host of the cluster it accepts the endpoint's port from anywhere
(the plan's public ports of that host), SSH, ICMP, replies to the host's own connections, and
everything from the cluster's own addresses (every host's inventory address and k2_local_ip,
and the subnets the inventory trusts); it drops the rest. Other tables are left alone.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from k2provision.core.templating import render_template

TABLE = "k2provision"


def _networks(entries: Iterable[str]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) networks of `entries` (addresses or CIDRs), sorted, duplicates dropped;
    a name that is not an address is left out (nft sets hold addresses only)."""
    v4: set[ipaddress.IPv4Network] = set()
    v6: set[ipaddress.IPv6Network] = set()
    for entry in entries:
        try:
            network = ipaddress.ip_network(str(entry).strip(), strict=False)
        except ValueError:
            continue
        if isinstance(network, ipaddress.IPv4Network):
            v4.add(network)
        else:
            v6.add(network)
    return [str(n) for n in sorted(v4)], [str(n) for n in sorted(v6)]


def ruleset(
    plan: Mapping[str, Any], host: str, ssh_ports: Sequence[int], trusted: Sequence[str] = ()
) -> str:
    """The ruleset file for `host` of `plan` (the plan as the roles receive it)."""
    hosts = list(plan["hosts"])
    part = next((h for h in hosts if h["name"] == host), None)
    if part is None:
        raise ValueError(f"{host} is in no pool of the plan; fix: add it or leave it out")
    peers = [a for h in hosts for a in (h["address"], h["local_ip"])]
    v4, v6 = _networks([*peers, *trusted])
    public = sorted({int(p["port"]) for p in part["ports"] if p.get("public")})
    return render_template(
        "firewall/k2provision.nft.j2",
        table=TABLE,
        host=host,
        ssh_ports=sorted({int(p) for p in ssh_ports}),
        public_ports=public,
        peers_v4=v4,
        peers_v6=v6,
    )
