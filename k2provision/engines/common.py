"""Small pieces every engine renderer shares.

Addresses: wherever a host and a port meet (URLs, `host:port` flags), an IPv6 address is
written in brackets (`[fd00::1]:5757`), through `host_port`, and a server that listens on every
address binds `::` when the cluster's addresses are IPv6 (`0.0.0.0` would leave it IPv4-only).
What the pinned releases take (read in their sources):
- sglang 0.5.23: `--dist-init-addr` and the PD bootstrap/KV addresses go through
  `NetworkAddress.parse` (sglang/srt/utils/network.py), which takes `[v6]:port` and refuses a
  bare `v6:port` as ambiguous; the servers are uvicorn (`--host ::` is dual-stack on Linux).
- vLLM 0.33.0: `--data-parallel-address` is a bare host, bracketed by vLLM itself
  (vllm/utils/network_utils.py `get_tcp_uri`, `join_host_port`); Ray 2.60's `parse_address`
  takes `[v6]:port` (ray._raylet), so `ray start --address` and `ray.init` get brackets.
- TensorRT-LLM: mpirun's `-H host:slots` list has no syntax for an IPv6 literal, so the
  inventory is refused for it (network.py); give the hosts IPv4 addresses or names.
"""

from __future__ import annotations

import ipaddress

from k2provision.models import Cluster, HealthGate

TOOL_PARSER = "kimi_k2"


def is_ipv6(address: str) -> bool:
    """True for an IPv6 literal (not for names, whatever they resolve to)."""
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


def host_port(address: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    return f"[{address}]:{port}" if is_ipv6(address) else f"{address}:{port}"


def http_url(address: str, port: int, path: str = "") -> str:
    """`http://host:port/path`, with an IPv6 address in brackets."""
    return f"http://{host_port(address, port)}{path}"


def any_address(cluster: Cluster) -> str:
    """The wildcard a server binds to be reachable at any of the cluster's addresses."""
    addresses = [a for h in cluster.hosts for a in (h.address, h.local_ip)]
    return "::" if any(is_ipv6(a) for a in addresses) else "0.0.0.0"


def http_gate(address: str, port: int, path: str, timeout_s: int) -> HealthGate:
    """A health gate on an HTTP endpoint of a host."""
    return HealthGate(url=http_url(address, port, path), timeout_s=timeout_s)


def tool_parser(engine: str) -> str | None:
    """The tool-call parser name an engine takes for Kimi-K2 (None: the engine has no flag)."""
    return None if engine == "ktransformers" else TOOL_PARSER
