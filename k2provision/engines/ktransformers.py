"""KTransformers: one host, routed experts on the CPU (kt-kernel), the rest on one GPU; a
fleet is replicas of one host each behind the router, each on its k2_local_ip and
k2_sglang_port (it is SGLang's server, so the router takes it by URL).

KTransformers serves the Kimi-K2 family through SGLang with its CPU expert kernels: the
server is SGLang's (`python3 -m sglang.launch_server`, from sglang-kt, the SGLang build
kt-kernel pairs with), and the `--kt-*` options hand the routed experts to kt-kernel
(kvcache-ai/ktransformers doc/en/kt-kernel/Native-Precision-Tutorial.md, Kimi-K2-Thinking.md;
the same options exist in sglang 0.5.23, sglang/srt/arg_groups/fields/exec_.py). The old
`ktransformers.server.main` of the 0.3 line served one request at a time unless given the
balance_serve backend and its rule files; it is no longer the path upstream documents.

- `--kt-weight-path`: the CPU experts' weights, read as the checkpoint ships them, so it is the
  model directory: FP8 block-quantised experts (Kimi-K2-Instruct) with `--kt-method FP8`, the
  native INT4 experts of K2-Thinking and K2.5+ with `--kt-method RAWINT4` ("CPU and GPU use
  the same INT4 weight": doc/en/kt-kernel/Kimi-K2-Thinking-Native.md, doc/en/Kimi-K2.5.md).
- `--kt-num-gpu-experts`: routed experts per layer kept on the GPU (k2_ktransformers_gpu_experts,
  0 by default: the memory fit counts the routed experts in host memory).
- `--kt-cpuinfer`: CPU threads; upstream advises the physical cores minus the GPUs, which only
  the host knows: its launch script counts them (or k2_ktransformers_cpuinfer fixes it).
- `--kt-threadpool-count`: one thread pool per NUMA node, counted by the launch script.
- `--max-total-tokens`: the KV cache size in tokens (k2_ktransformers_cache_lens).
"""

from __future__ import annotations

from dataclasses import replace

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    GpuSpec,
    LaunchValue,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    PoolPlan,
    Process,
    Tunables,
)
from k2provision.engines.base import (
    BatchTunable,
    ContainerNeeds,
    Deployment,
    HostRender,
    MetricNames,
    PublishedFigure,
    WeightSlices,
    layout_names,
    listener,
)
from k2provision.engines.common import (
    http_gate,
    http_url,
    instance_serving,
    inventory_served_name,
    kv_cache_dtype,
    master_endpoint,
    no_fp8_kv_problems,
    own_tunables,
    regular_worker,
)
from k2provision.engines.memory import (
    RUNTIME_GIB,
    KvBudget,
    PoolFit,
    activations_gib,
    floor2,
)
from k2provision.engines.sglang import BENCH_CLIENT as SGLANG_BENCH_CLIENT
from k2provision.engines.sglang import (
    LAUNCH_SERVER,
    NUMA_BINDING,
    SERVER_METRICS_ARGS,
    add_router,
    model_args,
    routed_endpoint,
    server_env,
    server_key,
)
from k2provision.engines.sglang import METRICS as SGLANG_METRICS

CONTAINER = "k2-ktransformers"
# kt-kernel's method for the routed experts' format as the checkpoint ships it.
KT_METHODS = {"fp8_block": "FP8", "int4_group": "RAWINT4"}
CPUINFER = LaunchValue(name="K2_KT_CPUINFER", kind="physical-cores-minus")
NUMA_NODES = LaunchValue(name="K2_NUMA_NODES", kind="numa-nodes")


def render(deployment: Deployment) -> dict[str, HostRender]:
    """The server on the single host of each replica of [nodes], and in a fleet the router
    in front of them."""
    out: dict[str, HostRender] = {}
    for replica in deployment.pool("nodes").members():
        out.update(_render_replica(deployment, replica))
    if deployment.cluster.fleet:
        add_router(out, deployment, HEALTH_PATH)
    return out


def serving(deployment: Deployment, replica: PoolPlan) -> tuple[str, int, bool]:
    """Where a replica's server listens: (bind address, port, whether it is the endpoint).
    Alone it is the endpoint on every interface and k2_api_port; in a fleet it serves the
    router on its host's k2_local_ip and k2_sglang_port (it is SGLang's server)."""
    cluster = deployment.cluster
    return instance_serving(cluster, replica, cluster.tunables.sglang_port)


