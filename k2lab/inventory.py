"""Pure text for the lab: the Ansible INI inventory, known_hosts lines, the /etc/hosts block.

No I/O here, so each piece is unit-tested without root.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from k2lab.errors import LabError

INVENTORY_HEADER = "# k2provision lab inventory"
HOSTS_BEGIN = "# BEGIN k2provision lab hosts"
HOSTS_END = "# END k2provision lab hosts"
_GROUP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLAIN_VALUE_RE = re.compile(r"^[A-Za-z0-9_./:@%+,=-]+$")

VarValue = str | int | float | bool


@dataclass(frozen=True)
class InventoryHost:
    name: str
    address: str


def layout_groups(names: Sequence[str], counts: Mapping[str, int] | None) -> dict[str, list[str]]:
    """Assign hosts to groups in order: {"prefill": 1, "decode": 3} -> lab1 prefill, lab2-4 decode.

    None means every host in `[nodes]`. Hosts beyond the counts stay in no group
    (Ansible puts them in `ungrouped`).
    """
    if counts is None:
        return {"nodes": list(names)}
    wanted = sum(counts.values())
    if any(c < 0 for c in counts.values()):
        raise LabError(f"group sizes must not be negative: {dict(counts)}")
    if wanted > len(names):
        raise LabError(
            f"groups {dict(counts)} need {wanted} hosts but the lab has {len(names)}; "
            f"fix: run `lab up {wanted}` or shrink the groups"
        )
    groups: dict[str, list[str]] = {}
    start = 0
    for group, count in counts.items():
        _check_group_name(group)
        groups[group] = list(names[start : start + count])
        start += count
    return groups


def _check_group_name(group: str) -> None:
    if not _GROUP_RE.match(group) or group in ("all", "ungrouped"):
        raise LabError(
            f"{group!r} is not a usable inventory group name; expected letters, digits and _ "
            "(and not all/ungrouped)"
        )


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """NAME=VALUE command-line items as a dict (LabError naming the bad item)."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LabError(f"{what} {item!r}: expected NAME=VALUE")
        pairs[key] = value
    return pairs


def parse_var_value(text: str) -> VarValue:
    """A command-line variable value: true/false as booleans, digits as integers."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return int(text) if text.isdigit() else text


def ini_value(value: VarValue) -> str:
    """A value as Ansible's INI loader reads it back unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if _PLAIN_VALUE_RE.match(value):
        return value
    return repr(value)


def ssh_common_args(known_hosts: str) -> str:
    """SSH options that pin the lab's host keys: its own known_hosts, strict checking."""
    return (
        f"-o UserKnownHostsFile={known_hosts} -o GlobalKnownHostsFile=/dev/null "
        "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    )


def bastion_ssh_config(
    name: str, address: str, ssh_port: int, private_key: str, known_hosts: str
) -> str:
    """The OpenSSH config the lab's inventory names with `-F`: the bastion as a host alias
    with its address, key and pinned host key. ssh passes `-F` on to the jump connection,
    which does not see the inventory's other options."""
    return (
        "# k2provision lab: the bastion, for ProxyJump (written by `lab up --bastion`).\n"
        f"Host {name}\n"
        f"  HostName {address}\n"
        f"  Port {ssh_port}\n"
        "  User root\n"
        f"  IdentityFile {private_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
    )


def render_inventory(
    hosts: Sequence[InventoryHost],
    *,
    instance: str,
    ssh_port: int,
    private_key: str,
    known_hosts: str,
    groups: Mapping[str, Sequence[str]],
    children: Mapping[str, Sequence[str]] | None = None,
    all_vars: Mapping[str, VarValue] | None = None,
    proxy_url: str | None = None,
    jump: tuple[str, str] | None = None,
) -> str:
    """The INI inventory for the lab: every host once, with its address and port.

    `jump` (the ssh_config path and the bastion's name in it) puts every host behind the
    bastion: `-F CONFIG -o ProxyJump=NAME` before the lab's SSH options.

    `lab_http_proxy` (when given) is the proxy hosts reach the outside through; plays
    pass it as http_proxy/https_proxy in their environment.
    """
    by_name = {h.name: h for h in hosts}
    grouped = {name for members in groups.values() for name in members}
    for group, members in groups.items():
        _check_group_name(group)
        for name in members:
            if name not in by_name:
                raise LabError(f"group [{group}] names {name!r}, which is not a lab host")

    def host_line(host: InventoryHost) -> str:
        return f"{host.name} ansible_host={host.address} ansible_port={ssh_port}"

    lines = [
        f"{INVENTORY_HEADER} (instance {instance}): written by `k2provision lab up`, "
        "rewritten on every up; edits are lost.",
        "# Lab profile: k2_lab=true skips the hardware-only steps (no GPUs or InfiniBand here).",
        "",
    ]
    ungrouped = [h for h in hosts if h.name not in grouped]
    lines.extend(host_line(h) for h in ungrouped)
    if ungrouped:
        lines.append("")
    placed: set[str] = set()
    for group, members in groups.items():
        lines.append(f"[{group}]")
        for name in members:
            # A host's variables go on its first line only; later groups just name it.
            lines.append(name if name in placed else host_line(by_name[name]))
            placed.add(name)
        lines.append("")
    for parent, kids in (children or {}).items():
        _check_group_name(parent)
        lines.append(f"[{parent}:children]")
        lines.extend(kids)
        lines.append("")
    merged_vars: dict[str, VarValue] = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": private_key,
        "ansible_ssh_common_args": (f"-F {jump[0]} -o ProxyJump={jump[1]} " if jump else "")
        + ssh_common_args(known_hosts),
        "ansible_python_interpreter": "/usr/bin/python3",
        "k2_lab": True,
    }
    if proxy_url:
        merged_vars["lab_http_proxy"] = proxy_url
    merged_vars.update(all_vars or {})
    lines.append("[all:vars]")
    lines.extend(f"{key}={ini_value(value)}" for key, value in merged_vars.items())
    return "\n".join(lines) + "\n"


def known_hosts_text(hosts: Sequence[tuple[str, str, str]], ssh_port: int) -> str:
    """known_hosts lines for (name, address, "type base64") triples; names are aliases."""
    lines = []
    for name, address, key in hosts:
        if ssh_port == 22:
            patterns = f"{address},{name}"
        else:
            patterns = f"[{address}]:{ssh_port},[{name}]:{ssh_port}"
        lines.append(f"{patterns} {key}")
    return "\n".join(lines) + ("\n" if lines else "")


def hosts_block(entries: Sequence[tuple[str, str]], controller: tuple[str, str]) -> str:
    """The lab's block of /etc/hosts: the controller, then every lab host."""
    rows = [HOSTS_BEGIN, f"{controller[1]}\t{controller[0]}"]
    rows.extend(f"{address}\t{name}" for name, address in entries)
    rows.append(HOSTS_END)
    return "\n".join(rows) + "\n"


def update_hosts_file(existing: str, block: str) -> str:
    """Replace the lab block in an /etc/hosts text (or append it), keeping every other line."""
    lines = existing.splitlines(keepends=True)
    out: list[str] = []
    inside = False
    replaced = False
    for line in lines:
        stripped = line.strip()
        if stripped == HOSTS_BEGIN:
            inside = True
            if not replaced:
                out.append(block)
                replaced = True
            continue
        if inside:
            if stripped == HOSTS_END:
                inside = False
            continue
        out.append(line)
    if not replaced:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(block)
    return "".join(out)
