"""TensorRT-LLM (PyTorch backend) across nodes: sshd in every container, mpirun from rank 0.

Stage 0, every host: container `k2-trtllm` runs sshd in the foreground on `ssh_port`,
key-only, with the keys and known_hosts that the ssh_mesh role places under
`{config_dir}/ssh/`. Stage 1, rank 0 only (docker exec into that container): one `mpirun`
starts N x 8 ranks through those sshds; `trtllm-llmapi-launch` makes rank 0 serve the
OpenAI API while the other ranks run the model workers.

In a fleet (k2_instances above 1) each instance is such a world of its own: its rank 0's
mpirun reaches its own hosts only, their sshd lets in their own addresses only (AllowUsers),
and its trtllm-serve serves the router on the head's k2_local_ip and k2_trtllm_port; the
launch registers each instance with the router by model id (trtllm-serve names none).

Every host gets the same extra-llm-api-options YAML (each rank reads it on its own node). It is
built from the typed mirror of TorchLlmArgs in `trtllm_schema` and validated again after being
written out, so a render cannot produce a file the pinned release would refuse.

Served name: `trtllm-serve serve` of the 1.2 line has no option for it; its OpenAI server lists
a model given as a local directory under the directory's base name, and any other model under
the string it was given (tensorrt_llm/serve/openai_server.py, `OpenAIServer.__init__`:
`self.model = model_dir.name` when `model_dir.is_dir()`). `served_model_name` follows that rule.

Socket interface: the ranks' environment comes from mpirun on rank 0 (`-x`), so NCCL's and
Gloo's interface is the one rank 0 finds (interface names must match across hosts, or set
k2_socket_ifname); Open MPI's own TCP traffic is pinned by subnet (`btl_tcp_if_include` /
`oob_tcp_if_include` take a CIDR), which holds whatever the interfaces are called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePosixPath

import yaml

from k2provision.core import catalog
from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    GpuSpec,
    HostSpec,
    KvDtype,
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
from k2provision.core.ssh_mesh import mesh_ssh_configs
from k2provision.core.templating import render_template
from k2provision.engines.base import (
    BatchTunable,
    BenchClient,
    ContainerNeeds,
    Deployment,
    HostRender,
    MetricNames,
    PublishedFigure,
    ResultFormat,
    WeightSlices,
    layout_names,
    listener,
)
from k2provision.engines.common import (
    SUBNET,
    http_gate,
    http_url,
    instance_serving,
    master_endpoint,
    multi_host,
    openai_bench_options,
    own_tunables,
    parser_args,
    socket_env,
    socket_ifname,
)
from k2provision.engines.memory import (
    RUNTIME_GIB,
    KvBudget,
    PoolFit,
    activations_gib,
    collective_buffers_gib,
    floor2,
    graph_gib,
)
from k2provision.engines.sglang import add_router, routed_endpoint
from k2provision.engines.trtllm_schema import (
    TRTLLM_VERSION,
    CudaGraphConfig,
    ExtraLlmApiOptions,
    KvCacheConfig,
    MoeBackend,
    MoeConfig,
    validate_extra_llm_api_options,
)

CONTAINER = "k2-trtllm"
SSHD = "/usr/sbin/sshd"
# CUDA graphs are captured for decode batches of these powers of two, up to this size.
CUDA_GRAPH_MAX_BATCH = 128
# The image's environment handed to ssh sessions, so that orted (and the ranks it starts) find
# Open MPI, Python and the TensorRT-LLM libraries on every node.
SSH_SESSION_ENV = ("PATH", "LD_LIBRARY_PATH", "OPAL_PREFIX")
# Exported by mpirun to every rank as well (-x), besides the process's own env.
MPI_FORWARD_ENV = ("PATH", "LD_LIBRARY_PATH")

# Every option of `trtllm-serve serve` in tensorrt_llm/commands/serve.py of the mirrored 1.2
# line (stored revision 00209af149e7774406881a37283dce303571eb11), aliases included.
SERVE_OPTIONS: frozenset[str] = frozenset(
    {
        "--tokenizer",
        "--custom_tokenizer",
        "--host",
        "--port",
        "--backend",
        "--custom_module_dirs",
        "--log_level",
        "--max_beam_width",
        "--max_batch_size",
        "--max_num_tokens",
        "--max_seq_len",
        "--tensor_parallel_size",
        "--tp_size",
        "--pipeline_parallel_size",
        "--pp_size",
        "--context_parallel_size",
        "--cp_size",
        "--moe_expert_parallel_size",
        "--ep_size",
        "--moe_cluster_parallel_size",
        "--cluster_size",
        "--gpus_per_node",
        "--free_gpu_memory_fraction",
        "--kv_cache_free_gpu_memory_fraction",
        "--num_postprocess_workers",
        "--trust_remote_code",
        "--revision",
        "--config",
        "--extra_llm_api_options",
        "--reasoning_parser",
        "--tool_parser",
        "--metadata_server_config_file",
        "--server_role",
        "--fail_fast_on_attention_window_too_large",
        "--otlp_traces_endpoint",
        "--disagg_cluster_uri",
        "--enable_chunked_prefill",
        "--media_io_kwargs",
        "--chat_template",
    }
)
# Options of `serve` that are flags (take no value).
SERVE_FLAGS: frozenset[str] = frozenset(
    {
        "--trust_remote_code",
        "--fail_fast_on_attention_window_too_large",
        "--enable_chunked_prefill",
    }
)
# `--tool_parser` is a click.Choice over ToolParserFactory.parsers of the same line.
TOOL_PARSERS: frozenset[str] = frozenset(
    {
        "qwen3",
        "qwen3_coder",
        "kimi_k2",
        "deepseekv3",
        "deepseekv3.1",
        "deepseek_v32",
    }
)


@dataclass(frozen=True)
class Paths:
    """Where the rendered and the ssh_mesh-provided files live on every host."""

    config_dir: str

    @property
    def ssh_dir(self) -> str:
        """Keys, known_hosts and the ssh configs (mounted read-only into the container)."""
        return f"{self.config_dir}/ssh"

    @property
    def extra_options(self) -> str:
        """The extra-llm-api-options YAML."""
        return f"{self.config_dir}/trtllm/extra-llm-api-config.yml"

    @property
    def sshd_start(self) -> str:
        """The container's main command (a script that execs sshd)."""
        return f"{self.config_dir}/trtllm/sshd-start.sh"

    @property
    def sshd_config(self) -> str:
        """sshd's configuration."""
        return f"{self.ssh_dir}/sshd_config"

    @property
    def ssh_config(self) -> str:
        """The ssh client configuration mpirun's ssh reads (-F)."""
        return f"{self.ssh_dir}/ssh_config"


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two from 1 up to min(max_batch_size, CUDA_GRAPH_MAX_BATCH)."""
    limit = min(max_batch_size, CUDA_GRAPH_MAX_BATCH)
    sizes = []
    size = 1
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def moe_backend(spec: ModelSpec, gpu: GpuSpec) -> MoeBackend | None:
    """The MoE backend to name for the model's experts on this GPU; None: the release's own
    choice. 1.2's AUTO resolves to CUTLASS for DeepseekV3ForCausalLM
    (tensorrt_llm/_torch/model_config.py `resolve_moe_backend`), whose FP8 block-scale grouped
    GEMM is built for Hopper only: on Blackwell it throws "fp8 blockscale gemm only support
    Hopper" (cpp/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/
    fp8_blockscale_gemm.cu), and TensorRT-LLM's own troubleshooting names DEEPGEMM for FP8
    weights there (examples/layer_wise_benchmarks/README.md)."""
    if spec.quantization.routed_experts.scheme == "fp8_block" and gpu.sm >= 100:
        return "DEEPGEMM"
    return None


def extra_llm_api_options(deployment: Deployment) -> ExtraLlmApiOptions:
    """The typed options every rank reads; only the keys set here are written out."""
    pool = deployment.pool("nodes")
    t = deployment.cluster.tunables
    # The plan decided it (k2_trtllm_kv_cache_dtype on an FP8-capable GPU) and counted it.
    kv_dtype = "fp8" if deployment.kv_cache_dtype == "fp8" else "auto"
    backend = moe_backend(deployment.model, catalog.gpu(deployment.cluster.gpu))
    moe = {"moe_config": MoeConfig(backend=backend)} if backend else {}
    return ExtraLlmApiOptions(
        **moe,
        # Padding rounds a decode batch up to the next captured size instead of running it
        # without a graph (the seed's `padding_enabled`, renamed enable_padding in 1.x).
        cuda_graph_config=CudaGraphConfig(
            enable_padding=True, batch_sizes=cuda_graph_batch_sizes(t.trtllm_max_batch_size)
        ),
        enable_attention_dp=pool.parallel.dp_attention,
        # A prompt longer than max_num_tokens is refused unless prefill may be chunked; MLA
        # supports chunked context on Hopper and Blackwell.
        enable_chunked_prefill=deployment.context_length > t.trtllm_max_num_tokens,
        # The seed printed a log line per iteration; on N x 8 ranks in production that floods
        # the container logs and costs host time on every step. Metrics come from /metrics.
        print_iter_log=False,
        kv_cache_config=KvCacheConfig(
            # The fraction of memory left free after weights and warm-up that the KV cache may
            # take: the plan's fraction (the release's own default, 0.90) rather than the seed's
            # 0.95, which leaves too little for NCCL/MPI buffers and allocations made after
            # the cache is sized. Same value as --kv_cache_free_gpu_memory_fraction.
            free_gpu_memory_fraction=pool.mem_fraction,
            # FP8 KV cache for MLA runs on Hopper (FlashMLA FP8) and Blackwell; it halves the
            # 68.6 KiB/token BF16 latent cache. k2_trtllm_kv_cache_dtype=auto turns it off.
            dtype=kv_dtype,
        ),
    )


def options_yaml(options: ExtraLlmApiOptions) -> str:
    """The YAML text of `options` (set keys only), re-validated after serialisation."""
    data = options.model_dump(mode="json", exclude_unset=True)
    body = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    text = (
        f"# TensorRT-LLM {TRTLLM_VERSION} extra LLM API options for trtllm-serve\n"
        "# --extra_llm_api_options: rendered by k2provision; edits are overwritten.\n"
        "# Checked against k2provision's mirror of TorchLlmArgs (unknown keys are errors).\n" + body
    )
    parsed = validate_extra_llm_api_options(yaml.safe_load(text))
    if parsed.model_dump(exclude_unset=True) != options.model_dump(exclude_unset=True):
        raise AssertionError("extra-llm-api-options YAML does not round-trip")
    return text


def served_model_name(model_dir: str) -> str:
    """The model id trtllm-serve lists for `model_dir` (a directory on every rank)."""
    return PurePosixPath(model_dir).name or model_dir


def mpi_interface(
    deployment: Deployment, instance: PoolPlan
) -> tuple[str | None, tuple[LaunchValue, ...]]:
    """What Open MPI's TCP traffic is pinned to: k2_socket_ifname, else the subnet of the
    instance's rank 0."""
    cluster = deployment.cluster
    if not multi_host(cluster):
        return None, ()
    if cluster.tunables.socket_ifname:
        return cluster.tunables.socket_ifname, ()
    rank0 = cluster.host(instance.master)
    ifname, values = socket_ifname(cluster, rank0)
    if ifname is None:
        return None, ()
    subnet = SUBNET.model_copy(update={"arg": rank0.local_ip})
    return subnet.ref, (*values, subnet)


