"""SGLang: tensor parallel across nodes, or prefill/decode disaggregation behind sglang-router.

Layout `tp`: every host of [nodes] runs one rank of a single `--tp-size N*8` server; rank 0
serves HTTP. Layout `pd`: [prefill] and [decode] each form one DP-attention + DeepEP instance
(tp = attention dp = ep = the pool's GPUs), and sglang-router joins them. In a fleet
(k2_instances, k2_prefill_instances, k2_decode_instances) each pool holds several such
instances, each with its own rendezvous, and one sglang-router fronts them all.

PD follows the production config for this very layout (sgl-project/ome
config/runtimes/srt/kimi-k2-pd-rt.yaml, the 128-GPU deployment of the LMSYS write-up): EPLB on
both pools, each with one spare expert slot per GPU. Spare slots without `--enable-eplb` hold
fixed copies of experts 0..N-1 and are never rebalanced (sglang/srt/eplb/expert_location.py
`init_trivial`): memory for nothing. `--chunked-prefill-size` is per instance: with attention
DP, SGLang divides it by the attention-DP size (sglang/srt/arg_groups/parallel_hook.py). The
plan's chunk is per rank (`k2_prefill_chunk_per_rank`, 16384) and the render multiplies it by
the pool's DP: 524288 at DP 32, the production value.

Flag spellings follow the pinned release's own parser (sglang 0.5.23), not the seed recipes:
`--moe-a2a-backend deepep` (was `--enable-deepep-moe`), `--attn-dp-size N` (was `--dp-size N
--enable-dp-attention`, deprecated), `--cuda-graph-max-bs-decode` (bare `--cuda-graph-bs` is
now ambiguous and rejected), `--dist-init-addr` (was `--nccl-init-addr`).
"""

from __future__ import annotations

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.endpoint_guard import API_KEY, API_KEY_YAML, guard_path
from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    HealthGate,
    HostSpec,
    LaunchValue,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    PoolPlan,
    Process,
    RouterRegistrar,
    Tunables,
    WorkerRegistration,
    registered_at_launch,
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
    RankLoadNames,
    ResultFormat,
    WeightSlices,
    listener,
)
from k2provision.engines.common import (
    TCP_STORE_BINDS_ALL,
    any_address,
    api_key_value,
    endpoint_gate,
    endpoint_url,
    fp8_kv_problems,
    host_port,
    http_gate,
    http_url,
    inventory_served_name,
    kv_cache_dtype,
    parser_args,
    socket_env,
    socket_ifname,
    tls_args,
)
from k2provision.engines.memory import (
    DEEPEP_NORMAL_GIB,
    RUNTIME_GIB,
    KvBudget,
    PoolFit,
    activations_gib,
    collective_buffers_gib,
    deepep_low_latency_gib,
    encoder_gib,
    floor2,
    graph_gib,
)

CONTAINER = "k2-sglang"
ROUTER_CONTAINER = "k2-router"
LAUNCH_SERVER = ("python3", "-m", "sglang.launch_server")
LAUNCH_ROUTER = catalog.ROUTER.launcher

# A forward batch that takes longer than this kills the server instead of hanging it. The
# default (300 s) is tight for 128k-token prefill chunks with DeepEP on a cold start; the
# seed's 1e6 s switches the watchdog off. Thirty minutes still ends a stuck rank.
WATCHDOG_TIMEOUT_S = 1800
# Decode iterations between log/metrics lines, per DP rank. The seed's 1 floods the logs of
# a 96-rank pool; 100 keeps roughly one line per rank every few seconds at full load.
DECODE_LOG_INTERVAL = 100
# PD failure detection: the release defaults. The seed's 1e7 s interval turns it off.
PD_HEARTBEAT_INTERVAL_S = 5
PD_HEARTBEAT_MAX_FAILURE = 2
# A decode server keeps what it learnt of each prefill instance it has talked to, by the
# prefill's bootstrap address: its parallel layout and its ranks' KV endpoints
# (srt/disaggregation/common/conn.py prefill_info_table and connection_pool, :464-467). It
# drops them only when its heartbeat (a GET of the bootstrap server's /health every
# SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL seconds, timeout 2 s to connect + 3 s to answer)
# has failed SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE times in a row
# (_start_heartbeat_checker_thread :1998-2043, _handle_node_failure :2060-2077); the next
# request then asks the bootstrap server afresh. A prefill instance replaced behind the same
# URL and bootstrap port whose successor answers before that keeps its decode peers on the
# old instance's endpoints: requests stall until the decode restarts (the upstream reports,
# sgl-project/sglang#16903, #33789). So a replaced prefill instance stays down long enough
# for every heartbeat to miss it that many times, however each check ends.
PD_HEARTBEAT_TIMEOUT_S = 2 + 3
PREFILL_PEERS_FORGET_S = (
    PD_HEARTBEAT_MAX_FAILURE * (PD_HEARTBEAT_INTERVAL_S + PD_HEARTBEAT_TIMEOUT_S)
    + PD_HEARTBEAT_INTERVAL_S
)

# What a server's checks ask (the launch gate, the look, a fleet router's health checks):
# liveness, never a generation. In sglang 0.5.23 /health and /health_generate are one handler
# (srt/entrypoints/http_server.py:721-722 health_generate) that queues a one-token generation
# and waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s, :218) for the scheduler to answer;
# SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (srt/environ.py:344, default true) is what skips
# it on /health (:745-748). A prefill instance busy with a long chunked prefill answers no
# such probe within the router's 5 s, and the router would take a working instance out.
# /ready (:714, tokenizer_manager.is_ready) queues nothing: 503 while starting, until the
# warm-up generation has passed (:2502, and for PD :2526-2528, where a failed warm-up leaves it
# UnHealthy), and from the moment the server starts shutting down; 200 otherwise. It needs no
# API key (srt/utils/auth.py: /health*, /ready* and /metrics* are always open). A hung
# scheduler is ended by --watchdog-timeout, which takes the HTTP server down with it.
SERVER_HEALTH_PATH = "/ready"
# Every SGLang server also runs with generation off on /health, so a probe of /health (the
# single-instance router's own default health checks, an operator's load balancer) is
# liveness too; /health_generate still runs a generation when one is wanted.
HEALTH_GENERATION_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
# Router readiness: /health is only liveness in sglang-router; /readiness turns 200 once the
# router sees healthy prefill and decode workers.
ROUTER_HEALTH_PATH = "/readiness"
ROUTER_LIVENESS_PATH = "/health"
# What sglang-router 0.3.2 answers without its --api-key: its public routes (sgl-model-gateway
# server.rs `public_routes`; the binary holds the same paths), seen answering without the key
# by tests/engine_parsers/test_router_routes.py. /health_generate sends a generation to a
# worker. Everything else (/generate, /v1/*completions, /workers, /get_loads, /flush_cache,
# ...) answers 401 without the key.
ROUTER_OPEN_ROUTES = (
    "/liveness",
    "/readiness",
    "/health",
    "/health_generate",
    "/engine_metrics",
    "/v1/models",
    "/get_model_info",
    "/get_server_info",
)
# A fleet's router: sglang-router 0.3.2's flags (sglang_router/router_args.py; the line of
# each flag's RouterArgs default is given), set only where the router fronts several
# instances so that a single instance's render stays as it was.
# Long generations: the default request timeout (:63, 1800 s) ends a 128k-token answer
# decoded at 20 tokens/s per request (6400 s); two hours leaves room for it.
ROUTER_REQUEST_TIMEOUT_S = 7200

