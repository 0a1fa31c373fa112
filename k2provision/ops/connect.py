"""How the commands that reach hosts themselves connect: exactly as ansible-playbook would.

`status`, `logs` and the launch-failure reports run the system `ssh` with the argv that
Ansible's own ssh connection plugin builds for the host (`ssh_command`): the same
`ansible_host` / `ansible_port` / `ansible_user` / `ansible_ssh_private_key_file`, the same
`ansible_ssh_common_args` / `ansible_ssh_extra_args` (ProxyJump, ProxyCommand, known_hosts),
ansible.cfg's `ssh_args`, timeout, host key checking and control masters. OpenSSH then reads
~/.ssh/config and the agent as it does for a playbook. Nothing here re-implements an SSH
option, so a bastion that works for `apply` works for every command.

A host that cannot be reached is named with the setting that failed (`failure_reason`): the
jump host, the address and port, the user and key, or the known_hosts check, as OpenSSH
resolves them (`ssh -G`). ssh runs in a session of its own with no terminal, so an unknown
host key is refused (nobody to ask) rather than prompted for. Private keys are read by ssh
only; nothing here reads, prints or records them.
"""

from __future__ import annotations

import io
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2provision.core import connection

# The inventory variables Ansible's ssh connection plugin reads (its `vars:` sources).
SSH_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_ssh_args",
    "ansible_ssh_executable",
    "ansible_ssh_timeout",
    "ansible_timeout",
    "ansible_host_key_checking",
    "ansible_ssh_host_key_checking",
    "ansible_control_path",
    "ansible_control_path_dir",
)
# Ansible's plugin loader is not thread-safe; hosts are asked from many threads at once.
_ANSIBLE_LOCK = threading.Lock()
CONFIG_FILE = Path(__file__).resolve().parents[2] / "ansible.cfg"
"""The project's Ansible configuration: the one its playbook runs use (ANSIBLE_CONFIG)."""


@dataclass(frozen=True)
class SshTarget:
    """One inventory host and the connection variables Ansible would use for it."""

    name: str
    variables: tuple[tuple[str, str], ...] = ()
    """The host's SSH_VARS that are set, as (name, value) pairs."""

    @property
    def host(self) -> str:
        """The address ssh is given: ansible_ssh_host, else ansible_host, else the inventory
        name, as Ansible resolves them (core/connection.py)."""
        return str(connection.host_address(self.name, dict(self.variables)).value) or self.name

    @property
    def spellings(self) -> tuple[str, str]:
        """The address and port variables Ansible used for this host, as a message names them
        (ansible_ssh_host where that alias won; ansible_host and ansible_port where unset)."""
        values = dict(self.variables)
        address = connection.host_address(self.name, values).variable
        port = connection.ssh_port(values).variable
        return address or "ansible_host", port or "ansible_port"


def ssh_target(name: str, host_vars: Mapping[str, Any]) -> SshTarget:
    """The connection settings of one host from its inventory variables. Pure."""
    pairs = tuple(
        (key, str(host_vars[key])) for key in SSH_VARS if host_vars.get(key) not in (None, "")
    )
    return SshTarget(name, pairs)


def _use_project_config() -> None:
    """Read ansible.cfg as the playbook runs do (they set ANSIBLE_CONFIG to the project's
    file), whichever directory the command was started from."""
    from ansible import constants
    from ansible.config.manager import ConfigManager

    if constants.config._config_file != str(CONFIG_FILE) and CONFIG_FILE.exists():
        constants.config = ConfigManager(str(CONFIG_FILE))


def ssh_command(target: SshTarget, command: str | None = None, *, tty: bool = False) -> list[str]:
    """The argv of `ssh` that runs `command` on the host (None: options and destination
    only), built by Ansible's own ssh connection plugin from the host's variables."""
    from ansible.playbook.play_context import PlayContext
    from ansible.plugins.loader import connection_loader, init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    with _ANSIBLE_LOCK:
        if AnsibleCollectionConfig.collection_finder is None:
            init_plugin_loader()
        _use_project_config()
        context = PlayContext()
        context.remote_addr = target.name
        plugin: Any = connection_loader.get("ssh", context, io.StringIO())
        variables = {**dict(target.variables), "inventory_hostname": target.name}
        plugin.set_options(var_options=variables)
        host = plugin.get_option("host") or target.name
        # The control socket is named by (host, port, user), the host as the plugin holds it:
        # the address, as a playbook's task gives it. Left at the inventory name, two
        # inventories' `lab1` (or two clusters' `node-01`) would share one master, and a
        # command meant for one would run on the other.
        plugin.host = host
        extra = [*(["-tt"] if tty else []), host, *([command] if command is not None else [])]
        argv = plugin._build_command(plugin.get_option("ssh_executable"), "ssh", *extra)
    return [a.decode() if isinstance(a, bytes) else str(a) for a in argv]