def mpirun_argv(
    deployment: Deployment,
    hosts: tuple[HostSpec, ...],
    instance: PoolPlan,
    paths: Paths,
    env_names: tuple[str, ...],
) -> tuple[str, ...]:
    """The mpirun line an instance's rank 0 runs: every rank of the instance's hosts (its own
    MPI world: a fleet's instances never share one), trtllm-serve on rank 0."""
    t = deployment.cluster.tunables
    gpn = deployment.cluster.gpus_per_node
    argv: list[str] = [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(len(hosts) * gpn),
        "-H",
        ",".join(f"{h.local_ip}:{gpn}" for h in hosts),
        # One argv element: Open MPI passes it to ssh as its arguments.
        "-mca",
        "plm_rsh_args",
        f"-p {t.ssh_port} -F {paths.ssh_config}",
    ]
    interface, _ = mpi_interface(deployment, instance)
    if interface:
        argv += ["-mca", "btl_tcp_if_include", interface, "-mca", "oob_tcp_if_include", interface]
    for name in env_names:
        argv += ["-x", name]
    argv += ["trtllm-llmapi-launch", *serve_argv(deployment, instance, paths)]
    return tuple(argv)


def serving(deployment: Deployment, instance: PoolPlan) -> tuple[str, int, bool]:
    """Where an instance's trtllm-serve listens: (bind address, port, whether it is the
    endpoint). Alone it is the endpoint on every interface and k2_api_port; in a fleet it
    serves the router on its head's k2_local_ip and k2_trtllm_port (`--host` goes to uvicorn
    as given: tensorrt_llm/commands/serve.py)."""
    cluster = deployment.cluster
    return instance_serving(cluster, instance, cluster.tunables.trtllm_port)


