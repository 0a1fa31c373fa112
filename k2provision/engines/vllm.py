"""vLLM: TP across nodes and TP+PP over a Ray cluster, or DP+EP with headless workers.

Every host runs one container, `k2-vllm`. Start order (stages start in turn; all processes of a
stage start before any of that stage's gates is waited on):

Layouts `tp` and `tp_pp` on one host: `vllm serve` as the container's main command (stage 0),
with vLLM's default multiprocessing executor, as the recipes run it; no Ray.

Layouts `tp` and `tp_pp` across hosts (Ray executor):
  stage 0  head host: container main command `ray start --head ... --block`.
           gate: a command in the head's container that passes once Ray counts the head node
           and its GPUs.
  stage 1  every other host: container main command `ray start --address HEAD:RAY_PORT ... --block`.
           gate: a command in that host's container that passes once Ray counts all N nodes
           and their N x GPUs-per-node GPUs.
  stage 2  head host: `vllm serve ... --distributed-executor-backend ray`, exec'd in the head's
           container (it joins the running Ray cluster); gate: GET /health on the head.
  `--block` keeps `ray start` in the foreground, so the container lives exactly as long as its
  Ray node; the env of `ray start` is what vLLM's Ray workers inherit.

Layout `dp_ep` (no Ray; the API servers on the head, engine cores on every host):
  stage 0  all hosts at once: the head's `vllm serve` (DP ranks 0-7, the DP RPC endpoint, and
           vLLM's internal load balancer over all DP ranks: one API server process per DP
           rank) and every worker's `vllm serve --headless --data-parallel-start-rank 8k`,
           each its container's main command. Workers connect to HEAD:DP_RPC_PORT and retry
           until the head listens, and the head only reports healthy once every DP rank has
           joined, so the head's GET /health gate sits in the same stage as the workers: a gate
           in an earlier stage than the workers would never pass.
  The head takes no `--data-parallel-start-rank`: in vLLM 0.33.0 a start rank on a node that
  is not headless selects hybrid load balancing (vllm/engine/arg_utils.py,
  vllm/entrypoints/cli/serve.py), and the head then refuses every `--headless` rank at the
  handshake ("must not use --headless in external or hybrid dp lb mode",
  vllm/v1/engine/utils.py `wait_for_engine_startup`).
  Across nodes the experts are exchanged with DeepEP (`--all2all-backend`, vLLM's expert
  parallel deployment guide) and balanced by EPLB with spare expert slots (`--enable-eplb
  --eplb-config '{"num_redundant_experts": N}'`; vLLM refuses spare slots without EPLB,
  vllm/config/parallel.py).

Ray workers point at the head's inventory address; each host announces its own `local_ip`
(`--node-ip-address`, VLLM_HOST_IP). The DP handshake binds the head's `local_ip`
(`--data-parallel-address`), the headless ranks dial it there. Every process waits for its
engine cores as long as the launch gate does (`VLLM_ENGINE_READY_TIMEOUT_S`, 600 s in vLLM
0.33.0: less than a cold load of about 1 TB of weights can take).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    GpuSpec,
    HealthGate,
    HostSpec,
    LaunchValue,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    PoolPlan,
    Process,
    Tunables,
    WorkerRegistration,
)
from k2provision.engines.base import (
    BatchTunable,
    BenchClient,
    ContainerNeeds,
    Deployment,
    HostRender,
    Listener,
    MetricNames,
    PublishedFigure,
    ResultFormat,
    WeightSlices,
    layout_names,
    listener,
)
from k2provision.engines.common import (
    any_address,
    api_key_value,
    endpoint_gate,
    endpoint_url,
    fp8_kv_problems,
    host_port,
    http_gate,
    http_url,
    instance_serving,
    inventory_served_name,
    kv_cache_dtype,
    no_warnings,
    openai_bench_options,
    own_tunables,
    parser_args,
    socket_env,
    socket_ifname,
    tls_args,
)
from k2provision.engines.memory import (
    RUNTIME_GIB,
    KvBudget,
    PoolFit,
    activations_gib,
    collective_buffers_gib,
    encoder_gib,
    floor2,
    graph_gib,
    kv_bytes_per_token,
    weights_per_gpu,
)
from k2provision.engines.sglang import add_router, routed_endpoint

CONTAINER = "k2-vllm"

RAY_CHECK_ATTEMPT_S = 60
# Run inside a Ray node's container with argv HEAD:PORT NODES GPUS: exit 0 once the cluster
# shows at least NODES live nodes holding GPUS GPUs between them.
RAY_CHECK = (
    "import sys, ray\n"
    "address, nodes, gpus = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])\n"
    "ray.init(address=address, logging_level='ERROR', log_to_driver=False)\n"
    "alive = [n for n in ray.nodes() if n['Alive']]\n"
    "have = sum(n['Resources'].get('GPU', 0.0) for n in alive)\n"
    "print(f'ray: {len(alive)}/{nodes} nodes, {have:g}/{gpus:g} GPUs alive')\n"
    "sys.exit(0 if len(alive) >= nodes and have >= gpus else 1)\n"
)


def render(deployment: Deployment) -> dict[str, HostRender]:
    """Processes per host for the cluster's vLLM layout: every instance of the pool, and in a
    fleet the router in front of them."""
    layout = deployment.cluster.layout
    if layout not in layout_names(LAYOUTS):
        raise ValueError(f"vllm has no layout {layout!r}")
    out: dict[str, HostRender] = {}
    for pool in deployment.pool("nodes").members():
        if layout == "dp_ep":
            out.update(_render_dp_ep(deployment, pool))
        elif len(pool.hosts) == 1:
            out.update(_render_one_node(deployment, pool))
        else:
            out.update(_render_ray(deployment, pool))
    if deployment.cluster.fleet:
        add_router(out, deployment, HEALTH_PATH)
    return out


def endpoint(deployment: Deployment) -> str:
    """The OpenAI-compatible base URL: the head's API server, or a fleet's router."""
    t = deployment.cluster.tunables
    if deployment.cluster.fleet:
        return routed_endpoint(deployment)
    return endpoint_url(t, deployment.pool("nodes").master_address, t.api_port)


def instance_url(cluster: Cluster, instance: PoolPlan) -> str:
    """Where a fleet's router reaches one instance: its API server on the head's k2_local_ip,
    on k2_vllm_port (the router takes k2_api_port, and may share the head's host)."""
    return http_url(cluster.host(instance.master).local_ip, cluster.tunables.vllm_port)


def router_worker(cluster: Cluster, instance: PoolPlan) -> WorkerRegistration:
    """A replica registered by the launch with its model id (regular mode). sglang-router
    0.3.2 asks a new worker's /server_info and /model_info for labels and goes on without them
    where the server has neither (sgl-model-gateway core/steps/worker/local/
    discover_metadata.rs: HTTP mode keeps what answers); vLLM 0.33.0 serves them only in its
    development mode, so a worker taken from --worker-urls gets the model id "unknown"
    (create_worker.rs: the request's model_id, else served_model_name or model_path from
    /server_info) and /v1/models lists "unknown", as the lab showed. `POST /workers` with
    model_id names it; vLLM's /health answers the router's health checks."""
    body: dict[str, str | int] = {
        "url": instance.url,
        "model_id": cluster.tunables.served_model_name,
    }
    return WorkerRegistration(body=body, at_launch=True)


def _serving(deployment: Deployment, pool: PoolPlan) -> tuple[str, int, bool]:
    """Where an instance's API server listens: (bind address, port, whether it is the
    endpoint). Alone it is the endpoint on every interface and k2_api_port; in a fleet it
    serves the router on the head's k2_local_ip and k2_vllm_port."""
    cluster = deployment.cluster
    return instance_serving(cluster, pool, cluster.tunables.vllm_port)


def _serve_gate(deployment: Deployment, pool: PoolPlan) -> HealthGate:
    """The API server's launch gate: the endpoint's /health, or in a fleet the instance's own
    on the private address (the router's key and TLS are the router's)."""
    t = deployment.cluster.tunables
    bind, port, endpoint_itself = _serving(deployment, pool)
    if endpoint_itself:
        return endpoint_gate(t, pool.master_address, port, HEALTH_PATH)
    return http_gate(bind, port, HEALTH_PATH, t.health_timeout_s)


def _serve_listener(deployment: Deployment, pool: PoolPlan, serve: Process) -> Listener:
    bind, port, endpoint_itself = _serving(deployment, pool)
    if endpoint_itself:
        return listener(serve, "k2_api_port", "the vLLM API server", port, bind=bind, public=True)
    return listener(
        serve,
        "k2_vllm_port",
        "the vLLM API server of an instance behind the router",
        port,
        bind=bind,
    )


def _tls(deployment: Deployment, pool: PoolPlan) -> tuple[str, ...]:
    """TLS on the API server (alone; in a fleet the router serves the endpoint's TLS):
    vLLM 0.33.0's --ssl-certfile / --ssl-keyfile (vllm/entrypoints/common/cli_args.py,
    handed to uvicorn by entrypoints/launchers/api_server/entry.py); on the API server only,
    the one process on the endpoint's host that has the launch phase's files."""
    if pool.instance:
        return ()
    return tls_args(deployment.cluster.tunables, "--ssl-certfile", "--ssl-keyfile")


def _api_key(
    deployment: Deployment, pool: PoolPlan, env: dict[str, str], values: tuple[LaunchValue, ...]
) -> tuple[dict[str, str], tuple[LaunchValue, ...]]:
    """The API server's `env` and host `values` with the endpoint's key: vLLM 0.33.0 reads it
    from VLLM_API_KEY when --api-key is not given (vllm/envs.py,
    entrypoints/serve/middleware/register.py), so it never enters the process's argv; the
    middleware guards /v1 only, and the launch gate's /health stays open. In a fleet the
    router holds the key and reaches the servers on the private network, as SGLang's."""
    key = api_key_value(deployment.cluster.tunables)
    if key is None or pool.instance:
        return env, values
    return {**env, "VLLM_API_KEY": key.ref}, (*values, key)


RAY_BINDS_ALL = (
    "Ray 2.60's GCS and raylet choose their own bind address: `ray start` has "
    "--node-ip-address (what the node announces, k2_local_ip) but no bind option "
    "(ray/scripts/scripts.py); its dashboard stays on localhost (--dashboard-host default)"
)


def _env(
    deployment: Deployment, pool: PoolPlan, host: HostSpec
) -> tuple[dict[str, str], tuple[LaunchValue, ...]]:
    """Environment of every vLLM-side process on `host` (Ray nodes included), and the host
    values it refers to."""
    t = deployment.cluster.tunables
    env = {
        "VLLM_HOST_IP": host.local_ip,
        "HF_HUB_OFFLINE": "1",
        # The API server waits this long for its engine cores, which load the weights first.
        "VLLM_ENGINE_READY_TIMEOUT_S": str(t.health_timeout_s),
    }
    ifname, values = socket_ifname(deployment.cluster, host)
    env.update(socket_env(ifname, nvshmem=_deepep(deployment, pool)))
    return env, values


def _deepep(deployment: Deployment, pool: PoolPlan) -> bool:
    """Whether the instance's experts travel through DeepEP (NVSHMEM) between nodes."""
    layout, t = deployment.cluster.layout, deployment.cluster.tunables
    return layout == "dp_ep" and len(pool.hosts) > 1 and t.vllm_all2all_backend.startswith("deepep")


def _hosts(deployment: Deployment, pool: PoolPlan) -> list[HostSpec]:
    return [deployment.cluster.host(name) for name in pool.hosts]


def _serve_args(deployment: Deployment, pool: PoolPlan, parallel: list[str]) -> list[str]:
    """`vllm serve MODEL_DIR`, the layout's `parallel` options, then what every layout shares."""
    t = deployment.cluster.tunables
    args = [
        "vllm",
        "serve",
        deployment.cluster.model_dir,
        "--served-model-name",
        t.served_model_name,
        *parallel,
        "--trust-remote-code",
    ]
    args += parser_args(
        deployment.model,
        "--tool-call-parser",
        "--reasoning-parser",
        tool_switch=("--enable-auto-tool-choice",),
    )
    bind, port, _ = _serving(deployment, pool)
    args += [
        "--host",
        bind,
        "--port",
        str(port),
        "--max-model-len",
        str(deployment.context_length),
        "--gpu-memory-utilization",
        f"{pool.mem_fraction:g}",
    ]
    args += _fit_args(deployment, pool)
    return args


def _fit_args(deployment: Deployment, pool: PoolPlan) -> list[str]:
    """Flags the plan's memory fit counts: decode context parallelism (each token's KV on one
    GPU of the TP group; vllm-project/recipes Kimi-K2-Thinking TP8+DCP8), an FP8 KV cache,
    text-only serving of a multimodal model (the vision tower is not loaded), or else the
    tower replicated on every TP rank (data-parallel encoder)."""
    args: list[str] = []
    if pool.parallel.dcp > 1:
        args += ["--decode-context-parallel-size", str(pool.parallel.dcp)]
    if deployment.kv_cache_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if deployment.language_model_only:
        args.append("--language-model-only")
    elif deployment.multimodal and pool.parallel.tp > 1:
        # The vision encoder data-parallel, as vLLM's Kimi-K2.5 recipe runs it: each TP rank
        # holds the whole tower (the fit counts it replicated) and encodes its share of the
        # batch (vllm/config/multimodal.py:385 mm_encoder_tp_mode; KimiK25ForConditional-
        # Generation.supports_encoder_tp_data, model_executor/models/kimi_k25.py:307, else
        # vllm/config/model.py:836 falls back to "weights").
        args += ["--mm-encoder-tp-mode", "data"]
    return args


def ray_gate(head: str, nodes: int, gpus: int, timeout_s: int) -> HealthGate:
    """A gate that passes once the Ray cluster at `head` has `nodes` live nodes, `gpus` GPUs."""
    # `timeout`: a connection attempt to a GCS that is not up yet can hang and ignore SIGTERM.
    return HealthGate(
        command=(
            "timeout",
            "-k",
            "5",
            str(RAY_CHECK_ATTEMPT_S),
            "python3",
            "-c",
            RAY_CHECK,
            head,
            str(nodes),
            str(gpus),
        ),
        timeout_s=timeout_s,
    )


def _tp_pp_args(pool: PoolPlan) -> list[str]:
    p = pool.parallel
    parallel = ["--tensor-parallel-size", str(p.tp)]
    if p.pp > 1:
        parallel += ["--pipeline-parallel-size", str(p.pp)]
    return parallel


def _render_one_node(deployment: Deployment, pool: PoolPlan) -> dict[str, HostRender]:
    """One host: `vllm serve` as the container's main command with vLLM's default executor,
    multiprocessing (vllm/config/parallel.py ParallelConfig.__post_init__ picks "mp" when
    the world fits the node and no Ray placement group exists), as the recipes run it."""
    (host,) = _hosts(deployment, pool)
    env, values = _api_key(deployment, pool, *_env(deployment, pool, host))
    serve = Process(
        name="vllm-serve",
        container=CONTAINER,
        image=deployment.image,
        argv=(*_serve_args(deployment, pool, _tp_pp_args(pool)), *_tls(deployment, pool)),
        env=env,
        resolve=values,
        stage=0,
        health=_serve_gate(deployment, pool),
        instance=pool.ref(),
    )
    return {
        host.name: HostRender(
            processes=(serve,), listeners=(_serve_listener(deployment, pool, serve),)
        )
    }


def _render_ray(deployment: Deployment, pool: PoolPlan) -> dict[str, HostRender]:
    t = deployment.cluster.tunables
    hosts = _hosts(deployment, pool)
    head = hosts[0]
    gpn = deployment.cluster.gpus_per_node
    ray_address = host_port(pool.master_address, t.ray_port)
    ray_options = ("--disable-usage-stats", "--block")

    out: dict[str, HostRender] = {}
    head_env, head_values = _env(deployment, pool, head)
    head_ray = Process(
        name="ray-head",
        container=CONTAINER,
        image=deployment.image,
        argv=(
            "ray",
            "start",
            "--head",
            "--port",
            str(t.ray_port),
            "--node-ip-address",
            head.local_ip,
            *ray_options,
        ),
        env=head_env,
        resolve=head_values,
        stage=0,
        health=ray_gate(ray_address, 1, gpn, t.health_timeout_s),
        instance=pool.ref(),
    )
    parallel = [*_tp_pp_args(pool), "--distributed-executor-backend", "ray"]
    serve_argv = _serve_args(deployment, pool, parallel)
    serve_env, serve_values = _api_key(deployment, pool, head_env, head_values)
    serve = Process(
        name="vllm-serve",
        container=CONTAINER,
        image=deployment.image,
        argv=(*serve_argv, *_tls(deployment, pool)),
        env=serve_env,
        resolve=serve_values,
        stage=2,
        exec_in=True,
        health=_serve_gate(deployment, pool),
        instance=pool.ref(),
    )
    out[head.name] = HostRender(
        processes=(head_ray, serve),
        listeners=(
            listener(
                head_ray,
                "k2_ray_port",
                "the Ray head",
                t.ray_port,
                bind=any_address(deployment.cluster),
                wildcard_why=RAY_BINDS_ALL,
            ),
            _serve_listener(deployment, pool, serve),
        ),
    )
    for host in hosts[1:]:
        env, values = _env(deployment, pool, host)
        worker = Process(
            name="ray-worker",
            container=CONTAINER,
            image=deployment.image,
            argv=(
                "ray",
                "start",
                "--address",
                ray_address,
                "--node-ip-address",
                host.local_ip,
                *ray_options,
            ),
            env=env,
            resolve=values,
            stage=1,
            health=ray_gate(ray_address, len(hosts), len(hosts) * gpn, t.health_timeout_s),
            instance=pool.ref(),
        )
        out[host.name] = HostRender(processes=(worker,))
    return out


def expert_args(deployment: Deployment, pool: PoolPlan) -> list[str]:
    """Expert parallelism: DeepEP between nodes, EPLB with the pool's spare expert slots."""
    t = deployment.cluster.tunables
    args = ["--enable-expert-parallel"]
    if len(pool.hosts) > 1:
        args += ["--all2all-backend", t.vllm_all2all_backend]
    spare = pool.parallel.redundant_experts
    if spare:
        # vLLM 0.33.0 spells the spare slots inside --eplb-config (vllm/config/parallel.py
        # EPLBConfig.num_redundant_experts) and refuses them without --enable-eplb.
        config = json.dumps({"num_redundant_experts": spare}, separators=(",", ":"))
        args += ["--enable-eplb", "--eplb-config", config]
    return args


def _render_dp_ep(deployment: Deployment, pool: PoolPlan) -> dict[str, HostRender]:
    t = deployment.cluster.tunables
    p = pool.parallel
    hosts = _hosts(deployment, pool)
    local = p.dp // len(hosts)
    shared = _serve_args(
        deployment,
        pool,
        [
            "--data-parallel-size",
            str(p.dp),
            "--data-parallel-size-local",
            str(local),
            "--data-parallel-address",
            hosts[0].local_ip,
            "--data-parallel-rpc-port",
            str(t.dp_rpc_port),
            *expert_args(deployment, pool),
            "--max-num-batched-tokens",
            str(t.vllm_max_num_batched_tokens),
            "--max-num-seqs",
            str(t.vllm_max_num_seqs),
        ],
    )
    out: dict[str, HostRender] = {}
    for rank, host in enumerate(hosts):
        head = rank == 0
        # The head holds DP ranks 0..local-1 without a start rank (internal load balancing);
        # a start rank there would switch vLLM to hybrid mode, which refuses headless ranks.
        argv = (
            [*shared, *_tls(deployment, pool)]
            if head
            else [*shared, "--data-parallel-start-rank", str(rank * local), "--headless"]
        )
        env, values = _env(deployment, pool, host)
        if head:
            env, values = _api_key(deployment, pool, env, values)
        process = Process(
            name="vllm-serve" if head else "vllm-headless",
            container=CONTAINER,
            image=deployment.image,
            argv=tuple(argv),
            env=env,
            resolve=values,
            stage=0,
            health=_serve_gate(deployment, pool) if head else None,
            instance=pool.ref(),
        )
        listeners = (
            (
                _serve_listener(deployment, pool, process),
                # The DP handshake binds --data-parallel-address (v1/engine/utils.py
                # get_engine_client_zmq_addr(host=data_parallel_address)).
                listener(
                    process,
                    "k2_dp_rpc_port",
                    "the DP RPC",
                    t.dp_rpc_port,
                    bind=hosts[0].local_ip,
                ),
            )
            if head
            else ()
        )
        out[host.name] = HostRender(processes=(process,), listeners=listeners)
    return out


# ---------------------------------------------------------------- what the plan asks

DISPLAY_NAME = "vLLM"
RELEASE = EngineRelease(
    engine="vllm", version="0.33.0", image="vllm/vllm-openai:v0.33.0", min_driver="580.65"
)
# The first release each model's vLLM recipe names (its min_vllm_version, or the release
# the recipe was written for).
SUPPORT: dict[str, EngineSupport] = {
    **dict.fromkeys(
        catalog.FP8_FAMILY,
        EngineSupport(min_version="0.12.0", source=f"{catalog.RECIPES}/Kimi-K2-Instruct.yaml"),
    ),
    "moonshotai/Kimi-K2-Thinking": EngineSupport(
        min_version="0.12.0", source=f"{catalog.RECIPES}/Kimi-K2-Thinking.yaml"
    ),
    **{
        model: EngineSupport(
            min_version=version,
            source=f"{catalog.RECIPES}/{model.removeprefix('moonshotai/')}.yaml min_vllm_version",
        )
        for model, version in (
            ("moonshotai/Kimi-K2.5", "0.19.1"),
            ("moonshotai/Kimi-K2.6", "0.25.0"),
            ("moonshotai/Kimi-K2.7-Code", "0.19.1"),
        )
    },
}
LAYOUTS: tuple[Layout, ...] = (Layout(name="tp"), Layout(name="tp_pp"), Layout(name="dp_ep"))
SINGLE_GPU = False
ROUTED_EXPERTS_ON_HOST = False
TEXT_ONLY = True  # --language-model-only
FP8_KV = True  # --kv-cache-dtype fp8
# Layouts that split attention with tensor parallelism (where DCP applies).
# Every layout renders fleets: replicas behind sglang-router (regular mode), each instance its
# own Ray cluster or DP group.
FLEET_LAYOUTS: tuple[str, ...] = layout_names(LAYOUTS)
DCP_LAYOUTS: tuple[str, ...] = ("tp", "tp_pp")
DCP_TUNABLE: str | None = "vllm_decode_context_parallel_size"
SPARE_EXPERT_TUNABLES: dict[PoolName, str] = {}
HEALTH_PATH = "/health"
# vllm 0.33.0's API server always mounts Prometheus' /metrics
# (entrypoints/serve/instrumentator/metrics.py); nothing to turn on.
METRICS_PATH: str | None = "/metrics"
METRICS_PORTS: tuple[str, ...] = ("k2_api_port", "k2_vllm_port", "k2_router_metrics_port")
# vllm 0.33.0's names, each found in its sources by tests/engine_parsers/test_metric_names.py.
METRICS: MetricNames | None = MetricNames(
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    running="vllm:num_requests_running",
    queued="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    ttft="vllm:time_to_first_token_seconds",
    inter_token="vllm:inter_token_latency_seconds",
    e2e="vllm:e2e_request_latency_seconds",
)
BENCH_CLIENT = BenchClient(
    "vllm",
    "vllm.benchmarks.serve",
    ("-m", "vllm.entrypoints.cli.main", "bench", "serve"),
    "openai",
    "result.json",
    "vllm==0.33.0 (scripts/install-engine-parsers vllm builds .venv-vllm)",
    # One JSON document with the percentiles it was asked for (p50/p90/p99) and `failed`.
    ResultFormat(json_lines=False, median="p50_{metric}_ms", e2e_metric="e2el", counts_failed=True),
    openai_bench_options(),
)
PUBLISHED_FIGURES: tuple[PublishedFigure, ...] = ()
# vLLM 0.33.0 keeps torch.compile's artifacts under VLLM_CACHE_ROOT (envs.py:714) and points
# DeepGEMM's JIT there too unless DG_JIT_CACHE_DIR is set (utils/deep_gemm.py:281); Triton,
# Inductor's own cache, FlashInfer's JIT workspace and the CUDA JIT cache go with it.
CONTAINER_NEEDS = ContainerNeeds(
    compile_caches=(
        ("VLLM_CACHE_ROOT", ""),
        ("DG_JIT_CACHE_DIR", "deep_gemm"),
        ("TRITON_CACHE_DIR", "triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("FLASHINFER_WORKSPACE_BASE", ""),
        ("CUDA_CACHE_PATH", "nv"),
    )
)
# Tunables only vLLM reads (every layout), each with the layouts that read it.
OWN_TUNABLES: dict[str, tuple[str, ...]] = own_tunables("k2_vllm_", layout_names(LAYOUTS))
NO_IPV6: str | None = None
NO_API_KEY: str | None = None
NO_TLS: str | None = None
DIST_PORT_SPAN = 0
BATCH_TUNABLES: tuple[BatchTunable, ...] = ()
kv_dtype = kv_cache_dtype
kv_dtype_problems = fp8_kv_problems
served_name = inventory_served_name
plan_warnings = no_warnings


def dcp_size(cluster: Cluster, spec: ModelSpec, parallel: Parallel) -> int:
    """Decode context parallelism: k2_vllm_decode_context_parallel_size, else the GPUs
    of a node where the model's recipes show it pays (vllm-project/recipes: Kimi-K2-Thinking
    TP8+DCP8 on 8xH200, +43% output throughput; Kimi-K2 TP8+PP2 with -dcp 8)."""
    if cluster.layout not in DCP_LAYOUTS:
        return 1
    chosen = cluster.tunables.vllm_decode_context_parallel_size
    if chosen is not None:
        return chosen
    if not spec.decode_context_parallel:
        return 1
    size = cluster.gpus_per_node
    return size if parallel.tp % size == 0 else 1


def pool_shape(cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
    """tp: TP over all GPUs; tp_pp: TP in a node, one pipeline stage per node; dp_ep: DP
    attention and EP over all GPUs with a spare expert slot per GPU unless the inventory
    says otherwise. DCP where it applies."""
    gpn = cluster.gpus_per_node
    if cluster.layout == "tp_pp":
        parallel = Parallel(tp=gpn, pp=nodes)
    elif cluster.layout == "dp_ep":
        parallel = Parallel(tp=1, dp=nodes * gpn, ep=nodes * gpn)
    else:
        parallel = Parallel(tp=nodes * gpn)
    dcp = dcp_size(cluster, spec, parallel)
    if dcp != 1:
        parallel = parallel.model_copy(update={"dcp": dcp})
    if cluster.layout == "dp_ep":
        spare = cluster.tunables.vllm_redundant_experts
        default = nodes * gpn if eplb_experts(spec) else 0
        parallel = parallel.model_copy(
            update={"redundant_experts": default if spare is None else spare}
        )
    return parallel


def weight_slices(cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
    """tp and tp_pp: every MLP weight over the TP group (FusedMoE without expert parallelism
    cuts each expert's intermediate by TP); dp_ep: TP 1, whole experts per EP rank."""
    expert = 1 if parallel.ep > 1 else parallel.tp
    return WeightSlices(expert=expert, shared=parallel.tp, dense=parallel.tp)


def eplb_experts(spec: ModelSpec) -> bool:
    """Whether vLLM 0.33.0's MoE method for the model's experts supports EPLB (spare expert
    slots): FP8 does (model_executor/layers/quantization/fp8.py:802 `supports_eplb`), the
    compressed-tensors INT4 method only on its Triton backend
    (compressed_tensors_moe_wna16.py:562), which the backend oracle ranks after Marlin
    (fused_moe/oracle/int_wna16.py:126 `_get_priority_backends`); with EPLB on, the layer
    raises "EPLB is not supported" (fused_moe/routed_experts.py:197)."""
    return spec.quantization.routed_experts.scheme in ("fp8_block", "bf16")


def kernel_path_problems(cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
    """dp_ep with spare expert slots renders --enable-eplb, which the INT4 experts' Marlin
    method refuses (see eplb_experts); without spare slots (their default for INT4) the
    DeepEP all-to-all feeds Marlin (batched Marlin for low latency)."""
    spare = cluster.tunables.vllm_redundant_experts
    if cluster.layout == "dp_ep" and spare and not eplb_experts(spec):
        experts = spec.quantization.routed_experts.label
        return [
            f"k2_vllm_redundant_experts={spare}: spare expert slots need EPLB, which vLLM "
            f"0.33.0 does not support for {spec.id}'s {experts} experts (its Marlin MoE "
            "method raises 'EPLB is not supported'), so k2_vllm_redundant_experts must be 0 "
            "or unset"
        ]
    return []


# ---------------------------------------------------------------- memory accounting

# vLLM 0.33.0 (vllm/v1/worker/gpu_worker.py determine_available_memory): KV = utilization x
# total - weights - profiled peak activations - non-torch memory - CUDA graph memory (counted
# since 0.21); blocks = KV // page; tokens = blocks x block size (x DCP size).

# vLLM caps the utilization it is given at the value its recipes recommend to maximize the
# KV cache ("Set --gpu-memory-utilization=0.95", vllm-project/recipes Kimi-K2-Instruct).
MAX_UTILIZATION = 0.95
# FlashMLA pages (vLLM's default MLA backend on Hopper and Blackwell).
MLA_BLOCK_SIZE = 64
KV_PAGE_TOKENS = MLA_BLOCK_SIZE
# vLLM samples at most max_num_seqs rows: FP32 logits, their sorted copy and int64 indices
# (the top-k/top-p path of v1/sample/ops/topk_topp_sampler.py) are four FP32-sized copies.
SAMPLER_COPIES = 4


@dataclass(frozen=True)
class VllmRelease:
    """The parts of vLLM's memory accounting that changed between releases."""

    version: str
    default_utilization: float
    counts_cuda_graphs: bool


PINNED = VllmRelease(version="0.33.0", default_utilization=0.92, counts_cuda_graphs=True)


def batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.33.0 picks for `vllm serve` on this GPU
    (engine/arg_utils.py get_batch_defaults)."""
    total = gpu.usable_gib
    if total >= 160:
        return 16384, 1024
    if total >= 70 and gpu.key != "a100":
        return 8192, 1024
    return 2048, 256


def capture_sizes(max_size: int) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 up to 256 and every 16 above."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, min(256, max_size) + 1, 8))
    sizes += list(range(272, max_size + 1, 16))
    return sizes


def reserve(f: PoolFit, release: VllmRelease = PINNED) -> MemoryReserve:
    """What vLLM's profile counts besides weights, per GPU."""
    t = f.tunables
    p = f.parallel
    if f.layout == "dp_ep":
        batched, seqs = t.vllm_max_num_batched_tokens, t.vllm_max_num_seqs
    else:
        batched, seqs = batch_defaults(f.gpu)
    forward = activations_gib(batched, f.spec, p)
    sampler = SAMPLER_COPIES * seqs * f.spec.vocab_size * 4 / GIB
    graphs = 0.0
    if release.counts_cuda_graphs:
        sizes = capture_sizes(min(seqs * 2, 512))
        # FULL decode graphs and PIECEWISE graphs: one set each (FULL_AND_PIECEWISE).
        graphs = graph_gib(sizes[-1], 2 * len(sizes), f.spec, p)
    group = p.tp if f.layout != "dp_ep" else p.ep
    return MemoryReserve(
        activations=round(max(forward, sampler), 2),
        cuda_graphs=round(graphs, 2),
        comm_buffers=round(collective_buffers_gib(group, f.gpus_per_node), 2),
        runtime=RUNTIME_GIB,
        encoder=encoder_gib(f),
        margin=t.reserve_gib,
    )


def kv_budget(f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
    """The largest utilization that leaves the margin outside, capped at the recipes' value;
    the KV cache is what the utilization leaves after weights and the profiled reserve."""
    usable = f.gpu.usable_gib
    fraction = min(MAX_UTILIZATION, floor2(1 - reserve.margin / usable))
    budget = fraction * usable
    return KvBudget(fraction, budget, budget - weights_gib - (reserve.total - reserve.margin))


def kv_tokens(f: PoolFit, release: VllmRelease, utilization: float) -> int:
    """vLLM's "GPU KV cache size" for a release and utilization (x DCP, as vLLM logs it):
    the calibration entry point, following gpu_worker.determine_available_memory."""
    weights_b, _ = weights_per_gpu(f, ROUTED_EXPERTS_ON_HOST)
    counted = reserve(f, release)
    kv = utilization * f.gpu.usable_gib - weights_b / GIB - (counted.total - counted.margin)
    blocks = int(max(kv, 0.0) * GIB // (kv_bytes_per_token(f) * MLA_BLOCK_SIZE))
    return blocks * MLA_BLOCK_SIZE * f.parallel.dcp


# ---------------------------------------------------------------- calibration


@dataclass(frozen=True)
class CalibrationPoint:
    """A figure vLLM published, and the settings it was measured at."""

    name: str
    source: str
    settings: str
    published: int
    unit: str
    fit: PoolFit
    release: VllmRelease
    utilization: float

    def predicted(self) -> int:
        """What the fit predicts at the same settings."""
        return kv_tokens(self.fit, self.release, self.utilization)


def _k2_thinking_tp8(dcp: int) -> PoolFit:
    return PoolFit(
        engine="vllm",
        layout="tp",
        pool="nodes",
        nodes=1,
        gpus=8,
        gpus_per_node=8,
        parallel=Parallel(tp=8, dcp=dcp),
        spec=catalog.model("moonshotai/Kimi-K2-Thinking"),
        gpu=catalog.gpu("h200"),
        context_length=262144,
        kv_dtype="bf16",
        vision_loaded=False,
        tunables=Tunables(),
    )


# The vLLM nightly of 2025-11-06 (0.11.1rc) that the Kimi-K2-Thinking recipe was measured on:
# --gpu-memory-utilization defaulted to 0.90, and CUDA graph memory was not yet deducted
# from the KV budget (vLLM logs it as "default since v0.21.0").
RELEASE_2025_11 = VllmRelease(
    version="0.11.1rc", default_utilization=0.90, counts_cuda_graphs=False
)
_RECIPE = (
    "vllm-project/recipes moonshotai/Kimi-K2-Think.md (PR #115 startup logs: "
    '"Available KV cache memory: 46.80 GiB")'
)
CALIBRATION: tuple[CalibrationPoint, ...] = (
    CalibrationPoint(
        name="vllm-k2-thinking-tp8",
        source=_RECIPE,
        settings="Kimi-K2-Thinking, 8xH200, TP8, BF16 KV, default max-model-len (262144), "
        "utilization 0.90, max-num-seqs 1024, max-num-batched-tokens 8192",
        published=715072,
        unit='tokens ("GPU KV cache size")',
        fit=_k2_thinking_tp8(1),
        release=RELEASE_2025_11,
        utilization=0.90,
    ),
    CalibrationPoint(
        name="vllm-k2-thinking-tp8-dcp8",
        source=_RECIPE,
        settings="as above with --decode-context-parallel-size 8",
        published=5721088,
        unit='tokens ("GPU KV cache size", x DCP)',
        fit=_k2_thinking_tp8(8),
        release=RELEASE_2025_11,
        utilization=0.90,
    ),
)