# Health checks (:84-88): every 10 s (default 60) on each worker's liveness route (its engine's
# launch gate path: SGLang's /ready, which queues no generation; vLLM's /health), a worker
# taken out after 3 failed checks (a dead instance serves errors for about 30 s at most) and
# put back after 2 good ones.


def fleet_health_args(worker_health_path: str) -> tuple[str, ...]:
    """The fleet router's health-check flags, asking each worker `worker_health_path`."""
    return (
        "--health-check-interval-secs",
        "10",
        "--health-failure-threshold",
        "3",
        "--health-success-threshold",
        "2",
        "--health-check-timeout-secs",
        "5",
        "--health-check-endpoint",
        worker_health_path,
    )


FLEET_ROUTER_ARGS: tuple[str, ...] = (
    # Circuit breaker (:91-94): 5 failed requests within 60 s open a worker's circuit (no
    # requests for 30 s), 2 good ones in half-open close it: faster than the 10 / 120 s
    # defaults, since the other instances take the load meanwhile.
    "--cb-failure-threshold",
    "5",
    "--cb-success-threshold",
    "2",
    "--cb-timeout-duration-secs",
    "30",
    "--cb-window-duration-secs",
    "60",
    # Retries (:77, default 5): a request the first worker failed goes to up to two others.
    "--retry-max-retries",
    "3",
    "--request-timeout-secs",
    str(ROUTER_REQUEST_TIMEOUT_S),
)
# PD fleet routing: one policy per pool, chosen from how many instances the pool has.
# No --dp-aware (:42, default off), though both pools run DP attention: the router splits
# a worker into `dp_size` ranks read from its /server_info (the binary's
# core/steps/worker/local/create_worker.rs asks for `dp_size` and nothing else), and
# sglang 0.5.23 reports the attention-DP width as `attn_dp_size` while `dp_size` counts
# replicas (srt/arg_groups/parallel_hook.py handle_deprecated_dp_attention: "dp_size
# counts replicas again"), so it is 1 with --attn-dp-size. The router would route every
# request of an instance to DP rank 0 (srt/managers/data_parallel_controller.py
# maybe_external_dp_rank_routing honours the routed rank); without it each server's own
# DP controller spreads requests over its attention-DP ranks.
# Several instances: power_of_two, the less loaded of two instances picked at random. What
# it compares is the router's own count of requests in flight on each worker, not the
# servers' load: the router's load monitor ("Started LoadMonitor for PowerOfTwo policies"
# in the binary) asks each worker for `/get_load`, which sglang 0.5.23 does not serve (it
# has `/v1/loads`, srt/entrypoints/v1_loads.py:96; the router gets 404 and logs "No loads
# fetched from workers"), so the policy falls back to `worker.load()`, the in-flight counter
# the router raises on the prefill and the decode worker of a request while it holds it
# (sgl-model-gateway routers/http/pd_router.rs, WorkerLoadGuard::new_multi). Every request
# goes through the one router, so the count is each instance's share of the live requests,
# blind to their lengths.
# Not cache_aware on prefill: the PD servers run --disable-radix-cache, so there is no
# prefix cache for its prefix tree to follow (the single-instance router's argument).
# One instance: round_robin, nothing to choose; sglang-router 0.3.2 refuses power_of_two
# for a pool of one ("Power-of-two policy for prefill requires at least 2 prefill
# workers", the same for decode: config/validation.rs, checked when the router starts).
MANY_INSTANCES_POLICY = "power_of_two"
ONE_INSTANCE_POLICY = "round_robin"


def pd_policies(prefill_instances: int, decode_instances: int) -> tuple[str, ...]:
    """The PD router's policies: --policy (:28) is prefill's when --prefill-policy is not
    given (naming both per-pool policies draws a warning that --policy is ignored, :943),
    --decode-policy (:30) decode's; each from its pool's instance count."""

    def policy(instances: int) -> str:
        return MANY_INSTANCES_POLICY if instances > 1 else ONE_INSTANCE_POLICY

    return (
        "--policy",
        policy(prefill_instances),
        "--decode-policy",
        policy(decode_instances),
    )


# Prometheus metrics: sglang 0.5.23 serves /metrics on each HTTP server once --enable-metrics
# is given (srt/arg_groups/fields/observability.py enable_metrics, default off); the router
# (sglang-router 0.3.2) serves its own on --prometheus-port (router_args.py, default 29000).
SERVER_METRICS_ARGS = ("--enable-metrics",)


def server_env(
    deployment: Deployment, host: HostSpec, *, deepep: bool = False
) -> tuple[dict[str, str], tuple[LaunchValue, ...]]:
    """Environment of an SGLang server on `host`, and the host values it refers to."""
    env = {"PYTHONUNBUFFERED": "1", **HEALTH_GENERATION_ENV}
    ifname, values = socket_ifname(deployment.cluster, host)
    env.update(socket_env(ifname, nvshmem=deepep))
    return env, values


# MLA attention backends that keep an FP8 KV cache FP8 (sglang 0.5.23). The defaults for MLA
# do not: fa3 on Hopper and flashinfer on Blackwell (arg_groups/model_override_base.py
# get_default_attn_backend) read a layer's whole cache as the query's BF16 every decode step
# (layers/attention/flashattention_backend.py:2350 and flashinfer_mla_backend.py:822,
# `get_key_buffer(layer.layer_id).to(q.dtype)`; fa3 leaves the query BF16 for MLA's 576-wide
# heads, :1428 `layer.head_dim <= 256`): a BF16 copy of the layer's cache that the fit does not
# count, and a conversion per layer per step. FlashMLA quantizes the query to FP8 instead
# and reads the cache as stored (layers/attention/flashmla_backend.py:97 is_fp8_kvcache,
# :457-480), at a page size of 64 (arg_groups/overrides.py:1148); on Blackwell TRT-LLM MLA
# does the same (layers/attention/trtllm_mla_backend.py:1245 forward_decode quantizes the
# query, :1327 reads the cache as stored). Prefill (extend) with a cached
# prefix still reads the prefix through flashinfer_mla_backend.py:761, once per chunk.
FP8_KV_BACKEND = "flashmla"
FP8_KV_BACKEND_BY_GPU = {"b200": "trtllm_mla"}


def fp8_kv_backend(gpu: str) -> str:
    """The MLA attention backend rendered with an FP8 KV cache on `gpu`."""
    return FP8_KV_BACKEND_BY_GPU.get(gpu, FP8_KV_BACKEND)


