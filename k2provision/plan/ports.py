"""The TCP ports a host's processes listen on, and the clashes among them. Pure.

Every process the plan starts on a host declares what it binds: the engine's (HostRender.
listeners: the port, the inventory variable that sets it, and the run of ports where it takes
several, the fleet's and PD's router included), the weights relay's (k2_weights_port, every
host) and the monitoring phase's (plan/monitoring.py: a node exporter on every host, NVIDIA's
DCGM exporter on every GPU host, Prometheus and Grafana on the monitoring host). The plan
records the engine's per host (HostPlan.ports) and refuses two listeners of one host on one
port (a launch that fails on the host, or worse, a router that answers for the prefill server,
an engine scraped as the node exporter) and any listener on the port Ansible reaches the
host's sshd on. Each is named by the inventory variable that sets it, or as fixed where none
does, so a refusal can say which variable to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from k2provision.core.records import Cluster, HostSpec, PortBinding
from k2provision.core.variables import shorten_hosts
from k2provision.engines.base import Listener
from k2provision.plan import monitoring

__all__ = ["host_listeners", "host_ports", "port_clashes"]

MONITORING_ROLE = "roles/k2_monitoring"
_EVERY_INTERFACE = "0.0.0.0"


def host_ports(listeners: Sequence[Listener]) -> tuple[PortBinding, ...]:
    """Every port the processes of one host bind, as the plan records them."""
    return tuple(
        PortBinding.model_validate(x.model_dump(exclude={"what", "count"})) for x in listeners
    )


def _relay(host: HostSpec) -> list[Listener]:
    if host.weights_port is None:
        return []
    return [
        Listener(
            setting="k2_weights_port",
            what="the weights relay",
            port=host.weights_port,
            process="weights-relay",
            container="",
            bind=_EVERY_INTERFACE,
            wildcard_why="the weights relay (roles/k2_weights) listens on every interface while "
            "it distributes the checkpoint",
        )
    ]


def _fixed(name: str, what: str, port: int) -> Listener:
    """A monitoring container's listener: its port is fixed (no inventory variable sets it)."""
    return Listener(
        setting="",
        what=what,
        port=port,
        process=name,
        container=name,
        bind=_EVERY_INTERFACE,
        wildcard_why=f"{what} ({MONITORING_ROLE}) listens on every interface",
    )


def _monitoring(cluster: Cluster, host: HostSpec, endpoint_host: str) -> list[Listener]:
    """The monitoring phase's listeners on `host` (monitoring.exporters_of and the server's
    containers): exporters everywhere (the lab's stand-ins on the same ports), DCGM's where
    the host has GPUs, and Prometheus and Grafana on the monitoring host, outside the lab and
    unless its k2_monitoring_server is false."""
    found = [_fixed("k2-node-exporter", "the node exporter", monitoring.NODE_EXPORTER_PORT)]
    if host.pool != "router":
        found.append(_fixed("k2-dcgm-exporter", "the DCGM exporter", monitoring.DCGM_EXPORTER_PORT))
    server = monitoring.server_host(endpoint_host, list(cluster.monitoring))
    if host.name == server and host.monitoring_server and not cluster.lab:
        found.append(_fixed("k2-prometheus", "Prometheus", monitoring.PROMETHEUS_PORT))
        found.append(_fixed("k2-grafana", "Grafana", monitoring.GRAFANA_PORT))
    return found


def host_listeners(
    cluster: Cluster, rendered: Mapping[str, Sequence[Listener]], endpoint_host: str
) -> dict[str, list[Listener]]:
    """Every listener of every host: the engine's as rendered, the weights relay's and the
    monitoring phase's."""
    return {
        host.name: [
            *rendered.get(host.name, ()),
            *_relay(host),
            *_monitoring(cluster, host, endpoint_host),
        ]
        for host in cluster.hosts
    }


def _named(listener: Listener) -> str:
    """`k2_sglang_port=30000 (the SGLang server)`, or `port 9100 (the node exporter, fixed)`."""
    if listener.setting:
        return str(listener)
    return f"port {listener.port} ({listener.what}, fixed in {MONITORING_ROLE})"


def _pair_fix(a: Listener, b: Listener) -> str:
    movable = [x.setting for x in (a, b) if x.setting]
    if len(movable) == 2:
        if movable[0] == movable[1]:
            return f"fix: set {movable[0]} to a port free on this host"
        return f"fix: move one of them ({movable[0]} or {movable[1]}) to a port free on this host"
    if movable:
        return f"fix: set {movable[0]} to a port free on this host"
    return "fix: run one of them elsewhere"


def _ssh_fix(listener: Listener, host: HostSpec) -> str:
    if listener.setting:
        return f"fix: set {listener.setting} to another port"
    variable = host.ssh_port_from or "ansible_port"
    return f"fix: run the host's sshd on another port and set {variable} to it"


def port_clashes(
    cluster: Cluster, rendered: Mapping[str, Sequence[Listener]], endpoint_host: str
) -> list[str]:
    """One line per pair of listeners that share a port on a host, and per listener on the
    host's SSH port (hosts grouped where the line is the same)."""
    clashes: dict[str, list[str]] = {}
    listeners = host_listeners(cluster, rendered, endpoint_host)
    for host in cluster.hosts:
        found = listeners[host.name]
        for a in found:
            if a.port <= host.ssh_port <= a.last:
                line = (
                    f"{_named(a)} is the host's SSH port, {host.ssh_port_setting}; expected "
                    "every listener on a port sshd does not hold; " + _ssh_fix(a, host)
                )
                clashes.setdefault(line, []).append(host.name)
        for i, a in enumerate(found):
            for b in found[i + 1 :]:
                if a.port <= b.last and b.port <= a.last:
                    line = (
                        f"{_named(a)} and {_named(b)} both listen on this host; expected "
                        "distinct ports on one host; " + _pair_fix(a, b)
                    )
                    clashes.setdefault(line, []).append(host.name)
    return [f"{shorten_hosts(hosts)}: {line}" for line, hosts in clashes.items()]
