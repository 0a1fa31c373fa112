"""The TCP ports a host's rendered processes listen on, and the clashes among them. Pure.

The engine that renders a process declares what it binds (HostRender.listeners: the port,
the inventory variable that sets it, and the run of ports where it takes several); the plan
records them per host (HostPlan.ports) and refuses two listeners of one host on one port,
the weights relay's included: a launch that fails on the host, or worse, a router that
answers for the prefill server. Each is named by the inventory variable that sets it, so a
refusal can say which variable to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from k2provision.core.records import Cluster, HostSpec, PortBinding
from k2provision.core.variables import shorten_hosts
from k2provision.engines.base import Listener

__all__ = ["host_ports", "port_clashes"]


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
            bind="0.0.0.0",
            wildcard_why="the weights relay (roles/k2_weights) listens on every interface while "
            "it distributes the checkpoint",
        )
    ]


def port_clashes(cluster: Cluster, rendered: Mapping[str, Sequence[Listener]]) -> list[str]:
    """One line per pair of listeners that share a port on a host (hosts grouped): the
    engine's, as rendered, and the weights relay's."""
    clashes: dict[str, list[str]] = {}
    for host in cluster.hosts:
        found = [*rendered.get(host.name, ()), *_relay(host)]
        for i, a in enumerate(found):
            for b in found[i + 1 :]:
                if a.port <= b.last and b.port <= a.last:
                    clashes.setdefault(f"{a} and {b}", []).append(host.name)
    return [
        f"{shorten_hosts(hosts)}: {pair} both listen on this host; expected distinct ports "
        f"on one host; fix: move one of them to a free port"
        for pair, hosts in clashes.items()
    ]
