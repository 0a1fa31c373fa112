"""Filter k2.cluster.firewall_ruleset: the nftables ruleset of one host of the plan, as
k2provision renders it (core/firewall.py), for the k2_firewall role."""

from __future__ import annotations

from typing import Any

from k2provision.core.firewall import ruleset


def firewall_ruleset(plan: dict[str, Any], host: str, ssh_ports: Any, trusted: Any = ()) -> str:
    """The ruleset file of `host`: the endpoint's port from anywhere, `ssh_ports`, and every
    address of the cluster and of `trusted` (addresses or CIDRs); the rest dropped."""
    return ruleset(plan, str(host), [int(p) for p in ssh_ports], [str(t) for t in trusted])


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {"firewall_ruleset": firewall_ruleset}
