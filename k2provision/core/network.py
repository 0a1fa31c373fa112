"""What each host listens on, and which addresses an engine can be wired with.

Pure: from the validated Cluster alone (plus the weights relay's port, a role variable). Two
listeners of one host on one port is a launch that fails on the host, or worse, a router that
answers for the prefill server; this refuses it first.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from k2provision.core.records import Cluster, HostSpec
from k2provision.core.variables import shorten_hosts

# SGLang with DP attention (the PD pools) binds the rendezvous port and the six after it on
# the pool's rank 0: sglang 0.5.23 srt/server_args.py PortArgs.init_new, port_base =
# dist_init_port + 1, detokenizer/rpc/metrics/scheduler/load-collector at port_base + 1..5.
SGLANG_DP_ATTENTION_DIST_PORTS = 7


@dataclass(frozen=True)
class Listener:
    """One listening socket (or a run of them) that a host's processes open."""

    variable: str
    what: str
    port: int
    count: int = 1

    @property
    def last(self) -> int:
        """The last port of the run."""
        return self.port + self.count - 1

    def __str__(self) -> str:
        """`k2_api_port=8000 (the PD router)`, with the run of ports where there is one."""
        run = f", ports {self.port}-{self.last}" if self.count > 1 else ""
        return f"{self.variable}={self.port} ({self.what}{run})"


def _engine_listeners(cluster: Cluster, host: HostSpec) -> list[Listener]:
    t = cluster.tunables
    engine, layout = cluster.engine, cluster.layout
    pool = cluster.pool(host.pool) if host.pool != "router" else ()
    master = bool(pool) and pool[0].name == host.name
    found: list[Listener] = []
    if engine == "sglang":
        if host.pool != "router":
            found.append(Listener("k2_sglang_port", "the SGLang server", t.sglang_port))
        if master:
            count = SGLANG_DP_ATTENTION_DIST_PORTS if layout == "pd" else 1
            found.append(Listener("k2_dist_port", "the rendezvous", t.dist_port, count))
        if host.pool == "prefill":
            found.append(Listener("k2_bootstrap_port", "the KV bootstrap", t.bootstrap_port))
        if layout == "pd" and host.name == cluster.router:
            found.append(Listener("k2_api_port", "the PD router", t.api_port))
    elif engine == "vllm":
        if master:
            found.append(Listener("k2_api_port", "the vLLM API server", t.api_port))
            if layout == "dp_ep":
                found.append(Listener("k2_dp_rpc_port", "the DP RPC", t.dp_rpc_port))
            else:
                found.append(Listener("k2_ray_port", "the Ray head", t.ray_port))
    elif engine == "trtllm":
        found.append(Listener("k2_ssh_port", "the containers' sshd", t.ssh_port))
        if master:
            found.append(Listener("k2_api_port", "trtllm-serve", t.api_port))
    elif master:
        found.append(Listener("k2_api_port", f"the {engine} server", t.api_port))
    return found


def listeners(cluster: Cluster, relay_ports: Mapping[str, int]) -> dict[str, list[Listener]]:
    """host -> what it listens on: its engine processes, and the weights relay."""
    out: dict[str, list[Listener]] = {}
    for host in cluster.hosts:
        found = _engine_listeners(cluster, host)
        if host.name in relay_ports:
            found.append(Listener("k2_weights_port", "the weights relay", relay_ports[host.name]))
        out[host.name] = found
    return out


def port_clashes(cluster: Cluster, relay_ports: Mapping[str, int]) -> list[str]:
    """One line per pair of listeners that share a port on a host (hosts grouped)."""
    clashes: dict[str, list[str]] = {}
    for host, found in listeners(cluster, relay_ports).items():
        for i, a in enumerate(found):
            for b in found[i + 1 :]:
                if a.port <= b.last and b.port <= a.last:
                    key = f"{a} and {b}"
                    clashes.setdefault(key, []).append(host)
    return [
        f"{shorten_hosts(hosts)}: {pair} both listen on this host; expected distinct ports "
        f"on one host; fix: move one of them to a free port"
        for pair, hosts in clashes.items()
    ]


def _version(address: str) -> int | None:
    try:
        return ipaddress.ip_address(address).version
    except ValueError:
        return None


def address_family_problems(cluster: Cluster) -> list[str]:
    """IPv4 and IPv6 literals mixed in one cluster, or IPv6 for an engine that cannot take it."""
    by_version: dict[int, list[str]] = {}
    for host in cluster.hosts:
        for address in dict.fromkeys((host.address, host.local_ip)):
            version = _version(address)
            if version:
                by_version.setdefault(version, []).append(host.name)
    problems = []
    if len(by_version) > 1:
        problems.append(
            f"{cluster.inventory}: IPv4 addresses ({shorten_hosts(by_version[4])}) and IPv6 "
            f"addresses ({shorten_hosts(by_version[6])}) in one cluster; expected one address "
            "family, since every host connects to every other; fix: give every host "
            "ansible_host and k2_local_ip of the same family"
        )
    if cluster.engine == "trtllm" and 6 in by_version:
        problems.append(
            f"{shorten_hosts(by_version[6])}: IPv6 address for trtllm, whose mpirun host list "
            "(-H host:slots) cannot carry an IPv6 literal; expected IPv4 addresses or host "
            "names; fix: set ansible_host to an IPv4 address or a resolvable name"
        )
    return problems