def model_args(deployment: Deployment) -> tuple[str, ...]:
    """The model, its name and its parsers: what every SGLang server of Kimi-K2 takes."""
    t = deployment.cluster.tunables
    # The plan's memory fit counts an FP8 KV cache at 1 byte per value (MLA on Hopper and
    # Blackwell: fp8_e4m3), with an attention backend that reads it as FP8 (fp8_kv_backend).
    kv = (
        (
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--attention-backend",
            fp8_kv_backend(deployment.cluster.gpu),
        )
        if deployment.kv_cache_dtype == "fp8"
        else ()
    )
    return (
        "--model-path",
        deployment.cluster.model_dir,
        "--served-model-name",
        t.served_model_name,
        "--trust-remote-code",
        *parser_args(deployment.model, "--tool-call-parser", "--reasoning-parser"),
        "--context-length",
        str(deployment.context_length),
        *kv,
    )


def _dist_args(pool: PoolPlan, master: HostSpec, rank: int, t: Tunables) -> tuple[str, ...]:
    """Multi-node rendezvous: the pool's rank 0 hosts torch.distributed's store."""
    return (
        "--dist-init-addr",
        host_port(master.local_ip, t.dist_port),
        "--nnodes",
        str(len(pool.hosts)),
        "--node-rank",
        str(rank),
    )


# ---------------------------------------------------------------- layout tp


def server_key(t: Tunables) -> tuple[str, ...]:
    """The endpoint's API key for a server that is the endpoint itself: sglang 0.5.23 takes
    the key only as --api-key (srt/arg_groups/fields/serving.py), but reads any option from
    `--config FILE.yaml` (srt/server_args.py, srt/utils/server_args_config_parser.py), so the
    key comes from the launch phase's YAML file and stays out of the process's argv. /ready
    needs no key (srt/utils/auth.py), so the launch gate still reads it."""
    if not t.api_key_file:
        return ()
    return ("--config", guard_path(t.config_dir, API_KEY_YAML))


def _server_tls(t: Tunables) -> tuple[str, ...]:
    """TLS on a server that is the endpoint itself: sglang 0.5.23's --ssl-certfile /
    --ssl-keyfile (srt/arg_groups/fields/serving.py, handed to uvicorn by
    srt/entrypoints/http_server.py; srt/arg_groups/serving_hook.py handle_ssl_validation
    refuses a missing file). Its own warm-up request then goes to https (ServerArgs.url) and,
    without --ssl-ca-certs, skips checking the certificate (serving_hook.py ssl_verify_of),
    which names the endpoint's address, not the loopback the warm-up may use: no CA is
    passed. /ready answers over the same TLS."""
    return tls_args(t, "--ssl-certfile", "--ssl-keyfile")


def _render_tp(deployment: Deployment) -> dict[str, HostRender]:
    out: dict[str, HostRender] = {}
    for instance in deployment.pool("nodes").members():
        out.update(_render_tp_instance(deployment, instance))
    if deployment.cluster.fleet:
        add_router(out, deployment)
    return out


def _render_tp_instance(deployment: Deployment, pool: PoolPlan) -> dict[str, HostRender]:
    """One TP instance. Alone it is the endpoint (rank 0 serves every interface, with the
    endpoint's key and TLS); in a fleet the router is, and each instance's rank 0 serves on
    its k2_local_ip as PD's servers do."""
    cluster = deployment.cluster
    t = cluster.tunables
    master = cluster.host(pool.master)
    fleet = bool(pool.instance)
    out: dict[str, HostRender] = {}
    for rank, name in enumerate(pool.hosts):
        bind = cluster.host(name).local_ip if fleet else any_address(cluster)
        argv = (
            *LAUNCH_SERVER,
            *model_args(deployment),
            "--tp-size",
            str(pool.parallel.tp),
            *_dist_args(pool, master, rank, t),
            "--host",
            bind,
            "--port",
            str(t.sglang_port),
            "--mem-fraction-static",
            str(pool.mem_fraction),
            *SERVER_METRICS_ARGS,
            # The guard's files are on the endpoint's host only (guard.yml), and only rank 0
            # serves HTTP.
            *((*server_key(t), *_server_tls(t)) if rank == 0 and not fleet else ()),
        )
        # Only rank 0 runs the HTTP server; the other ranks have nothing to poll.
        health = None
        if rank == 0:
            health = (
                http_gate(master.local_ip, t.sglang_port, SERVER_HEALTH_PATH, t.health_timeout_s)
                if fleet
                else endpoint_gate(t, pool.master_address, t.sglang_port, SERVER_HEALTH_PATH)
            )
        env, values = server_env(deployment, cluster.host(name))
        process = Process(
            name="sglang",
            container=CONTAINER,
            image=deployment.image,
            argv=argv,
            env=env,
            resolve=values,
            stage=0,
            health=health,
            instance=pool.ref(),
        )
        # Rank 0 serves HTTP (the endpoint, or an instance behind the router) and hosts the
        # rendezvous; the other ranks bind nothing of theirs.
        listeners = (
            (
                listener(
                    process,
                    "k2_sglang_port",
                    "the SGLang server",
                    t.sglang_port,
                    bind=bind,
                    public=not fleet,
                ),
                listener(
                    process,
                    "k2_dist_port",
                    "the rendezvous",
                    t.dist_port,
                    bind=any_address(cluster),
                    wildcard_why=TCP_STORE_BINDS_ALL,
                ),
            )
            if rank == 0
            else ()
        )
        out[name] = HostRender(processes=(process,), listeners=listeners)
    return out


# ---------------------------------------------------------------- layout pd


def _pd_env(
    deployment: Deployment, pool: PoolPlan, host: HostSpec
) -> tuple[dict[str, str], tuple[LaunchValue, ...]]:
    t = deployment.cluster.tunables
    env, values = server_env(deployment, host, deepep=True)
    if t.pd_transfer_backend == "mooncake":
        # Mooncake's transfer engine logs its throughput (a Mooncake variable; NIXL has none).
        env["MC_TE_METRIC"] = "true"
    env.update(
        {
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(t.pd_timeout_s),
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(t.pd_timeout_s),
            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": str(PD_HEARTBEAT_INTERVAL_S),
            "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": str(PD_HEARTBEAT_MAX_FAILURE),
        }
    )
    if pool.name == "decode":
        # DeepEP low-latency buffers are sized for this many tokens per rank: at least the
        # largest decode batch a rank runs, i.e. the cuda-graph batch size.
        env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] = str(t.cuda_graph_max_bs_decode)
    return env, values


