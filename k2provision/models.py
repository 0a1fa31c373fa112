"""Typed records shared by the pure core: what the inventory says, and what the plan decides.

Every record is frozen and rejects unknown keys: a typo in data is an error, not a silent default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

EngineName = Literal["sglang", "trtllm", "vllm", "ktransformers"]
PoolName = Literal["nodes", "prefill", "decode"]
Role = Literal["node", "prefill", "decode", "router"]

ENGINES: tuple[EngineName, ...] = ("sglang", "trtllm", "vllm", "ktransformers")
LAYOUTS: dict[str, tuple[str, ...]] = {
    "sglang": ("tp", "pd"),
    "trtllm": ("tp_ep",),
    "vllm": ("tp", "tp_pp", "dp_ep"),
    "ktransformers": ("single",),
}


class Record(BaseModel):
    """Base of all records: immutable, strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- what the inventory says


class HostSpec(Record):
    """One inventory host as k2provision sees it."""

    name: str
    address: str
    pool: PoolName | Literal["router"]
    local_ip: str
    ib_devices: tuple[str, ...] = ()


class Tunables(Record):
    """Knobs with sane defaults that an inventory may override (k2_<field> variables)."""

    api_port: int = 8000
    sglang_port: int = 30000
    dist_port: int = 5757
    bootstrap_port: int = 8998
    ray_port: int = 6379
    dp_rpc_port: int = 13345
    ssh_port: int = 2233
    served_model_name: str = "kimi-k2"
    config_dir: str = "/etc/k2provision"
    max_running_requests_prefill: int = 1024
    cuda_graph_max_bs_decode: int = 480
    # Tokens one SGLang prefill instance takes per chunk, across the whole instance:
    # `--chunked-prefill-size` as SGLang reads it, which divides it by the attention-DP
    # size (524288 over DP 32: 16384 tokens per rank), the production PD value.
    chunked_prefill_size: int = 524288
    pd_transfer_backend: Literal["mooncake", "nixl"] = "mooncake"
    # Bounded: the seed's 1e5..1e7 s values switch PD failure detection off.
    pd_timeout_s: int = Field(default=600, ge=30, le=3600)
    health_timeout_s: int = 3600
    vllm_max_num_batched_tokens: int = 8192
    vllm_max_num_seqs: int = 256
    # vLLM's all-to-all for expert parallelism across nodes (the DeepEP kernels are what
    # vLLM's expert-parallel deployment guide names for multi-node).
    vllm_all2all_backend: Literal[
        "deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter"
    ] = "deepep_low_latency"
    # Spare expert slots for vLLM's EPLB in layout dp_ep; None: one per GPU.
    vllm_redundant_experts: int | None = Field(default=None, ge=0)
    trtllm_max_batch_size: int = 128
    trtllm_max_num_tokens: int = 4096
    trtllm_kv_cache_dtype: Literal["fp8", "auto"] = "fp8"
    # KV cache tokens of the KTransformers server (SGLang's --max-total-tokens).
    ktransformers_cache_lens: int = 30000
    # Routed experts per layer kept on the GPU (the rest run on the CPU with kt-kernel).
    ktransformers_gpu_experts: int = Field(default=0, ge=0)
    # kt-kernel CPU threads; None: the host's physical cores minus its GPUs, found at launch.
    ktransformers_cpuinfer: int | None = Field(default=None, ge=1)
    decode_redundant_experts: int | None = None
    # Spare expert slots of the PD prefill pool; None: one per prefill GPU.
    prefill_redundant_experts: int | None = Field(default=None, ge=0)
    reserve_gib: float = 4.0
    # A config.json (on the controller, e.g. in a local mirror of the model) whose
    # architecture numbers override the catalog's.
    model_config_json: str | None = None
    # The socket interface of NCCL, Gloo and Open MPI; None: on each host, the interface
    # that holds its k2_local_ip, found by the launch script when the process starts.
    socket_ifname: str | None = None
    image: str | None = None
    # The image the PD router runs in; None: the engine image (see catalog.ROUTER).
    router_image: str | None = None


class Cluster(Record):
    """The inventory, validated: which hosts, which engine and layout, which model and hardware."""

    inventory: str
    engine: EngineName
    layout: str
    model: str
    model_dir: str
    gpu: str
    gpus_per_node: int = Field(gt=0)
    context_length: int | None = None
    hosts: tuple[HostSpec, ...]
    router: str | None = None
    lab: bool = False
    tunables: Tunables = Tunables()

    def pool(self, name: PoolName) -> tuple[HostSpec, ...]:
        """Hosts of one pool, in inventory order."""
        return tuple(h for h in self.hosts if h.pool == name)

    def host(self, name: str) -> HostSpec:
        """The host called `name` (KeyError if absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


# ---------------------------------------------------------------- catalog


class ModelSpec(Record):
    """A model's architecture numbers (from its config.json) and checkpoint facts."""

    id: str
    revision: str = "main"
    architectures: tuple[str, ...]
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    weight_block_size: tuple[int, int] = (128, 128)
    checkpoint_gib: float
    shard_count: int
    # The engines' parser names for this model's tool calls and reasoning (None: none).
    tool_parser: str | None = "kimi_k2"
    reasoning_parser: str | None = None


