"""Typed records shared by the pure core: what the inventory says, and what the plan decides.

Every record is frozen and rejects unknown keys: a typo in data is an error, not a silent default.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
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


# Every numeric knob has a range: a value outside it is a typo or a misunderstanding, and it is
# refused with the range before anything runs. The README's reference lists these ranges.
Port = Annotated[int, Field(ge=1, le=65535)]


def _absolute_path(value: str) -> str:
    parts = set(value.split("/"))
    if not value.startswith("/") or {".", ".."} & parts or re.search(r"[\s:,]", value):
        raise ValueError("expected an absolute path without '.', '..', whitespace, ':' or ','")
    return value


# An absolute, normalised path that can stand in a `docker run -v SRC:DST:ro` volume.
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
# A word without whitespace: a name passed as one argv item.
Word = Annotated[str, Field(pattern=r"^\S+$")]
NUMERIC_ANNOTATIONS: tuple[Any, ...] = (int, float, int | None, float | None)


def reject_bool_number(value: Any, info: ValidationInfo, fields: dict[str, Any]) -> Any:
    """true/false is not a number (pydantic would read it as 1/0)."""
    field = fields.get(info.field_name or "")
    if isinstance(value, bool) and field is not None and field.annotation in NUMERIC_ANNOTATIONS:
        raise ValueError("Input should be a number, not a boolean")
    return value


class Tunables(Record):
    """Knobs with sane defaults that an inventory may override (k2_<field> variables)."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    api_port: Port = Field(default=8000, description="the public OpenAI-compatible endpoint")
    sglang_port: Port = Field(default=30000, description="every SGLang server's HTTP port")
    dist_port: Port = Field(
        default=5757,
        description="rank 0's torch.distributed rendezvous; SGLang with DP attention also "
        "takes the next 6 ports",
    )
    bootstrap_port: Port = Field(default=8998, description="SGLang PD's KV bootstrap server")
    ray_port: Port = Field(default=6379, description="the vLLM Ray head")
    dp_rpc_port: Port = Field(default=13345, description="vLLM data-parallel RPC on the head")
    ssh_port: Port = Field(
        default=2233, description="sshd inside engine containers, for mpirun (TensorRT-LLM)"
    )
    served_model_name: Word = Field(
        default="kimi-k2", description="the model id clients send and /v1/models lists"
    )
    config_dir: AbsolutePath = Field(
        default="/etc/k2provision", description="where hosts keep launch scripts and configs"
    )
    max_running_requests_prefill: int = Field(
        default=1024, ge=1, le=65536, description="SGLang PD: concurrent requests per prefill"
    )
    cuda_graph_max_bs_decode: int = Field(
        default=480,
        ge=1,
        le=4096,
        description="SGLang PD: largest decode batch per rank captured in a CUDA graph",
    )
    chunked_prefill_size: int = Field(
        default=131072, ge=1, le=1048576, description="SGLang PD: tokens per prefill chunk"
    )
    pd_transfer_backend: Literal["mooncake", "nixl"] = Field(
        default="mooncake", description="SGLang PD: KV transfer between the pools"
    )
    # Bounded: the seed's 1e5..1e7 s values switch PD failure detection off.
    pd_timeout_s: int = Field(
        default=600, ge=30, le=3600, description="SGLang PD: bootstrap and waiting timeouts"
    )
    health_timeout_s: int = Field(
        default=3600,
        ge=60,
        le=86400,
        description="seconds a process may take to pass its health gate",
    )
    vllm_max_num_batched_tokens: int = Field(
        default=8192, ge=1, le=1048576, description="vLLM dp_ep: tokens per engine step"
    )
    vllm_max_num_seqs: int = Field(
        default=256, ge=1, le=65536, description="vLLM dp_ep: sequences per engine step"
    )
    trtllm_max_batch_size: int = Field(
        default=128, ge=1, le=4096, description="TensorRT-LLM: requests per batch"
    )
    trtllm_max_num_tokens: int = Field(
        default=4096, ge=1, le=1048576, description="TensorRT-LLM: tokens per batch"
    )
    trtllm_kv_cache_dtype: Literal["fp8", "auto"] = Field(
        default="fp8", description="TensorRT-LLM: KV cache data type"
    )
    ktransformers_cache_lens: int = Field(
        default=30000, ge=1, le=2097152, description="KTransformers: KV cache size in tokens"
    )
    ktransformers_optimize_config: Word | None = Field(
        default=None, description="KTransformers: an injection rule file (--optimize_config_path)"
    )
    decode_redundant_experts: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="SGLang PD: spare expert slots in the decode pool (default: one per GPU)",
    )
    reserve_gib: float = Field(
        default=4.0,
        ge=0,
        le=256,
        description="GiB per GPU kept for activations, CUDA graphs and communication buffers",
    )
    # A config.json (on the controller, e.g. in a local mirror of the model) whose
    # architecture numbers override the catalog's.
    model_config_json: Word | None = Field(
        default=None,
        description="a config.json on the controller whose numbers override the catalog's "
        "(relative: to the inventory's directory)",
    )
    socket_ifname: Word | None = Field(
        default=None, description="NCCL/GLOO socket interface (e.g. bond0)"
    )
    image: Word | None = Field(default=None, description="override the engine image")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_bool_number(value, info, cls.model_fields)


class Cluster(Record):
    """The inventory, validated: which hosts, which engine and layout, which model and hardware."""

    inventory: str
    engine: EngineName
    layout: str
    model: str
    model_dir: AbsolutePath
    gpu: str
    gpus_per_node: int = Field(ge=1, le=16)
    context_length: int | None = Field(default=None, ge=1, le=2097152)
    hosts: tuple[HostSpec, ...]
    router: str | None = None
    lab: bool = False
    tunables: Tunables = Tunables()

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_bool_number(value, info, cls.model_fields)

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


class ContainerOptions(Record):
    """docker run options shared by every engine container of a plan."""

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
    model_dir: AbsolutePath
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