def _render_replica(deployment: Deployment, pool: PoolPlan) -> dict[str, HostRender]:
    """The server command on the replica's one host."""
    cluster = deployment.cluster
    t = cluster.tunables
    model_dir = cluster.model_dir
    values: list[LaunchValue] = [NUMA_NODES]
    if t.ktransformers_cpuinfer is None:
        cpuinfer = CPUINFER.model_copy(update={"arg": str(pool.gpus)})
        values.append(cpuinfer)
        threads = cpuinfer.ref
    else:
        threads = str(t.ktransformers_cpuinfer)
    bind, port, endpoint_itself = serving(deployment, pool)
    argv = (
        *LAUNCH_SERVER,
        *model_args(deployment),
        "--kt-weight-path",
        model_dir,
        "--kt-method",
        KT_METHODS[deployment.model.quantization.routed_experts.scheme],
        "--kt-cpuinfer",
        threads,
        "--kt-threadpool-count",
        NUMA_NODES.ref,
        "--kt-num-gpu-experts",
        str(t.ktransformers_gpu_experts),
        "--tp-size",
        str(pool.parallel.tp),
        "--mem-fraction-static",
        str(pool.mem_fraction),
        "--max-total-tokens",
        str(t.ktransformers_cache_lens),
        # Shared experts stay on the GPU with the attention (kt-kernel takes routed ones).
        "--disable-shared-experts-fusion",
        *SERVER_METRICS_ARGS,
        "--host",
        bind,
        "--port",
        str(port),
        # The key as SGLang's server takes it: sglang-kt 0.7.2 has the same --api-key and
        # --config (sglang/srt/server_args.py) and leaves /health open (srt/utils/auth.py).
        # In a fleet the router holds the endpoint's key, as SGLang's replicas do.
        *(server_key(t) if endpoint_itself else ()),
    )
    env, socket_values = server_env(deployment, cluster.host(pool.master))
    process = Process(
        name="ktransformers",
        container=CONTAINER,
        image=deployment.image,
        argv=argv,
        env=env,
        resolve=(*socket_values, *values),
        health=http_gate(
            pool.master_address if endpoint_itself else bind,
            port,
            HEALTH_PATH,
            t.health_timeout_s,
        ),
        instance=pool.ref(),
    )
    if endpoint_itself:
        served = listener(
            process, "k2_api_port", "the ktransformers server", port, bind=bind, public=True
        )
    else:
        served = listener(
            process, "k2_sglang_port", "the ktransformers server of a replica behind the "
            "router", port, bind=bind,
        )  # fmt: skip
    return {pool.master: HostRender(processes=(process,), listeners=(served,))}


def endpoint(deployment: Deployment) -> str:
    """The OpenAI-compatible base URL: the one server, or a fleet's router."""
    if deployment.cluster.fleet:
        return routed_endpoint(deployment)
    return master_endpoint(deployment)


def instance_url(cluster: Cluster, instance: PoolPlan) -> str:
    """Where a fleet's router reaches one replica: its server on the host's k2_local_ip and
    k2_sglang_port."""
    return http_url(cluster.host(instance.master).local_ip, cluster.tunables.sglang_port)


# sglang-kt's server is SGLang's: it answers /server_info and /model_info, so sglang-router
# 0.3.2 takes a replica back by its URL alone, as it does an SGLang replica.
router_worker = regular_worker


# ---------------------------------------------------------------- what the plan asks

