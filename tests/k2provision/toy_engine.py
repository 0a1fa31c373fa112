"""A fifth engine, for the test that adds one (test_toy_engine.py): one OpenAI-compatible
server per host of [nodes], tensor parallel over the host's GPUs, with a config file of its own.

It is what a new engine is: this module, implementing the `Engine` protocol of
k2provision/engines/base.py, with what it shares with the other engines taken by assignment from
engines/common.py, and one registry line (the test adds it to REGISTRY).
"""

from __future__ import annotations

from dataclasses import replace

from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    Process,
)
from k2provision.engines import sglang
from k2provision.engines.base import (
    BatchTunable,
    BenchClient,
    ContainerNeeds,
    Deployment,
    HostRender,
    MetricNames,
    PublishedFigure,
    WeightSlices,
    listener,
)
from k2provision.engines.common import (
    any_address,
    fp8_kv_problems,
    http_gate,
    inventory_served_name,
    kv_cache_dtype,
    master_endpoint,
    master_instance_url,
    no_warnings,
    regular_worker,
)
from k2provision.engines.memory import (
    RUNTIME_GIB,
    KvBudget,
    PoolFit,
    activations_gib,
    collective_buffers_gib,
    floor2,
)

CONTAINER = "k2-toy"
NAME = "toy"


def config_path(config_dir: str) -> str:
    """Where the server's own config file lives on every host."""
    return f"{config_dir}/toy/server.yaml"


def render(deployment: Deployment) -> dict[str, HostRender]:
    """One server on the master of [nodes], reading its config file."""
    pool = deployment.pool("nodes")
    t = deployment.cluster.tunables
    config = config_path(t.config_dir)
    process = Process(
        name="toy-server",
        container=CONTAINER,
        image=deployment.image,
        argv=(
            "toy-serve",
            "--model",
            deployment.cluster.model_dir,
            "--served-name",
            t.served_model_name,
            "--tp",
            str(pool.parallel.tp),
            "--config",
            config,
        ),
        health=http_gate(pool.master_address, t.api_port, HEALTH_PATH, t.health_timeout_s),
    )
    text = (
        f"port: {t.api_port}\n"
        f"host: {any_address(deployment.cluster)}\n"
        f"memory_fraction: {pool.mem_fraction}\n"
        f"context_length: {deployment.context_length}\n"
    )
    port = listener(
        process,
        "k2_api_port",
        "the toy server",
        t.api_port,
        bind=any_address(deployment.cluster),
        public=True,
    )
    return {pool.master: HostRender(processes=(process,), files={config: text}, listeners=(port,))}


endpoint = master_endpoint
instance_url = master_instance_url
router_worker = regular_worker

DISPLAY_NAME = "Toy"
RELEASE = EngineRelease(
    engine=NAME, version="1.0", image="registry.example/toy:1.0", min_driver="570.26"
)
SUPPORT: dict[str, EngineSupport] = {
    "moonshotai/Kimi-K2-Thinking": EngineSupport(min_version="1.0", source="the toy's own tests")
}
LAYOUTS: tuple[Layout, ...] = (Layout(name="solo", one_host=True),)
SINGLE_GPU = False
ROUTED_EXPERTS_ON_HOST = False
TEXT_ONLY = False
FP8_KV = True
DCP_LAYOUTS: tuple[str, ...] = ()
DCP_TUNABLE: str | None = None
SPARE_EXPERT_TUNABLES: dict[PoolName, str] = {}
FLEET_LAYOUTS: tuple[str, ...] = ()
HEALTH_PATH = "/health"
METRICS_PATH: str | None = "/metrics"
METRICS_PORTS: tuple[str, ...] = ("k2_api_port",)
METRICS: MetricNames | None = MetricNames(
    prompt_tokens="toy:prompt_tokens_total",
    generation_tokens="toy:generation_tokens_total",
    running="toy:running",
    queued="toy:queued",
    kv_usage="toy:kv_usage",
    ttft="toy:ttft_seconds",
    inter_token="toy:itl_seconds",
    e2e="toy:e2e_seconds",
)
# An OpenAI-compatible server: sglang's client on the OpenAI route, as for TensorRT-LLM.
BENCH_CLIENT: BenchClient = replace(sglang.BENCH_CLIENT, backend="sglang-oai")
PUBLISHED_FIGURES: tuple[PublishedFigure, ...] = ()
CONTAINER_NEEDS = ContainerNeeds(compile_caches=(("TOY_CACHE_DIR", ""),))
KV_PAGE_TOKENS = 1
OWN_TUNABLES: dict[str, tuple[str, ...]] = {}
DIST_PORT_SPAN = 0
NO_IPV6: str | None = None
NO_API_KEY: str | None = "toy-serve has no key option"
NO_TLS: str | None = "toy-serve has no certificate option"
BATCH_TUNABLES: tuple[BatchTunable, ...] = ()
kv_dtype = kv_cache_dtype
kv_dtype_problems = fp8_kv_problems
served_name = inventory_served_name
plan_warnings = no_warnings


def pool_shape(cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
    """Tensor parallel over the host's GPUs."""
    return Parallel(tp=nodes * cluster.gpus_per_node)


def weight_slices(cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
    """Every MLP weight cut over the tensor-parallel ranks."""
    return WeightSlices(expert=parallel.tp, shared=parallel.tp, dense=parallel.tp)


def kernel_path_problems(cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
    """Every format has a path."""
    return []


def reserve(f: PoolFit) -> MemoryReserve:
    """Activations for an 8192-token step and the all-reduce buffers."""
    return MemoryReserve(
        activations=round(activations_gib(8192, f.spec, f.parallel), 2),
        cuda_graphs=0.0,
        comm_buffers=round(collective_buffers_gib(f.parallel.tp, f.gpus_per_node), 2),
        runtime=RUNTIME_GIB,
        margin=f.tunables.reserve_gib,
    )


def kv_budget(f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
    """The fraction that leaves the reserve outside; the KV cache is the rest of it."""
    fraction = floor2(1 - reserve.total / f.gpu.usable_gib)
    budget = fraction * f.gpu.usable_gib
    return KvBudget(fraction, budget, budget - weights_gib)