def resolved_options(argv: Sequence[str]) -> dict[str, str]:
    """What OpenSSH makes of an ssh argv (its options, ~/.ssh/config included), by `ssh -G`:
    lowercased option -> value. Empty when ssh cannot say."""
    try:
        done = subprocess.run(
            [argv[0], "-G", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    options: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key.lower(), value.strip())
    return options


def unreachable_reason(target: SshTarget, argv: Sequence[str], stderr: str) -> str:
    """Why ssh (`argv`, ending with the remote command) could not reach the host, naming the
    setting that failed. With a control master about to persist, OpenSSH sends a jump host's
    errors to /dev/null; then the same connection is tried once more without one, to hear
    them."""
    options = resolved_options(argv[:-1])
    jumps = (
        options.get("proxyjump", "none") != "none" or options.get("proxycommand", "none") != "none"
    )
    if jumps and not _SPECIFIC_RE.search(stderr):
        bare = [argv[0], "-o", "ControlMaster=no", "-o", "ControlPersist=no", *argv[1:-1], "true"]
        try:
            stderr = subprocess.run(
                bare,
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                check=False,
            ).stderr
        except subprocess.TimeoutExpired:
            stderr = "Connection timed out"
    return failure_reason(target, stderr, options)


_SPECIFIC_RE = re.compile(r"Host key verification|Permission denied|connect to host|resolve")
_CONNECT_RE = re.compile(r"connect to host (\S+) port (\d+): (.+)")
_RESOLVE_RE = re.compile(r"Could not resolve hostname (\S+?):? (.+)")


def _error_lines(stderr: str) -> list[str]:
    skip = ("Warning: Permanently added", "Connection closed by", "kex_exchange_identification")
    return [
        line.strip()
        for line in stderr.replace("\r", "").splitlines()
        if line.strip() and not line.strip().startswith(skip)
    ]


def failure_reason(target: SshTarget, stderr: str, options: Mapping[str, str]) -> str:
    """One line naming the setting that kept ssh from the host: the jump host, the address
    and port, the user and key, or the host key check, with the fix. `options` is what
    OpenSSH resolved for the host (`resolved_options`). Pure."""
    lines = _error_lines(stderr)
    text = "\n".join(lines)
    jump = options.get("proxyjump", "none")
    proxy = options.get("proxycommand", "none")
    via = f"ProxyJump={jump}" if jump != "none" else ""
    via = via or (f"ProxyCommand={proxy}" if proxy != "none" else "")
    address = options.get("hostname", target.host)
    port = options.get("port", "22")
    user = options.get("user", "?")
    if "Host key verification failed" in text:
        known = options.get("userknownhostsfile", "~/.ssh/known_hosts")
        which = next((ln for ln in lines if "host key" in ln.lower() and "known" in ln), "")
        where = f" ({which})" if which else ""
        return (
            f"host key verification failed{where} with UserKnownHostsFile={known} "
            f"StrictHostKeyChecking={options.get('stricthostkeychecking', 'ask')}"
            f"{' via ' + via if via else ''}; fix: add the host's key to that known_hosts file"
        )
    if "Permission denied" in text or "Too many authentication failures" in text:
        keys = options.get("identityfile", "")
        return (
            f"authentication refused for User={user} (IdentityFile={keys or 'agent/defaults'})"
            f"{' via ' + via if via else ''}; fix: check ansible_user and "
            "ansible_ssh_private_key_file, or the keys in the SSH agent"
        )
    host_var, port_var = target.spellings
    if match := _RESOLVE_RE.search(text):
        name = match.group(1)
        setting = via if via and name != address else f"{host_var}={address}"
        return f"{setting}: cannot resolve {name} ({match.group(2)}); fix: check the name"
    if via and re.search(r"open failed|stdio forwarding failed", text):
        return (
            f"{via} was reached, but it cannot reach {host_var}={address} {port_var}={port}: "
            f"{lines[0] if lines else 'forwarding refused'}; fix: check the address as the jump "
            "host sees it, and that the host's sshd listens there"
        )
    if match := _CONNECT_RE.search(text):
        host, at, why = match.groups()
        if via and (host, at) != (address, port):
            return f"{via}: cannot connect to {host} port {at}: {why}; fix: check the jump host"
        return (
            f"cannot connect to {host_var}={host} {port_var}={at}: {why}"
            f"{' via ' + via if via else ''}; fix: check the address, the port and that sshd "
            "runs there"
        )
    if "timed out" in text.lower():
        return (
            f"{host_var}={address} {port_var}={port}"
            + (f" via {via}" if via else "")
            + f": {lines[-1]}"
        )
    last = lines[-1] if lines else "ssh ended without a message"
    return f"{last}{' (via ' + via + ')' if via else ''}"
