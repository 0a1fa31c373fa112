"""Filters for the k2_front_tier role (k2provision/plan/front.py renders what they return):

- ``plan | k2.cluster.front_writes(host, interface)``: HAProxy's and keepalived's configurations
  on `host` as k2.cluster.write_files entries {path, content, mode}.
- ``plan | k2.cluster.front_interface(host, ip_output)``: the interface keepalived adds the
  floating address to: the plan's k2_front_interface, else the one ``ip -o -4 addr show to
  ADDRESS`` names for the host's own address.
"""

from __future__ import annotations

from typing import Any

from k2provision.core.inventory import plain_value
from k2provision.core.records import Plan
from k2provision.plan.front import front_files


def front_writes(plan: dict[str, Any], host: str, interface: str) -> list[dict[str, str]]:
    """The front's files on `host`, each written where it differs (mode 0644)."""
    files = front_files(Plan.model_validate(plain_value(plan)), str(host), str(interface))
    return [{"path": path, "content": text, "mode": "0644"} for path, text in files.items()]


def front_interface(plan: dict[str, Any], host: str, ip_output: str) -> str:
    """The interface of the front's address on `host` ("" when none is found)."""
    front = plain_value(plan).get("front") or {}
    if front.get("interface"):
        return str(front["interface"])
    for line in str(ip_output or "").splitlines():
        fields = line.split()
        if len(fields) > 1:
            return fields[1].split("@")[0]
    return ""


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {"front_writes": front_writes, "front_interface": front_interface}