class GpuSpec(Record):
    """A GPU model: what nvidia-smi calls it, its memory, and the system it comes in."""

    key: str
    product_pattern: str
    memory_mib: int
    fp8: bool
    nvswitch: bool
    min_driver: str


class EngineRelease(Record):
    """The engine release the renders target, and its container image."""

    engine: EngineName
    version: str
    image: str
    min_driver: str


class RouterRelease(Record):
    """The PD router: its own package, pinned apart from the engine's."""

    package: str
    version: str
    launcher: tuple[str, ...]


# ---------------------------------------------------------------- what the plan decides


class Parallel(Record):
    """Parallel sizes of one serving pool."""

    tp: int
    dp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False
    redundant_experts: int = 0

    @property
    def attention_tp(self) -> int:
        """How many GPUs split one attention layer's heads."""
        return self.tp // self.dp if self.dp_attention else self.tp


class PoolPlan(Record):
    """One group of hosts that forms one serving instance (or the single pool)."""

    name: PoolName
    hosts: tuple[str, ...]
    master: str
    master_address: str
    gpus: int
    parallel: Parallel
    mem_fraction: float


class FitReport(Record):
    """Memory arithmetic for one pool, per GPU, in GiB and tokens."""

    pool: PoolName
    gpu_memory_gib: float
    budget_gib: float
    weights_gib: float
    reserve_gib: float
    kv_gib: float
    kv_bytes_per_token: int
    kv_tokens_per_gpu: int
    kv_tokens_total: int
    context_length: int
    fits: bool


class HealthGate(Record):
    """How to know a process is ready before the next stage starts.

    One of two kinds: `url`, polled with HTTP GET until it answers `expect_status`; or
    `command`, run inside the process's container (docker exec) until it exits 0. Both give up
    after `timeout_s`. A URL gate serializes exactly as before command gates existed.
    """

    url: str | None = None
    expect_status: int = 200
    command: tuple[str, ...] = ()
    timeout_s: int = 3600

    @model_validator(mode="after")
    def _one_kind(self) -> HealthGate:
        if (self.url is None) == (not self.command):
            raise ValueError("a health gate has exactly one of url and command")
        return self

    @model_serializer(mode="wrap")
    def _only_its_kind(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        drop = ("url", "expect_status") if self.command else ("command",)
        return {k: v for k, v in data.items() if k not in drop}


class LaunchValue(Record):
    """A value only the host itself knows, found by the launch script before the process starts.

    `argv` and `env` of the process refer to it as `${name}`. Kinds: `ifname-of IP` (the
    network interface that holds IP), `cidr-of IP` (that interface's subnet),
    `physical-cores-minus N` (physical CPU cores this process may use, minus N) and
    `numa-nodes` (NUMA nodes of the host).
    """

    name: str
    kind: Literal["ifname-of", "cidr-of", "physical-cores-minus", "numa-nodes"]
    arg: str = ""

    @property
    def ref(self) -> str:
        """How argv and env refer to the value."""
        return "${" + self.name + "}"


class Process(Record):
    """One thing to run on a host: a container's main command, or a command exec'd inside one."""

    name: str
    container: str
    image: str
    argv: tuple[str, ...]
    env: dict[str, str] = {}
    stage: int = 0
    exec_in: bool = False
    gpus: bool = True
    health: HealthGate | None = None
    resolve: tuple[LaunchValue, ...] = ()

    @model_serializer(mode="wrap")
    def _no_empty_resolve(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.resolve:
            data.pop("resolve", None)
        return data


class ContainerOptions(Record):
    """docker run options shared by every engine container of a plan.

    `reasons` says why each option is there, keyed by the option as docker reads it
    (`--cap-add IPC_LOCK`, `--device /dev/infiniband`, ...): an option without a reason is
    one nobody should render.
    """

    network: str = "host"
    ipc: str = "host"
    gpus: str | None = "all"
    privileged: bool = False
    cap_add: tuple[str, ...] = ("IPC_LOCK", "SYS_NICE")
    ulimits: tuple[str, ...] = (
        "memlock=-1:-1",
        "stack=67108864:67108864",
        "nofile=1048576:1048576",
    )
    devices: tuple[str, ...] = ("/dev/infiniband",)
    volumes: tuple[str, ...] = ()
    reasons: dict[str, str] = {}


class HostPlan(Record):
    """Everything one host does: its role, rank, processes and files."""

    name: str
    address: str
    role: Role
    pool: PoolName | Literal["router"]
    node_rank: int
    gpus: int
    processes: tuple[Process, ...] = ()
    files: dict[str, str] = {}


class Plan(Record):
    """The whole decision: an exact description of what runs where."""

    engine: EngineName
    engine_version: str
    layout: str
    model: str
    model_dir: str
    gpu: str
    endpoint: str
    endpoint_host: str
    served_model_name: str
    config_dir: str
    lab: bool
    container: ContainerOptions
    pools: tuple[PoolPlan, ...]
    fit: tuple[FitReport, ...]
    warnings: tuple[str, ...]
    hosts: tuple[HostPlan, ...]

    def host(self, name: str) -> HostPlan:
        """The plan of host `name` (KeyError if absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)