def _pd_pool_args(deployment: Deployment, pool: PoolPlan) -> tuple[str, ...]:
    """The flags that differ between the prefill and the decode instance."""
    t = deployment.cluster.tunables
    p = pool.parallel
    if pool.name == "prefill":
        return (
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(t.bootstrap_port),
            "--deepep-mode",
            "normal",
            # Per instance: SGLang divides it by the attention-DP size, so the plan's per-rank
            # chunk is multiplied back (16384 x DP 32 = 524288, the production value).
            "--chunked-prefill-size",
            str(t.prefill_chunk_per_rank * pool.parallel.dp),
            "--max-running-requests",
            str(t.max_running_requests_prefill),
            # Prefill batches are large: each token goes to any replica of its expert
            # (ome's prefill pool); decode keeps EPLB's default, the static replica table.
            "--ep-dispatch-algorithm",
            "dynamic",
        )
    return (
        "--disaggregation-mode",
        "decode",
        "--deepep-mode",
        "low_latency",
        "--cuda-graph-max-bs-decode",
        str(t.cuda_graph_max_bs_decode),
        # Every DP rank can hold a full cuda-graph batch (96 x 480 = 46080 in the seed).
        "--max-running-requests",
        str(p.dp * t.cuda_graph_max_bs_decode),
    )


def _pd_server(deployment: Deployment, pool: PoolPlan, host: HostSpec, rank: int) -> Process:
    cluster = deployment.cluster
    t = cluster.tunables
    p = pool.parallel
    master = cluster.host(pool.master)
    # EPLB on both pools; spare slots only with it (they are useless without rebalancing).
    eplb: tuple[str, ...] = ("--enable-eplb", "--eplb-algorithm", "deepseek")
    if p.redundant_experts:
        eplb += ("--ep-num-redundant-experts", str(p.redundant_experts))
    # KV transfer NICs are per host; lab hosts have no RDMA devices at all. Both backends
    # read --disaggregation-ib-device in sglang 0.5.23: Mooncake's transfer engine, and NIXL's
    # UCX backend (SGLANG_DISAGGREGATION_NIXL_BACKEND, default UCX, srt/environ.py:766), which
    # maps it per GPU to its UCX device_list, appending port 1 to each HCA name
    # (srt/disaggregation/nixl/conn.py:564-595, _resolve_ucx_device_list :186; names with a
    # port suffix are refused there, and k2_ib_devices admits none). UCX_NET_DEVICES is not
    # rendered: set, it overrides that mapping (:565-569).
    ib = (
        ("--disaggregation-ib-device", ",".join(host.ib_devices))
        if host.ib_devices and not cluster.lab
        else ()
    )
    argv = (
        *LAUNCH_SERVER,
        *model_args(deployment),
        *_pd_pool_args(deployment, pool),
        "--disaggregation-transfer-backend",
        t.pd_transfer_backend,
        *ib,
        "--tp-size",
        str(p.tp),
        "--attn-dp-size",
        str(p.dp),
        "--ep-size",
        str(p.ep),
        *_dist_args(pool, master, rank, t),
        "--moe-a2a-backend",
        "deepep",
        *eplb,
        "--moe-dense-tp-size",
        "1",
        "--enable-dp-lm-head",
        "--disable-shared-experts-fusion",
        "--enable-two-batch-overlap",
        "--disable-radix-cache",
        "--mem-fraction-static",
        str(pool.mem_fraction),
        # The bootstrap server and KV transfer advertise this address to the other pool.
        "--host",
        host.local_ip,
        "--port",
        str(t.sglang_port),
        "--watchdog-timeout",
        str(WATCHDOG_TIMEOUT_S),
        "--decode-log-interval",
        str(DECODE_LOG_INTERVAL),
        *SERVER_METRICS_ARGS,
    )
    health = (
        http_gate(host.local_ip, t.sglang_port, SERVER_HEALTH_PATH, t.health_timeout_s)
        if rank == 0
        else None
    )
    env, values = _pd_env(deployment, pool, host)
    return Process(
        name=f"sglang-{pool.name}",
        container=CONTAINER,
        image=deployment.image,
        argv=argv,
        env=env,
        resolve=values,
        stage=0,
        health=health,
        instance=pool.ref(),
    )


def _pd_listeners(
    process: Process, cluster: Cluster, pool: PoolPlan, rank: int, local_ip: str
) -> list[Listener]:
    """What a PD server binds: on rank 0 its HTTP server, the prefill pool's KV bootstrap (on
    --host, the host's k2_local_ip) and
    the rendezvous with the ports DP attention takes after it (sglang 0.5.23
    srt/server_args.py PortArgs.init_new: port_base = dist_init_port + 1, detokenizer / rpc /
    metrics / scheduler / load-collector at port_base + 1..5)."""
    t = cluster.tunables
    if rank != 0:
        return []
    found = [listener(process, "k2_sglang_port", "the SGLang server", t.sglang_port, bind=local_ip)]
    if pool.name == "prefill":
        # The bootstrap server binds --host (srt/managers/disagg_service.py).
        found.append(
            listener(
                process, "k2_bootstrap_port", "the KV bootstrap", t.bootstrap_port, bind=local_ip
            )
        )
    found.append(
        listener(
            process,
            "k2_dist_port",
            "the rendezvous",
            t.dist_port,
            bind=any_address(cluster),
            count=DIST_PORT_SPAN + 1,
            wildcard_why=TCP_STORE_BINDS_ALL,
        )
    )
    return found


def router_host(deployment: Deployment) -> HostSpec:
    """The host the (first) router runs on: [router], else the first pool's first master."""
    return router_hosts(deployment)[0]


def router_hosts(deployment: Deployment) -> tuple[HostSpec, ...]:
    """Every router's host: [router]'s (several: behind the front), else the first pool's
    first master."""
    cluster = deployment.cluster
    first: PoolName = "prefill" if cluster.layout == "pd" else "nodes"
    names = cluster.router_hosts or (deployment.pool(first).master,)
    return tuple(cluster.host(name) for name in names)


def _pool_urls(deployment: Deployment, name: PoolName) -> list[str]:
    """The HTTP URL of each instance's rank 0 in a pool, on the address its server binds: a
    fleet's instances carry the URL their engine gave them (a vLLM fleet's router fronts
    vLLM servers), a single PD instance is SGLang's."""
    return [
        instance.url or instance_url(deployment.cluster, instance)
        for instance in deployment.pool(name).members()
    ]


def _decode_capacity(deployment: Deployment) -> int:
    """Requests the decode instances run at once (their --max-running-requests, summed)."""
    pool = deployment.pool("decode")
    per_instance = pool.parallel.dp * deployment.cluster.tunables.cuda_graph_max_bs_decode
    return len(pool.members()) * per_instance


