"""The types every engine module shares: what an engine gets, what it returns, its interface.

A module of its own so that engine modules import these types without importing the registry
(engines/__init__.py), which imports the engine modules: imports run one way only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    EngineRelease,
    EngineSupport,
    GpuSpec,
    KvDtype,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    PoolPlan,
    Process,
    Record,
    Tunables,
    WorkerRegistration,
)
from k2provision.engines.memory import KvBudget, PoolFit


class Deployment(Record):
    """What a renderer needs: the cluster, the model, the release and the decided pools."""

    cluster: Cluster
    model: ModelSpec
    release: EngineRelease
    pools: tuple[PoolPlan, ...]
    context_length: int
    image: str
    router_image: str = ""
    """The image a router runs in (plan/images.py); empty: the engine's image."""
    # Decided by the plan's memory fit (the fit counts exactly what is rendered):
    kv_cache_dtype: KvDtype = "bf16"
    multimodal: bool = False  # the vision tower is loaded and image input is served
    language_model_only: bool = False  # a multimodal model served text-only (vLLM)

    def pool(self, name: PoolName) -> PoolPlan:
        """The pool called `name` (KeyError if the layout has none)."""
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


class Listener(Record):
    """A listening socket (or a run of them) that one of a host's rendered processes opens,
    named by the inventory variable that sets its port."""

    setting: str
    """The inventory variable of the port (``k2_sglang_port``)."""
    what: str
    port: int
    count: int = 1
    process: str
    container: str
    """The container that holds the port once it runs."""
    bind: str
    """The address the process is told to bind: the host's k2_local_ip, or a wildcard (every
    interface) for the endpoint and where the pinned engine offers no choice."""
    public: bool = False
    """The endpoint: the one listener users reach, on every interface."""
    wildcard_why: str = ""
    """Why a listener other than the endpoint binds every interface (the pinned release's
    source that fixes it); empty where it binds k2_local_ip."""

    @property
    def last(self) -> int:
        """The last port of the run."""
        return self.port + self.count - 1

    def __str__(self) -> str:
        """`k2_api_port=8000 (the PD router)`, with the run of ports where there is one."""
        run = f", ports {self.port}-{self.last}" if self.count > 1 else ""
        return f"{self.setting}={self.port} ({self.what}{run})"


def layout_names(layouts: tuple[Layout, ...]) -> tuple[str, ...]:
    """The names of `layouts`, in order."""
    return tuple(layout.name for layout in layouts)


def listener(
    process: Process,
    setting: str,
    what: str,
    port: int,
    *,
    bind: str,
    count: int = 1,
    public: bool = False,
    wildcard_why: str = "",
) -> Listener:
    """What `process` binds: `count` ports from `port` on `bind`, set by `setting`."""
    return Listener(
        setting=setting,
        what=what,
        port=port,
        count=count,
        process=process.name,
        container=process.container,
        bind=bind,
        public=public,
        wildcard_why=wildcard_why,
    )


class HostRender(Record):
    """One host's share of a rendering: its processes, their files, and every port they bind
    (in process order), which the plan records and checks for clashes."""

    processes: tuple[Process, ...] = ()
    files: dict[str, str] = {}
    listeners: tuple[Listener, ...] = ()


@dataclass(frozen=True)
class ContainerNeeds:
    """What an engine adds to the docker run options, each with its reason."""

    cap_add: tuple[tuple[str, str], ...] = ()
    """(capability, why)."""
    ulimits: tuple[tuple[str, str], ...] = ()
    """(ulimit, why), set ahead of the open-files limit every engine gets."""
    compile_caches: tuple[tuple[str, str], ...] = ()
    """(environment variable, subdirectory): where the engine's compile and JIT caches go,
    each pointed at a subdirectory of the host's compile cache volume (plan/caches.py) so a
    restart finds what the last start compiled."""


@dataclass(frozen=True)
class ResultFormat:
    """How a bench client writes its result file."""

    json_lines: bool
    """One JSON line appended per run (this run's is the last), else one JSON document."""
    median: str
    """The key of a metric's median, `{metric}` standing for the metric."""
    e2e_metric: str
    """The metric name of the end-to-end latency."""
    counts_failed: bool
    """The file has `failed`; otherwise the prompts not `completed` failed."""
    dropped: tuple[str, ...] = ()
    """Keys the run record leaves out of each document (a copy of the server's settings)."""
    no_p90: tuple[str, ...] = ()
    """Metrics the client writes no 90th percentile of (the run record says null)."""


@dataclass(frozen=True)
class PublishedFigure:
    """A throughput an engine's authors published for a layout and a bench workload."""

    layout: str
    workload: str
    metric: Literal["input", "output"]
    per_node: float
    source: str