def serve_argv(deployment: Deployment, instance: PoolPlan, paths: Paths) -> tuple[str, ...]:
    """`trtllm-serve serve MODEL ...` with options named as in the release's serve.py."""
    t = deployment.cluster.tunables
    p = instance.parallel
    bind, port, _ = serving(deployment, instance)
    return (
        "trtllm-serve",
        "serve",
        deployment.cluster.model_dir,
        "--backend",
        "pytorch",
        "--host",
        bind,
        "--port",
        str(port),
        "--tp_size",
        str(p.tp),
        "--ep_size",
        str(p.ep),
        "--gpus_per_node",
        str(deployment.cluster.gpus_per_node),
        "--max_batch_size",
        str(t.trtllm_max_batch_size),
        "--max_num_tokens",
        str(t.trtllm_max_num_tokens),
        "--max_seq_len",
        str(deployment.context_length),
        "--kv_cache_free_gpu_memory_fraction",
        f"{instance.mem_fraction:g}",
        "--trust_remote_code",
        *parser_args(deployment.model, "--tool_parser", "--reasoning_parser"),
        # `--config` is the same option in this release; the long name also works on 1.0/1.1.
        "--extra_llm_api_options",
        paths.extra_options,
    )


def render(deployment: Deployment) -> dict[str, HostRender]:
    """Every instance of [nodes] (its sshds, the mpirun launch on its rank 0), and in a fleet
    the router in front of them."""
    out: dict[str, HostRender] = {}
    for instance in deployment.pool("nodes").members():
        out.update(_render_instance(deployment, instance))
    if deployment.cluster.fleet:
        add_router(out, deployment, HEALTH_PATH)
    return out