def _router_guard(deployment: Deployment) -> tuple[tuple[str, ...], tuple[LaunchValue, ...]]:
    """The router's limits, API key and TLS arguments, and the host value the key is (read
    from its file at launch: sglang-router 0.3.2 takes the key on its command line only)."""
    t = deployment.cluster.tunables
    argv: tuple[str, ...] = ()
    # Replicas of layout tp set no --max-running-requests (SGLang sizes it from the KV cache at
    # start), so a replica fleet's router limits only what the inventory asks.
    pd = deployment.cluster.layout == "pd"
    limit = t.router_max_concurrent_requests or (_decode_capacity(deployment) if pd else None)
    if limit is not None:
        queue = limit if t.router_queue_size is None else t.router_queue_size
        argv += ("--max-concurrent-requests", str(limit), "--queue-size", str(queue))
    if limit is not None or t.router_queue_size is not None:
        argv += ("--queue-timeout-secs", str(t.router_queue_timeout_s))
    resolve: tuple[LaunchValue, ...] = ()
    if key := api_key_value(t):
        argv += ("--api-key", key.ref)
        resolve = (key,)
    argv += tls_args(t, "--tls-cert-path", "--tls-key-path")
    return argv, resolve


def _workers(deployment: Deployment) -> tuple[str, ...]:
    """The router's workers and how it picks among them."""
    if deployment.cluster.layout != "pd":
        # Replicas keep their prefix caches (SGLang's radix cache, vLLM's prefix caching):
        # cache-aware routing sends a request to the replica most likely to hold its prefix.
        # Workers the launch registers (WorkerRegistration.at_launch) are not on the command
        # line: the router starts without them.
        members = deployment.pool("nodes").members()
        urls = [
            url
            for instance, url in zip(members, _pool_urls(deployment, "nodes"), strict=True)
            if not _registered_later(instance)
        ]
        if not urls:
            return ("--policy", "cache_aware")
        return ("--worker-urls", *urls, "--policy", "cache_aware")
    bootstrap = str(deployment.cluster.tunables.bootstrap_port)
    argv: tuple[str, ...] = ("--pd-disaggregation",)
    for url in _pool_urls(deployment, "prefill"):
        argv += ("--prefill", url, bootstrap)
    for url in _pool_urls(deployment, "decode"):
        argv += ("--decode", url)
    if not deployment.cluster.fleet:
        # One prefill and one decode worker (each a whole DP-attention instance): there is
        # nothing to balance, and cache_aware's prefix tree buys nothing with the radix
        # cache disabled on the servers.
        return (*argv, "--policy", "round_robin")
    return (
        *argv,
        *pd_policies(
            len(deployment.pool("prefill").members()), len(deployment.pool("decode").members())
        ),
    )


def _registered_later(instance: PoolPlan) -> bool:
    return instance.router_worker is not None and instance.router_worker.at_launch


def _router(deployment: Deployment, worker_health_path: str, router: HostSpec) -> Process:
    """The router on `router`: alone, the endpoint on every interface; behind the front, on
    its k2_local_ip and k2_router_port, where the front's HAProxy reaches it."""
    t = deployment.cluster.tunables
    front = deployment.cluster.front
    guard, resolve = _router_guard(deployment)
    argv = (
        *LAUNCH_ROUTER,
        *_workers(deployment),
        *(
            (*fleet_health_args(worker_health_path), *FLEET_ROUTER_ARGS)
            if deployment.cluster.fleet
            else ()
        ),
        "--host",
        router.local_ip if front else any_address(deployment.cluster),
        "--port",
        str(t.router_port if front else t.api_port),
        # Prometheus: sglang-router 0.3.2 binds 0.0.0.0:29000 unless told otherwise
        # (router_args.py --prometheus-host / --prometheus-port).
        "--prometheus-host",
        router.local_ip,
        "--prometheus-port",
        str(t.router_metrics_port),
        *guard,
    )
    # /readiness needs workers; a router whose workers the launch registers after it starts
    # is gated on /health (liveness), and the registration waits for the workers instead.
    later = any(_registered_later(i) for p in deployment.pools for i in p.members())
    path = ROUTER_LIVENESS_PATH if later else ROUTER_HEALTH_PATH
    if front:
        health = HealthGate(
            url=http_url(router.local_ip, t.router_port, path), timeout_s=t.health_timeout_s
        )
    else:
        health = endpoint_gate(t, router.address, t.api_port, path)
    return Process(
        name="sglang-router",
        container=ROUTER_CONTAINER,
        image=router_image(deployment),
        argv=argv,
        env={"PYTHONUNBUFFERED": "1"},
        stage=1,
        gpus=False,  # the router only routes HTTP; a dedicated router host may have no GPUs
        health=health,
        resolve=resolve,
        registrar=_registrar(deployment, router) if later else None,
    )


def _registrar(deployment: Deployment, router: HostSpec) -> RouterRegistrar | None:
    """What the router's launch script registers with it once it answers: the workers the
    router cannot name itself, so that a router that restarts serves them at once (the
    launch registers them too, and waits for them). Plain HTTP only: behind TLS the router's
    certificate names the endpoint, not the address the script asks, so the launch's
    registration alone brings its workers back."""
    t = deployment.cluster.tunables
    if t.tls_cert_file:
        return None
    front = deployment.cluster.front
    return RouterRegistrar(
        url=http_url(router.local_ip, t.router_port if front else t.api_port),
        workers=registered_at_launch(deployment.pools),
        key_file=guard_path(t.config_dir, API_KEY) if t.api_key_file else "",
    )


def router_image(deployment: Deployment) -> str:
    """The image the router runs in (plan/images.py decides), else the deployment's image."""
    return deployment.router_image or deployment.image


def _render_pd(deployment: Deployment) -> dict[str, HostRender]:
    cluster = deployment.cluster
    processes: dict[str, list[Process]] = {}
    listeners: dict[str, list[Listener]] = {}
    for pool_name in ("prefill", "decode"):
        # Each instance is a DP-attention + DeepEP group of its own: its ranks meet at its own
        # master, and its rank 0 serves HTTP (and, for prefill, the KV bootstrap).
        for pool in deployment.pool(pool_name).members():
            for rank, name in enumerate(pool.hosts):
                server = _pd_server(deployment, pool, cluster.host(name), rank)
                processes.setdefault(name, []).append(server)
                listeners.setdefault(name, []).extend(
                    _pd_listeners(server, cluster, pool, rank, cluster.host(name).local_ip)
                )
    out = {
        name: HostRender(processes=tuple(procs), listeners=tuple(listeners[name]))
        for name, procs in processes.items()
    }
    add_router(out, deployment)
    return out


def add_router(
    out: dict[str, HostRender],
    deployment: Deployment,
    worker_health_path: str = SERVER_HEALTH_PATH,
) -> None:
    """Put the router on its host, after what the host already runs. Other engines' replica
    fleets use it too: sglang-router fronts any OpenAI-compatible server in regular mode, and
    checks each worker on `worker_health_path` (its engine's liveness route)."""
    t = deployment.cluster.tunables
    front = deployment.cluster.front
    what = "the PD router" if deployment.cluster.layout == "pd" else "the fleet's router"
    for host in router_hosts(deployment):
        router = _router(deployment, worker_health_path, host)
        if front:
            serves = listener(
                router, "k2_router_port", f"{what} behind the front", t.router_port,
                bind=host.local_ip,
            )  # fmt: skip
        else:
            serves = listener(
                router, "k2_api_port", what, t.api_port,
                bind=any_address(deployment.cluster), public=True,
            )  # fmt: skip
        metrics = listener(
            router, "k2_router_metrics_port", f"{what}'s metrics", t.router_metrics_port,
            bind=host.local_ip,
        )  # fmt: skip
        before = out.get(host.name, HostRender())
        out[host.name] = HostRender(
            processes=(*before.processes, router),
            files=before.files,
            listeners=(*before.listeners, serves, metrics),
        )


