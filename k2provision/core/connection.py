"""Where Ansible reaches a host: its address and SSH port, resolved from the inventory's
connection variables exactly as ansible-core resolves them. Pure; the one reader of them.

Ansible accepts two spellings of each: `ansible_host` or its alias `ansible_ssh_host`, and
`ansible_port` or its alias `ansible_ssh_port`. When both are set the alias wins: the ssh
connection plugin lists its sources as `vars: [inventory_hostname, ansible_host,
ansible_ssh_host]` and `[ansible_port, ansible_ssh_port]`, and ConfigManager._loop_entries keeps
the last one that is defined, None being undefined (ansible-core 2.19,
ansible/plugins/connection/ssh.py options `host` and `port`, ansible/config/manager.py
`_loop_entries`); PlayContext agrees, trying `('ansible_ssh_host', 'ansible_host')` and
`('ansible_ssh_port', 'ansible_port')` first to last (ansible/constants.py
MAGIC_VARIABLE_MAPPING, ansible/playbook/play_context.py). Without either, the address is the
inventory name and the port ssh's default, 22 (the project's ansible.cfg sets no remote_port).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Each variable and its alias, in Ansible's order: a later one that is set wins.
ADDRESS_VARS: tuple[str, str] = ("ansible_host", "ansible_ssh_host")
PORT_VARS: tuple[str, str] = ("ansible_port", "ansible_ssh_port")
CONNECTION_VARS = (*ADDRESS_VARS, *PORT_VARS)
DEFAULT_SSH_PORT = 22


@dataclass(frozen=True)
class Resolved:
    """A connection setting as Ansible uses it, and the variable it came from (None: neither
    spelling is set, and Ansible's default applies)."""

    value: Any
    variable: str | None


def _last_set(host_vars: Mapping[str, Any], names: tuple[str, str]) -> tuple[Any, str | None]:
    found: tuple[Any, str | None] = (None, None)
    for name in names:
        if host_vars.get(name) is not None:
            found = (host_vars[name], name)
    return found


def host_address(name: str, host_vars: Mapping[str, Any]) -> Resolved:
    """The address Ansible connects to: ansible_ssh_host, else ansible_host, else the name."""
    value, variable = _last_set(host_vars, ADDRESS_VARS)
    return Resolved(name if variable is None else str(value), variable)


def ssh_port(host_vars: Mapping[str, Any]) -> Resolved:
    """The SSH port Ansible connects to, as the inventory wrote it (unchecked):
    ansible_ssh_port, else ansible_port, else 22."""
    value, variable = _last_set(host_vars, PORT_VARS)
    return Resolved(DEFAULT_SSH_PORT if variable is None else value, variable)
