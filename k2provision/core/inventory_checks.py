"""Pure checks of inventory values: addresses, RDMA device lists, one value per cluster.

Each check returns what is wrong in words (or the problem lines), never raises; inventory.py
gathers them so that every problem is reported at once.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from k2provision.core.records import LAB_FAULTS, TIMED_LAB_FAULTS, integer_spelling_problem
from k2provision.core.variables import shorten_hosts, show

# RFC 1123 host name labels (underscores tolerated, as resolvers and Ansible do).
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
# RDMA device names as the kernel gives them (mlx5_0, mlx5_bond_0, irdma0, rocep1s0f0, ...).
_RDMA_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_UNSET = object()
# Inventory host names: what Ansible accepts in practice, less shell and path specials.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]*$")


def host_name_problem(name: str) -> str | None:
    """Why an inventory host name cannot name files, containers and messages (None if fine)."""
    if not _HOST_NAME.match(name):
        return "holds a character a shell or a path reads specially"
    return None


def address_problem(address: str) -> str | None:
    """Why `address` cannot be a host's address (None when it can: an IP or a host name)."""
    if not address:
        return "is empty"
    if "%" in address:
        return (
            "holds an IPv6 zone id (%...), which URLs and engine arguments cannot carry; "
            "expected a global or unique-local address"
        )
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    if address.startswith("[") and address.endswith("]"):
        return "is in brackets; expected the bare IPv6 address (brackets belong in URLs)"
    with_port = re.fullmatch(r"(.+):(\d+)", address)
    if with_port and address.count(":") == 1:
        return (
            f"holds a port; expected the address alone (the SSH port goes in "
            f"ansible_port={with_port.group(2)})"
        )
    if re.fullmatch(r"[\d.]+", address):
        return "is not an IPv4 address (four numbers from 0 to 255)"
    labels = address.rstrip(".").split(".")
    if len(address) > 253 or not all(_LABEL.match(label) for label in labels):
        return "is neither an IP address nor a host name"
    return None


def ip_problem(value: str) -> str | None:
    """Why `value` is not an IP address literal (None when it is)."""
    if "%" in value:
        return address_problem(value)
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        why = address_problem(value)
        return why if why and "port" in why else "is not an IP address"


def port_problem(value: Any) -> str | None:
    """Why `value` is not a TCP port number (None when it is); written as every integer of the
    contract is (records.integer_spelling_problem)."""
    if spelling := integer_spelling_problem(value):
        return f"{spelling}; expected an integer from 1 to 65535"
    if not str(value).isdigit():
        return "is not a port number; expected an integer from 1 to 65535"
    if not 1 <= int(str(value)) <= 65535:
        return "is out of range; expected an integer from 1 to 65535"
    return None


def lab_fault_problem(value: Any) -> str | None:
    """Why `value` is not a stand-in fault mode for k2_lab_fault (None when it is)."""
    text = str(value).strip() if isinstance(value, str | int | float) else ""
    mode, eq, seconds = text.partition("=")
    if mode in TIMED_LAB_FAULTS:
        try:
            ok = eq == "=" and float(seconds) > 0
        except ValueError:
            ok = False
        return None if ok else f"needs a number of seconds > 0 ({mode}=20)"
    if mode in LAB_FAULTS and not eq:
        return None
    return "is not a fault mode"


def ib_devices(value: Any) -> tuple[tuple[str, ...], str | None]:
    """k2_ib_devices as a tuple of device names, and why it is malformed (or None)."""
    if value is None or value == "":
        return (), None
    if isinstance(value, list | tuple):
        items = list(value)
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    else:
        items = [value]
    names = tuple(str(item) for item in items)
    if any(not isinstance(item, str) for item in items):
        return names, "holds something that is not a device name"
    if "" in names:
        return names, "has an empty item (two commas in a row, or a trailing comma)"
    bad = [n for n in names if not _RDMA_DEVICE.match(n)]
    if bad:
        return names, f"has {', '.join(map(repr, bad))}: not an RDMA device name (mlx5_0)"
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return names, f"names {', '.join(twice)} more than once"
    return names, None


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def cluster_values(
    hosts: Sequence[str], host_vars: Mapping[str, Mapping[str, Any]], names: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """The one value of each cluster variable, and a line per variable whose hosts disagree.

    When most hosts share a value, the hosts that differ are named, once; with no majority,
    every value is listed with its hosts. The majority's (or the first host's) value is
    returned so the remaining checks still run.
    """
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name in names:
        groups: dict[str, list[str]] = {}
        seen: dict[str, Any] = {}
        for host in hosts:
            value = host_vars[host].get(name, _UNSET)
            key = "unset" if value is _UNSET else _key(value)
            groups.setdefault(key, []).append(host)
            seen.setdefault(key, value)
        ranked = sorted(groups, key=lambda k: -len(groups[k]))
        chosen = seen[ranked[0]]
        if chosen is not _UNSET:
            values[name] = chosen
        if len(groups) == 1:
            continue
        fix = (
            f"fix: set {name} once in [all:vars] or group_vars/all, and remove it from "
            "host lines, host_vars and other groups' vars"
        )
        if len(groups[ranked[0]]) > len(groups[ranked[1]]):
            common = groups[ranked[0]]
            for key in ranked[1:]:
                odd = groups[key]
                problems.append(
                    f"{shorten_hosts(odd)}: {_state(name, seen[key])} differs from the other "
                    f"{len(common)} host{'s' if len(common) > 1 else ''}' "
                    f"{_state(name, chosen)}; expected one value for the whole cluster; {fix}"
                )
        else:
            listed = "; ".join(
                f"{_state(name, seen[key])} on {shorten_hosts(groups[key])}" for key in ranked
            )
            problems.append(
                f"{name} differs between hosts: {listed}; expected one value for the whole "
                f"cluster; {fix}"
            )
    return values, problems


def _state(name: str, value: Any) -> str:
    return f"{name} unset" if value is _UNSET else f"{name}={show(value)}"


def instance_split_problem(
    pool: str, hosts: Sequence[str], variable: str, count: int
) -> str | None:
    """Why `count` instances cannot split the pool's hosts into equal, consecutive groups
    (None when they can)."""
    if count <= len(hosts) and len(hosts) % count == 0:
        return None
    working = [n for n in range(1, len(hosts) + 1) if len(hosts) % n == 0]
    return (
        f"[{pool}] ({shorten_hosts(hosts)}) has {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
        f", which {variable}={count} does not split into whole instances of equal size; "
        f"expected one of {', '.join(map(str, working))}; fix: set {variable} to one of them, "
        f"or list a multiple of {count} hosts in [{pool}]"
    )