@dataclass(frozen=True)
class BatchTunable:
    """A tunable whose smaller values leave more GPU memory (buffers and graphs sized for the
    largest batch), at the cost of that batch: a fix hint offers the largest candidate below
    the current value that makes the pool fit."""

    field: str
    """The Tunables field."""
    layouts: tuple[str, ...]
    pools: tuple[PoolName, ...]
    candidates: tuple[int, ...]
    """Values to try, largest first."""
    effect: str
    """What the value bounds, for the hint: `{value}` stands for it."""

    @property
    def variable(self) -> str:
        """The inventory variable (k2_ and the field)."""
        return f"k2_{self.field}"


@dataclass(frozen=True)
class BenchClient:
    """The pinned benchmark client that fits an engine, and how it is invoked."""

    kind: str
    """Whose client it is (the engine that ships it), as the run record names it."""
    module: str
    """The module the client's Python must import (checked before any run)."""
    command: tuple[str, ...]
    """What follows the Python interpreter: `-m MODULE [SUBCOMMAND...]`."""
    backend: str
    result_name: str
    """The result file's name in the run's directory."""
    install: str
    """The pinned client's package, and how to get it."""
    result_format: ResultFormat
    options: tuple[str, ...]
    """The client's own options after the common ones; `{field}` stands for a field of the
    run (ops/bench.py RunSpec: served_model_name, tokenizer, out_dir) or `result_name`,
    `percentiles`."""

    @property
    def label(self) -> str:
        return "python " + " ".join(self.command)


@dataclass(frozen=True)
class RankLoadNames:
    """Load gauges per rank from a route of the instance's HTTP server that covers every rank
    of an instance on several hosts, where the engine's own gauges cover only the ranks of the
    server's node."""

    path: str
    """The route (scraped on the instance's first host)."""
    params: tuple[tuple[str, str], ...]
    """Its query parameters."""
    running: str
    """Gauge of requests running, per rank."""
    queued: str
    """Gauge of requests waiting, per rank."""
    kv_usage: str
    """Gauge of the KV cache's used fraction, per rank."""
    published: str = ""
    """Gauge of when each rank last published its load (Unix seconds): a rank that holds
    requests and has published nothing for long is stuck (ops/rank_liveness.py); empty: the
    engine publishes no such time."""


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus series an engine's servers export, by what they measure: the dashboards
    and alert rules (plan/dashboards.py, plan/alert_rules.py) ask every engine's names."""

    prompt_tokens: str
    """Counter of prompt tokens."""
    generation_tokens: str
    """Counter of generated tokens."""
    running: str
    """Gauge of requests running."""
    queued: str
    """Gauge of requests waiting."""
    kv_usage: str
    """Gauge of the KV cache's used fraction."""
    ttft: str
    """Histogram of the time to first token (seconds), without `_bucket`."""
    inter_token: str
    """Histogram of the inter-token latency (seconds)."""
    e2e: str
    """Histogram of the end-to-end request latency (seconds)."""
    kv_transfer_latency: str | None = None
    """Histogram of a disaggregated layout's KV transfer latency (ms); None without one."""
    kv_transfer_speed: str | None = None
    """Histogram of its KV transfer speed (GB/s)."""
    kv_bootstrap: str | None = None
    """Histogram of its KV bootstrap time (ms)."""
    rank_load: RankLoadNames | None = None
    """Where every rank's load of an instance on several hosts is read (None: the gauges
    above cover every rank)."""


@dataclass(frozen=True)
class WeightSlices:
    """Over how many ranks a pool cuts each MLP weight's intermediate dimension (1: every
    rank that holds the weight holds all of it). The plan checks each slice against the
    weight's stored format (plan/shapes.py split_problems)."""

    expert: int
    """Each routed expert's moe_intermediate_size."""
    shared: int
    """The shared experts' intermediate size."""
    dense: int
    """The dense MLP's intermediate_size (the first_k_dense_replace layers)."""


