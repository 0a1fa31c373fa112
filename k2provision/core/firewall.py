"""The optional host firewall's nftables ruleset (the k2_firewall role). Pure.

One table of its own, `inet k2provision`, replaced whole on every load (so loading it twice
is loading it once): on a host of the cluster it accepts the endpoint's port from anywhere
(the plan's public ports of that host), SSH, ICMP, replies to the host's own connections, and
everything from the cluster's own addresses (every host's inventory address and k2_local_ip,
and the subnets the inventory trusts); it drops the rest. On a host of a fleet instance that
runs the mpirun mesh's sshd (k2_ssh_port), that port takes the instance's own hosts only:
each instance is its own MPI world. Other tables are left alone.

`firewall_problems` refuses, at plan time, the settings under which that ruleset would shut
out what it must let in: a host written by DNS name (nft sets hold addresses, and the plan
cannot resolve a name as the hosts will), a k2_firewall_trusted entry that is no address, and
a k2_firewall_ssh_ports list without the port Ansible reaches the host on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from k2provision.core import role_specs
from k2provision.core.records import Cluster
from k2provision.core.templating import render_template
from k2provision.core.variables import shorten_hosts, show

TABLE = "k2provision"
ENABLED = "k2_firewall_enabled"
SSH_PORTS = "k2_firewall_ssh_ports"
TRUSTED = "k2_firewall_trusted"
# The mpirun mesh's sshd port (TensorRT-LLM's containers), as the plan's port bindings name it.
MESH_PORT_SETTING = "k2_ssh_port"


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return False
    return True


def _role_value(variables: Mapping[str, Any], name: str) -> Any:
    """A k2_firewall variable as the role receives it (None: a template, or refused by the
    role's argument spec, which the inventory check reports)."""
    return role_specs.validated(name, variables.get(name, role_specs.default(name)))


def firewall_problems(cluster: Cluster, host_vars: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the firewall would drop that it must not, one line per host (hosts that share a
    line grouped), where k2_firewall_enabled is true on some host of the cluster."""
    guarded = [h for h in cluster.hosts if _role_value(host_vars.get(h.name, {}), ENABLED) is True]
    if not guarded:
        return []
    on = shorten_hosts([h.name for h in guarded])
    problems = []
    for host in cluster.hosts:
        if _is_network(host.local_ip):
            continue
        variable = host.address_from or "ansible_host"
        problems.append(
            f"{host.name}: {host.address_setting} is a DNS name and k2_local_ip is unset, so "
            f"the firewall ({ENABLED} on {on}) has no address to trust for it: nft sets hold "
            "addresses, and the plan cannot resolve a name as the hosts will, so its traffic "
            "to the engines would be dropped; expected an IP address for every host where "
            f"the firewall is on; fix: set {host.name}'s k2_local_ip to the IP address the "
            f"other hosts reach it on, or write {variable} as an IP address"
        )
    shared: dict[str, list[str]] = {}
    for host in guarded:
        variables = host_vars.get(host.name, {})
        trusted = _role_value(variables, TRUSTED)
        odd = [str(e) for e in trusted or () if not _is_network(str(e))]
        if odd:
            shared.setdefault(
                f"{TRUSTED}={show(variables.get(TRUSTED))} holds {', '.join(map(repr, odd))}, "
                "which is not an IP address or CIDR; nft sets hold addresses only, so the "
                "firewall would trust nothing for it; expected addresses or CIDRs (10.0.0.0/16)"
                f"; fix: write each as its IP address or subnet",
                [],
            ).append(host.name)
        ports = _role_value(variables, SSH_PORTS)
        if ports is not None and host.ssh_port not in ports:
            shared.setdefault(
                f"{SSH_PORTS}={show(variables.get(SSH_PORTS))} leaves out the host's SSH port, "
                f"{host.ssh_port_setting}; expected a list that holds {host.ssh_port}, since the "
                "firewall drops every port it does not list from outside the cluster, and "
                f"Ansible (and you) would be locked out; fix: add {host.ssh_port} to "
                f"{SSH_PORTS}, or remove it (its default is the port Ansible connects to)",
                [],
            ).append(host.name)
    return problems + [f"{shorten_hosts(hosts)}: {line}" for line, hosts in shared.items()]


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
    mesh_v4: list[str] = []
    mesh_v6: list[str] = []
    mesh_ports = sorted(
        {int(p["port"]) for p in part["ports"] if p.get("setting") == MESH_PORT_SETTING}
    )
    if mesh_ports and part.get("instance"):
        # A fleet instance's mpirun world is its own: its hosts' sshd takes its peers only.
        own = [h for h in hosts if h.get("instance") == part["instance"]]
        mesh_v4, mesh_v6 = _networks([a for h in own for a in (h["address"], h["local_ip"])])
    return render_template(
        "firewall/k2provision.nft.j2",
        table=TABLE,
        host=host,
        ssh_ports=sorted({int(p) for p in ssh_ports}),
        public_ports=public,
        peers_v4=v4,
        peers_v6=v6,
        mesh_ports=mesh_ports if mesh_v4 or mesh_v6 else [],
        instance=part.get("instance", ""),
        mesh_v4=mesh_v4,
        mesh_v6=mesh_v6,
    )
