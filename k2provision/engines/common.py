"""Small pieces every engine renderer shares: addresses, health gates, parser names, socket
interfaces.

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
  inventory is refused for it (trtllm.py NO_IPV6); give the hosts IPv4 addresses or names.

Socket interface. NCCL, Gloo (torch.distributed), NVSHMEM's bootstrap and Open MPI pick a
network interface on their own when not told, and on hosts with several NICs they may pick one
that cannot reach the peers: the launch then hangs. Every multi-host process is therefore told
the interface. `k2_socket_ifname` names it for every host; when it is unset, each host's
launch script finds, when the process starts, the interface that holds that host's
`k2_local_ip` (a `LaunchValue`), so the plan stays a pure function of the inventory while the
value comes from the host itself. Where no interface can be derived (a `k2_local_ip` that is a
name, not an address), the plan warns and the engines choose on their own.
"""

from __future__ import annotations

import ipaddress

from k2provision.core.endpoint_guard import API_KEY, TLS_CERT, TLS_KEY, guard_path
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    GpuSpec,
    HealthGate,
    HostSpec,
    KvDtype,
    LaunchValue,
    ModelSpec,
    PoolPlan,
    Tunables,
    WorkerRegistration,
)
from k2provision.core.variables import TUNABLE_VARS
from k2provision.engines.base import Deployment

IFNAME = LaunchValue(name="K2_SOCKET_IFNAME", kind="ifname-of")
SUBNET = LaunchValue(name="K2_SOCKET_SUBNET", kind="cidr-of")


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


def api_key_value(tunables: Tunables) -> LaunchValue | None:
    """The endpoint's API key as a host value its launch script reads from the launch phase's
    file (never a plan's, a render's or a record's text), None without k2_api_key_file."""
    if not tunables.api_key_file:
        return None
    return LaunchValue(
        name="K2_API_KEY", kind="secret-file", arg=guard_path(tunables.config_dir, API_KEY)
    )


def tls_args(tunables: Tunables, cert_option: str, key_option: str) -> tuple[str, ...]:
    """The endpoint server's certificate and key options on the launch phase's files (on the
    endpoint's host only: roles/k2_launch/tasks/guard.yml); () without k2_tls_cert_file."""
    if not tunables.tls_cert_file:
        return ()
    return (
        cert_option,
        guard_path(tunables.config_dir, TLS_CERT),
        key_option,
        guard_path(tunables.config_dir, TLS_KEY),
    )


def endpoint_url(tunables: Tunables, address: str, port: int, path: str = "") -> str:
    """The endpoint's URL: https where it serves k2_tls_cert_file."""
    url = http_url(address, port, path)
    return "https" + url.removeprefix("http") if tunables.tls_cert_file else url


def endpoint_gate(tunables: Tunables, address: str, port: int, path: str) -> HealthGate:
    """The endpoint's health gate, https where it serves TLS: asked on the host under the
    registry's one certificate policy (the host's trust store and the CA the launch places
    there for k2_tls_ca_file; module_utils/host_questions.py)."""
    return HealthGate(
        url=endpoint_url(tunables, address, port, path), timeout_s=tunables.health_timeout_s
    )


def unguarded_endpoint_problems(
    cluster: Cluster, no_key: str | None, no_tls: str | None
) -> list[str]:
    """Refusals where the inventory guards the endpoint but the engine cannot: `no_key` /
    `no_tls` say why it takes no API key / serves no TLS (its NO_API_KEY / NO_TLS; None: it
    does). An endpoint the inventory means guarded that answers unguarded would be a silent
    security failure."""
    t = cluster.tunables
    choose = (
        "choose k2_engine=sglang (its server, or its router with layout pd) or vllm, or "
        "serve it as a fleet (k2_instances above 1), whose router holds the key and the TLS"
    )
    found = []
    if t.api_key_file and no_key:
        found.append(
            f"k2_api_key_file={t.api_key_file}: {cluster.engine} takes no API key "
            f"({no_key}), so the endpoint would answer without one; fix: {choose}, or unset "
            "k2_api_key_file and put a proxy of your own that checks the key in front of it"
        )
    if t.tls_cert_file and no_tls:
        found.append(
            f"k2_tls_cert_file={t.tls_cert_file}: {cluster.engine} serves no TLS ({no_tls}), "
            f"so the endpoint would be plain http; fix: {choose}, or unset k2_tls_cert_file "
            "and k2_tls_key_file and put a TLS-terminating proxy of your own in front of it"
        )
    return found