# ---------------------------------------------------------------- interface


def instance_url(cluster: Cluster, instance: PoolPlan) -> str:
    """The HTTP URL of an instance's rank 0, on the address its server binds (k2_local_ip)."""
    return http_url(cluster.host(instance.master).local_ip, cluster.tunables.sglang_port)


def router_worker(cluster: Cluster, instance: PoolPlan) -> WorkerRegistration:
    """How sglang-router 0.3.2 takes an instance back (``POST /workers``, its
    WorkerConfigRequest: url, worker_type, bootstrap_port, read off the pinned binary): a
    replica by its URL; a PD prefill instance as ``prefill`` with its KV bootstrap port (without
    them the router would take it as a regular worker); a decode instance as ``decode``. One
    PD half does not answer a chat completion alone."""
    if cluster.layout != "pd":
        return WorkerRegistration(body={"url": instance.url})
    if instance.name == "prefill":
        body: dict[str, str | int] = {
            "url": instance.url,
            "worker_type": "prefill",
            "bootstrap_port": cluster.tunables.bootstrap_port,
        }
        # The decode instances cache a prefill instance's endpoints until their heartbeat
        # misses it (PREFILL_PEERS_FORGET_S).
        return WorkerRegistration(
            body=body, answers_alone=False, peers_forget_s=PREFILL_PEERS_FORGET_S
        )
    body = {"url": instance.url, "worker_type": "decode"}
    return WorkerRegistration(body=body, answers_alone=False)


def render(deployment: Deployment) -> dict[str, HostRender]:
    """Processes per host for layout `tp` or `pd`."""
    if deployment.cluster.layout == "pd":
        return _render_pd(deployment)
    return _render_tp(deployment)


def endpoint(deployment: Deployment) -> str:
    """The OpenAI-compatible base URL: the router (pd, fleets) or rank 0's server (tp)."""
    t = deployment.cluster.tunables
    if deployment.cluster.layout == "pd" or deployment.cluster.fleet:
        return routed_endpoint(deployment)
    return endpoint_url(t, deployment.pool("nodes").master_address, t.sglang_port)


def routed_endpoint(deployment: Deployment) -> str:
    """The endpoint of a routed deployment: the front's floating address with several
    routers, else the router's host."""
    t = deployment.cluster.tunables
    if deployment.cluster.front and t.front_address:
        return http_url(t.front_address.split("/")[0], t.api_port)
    return endpoint_url(t, router_host(deployment).address, t.api_port)


# ---------------------------------------------------------------- what the plan asks