def _render_instance(deployment: Deployment, instance: PoolPlan) -> dict[str, HostRender]:
    """sshd on every host of the instance; its mpirun launch on the instance's rank 0."""
    cluster = deployment.cluster
    t = cluster.tunables
    paths = Paths(t.config_dir)
    hosts = tuple(cluster.host(name) for name in instance.hosts)

    template_vars = {
        "container": CONTAINER,
        "port": t.ssh_port,
        "ssh_dir": paths.ssh_dir,
        "sshd": SSHD,
        "user_environment": SSH_SESSION_ENV,
    }
    files = {
        paths.extra_options: options_yaml(extra_llm_api_options(deployment)),
        **mesh_ssh_configs(
            paths.ssh_dir,
            t.ssh_port,
            CONTAINER,
            SSH_SESSION_ENV,
            # A fleet's instance: mpirun of another instance cannot log in here.
            allow_from=sorted({a for h in hosts for a in (h.address, h.local_ip)})
            if instance.instance
            else (),
        ),
    }
    sshd = Process(
        name="sshd",
        container=CONTAINER,
        image=deployment.image,
        argv=("/bin/sh", paths.sshd_start),
        stage=0,
        instance=instance.ref(),
    )

    # The model is a local directory: never wait on the Hugging Face Hub from a rank.
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    ifname, values = socket_ifname(cluster, cluster.host(instance.master))
    env.update(socket_env(ifname))
    _, mpi_values = mpi_interface(deployment, instance)
    resolve = tuple({v.name: v for v in (*values, *mpi_values)}.values())
    bind, port, endpoint_itself = serving(deployment, instance)
    serve = Process(
        name="trtllm-serve",
        container=CONTAINER,
        image=deployment.image,
        # The compile cache variables are set on the container (plan/caches.py); the ranks
        # on the other hosts get them from mpirun too.
        argv=mpirun_argv(
            deployment,
            hosts,
            instance,
            paths,
            (*MPI_FORWARD_ENV, *sorted({*env, *(name for name, _ in COMPILE_CACHES)})),
        ),
        env=env,
        resolve=resolve,
        stage=1,
        exec_in=True,
        health=http_gate(
            instance.master_address if endpoint_itself else bind,
            port,
            HEALTH_PATH,
            t.health_timeout_s,
        ),
        instance=instance.ref(),
    )
    if endpoint_itself:
        serve_port = listener(serve, "k2_api_port", "trtllm-serve", port, bind=bind, public=True)
    else:
        serve_port = listener(
            serve, "k2_trtllm_port", "the trtllm-serve of an instance behind the router",
            port, bind=bind,
        )  # fmt: skip
    out: dict[str, HostRender] = {}
    for h in hosts:
        # sshd for mpirun listens on the host's k2_local_ip only (its start script's
        # `-o ListenAddress`), where mpirun dials it (-H); the process is every host's same.
        start = render_template("trtllm/sshd-start.sh.j2", **template_vars, listen=h.local_ip)
        sshd_port = listener(
            sshd, "k2_ssh_port", "the containers' sshd", t.ssh_port, bind=h.local_ip
        )
        out[h.name] = HostRender(
            processes=(sshd, serve) if h.name == instance.master else (sshd,),
            files={**files, paths.sshd_start: start},
            listeners=(serve_port, sshd_port) if h.name == instance.master else (sshd_port,),
        )
    return out