TCP_STORE_BINDS_ALL = (
    "torch.distributed's store on rank 0 binds every interface: the tcp:// rendezvous passes "
    "only a host for clients to dial (torch/distributed/rendezvous.py _tcp_rendezvous_handler) "
    "and c10d's TCPStore server takes no bind address"
)


def http_gate(address: str, port: int, path: str, timeout_s: int) -> HealthGate:
    """A health gate on an HTTP endpoint of a host."""
    return HealthGate(url=http_url(address, port, path), timeout_s=timeout_s)


def tool_parser(model: ModelSpec) -> str | None:
    """The model's tool-call parser name (the same in SGLang, vLLM and TensorRT-LLM)."""
    return model.tool_parser


def reasoning_parser(model: ModelSpec) -> str | None:
    """The model's reasoning parser name, None for models that do not think aloud."""
    return model.reasoning_parser


def parser_args(
    model: ModelSpec, tool_flag: str, reasoning_flag: str, *, tool_switch: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The engine's options naming the model's parsers (`tool_switch` turns tool calls on
    where the engine wants that said too)."""
    args: tuple[str, ...] = ()
    tools = tool_parser(model)
    if tools:
        args += (*tool_switch, tool_flag, tools)
    thinking = reasoning_parser(model)
    if thinking:
        args += (reasoning_flag, thinking)
    return args


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def multi_host(cluster: Cluster) -> bool:
    """Whether processes of the deployment talk across hosts."""
    return len({h.name for h in cluster.hosts if h.pool != "router"}) > 1


def socket_ifname(cluster: Cluster, host: HostSpec) -> tuple[str | None, tuple[LaunchValue, ...]]:
    """The socket interface for processes on `host`: the value to render (a name, or a
    reference to a host value) and the host values it needs; (None, ()) when the deployment
    has one host or the interface cannot be derived."""
    if not multi_host(cluster):
        return None, ()
    if cluster.tunables.socket_ifname:
        return cluster.tunables.socket_ifname, ()
    if not _is_address(host.local_ip):
        return None, ()
    value = IFNAME.model_copy(update={"arg": host.local_ip})
    return value.ref, (value,)


def socket_env(ifname: str | None, *, nvshmem: bool = False) -> dict[str, str]:
    """NCCL's and Gloo's interface (and NVSHMEM's bootstrap one, for DeepEP), or nothing."""
    if ifname is None:
        return {}
    env = {"NCCL_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname}
    if nvshmem:
        env["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] = ifname
    return env


def socket_warnings(cluster: Cluster) -> list[str]:
    """Hosts whose socket interface nobody can derive."""
    if not multi_host(cluster) or cluster.tunables.socket_ifname:
        return []
    unknown = [h.name for h in cluster.hosts if h.pool != "router" and not _is_address(h.local_ip)]
    if not unknown:
        return []
    return [
        f"k2_socket_ifname is unset and k2_local_ip of {', '.join(unknown)} is a name, not an "
        "address: the interface NCCL, Gloo and MPI use there cannot be derived and is left to "
        "the engines, a common cause of hangs at start on hosts with several NICs; set "
        "k2_socket_ifname (e.g. k2_socket_ifname=bond0) or k2_local_ip to the host's address"
    ]


# ---------------------------------------------------------------- engine answers most share


def kv_cache_dtype(tunables: Tunables, gpu: GpuSpec) -> KvDtype:
    """k2_kv_cache_dtype as rendered: fp8, or the model's BF16."""
    return "fp8" if tunables.kv_cache_dtype == "fp8" else "bf16"


def fp8_kv_problems(tunables: Tunables, gpu: GpuSpec) -> list[str]:
    """An FP8 KV cache asked of a GPU without FP8."""
    if tunables.kv_cache_dtype == "fp8" and not gpu.fp8:
        return [f"k2_kv_cache_dtype=fp8: {gpu.key} has no FP8; fix: set k2_kv_cache_dtype=auto"]
    return []


def no_fp8_kv_problems(engine: str, tunables: Tunables) -> list[str]:
    """An FP8 KV cache asked of an engine that renders none."""
    if tunables.kv_cache_dtype == "fp8":
        return [
            f"k2_kv_cache_dtype=fp8: {engine} renders no FP8 KV cache; fix: set "
            "k2_kv_cache_dtype=auto"
        ]
    return []


def inventory_served_name(cluster: Cluster) -> str:
    """k2_served_model_name, which the engine is told to list."""
    return cluster.tunables.served_model_name


def no_warnings(cluster: Cluster, spec: ModelSpec, release: EngineRelease) -> list[str]:
    """Nothing engine-specific to say."""
    return []


def own_tunables(prefix: str, layouts: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The tunables named `prefix...`, each read by every one of `layouts`."""
    return {name: layouts for name in TUNABLE_VARS if name.startswith(prefix)}


def instance_serving(
    cluster: Cluster, instance: PoolPlan, fleet_port: int
) -> tuple[str, int, bool]:
    """Where an instance's API server listens: (bind address, port, whether it is the
    endpoint). Alone it is the endpoint on every interface and k2_api_port; in a fleet it
    serves the router (which takes k2_api_port, and may share its host) on its master's
    k2_local_ip and `fleet_port`, the engine's own port setting."""
    if instance.instance:
        return cluster.host(instance.master).local_ip, fleet_port, False
    return any_address(cluster), cluster.tunables.api_port, True


def master_endpoint(deployment: Deployment) -> str:
    """The base URL of one server on the [nodes] master, on k2_api_port (an engine with no
    router and no TLS)."""
    pool = deployment.pool("nodes")
    return http_url(pool.master_address, deployment.cluster.tunables.api_port)


def master_instance_url(cluster: Cluster, instance: PoolPlan) -> str:
    """Where a router would reach one instance: its master's k2_local_ip on k2_api_port."""
    return http_url(cluster.host(instance.master).local_ip, cluster.tunables.api_port)


def regular_worker(cluster: Cluster, instance: PoolPlan) -> WorkerRegistration:
    """A replica the router takes back by its URL alone (sglang-router 0.3.2 regular mode:
    ``POST /workers {"url": ...}``)."""
    return WorkerRegistration(body={"url": instance.url})


def openai_bench_options(*random: str) -> tuple[str, ...]:
    """The options of a vLLM-lineage serving benchmark (vLLM's `bench serve`, TensorRT-LLM's
    benchmark_serving, both with these names) against the OpenAI completions route: random
    prompts of exact lengths (`random`: what else that client's random set needs), answers of
    exact lengths, p50/p90/p99 of TTFT, ITL and end-to-end latency in one JSON result."""
    return (
        "--endpoint",
        "/v1/completions",
        "--dataset-name",
        "random",
        *random,
        "--random-range-ratio",
        "0",  # lengths in [L(1-r), L(1+r)]; 0 is exact
        "--ignore-eos",
        "--model",
        "{served_model_name}",
        "--percentile-metrics",
        "ttft,itl,e2el",
        "--metric-percentiles",
        "{percentiles}",
        "--save-result",
        "--result-dir",
        "{out_dir}",
        "--result-filename",
        "{result_name}",
    )
