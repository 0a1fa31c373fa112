"""Filters for the k2_firewall role: k2.cluster.firewall_ruleset, the nftables ruleset of one
host of the plan as k2provision renders it (core/firewall.py), and k2.cluster.ssh_port, the
port Ansible reaches a host's sshd on, resolved as the plan resolves it (core/connection.py:
ansible_ssh_port, else ansible_port, else 22)."""

from __future__ import annotations

from typing import Any

from k2provision.core import connection
from k2provision.core.firewall import ruleset


def firewall_ruleset(plan: dict[str, Any], host: str, ssh_ports: Any, trusted: Any = ()) -> str:
    """The ruleset file of `host`: the endpoint's port from anywhere, `ssh_ports`, and every
    address of the cluster and of `trusted` (addresses or CIDRs); the rest dropped."""
    return ruleset(plan, str(host), [int(p) for p in ssh_ports], [str(t) for t in trusted])


def ssh_port(host_vars: Any) -> int:
    """The SSH port of the host whose variables (hostvars[inventory_hostname]) are given."""
    variables = {name: host_vars.get(name) for name in connection.PORT_VARS}
    return int(str(connection.ssh_port(variables).value))


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {"firewall_ruleset": firewall_ruleset, "ssh_port": ssh_port}