def endpoint(deployment: Deployment) -> str:
    """The OpenAI-compatible base URL: rank 0's server, or a fleet's router."""
    if deployment.cluster.fleet:
        return routed_endpoint(deployment)
    return master_endpoint(deployment)


def instance_url(cluster: Cluster, instance: PoolPlan) -> str:
    """Where a fleet's router reaches one instance: its trtllm-serve on the head's
    k2_local_ip, on k2_trtllm_port (the router takes k2_api_port, and may share the head's
    host)."""
    return http_url(cluster.host(instance.master).local_ip, cluster.tunables.trtllm_port)


def router_worker(cluster: Cluster, instance: PoolPlan) -> WorkerRegistration:
    """An instance registered by the launch with its model id, as a vLLM replica is:
    trtllm-serve 1.2.1 serves no /server_info or /model_info
    (tensorrt_llm/serve/openai_server.py register_routes), so sglang-router 0.3.2 would hold
    a worker taken from --worker-urls under the model id "unknown"; `POST /workers` with the
    served name names it, and trtllm-serve's /health answers the router's health checks."""
    return WorkerRegistration(
        body={"url": instance.url, "model_id": served_name(cluster)}, at_launch=True
    )


# ---------------------------------------------------------------- what the plan asks

DISPLAY_NAME = "TensorRT-LLM"
RELEASE = EngineRelease(
    engine="trtllm",
    version=TRTLLM_VERSION,
    image=f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}",
    min_driver="580.65",
    build="trtllm",  # containers/trtllm: FROM the release image, with sshd and nccl-tests
)
SUPPORT: dict[str, EngineSupport] = {
    **dict.fromkeys(
        catalog.FP8_FAMILY,
        EngineSupport(min_version="1.2.1", source="the pinned release (schema-checked)"),
    ),
    **dict.fromkeys(
        catalog.INT4_FAMILY,
        EngineSupport(
            min_version=None,
            source="TensorRT-LLM documents the family only as NVFP4 checkpoints on Blackwell "
            "(nvidia/Kimi-K2-Thinking-NVFP4), not these INT4 compressed-tensors weights",
        ),
    ),
}
LAYOUTS: tuple[Layout, ...] = (Layout(name="tp_ep"),)
SINGLE_GPU = False
ROUTED_EXPERTS_ON_HOST = False
TEXT_ONLY = False
FP8_KV = False  # its KV dtype is k2_trtllm_kv_cache_dtype (kv_cache_config.dtype)
FLEET_LAYOUTS: tuple[str, ...] = layout_names(LAYOUTS)
DCP_LAYOUTS: tuple[str, ...] = ()
DCP_TUNABLE: str | None = None
SPARE_EXPERT_TUNABLES: dict[PoolName, str] = {}
HEALTH_PATH = "/health"
# No Prometheus scrape: trtllm-serve's GET /metrics answers iteration stats as JSON
# (tensorrt_llm/serve/openai_server.py, get_iteration_stats), not Prometheus text. Its
# prometheus_client app is mounted at /prometheus/metrics on the API port only with the LLM
# API option return_perf_metrics (register_routes -> mount_metrics; the load gauges also need
# enable_iter_perf_stats), with names (tensorrt_llm/metrics/collector.py, trtllm_*) that
# differ between releases and could not be read at the v1.2.1 tag: left off until they are
# (docs/engines.md, "Metrics").
METRICS_PATH: str | None = None
METRICS_PORTS: tuple[str, ...] = ()
METRICS: MetricNames | None = None
# TensorRT-LLM's own serving benchmark, in every release image with the wheel
# (tensorrt_llm/serve/scripts/benchmark_serving.py, `python -m` as NVIDIA's serving
# benchmark guide runs it). Options as its argparser defines them in the 1.2 line:
# --backend openai (the /v1/completions route; openai-chat would be the chat route),
# --dataset-name random with --random-ids (random token ids, nothing downloaded; without it the
# random set wants a dataset path), --random-range-ratio 0 (lengths in [L(1-r), L(1+r)], so
# exact), --model is required and is what requests carry, --tokenizer is loaded with
# AutoTokenizer (the model's directory, local). The result (--save-result, --result-filename
# joined to --result-dir) is one JSON document: `completed` of `num_prompts` (no `failed`
# key), mean/median/std/pNN of each --percentile-metrics metric (`e2el` only when asked).
BENCH_CLIENT = BenchClient(
    "trtllm",
    "tensorrt_llm.serve.scripts.benchmark_serving",
    ("-m", "tensorrt_llm.serve.scripts.benchmark_serving"),
    "openai",
    "result.json",
    f"tensorrt_llm=={TRTLLM_VERSION}, in the TensorRT-LLM image (its wheels are on "
    "pypi.nvidia.com, not PyPI: pip install tensorrt_llm --extra-index-url "
    "https://pypi.nvidia.com)",
    ResultFormat(
        json_lines=False, median="p50_{metric}_ms", e2e_metric="e2el", counts_failed=False
    ),
    openai_bench_options("--random-ids"),
)
PUBLISHED_FIGURES: tuple[PublishedFigure, ...] = ()
# The PyTorch backend's JIT-compiled kernels: DeepGEMM (its own DG_JIT_CACHE_DIR), Triton,
# torch.compile's Inductor, FlashInfer's JIT workspace, the CUDA JIT cache; the rest of what
# it caches under the home directory's .cache goes with XDG_CACHE_HOME.
COMPILE_CACHES = (
    ("DG_JIT_CACHE_DIR", "deep_gemm"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("FLASHINFER_WORKSPACE_BASE", ""),
    ("CUDA_CACHE_PATH", "nv"),
    ("XDG_CACHE_HOME", "xdg"),
)
CONTAINER_NEEDS = ContainerNeeds(
    cap_add=(
        (
            "SYS_PTRACE",
            "Open MPI copies between the ranks of a node with process_vm_readv (CMA), which "
            "Docker's default seccomp profile allows only with CAP_SYS_PTRACE",
        ),
    ),
    ulimits=(
        (
            "stack=67108864:67108864",
            "the 64 MiB stack NVIDIA's TensorRT-LLM container instructions ask for",
        ),
    ),
    compile_caches=COMPILE_CACHES,
)
# Tunables only TensorRT-LLM reads, each with the layouts that read it.
OWN_TUNABLES: dict[str, tuple[str, ...]] = own_tunables("k2_trtllm_", layout_names(LAYOUTS))
# mpirun takes its hosts as -H host:slots, where an IPv6 literal's colons break the list.
NO_IPV6: str | None = "mpirun host list (-H host:slots) cannot carry an IPv6 literal"
# The `serve` options (SERVE_OPTIONS) have neither a key nor a certificate.
NO_API_KEY: str | None = "trtllm-serve 1.2 has no key option, tensorrt_llm/commands/serve.py"
NO_TLS: str | None = "trtllm-serve 1.2 has no certificate option, tensorrt_llm/commands/serve.py"
DIST_PORT_SPAN = 0
BATCH_TUNABLES: tuple[BatchTunable, ...] = ()


def pool_shape(cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
    """Attention DP over all GPUs, MoE EP within a node."""
    gpn = cluster.gpus_per_node
    return Parallel(tp=nodes * gpn, dp=nodes * gpn, ep=gpn, dp_attention=True)


def weight_slices(cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
    """Each expert's intermediate over the MoE TP size tp / ep, i.e. the node count
    (tensorrt_llm/_torch/modules/fused_moe/interface.py MoE: intermediate_size_per_partition
    = intermediate_size // moe_tp_size); with attention DP the dense MLP and the shared
    experts are not split (_torch/models/modeling_deepseekv3.py `_compute_mlp_tp_size`,
    `_compute_shared_expert_tp_size`: TP 1 under enable_attention_dp)."""
    return WeightSlices(expert=parallel.tp // parallel.ep, shared=1, dense=1)


def kernel_path_problems(cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
    """FP8 block-scale experts run on CUTLASS on Hopper and on DeepGEMM on Blackwell (see
    moe_backend); the render names no path for other expert formats (the catalog serves none
    on this engine)."""
    experts = spec.quantization.routed_experts
    if experts.scheme != "fp8_block":
        return [
            f"the TensorRT-LLM render has no MoE backend for {spec.id}'s {experts.label} experts"
        ]
    return []


def kv_dtype(tunables: Tunables, gpu: GpuSpec) -> KvDtype:
    """k2_trtllm_kv_cache_dtype, FP8 only where the GPU has it."""
    return "fp8" if tunables.trtllm_kv_cache_dtype == "fp8" and gpu.fp8 else "bf16"


def kv_dtype_problems(tunables: Tunables, gpu: GpuSpec) -> list[str]:
    """k2_kv_cache_dtype is not TensorRT-LLM's setting."""
    if tunables.kv_cache_dtype == "fp8":
        return [
            "k2_kv_cache_dtype=fp8: TensorRT-LLM's KV dtype is k2_trtllm_kv_cache_dtype "
            f"({tunables.trtllm_kv_cache_dtype}); fix: unset k2_kv_cache_dtype"
        ]
    return []


def served_name(cluster: Cluster) -> str:
    """trtllm-serve has no served-model-name option: it lists the directory's base name."""
    return served_model_name(cluster.model_dir)


def plan_warnings(cluster: Cluster, spec: ModelSpec, release: EngineRelease) -> list[str]:
    """None: the published image lacks sshd for mpirun's mesh, so the plan runs the one
    containers/trtllm builds from it (plan/images.py), unless k2_image names another."""
    return []


# ---------------------------------------------------------------- memory accounting

# TensorRT-LLM 1.2 (KvCacheConfig.free_gpu_memory_fraction): KV = fraction x the memory
# free after weights and warm-up; graphs and buffers allocated later need the rest.
KV_PAGE_TOKENS = 1


def reserve(f: PoolFit) -> MemoryReserve:
    """TensorRT-LLM: warm-up activations for max_num_tokens, graphs for the padded batch
    sizes (powers of two up to 128), NCCL/MPI buffers."""
    t = f.tunables
    p = f.parallel
    graph_max = min(t.trtllm_max_batch_size, 128)
    graphs = int(math.log2(graph_max)) + 1
    return MemoryReserve(
        activations=round(activations_gib(t.trtllm_max_num_tokens, f.spec, p), 2),
        cuda_graphs=round(graph_gib(graph_max, graphs, f.spec, p), 2),
        comm_buffers=round(collective_buffers_gib(p.tp, f.gpus_per_node), 2),
        runtime=RUNTIME_GIB,
        margin=t.reserve_gib,
    )


def kv_budget(f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
    """The fraction of the memory free after weights and warm-up that leaves the graphs and
    the margin, allocated later, outside."""
    free = (
        f.gpu.usable_gib
        - weights_gib
        - reserve.activations
        - reserve.comm_buffers
        - reserve.runtime
    )
    later = reserve.cuda_graphs + reserve.margin
    fraction = floor2(1 - later / free) if free > later else 0.0
    return KvBudget(fraction, weights_gib + fraction * max(free, 0.0), fraction * max(free, 0.0))