DISPLAY_NAME = "SGLang"
RELEASE = EngineRelease(
    engine="sglang", version="0.5.23", image="lmsysorg/sglang:v0.5.23", min_driver="580.65"
)
_K25 = EngineSupport(
    min_version="0.5.9",
    source="the first sglang wheel with sglang/srt/models/kimi_k25.py (0.5.8 has none)",
)
SUPPORT: dict[str, EngineSupport] = {
    **dict.fromkeys(
        catalog.FP8_FAMILY,
        EngineSupport(min_version="0.5.23", source="the pinned release (parser-checked)"),
    ),
    **dict.fromkeys(catalog.INT4_FAMILY, _K25),
    "moonshotai/Kimi-K2-Thinking": EngineSupport(
        min_version="0.5.5",
        source="the first sglang release with the kimi_k2 reasoning parser and "
        "CompressedTensorsWNA16MoEMethod (wheel of 2025-11-06)",
    ),
}
LAYOUTS: tuple[Layout, ...] = (Layout(name="tp"), Layout(name="pd", pools=("prefill", "decode")))
SINGLE_GPU = False
ROUTED_EXPERTS_ON_HOST = False
# SGLang 0.5.23's --language-model-only does not accept KimiK25ForConditionalGeneration
# (server_args.py LANGUAGE_MODEL_ONLY_ARCHITECTURES).
TEXT_ONLY = False
FP8_KV = True  # --kv-cache-dtype fp8_e4m3
# Both layouts render as fleets: every instance behind one sglang-router (PD: each prefill
# and decode instance; tp: replicas, the router regular mode's --worker-urls).
FLEET_LAYOUTS: tuple[str, ...] = ("tp", "pd")
DCP_LAYOUTS: tuple[str, ...] = ()
DCP_TUNABLE: str | None = None
SPARE_EXPERT_TUNABLES: dict[PoolName, str] = {"decode": "decode_redundant_experts"}
HEALTH_PATH = SERVER_HEALTH_PATH
METRICS_PATH: str | None = "/metrics"
METRICS_PORTS: tuple[str, ...] = ("k2_sglang_port", "k2_router_metrics_port")
# sglang 0.5.23's names (the KV transfer ones exported by PD's pools), each found in its
# sources by tests/engine_parsers/test_metric_names.py.
# /metrics reads the prometheus_client multiprocess directory of the server's own node, and
# only node 0 runs an HTTP server (srt/entrypoints/http_server.py:3163, node_rank >= 1 returns
# after the schedulers): the scheduler gauges of a PD instance over 12 nodes are those of its
# 8 ranks on node 0. Every rank's load reaches node 0 all the same: with DP attention over
# several nodes each scheduler pushes its load snapshot over ZMQ to node 0
# (srt/managers/load_snapshot.py should_use_zmq :69-79, ZmqShmLoadSnapshotReader), and
# /v1/loads?format=prometheus (srt/entrypoints/v1_loads.py:96, _format_loads_prometheus :64)
# serves one gauge per DP rank, `sglang_<field>{dp_rank="N"}` of LoadSnapshot's core fields
# (load_snapshot.py:196). The plan scrapes it on the first host of each such instance, and
# the rules and dashboards read running, queued and KV usage from it where it has series.
METRICS_LOAD_PATH = "/v1/loads"
METRICS: MetricNames | None = MetricNames(
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    running="sglang:num_running_reqs",
    queued="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    ttft="sglang:time_to_first_token_seconds",
    inter_token="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    kv_transfer_latency="sglang:kv_transfer_latency_ms",
    kv_transfer_speed="sglang:kv_transfer_speed_gb_s",
    kv_bootstrap="sglang:kv_transfer_bootstrap_ms",
    rank_load=RankLoadNames(
        path=METRICS_LOAD_PATH,
        params=(("format", "prometheus"), ("include", "core")),
        running="sglang_num_running_reqs",
        queued="sglang_num_waiting_reqs",
        kv_usage="sglang_token_usage",
        # LoadSnapshot.timestamp (load_snapshot.py:199), time.time() when the rank's scheduler
        # took the snapshot (scheduler_components/load_inquirer.py:233): after each batch,
        # and at least every 50 ms while it holds work without one (scheduler.py:411
        # LOAD_STALL_REFRESH_S, on_idle). /health answers without asking any rank and
        # /health_generate as soon as one answers (http_server.py:721-800), so this is the
        # one per-rank sign of life (ops/rank_liveness.py).
        published="sglang_timestamp",
    ),
)
# The native /generate route, through sglang's own client (sglang 0.5.23's home of
# `sglang.bench_serving`, which is a deprecated alias there).
BENCH_CLIENT = BenchClient(
    "sglang",
    "sglang.benchmark.serving",
    ("-m", "sglang.benchmark.serving"),
    "sglang",
    "result.jsonl",
    "sglang==0.5.23 (scripts/install-engine-parsers sglang builds .venv-sglang)",
    # Appends one JSON line per run with median/p90/p95/p99, and a copy of the server's whole
    # /server_info (server arguments included), which the run record leaves out.
    ResultFormat(
        json_lines=True,
        median="median_{metric}_ms",
        e2e_metric="e2e_latency",
        counts_failed=False,
        dropped=("server_info",),
    ),
    # `random-ids` draws ids from the tokenizer's vocabulary (`random` would download
    # ShareGPT); range ratio 1.0 makes lengths exact; ignore_eos is its default. --model
    # names the tokenizer so its chat-template probe stays local; requests carry the served
    # name.
    (
        "--dataset-name",
        "random-ids",
        "--random-range-ratio",
        "1.0",
        "--model",
        "{tokenizer}",
        "--served-model-name",
        "{served_model_name}",
        "--output-file",
        "{out_dir}/{result_name}",
    ),
)
PUBLISHED_FIGURES: tuple[PublishedFigure, ...] = (
    PublishedFigure(
        "pd",
        "lmsys-2000-100",
        "input",
        56_000,
        "seed 002 (LMSYS): 896k prefill tok/s on 16 nodes of 8 x H200 (4P12D), 56k per node",
    ),
    PublishedFigure(
        "pd",
        "lmsys-2000-100",
        "output",
        24_000,
        "seed 002 (LMSYS): 384k decode tok/s on 16 nodes of 8 x H200 (4P12D, "
        "decode batch 480), 24k per node",
    ),
)
NUMA_BINDING = (
    "SYS_NICE",
    "SGLang binds each rank's memory to its GPU's NUMA node with set_mempolicy/mbind, "
    "which Docker's default seccomp profile allows only with CAP_SYS_NICE",
)
# sglang 0.5.23 keeps every compiled kernel under SGLANG_CACHE_DIR: DeepGEMM's JIT
# (SGLANG_DG_CACHE_DIR, srt/environ.py:1373 defaults it to SGLANG_CACHE_DIR/deep_gemm) and,
# by setdefault at start, Triton, Inductor, the CUDA JIT cache and FlashInfer's workspace
# (srt/environ.py:2308 third_party_cache_defaults). Set each, so none depends on that
# setdefault running before the library is imported.
COMPILE_CACHES = (
    ("SGLANG_CACHE_DIR", ""),
    ("SGLANG_DG_CACHE_DIR", "deep_gemm"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("CUDA_CACHE_PATH", "nv"),
    ("FLASHINFER_WORKSPACE_BASE", ""),
)
CONTAINER_NEEDS = ContainerNeeds(cap_add=(NUMA_BINDING,), compile_caches=COMPILE_CACHES)
# Tunables only SGLang reads, each with the layouts that read it.
PD_TUNABLES = (
    "k2_max_running_requests_prefill",
    "k2_cuda_graph_max_bs_decode",
    "k2_prefill_chunk_per_rank",
    "k2_pd_transfer_backend",
    "k2_pd_timeout_s",
    "k2_decode_redundant_experts",
    "k2_prefill_redundant_experts",
    "k2_bootstrap_port",
)
OWN_TUNABLES: dict[str, tuple[str, ...]] = dict.fromkeys(PD_TUNABLES, ("pd",))
# With DP attention it takes the dist port and the next 6 (see Tunables.dist_port).
NO_IPV6: str | None = None
NO_API_KEY: str | None = None
NO_TLS: str | None = None
DIST_PORT_SPAN = 6
# The decode reserve grows with the captured batch: CUDA graphs up to it, and DeepEP's
# low-latency dispatch buffers sized by SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK (set to
# it, see the render). 480 is the production 4P12D value on H200; on 80 GB GPUs the decode
# pool fits only with fewer.
BATCH_TUNABLES: tuple[BatchTunable, ...] = (
    BatchTunable(
        "cuda_graph_max_bs_decode",
        ("pd",),
        ("decode",),
        (384, 256, 192, 128, 64, 32),
        "decode CUDA graphs and DeepEP dispatch buffers for batches up to {value} per rank",
    ),
)
kv_dtype = kv_cache_dtype
kv_dtype_problems = fp8_kv_problems
served_name = inventory_served_name


def _metrics_warning(cluster: Cluster, release: EngineRelease) -> list[str]:
    """What the metrics of PD instances on several hosts cover (see METRICS)."""
    spread = [
        f"[{p}] ({len(cluster.pool(p)) // cluster.instance_count(p)} hosts each)"
        for p in ("prefill", "decode")
        if len(cluster.pool(p)) > cluster.instance_count(p)
    ]
    if not spread:
        return []
    return [
        f"metrics of the {' and '.join(spread)} instances: sglang {release.version} serves "
        "/metrics on each instance's first host only, so its KV transfer timings are those of "
        "that host's ranks; running and queued requests and KV usage of every rank are "
        f"scraped from its {METRICS_LOAD_PATH} (job loads) instead (docs/engines.md)"
    ]


def plan_warnings(cluster: Cluster, spec: ModelSpec, release: EngineRelease) -> list[str]:
    """What a PD fleet's router balances on (MANY_INSTANCES_POLICY): its own in-flight counts,
    since the servers do not serve the load route it asks for; and what the metrics of
    instances on several hosts cover."""
    if cluster.layout != "pd":
        return []
    found = _metrics_warning(cluster, release)
    pools = [p for p in ("prefill", "decode") if cluster.instance_count(p) > 1]
    if not pools:
        return found
    return [
        f"the PD router picks among the {' and among the '.join(pools)} instances by "
        f"{MANY_INSTANCES_POLICY} on its own count of requests in flight on each, not on the "
        f"servers' load: {catalog.ROUTER.package} {catalog.ROUTER.version} asks each worker "
        f"for /get_load, which sglang {release.version} does not serve (docs/engines.md)",
        *found,
    ]


def pool_shape(cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
    """TP over the pool's GPUs; in PD pools DP attention and EP as wide, with one spare expert
    slot per GPU (EPLB rebalances them) unless the inventory says otherwise, as the
    production 4P12D config does (32 + 96)."""
    gpus = nodes * cluster.gpus_per_node
    if cluster.layout != "pd":
        return Parallel(tp=gpus)
    t = cluster.tunables
    spare = t.decode_redundant_experts if pool == "decode" else t.prefill_redundant_experts
    return Parallel(
        tp=gpus,
        dp=gpus,
        ep=gpus,
        dp_attention=True,
        redundant_experts=gpus if spare is None else spare,
    )


def weight_slices(cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
    """tp: every MLP weight over the TP group (each expert's intermediate too: FusedMoE
    without expert parallelism). pd: whole experts per EP rank; the shared experts replicated
    under DeepEP (0.5.23 models/deepseek_v2.py:874 `_shared_expert_use_tp1`) and the dense
    MLP replicated by --moe-dense-tp-size 1 (models/deepseek_v2.py:2665,
    layers/layer_boundary/layout.py:83 `is_dense_ffn_fully_dp`)."""
    if cluster.layout == "pd":
        return WeightSlices(expert=parallel.tp // parallel.ep, shared=1, dense=1)
    return WeightSlices(expert=parallel.tp, shared=parallel.tp, dense=parallel.tp)


def kernel_path_problems(cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
    """pd runs the experts through DeepEP (--moe-a2a-backend deepep). In 0.5.23 DeepEPMoE
    runs only FP8 (DeepGEMM) and W4AFP8 experts: for any other quantized experts
    `run_moe_core` ends in `assert False, "forward_deepgemm_contiguous is deprecated"`
    (normal mode) or "forward_deepgemm_masked is deprecated" (low latency)
    (layers/moe/ep_moe/layer.py:296, :301), and the compressed-tensors INT4 method runs
    Marlin on the standard dispatcher only (layers/quantization/compressed_tensors/schemes/
    compressed_tensors_wNa16_moe.py:444; layers/moe/moe_runner/marlin.py registers no
    DeepEP permute). tp uses the standard dispatcher, where both formats have kernels."""
    experts = spec.quantization.routed_experts
    if cluster.layout == "pd" and experts.scheme not in ("fp8_block", "bf16"):
        return [
            f"SGLang 0.5.23's DeepEP MoE layer (the pd layout's --moe-a2a-backend deepep) has "
            f"no kernel for {spec.id}'s {experts.label} experts (compressed-tensors INT4 runs "
            "Marlin on the standard dispatcher only)"
        ]
    return []


# ---------------------------------------------------------------- memory accounting

# SGLang 0.5.23 (mem_cache/kv_cache_configurator.py _profile_available_bytes): KV = free
# memory after loading - (1 - mem_fraction_static) x free memory before loading; the rest
# of the GPU must hold activations, graphs and buffers.
KV_PAGE_TOKENS = 1


# DeepEP low-latency decode, measured: CUDA graph capture to batch 128 took about 20 GB
# per rank (SGLang logs GiB as "GB") for Kimi-K2-Thinking at TP/DP-attention/EP 32 with
# DeepEP and SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256 (sgl-project/sglang#24453).
# The capture includes DeepEP's buffers, which SGLang allocates lazily at the first
# dispatch inside it (sgl-project/sglang#29942). The model below counts 9.4 GiB there; its
# graph and all-to-all terms are scaled by measured / modelled.
DEEPEP_DECODE_MEASURED_GIB = 20.0
DEEPEP_DECODE_SOURCE = (
    "sgl-project/sglang#24453: ~20 GB per rank for graphs to 128 + DeepEP buffers at "
    "DP/EP 32, 256 dispatch tokens"
)


def deepep_decode_model(
    spec: ModelSpec, p: Parallel, graph_bs: int, dispatch_tokens: int
) -> tuple[float, float]:
    """(CUDA graphs, DeepEP buffers) in GiB per GPU of a low-latency decode pool, before
    calibration: the graphs' rows, and inside them, for every row a local expert can
    receive (dispatch tokens per rank from every rank), the grouped GEMM pipeline's
    tensors (received row, gate/up output, activation, down output); and DeepEP's
    low-latency RDMA buffer."""
    local_experts = (spec.n_routed_experts + p.redundant_experts) / p.ep
    row = (2 * spec.hidden_size + 3 * spec.moe_intermediate_size) * 2
    received = local_experts * p.ep * dispatch_tokens * row / GIB
    graphs = graph_gib(graph_bs, graph_bs, spec, p) + received
    return graphs, deepep_low_latency_gib(spec, p, dispatch_tokens)


def deepep_decode_scale() -> float:
    """Measured / modelled at the settings of the measurement (DEEPEP_DECODE_SOURCE)."""
    spec = catalog.model("moonshotai/Kimi-K2-Thinking")
    at = Parallel(tp=32, dp=32, ep=32, dp_attention=True)
    graphs, buffers = deepep_decode_model(spec, at, 128, 256)
    return DEEPEP_DECODE_MEASURED_GIB / (graphs + buffers)


def reserve(f: PoolFit) -> MemoryReserve:
    """What SGLang needs outside its static pool (weights + KV), per GPU."""
    t = f.tunables
    p = f.parallel
    spec = f.spec
    all2all = 0.0
    calibration = ""
    if f.pool == "decode":
        # The render sizes DeepEP's dispatch to the largest graph batch (_pd_env).
        tokens = t.cuda_graph_max_bs_decode
        scale = deepep_decode_scale()
        graphs, all2all = (term * scale for term in deepep_decode_model(spec, p, tokens, tokens))
        calibration = f"CUDA graphs and DeepEP x{scale:.2f}: {DEEPEP_DECODE_SOURCE}"
    elif f.pool == "prefill":
        # The render gives SGLang per rank x DP, which 0.5.23 divides by the attention-DP size.
        tokens = t.prefill_chunk_per_rank
        all2all = DEEPEP_NORMAL_GIB
        graphs = 0.0  # --deepep-mode normal disables CUDA graphs
    else:
        tokens = 8192 if f.gpu.usable_gib >= 60 else 4096  # 0.5.23's chunk default
        graph_rows = 512 if p.tp >= 4 else 256  # its decode max_bs default
        graphs = graph_gib(graph_rows, graph_rows, spec, p)
    comm = all2all + collective_buffers_gib(p.tp, f.gpus_per_node)
    return MemoryReserve(
        activations=round(activations_gib(tokens, spec, p), 2),
        cuda_graphs=round(graphs, 2),
        comm_buffers=round(comm, 2),
        all2all=round(all2all, 2),
        runtime=RUNTIME_GIB,
        encoder=encoder_gib(f),
        margin=t.reserve_gib,
        calibration=calibration,
    )


def kv_budget(f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
    """SGLang measures free memory once its runtime is up, before loading weights; the
    buffers and graphs allocated later must fit in (1 - fraction) of that."""
    before_load = f.gpu.usable_gib - reserve.runtime
    fraction = floor2(1 - (reserve.total - reserve.runtime) / before_load)
    budget = fraction * before_load
    return KvBudget(fraction, budget, budget - weights_gib)