DISPLAY_NAME = "KTransformers"
# KTransformers serves Kimi-K2 through SGLang with its CPU expert kernels (kt-kernel):
# kt-kernel 0.7.2 and the SGLang build it pairs with, sglang-kt 0.7.2 (both on PyPI, both
# pinning torch 2.9.1 and CUDA 12.8 wheels). No public image of this pair is published
# under a tag we could check, so the image is the one containers/ktransformers builds
# from those pins, FROM CUDA 12.8's image (plan/images.py names it by its content).
RELEASE = EngineRelease(
    engine="ktransformers",
    version="0.7.2",
    image="nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04",
    build="ktransformers",
    min_driver="570.26",  # CUDA 12.8, the torch 2.9.1 wheels kt-kernel pins
)
_FP8 = EngineSupport(min_version="0.3.2", source="kvcache-ai/ktransformers doc/en/Kimi-K2.md")
_INT4 = EngineSupport(
    min_version="0.7.2",
    source="SGLang with kt-kernel, --kt-method RAWINT4 on the native INT4 weights "
    "(kvcache-ai/ktransformers doc/en/kt-kernel/Kimi-K2-Thinking-Native.md, doc/en/Kimi-K2.5.md; "
    "RAWINT4 since kt-kernel's 'Support Native Kimi K2 Thinking', Dec 2025)",
)
SUPPORT: dict[str, EngineSupport] = {
    **dict.fromkeys(catalog.FP8_FAMILY, _FP8),
    **dict.fromkeys(catalog.INT4_FAMILY, _INT4),
}
LAYOUTS: tuple[Layout, ...] = (Layout(name="single", one_host=True),)
SINGLE_GPU = True
ROUTED_EXPERTS_ON_HOST = True
TEXT_ONLY = False
FP8_KV = False
FLEET_LAYOUTS: tuple[str, ...] = layout_names(LAYOUTS)
DCP_LAYOUTS: tuple[str, ...] = ()
DCP_TUNABLE: str | None = None
SPARE_EXPERT_TUNABLES: dict[PoolName, str] = {}
HEALTH_PATH = "/health"
# sglang-kt 0.7.2 is SGLang's server: --enable-metrics mounts Prometheus' /metrics on its HTTP
# port (sglang/srt/entrypoints/http_server.py, add_prometheus_middleware in
# sglang/srt/utils/common.py), in SGLang's metric names.
METRICS_PATH: str | None = "/metrics"
METRICS_PORTS: tuple[str, ...] = ("k2_api_port",)
METRICS: MetricNames | None = SGLANG_METRICS
# Served by sglang.launch_server: sglang-kt's own client (its sglang fork), on the native route.
BENCH_CLIENT = replace(
    SGLANG_BENCH_CLIENT,
    kind="ktransformers",
    # sglang-kt 0.7.2 keeps the client at sglang/bench_serving.py (its sglang/benchmark/ has
    # only datasets and utils), with the options of sglang 0.5.23's (`random-ids`,
    # --served-model-name, --output-file); its JSON line has no p90 of TTFT or ITL (p95/p99 of
    # ITL, p99 of TTFT: bench_serving.py run_benchmark).
    module="sglang.bench_serving",
    command=("-m", "sglang.bench_serving"),
    install="sglang-kt==0.7.2, in the KTransformers image (scripts/install-engine-parsers "
    "sglang-kt builds .venv-sglang-kt)",
    result_format=replace(SGLANG_BENCH_CLIENT.result_format, no_p90=("ttft", "itl")),
)
PUBLISHED_FIGURES: tuple[PublishedFigure, ...] = ()
# sglang-kt 0.7.2 has no SGLANG_CACHE_DIR: DeepGEMM's JIT cache is SGLANG_DG_CACHE_DIR
# (srt/environ.py:360, ~/.cache/deep_gemm by default); the libraries keep their own.
CONTAINER_NEEDS = ContainerNeeds(
    cap_add=(NUMA_BINDING,),
    compile_caches=(
        ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
        ("TRITON_CACHE_DIR", "triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("CUDA_CACHE_PATH", "nv"),
        ("FLASHINFER_WORKSPACE_BASE", ""),
    ),
)
# Tunables only KTransformers reads, each with the layouts that read it.
OWN_TUNABLES: dict[str, tuple[str, ...]] = own_tunables("k2_ktransformers_", layout_names(LAYOUTS))
NO_IPV6: str | None = None
NO_API_KEY: str | None = None
NO_TLS: str | None = (
    "sglang-kt 0.7.2, kt-kernel's SGLang, has no --ssl-certfile, sglang/srt/server_args.py"
)
DIST_PORT_SPAN = 0
BATCH_TUNABLES: tuple[BatchTunable, ...] = ()
kv_dtype = kv_cache_dtype
served_name = inventory_served_name


def pool_shape(cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
    """One GPU."""
    return Parallel(tp=1)


def weight_slices(cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
    """One GPU: nothing is split."""
    return WeightSlices(expert=1, shared=1, dense=1)


def kernel_path_problems(cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
    """Routed experts run in kt-kernel on the host, with the --kt-method of their format
    (KT_METHODS: FP8 and RAWINT4, both inference methods of sglang-kt 0.7.2's
    layers/moe/kt_ep_wrapper.py, which maps them at :212 and :216); any other format has none."""
    experts = spec.quantization.routed_experts
    if experts.scheme not in KT_METHODS:
        return [f"kt-kernel has no --kt-method for {spec.id}'s {experts.label} experts"]
    return []


def kv_dtype_problems(tunables: Tunables, gpu: GpuSpec) -> list[str]:
    """The render has no FP8 KV cache."""
    return no_fp8_kv_problems("ktransformers", tunables)


def plan_warnings(cluster: Cluster, spec: ModelSpec, release: EngineRelease) -> list[str]:
    """The routed experts' host memory."""
    return [
        f"ktransformers keeps routed experts in host memory: the host needs about "
        f"{catalog.routed_expert_bytes(spec) / GIB:.0f} GiB of RAM for the "
        f"{spec.quantization.routed_experts.label} experts kt-kernel reads from the model "
        "directory; preflight checks it"
    ]


# ---------------------------------------------------------------- memory accounting

# Routed experts in host memory (ROUTED_EXPERTS_ON_HOST); the GPU holds the rest and the cache.
KV_PAGE_TOKENS = 1


def reserve(f: PoolFit) -> MemoryReserve:
    """KTransformers: one GPU, no collectives; activations for its prefill chunk."""
    return MemoryReserve(
        activations=round(activations_gib(8192, f.spec, f.parallel), 2),
        cuda_graphs=0.0,
        comm_buffers=0.0,
        runtime=RUNTIME_GIB,
        margin=f.tunables.reserve_gib,
    )


def kv_budget(f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
    """The fraction that leaves the whole reserve outside; the KV cache is the rest of it."""
    fraction = floor2(1 - reserve.total / f.gpu.usable_gib)
    budget = fraction * f.gpu.usable_gib
    return KvBudget(fraction, budget, budget - weights_gib)
