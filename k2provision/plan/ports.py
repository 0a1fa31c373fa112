"""The TCP ports a host's rendered processes listen on, read once when the plan is built. Pure.

A port counts when a process that serves on the host binds it: the port of its HTTP health
gate, the PD bootstrap and DP RPC ports, the torch rendezvous of ``--dist-init-addr``, a Ray
head's port, and the ``Port`` of the mesh sshd the engine's files configure. Each is named by
the inventory variable that sets it, so a refusal can say which variable to change. Processes
without a health gate (ranks that join another's server) bind nothing of their own here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from k2provision.core.records import PortBinding, Process
from k2provision.engines.base import Engine

__all__ = ["host_ports"]

_BIND_FLAGS: dict[str, str] = {
    "--disaggregation-bootstrap-port": "k2_bootstrap_port",
    "--data-parallel-rpc-port": "k2_dp_rpc_port",
}


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


def _process_ports(proc: Process, engine: Engine) -> list[tuple[str, int]]:
    """(setting, port) pairs one serving process binds, read from its gate and argv."""
    if proc.health is None:
        return []
    argv = list(proc.argv)
    found: list[tuple[str, int]] = []
    if proc.health.url is not None:
        port = urlsplit(proc.health.url).port
        if port is not None:
            found.append((engine.health_port_setting(proc), port))
    for flag, setting in _BIND_FLAGS.items():
        value = _flag_value(argv, flag)
        if value is not None and value.isdigit():
            found.append((setting, int(value)))
    rendezvous = _flag_value(argv, "--dist-init-addr")
    if rendezvous is not None and rendezvous.rpartition(":")[2].isdigit():
        found.append(("k2_dist_port", int(rendezvous.rpartition(":")[2])))
    if argv[:2] == ["ray", "start"] and "--head" in argv:
        value = _flag_value(argv, "--port")
        if value is not None and value.isdigit():
            found.append(("k2_ray_port", int(value)))
    return found


def host_ports(
    processes: Sequence[Process], files: Mapping[str, str], config_dir: str, engine: Engine
) -> tuple[PortBinding, ...]:
    """Every port the processes of one host bind, in process order, the mesh sshd's last."""
    bindings = [
        PortBinding(setting=setting, port=port, process=proc.name, container=proc.container)
        for proc in processes
        for setting, port in _process_ports(proc, engine)
    ]
    sshd_config = files.get(f"{config_dir}/ssh/sshd_config")
    owner = next((p.container for p in processes if not p.exec_in), None)
    if sshd_config is not None and owner is not None:
        match = re.search(r"^Port\s+(\d+)\s*$", sshd_config, re.MULTILINE)
        if match is not None:
            bindings.append(
                PortBinding(
                    setting="k2_ssh_port", port=int(match.group(1)), process="sshd", container=owner
                )
            )
    return tuple(bindings)