class Engine(Protocol):
    """The interface every engine module implements: all that is engine-specific.

    The plan asks these (``REGISTRY[cluster.engine]``) instead of naming an engine."""

    DISPLAY_NAME: str
    """The engine's name as its authors write it, for messages."""
    RELEASE: EngineRelease
    """The pinned release the renders follow, and its image."""
    SUPPORT: dict[str, EngineSupport]
    """Per catalog model id, the first release of the engine that serves it (a model absent
    here, or with no min_version, is one no release is known to serve)."""
    LAYOUTS: tuple[Layout, ...]
    """The layouts the engine renders, in the order tables and fix hints list them."""
    SINGLE_GPU: bool
    """A pool uses one GPU of its host, whatever the host has."""
    ROUTED_EXPERTS_ON_HOST: bool
    """Routed experts live in host memory, not on the GPU."""
    TEXT_ONLY: bool
    """The pinned release can leave a multimodal model's vision tower unloaded."""
    FP8_KV: bool
    """k2_kv_cache_dtype=fp8 renders an FP8 KV cache for MLA."""
    DCP_LAYOUTS: tuple[str, ...]
    """Layouts with decode context parallelism."""
    SPARE_EXPERT_TUNABLES: dict[PoolName, str]
    """Per pool, the Tunables field of its spare expert slots, where the engine takes them: a
    fix hint offers the count that lets the pool's expert parallelism divide the experts."""
    DCP_TUNABLE: str | None
    """The Tunables field that sets the decode context parallel size (a fix hint offers
    other sizes); None where the engine has none."""
    FLEET_LAYOUTS: tuple[str, ...]
    """Layouts the engine renders as fleets (a pool of several instances behind one router);
    the plan refuses k2_instances above 1 in the others."""
    HEALTH_PATH: str
    """The path of the HTTP health gate of the engine's servers."""
    METRICS_PATH: str | None
    """The Prometheus metrics path the plan renders, None while it renders none."""
    METRICS_PORTS: tuple[str, ...]
    """The port settings (``k2_sglang_port``) whose listeners serve METRICS_PATH."""
    METRICS: MetricNames | None
    """The names of the series METRICS_PATH serves, None while the plan scrapes none."""
    BENCH_CLIENT: BenchClient
    PUBLISHED_FIGURES: tuple[PublishedFigure, ...]
    """Throughputs published for this engine, beside which bench reports its own."""
    CONTAINER_NEEDS: ContainerNeeds
    KV_PAGE_TOKENS: int
    """The KV cache is counted in whole pages of this many tokens (1: no pages)."""
    OWN_TUNABLES: dict[str, tuple[str, ...]]
    """Tunables (k2_ names) no other engine reads, each with this engine's layouts that do."""
    DIST_PORT_SPAN: int
    """The ports after k2_dist_port the engine also takes (0: only that one)."""
    NO_IPV6: str | None
    """Why the engine cannot be wired with IPv6 literal addresses; None when it can."""
    NO_API_KEY: str | None
    """Why the endpoint cannot take k2_api_key_file (the plan refuses it); None when it can."""
    NO_TLS: str | None
    """Why the endpoint cannot serve k2_tls_cert_file (the plan refuses it); None when it can."""
    BATCH_TUNABLES: tuple[BatchTunable, ...]
    """Tunables that give up batch size for memory, which fix hints offer when a pool does
    not fit."""

    def render(self, deployment: Deployment) -> dict[str, HostRender]:
        """Processes and files per host name."""
        ...

    def endpoint(self, deployment: Deployment) -> str:
        """The OpenAI-compatible base URL clients use."""
        ...

    def instance_url(self, cluster: Cluster, instance: PoolPlan) -> str:
        """Where a fleet's router reaches one instance (its master's server)."""
        ...

    def router_worker(self, cluster: Cluster, instance: PoolPlan) -> WorkerRegistration:
        """How the fleet's router takes `instance` (its url set) back after a rolling change."""
        ...

    def pool_shape(self, cluster: Cluster, pool: PoolName, nodes: int, spec: ModelSpec) -> Parallel:
        """The parallel sizes of one pool of `nodes` hosts in the cluster's layout."""
        ...

    def weight_slices(self, cluster: Cluster, pool: PoolName, parallel: Parallel) -> WeightSlices:
        """How the pinned release splits the MLP weights of a pool of this shape."""
        ...

    def kernel_path_problems(self, cluster: Cluster, pool: PoolName, spec: ModelSpec) -> list[str]:
        """Why the pinned release has no MoE kernel and all-to-all path for the model's weight
        format in this layout and pool (empty: the path the render takes exists)."""
        ...

    def kv_dtype(self, tunables: Tunables, gpu: GpuSpec) -> KvDtype:
        """The KV cache dtype the render gives the engine."""
        ...

    def kv_dtype_problems(self, tunables: Tunables, gpu: GpuSpec) -> list[str]:
        """KV dtype settings the engine or the GPU cannot honour."""
        ...

    def served_name(self, cluster: Cluster) -> str:
        """The model id the engine's API lists."""
        ...

    def plan_warnings(self, cluster: Cluster, spec: ModelSpec, release: EngineRelease) -> list[str]:
        """What the operator should know about this engine on this cluster."""
        ...

    def reserve(self, f: PoolFit) -> MemoryReserve:
        """What the engine needs per GPU besides weights and KV cache (plan/fit.py)."""
        ...

    def kv_budget(self, f: PoolFit, reserve: MemoryReserve, weights_gib: float) -> KvBudget:
        """The memory fraction to render, the memory it governs and the KV cache it leaves."""
        ...
