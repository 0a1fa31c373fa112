"""Typed records shared by the pure core: what the inventory says, and what the plan decides.

Every record is frozen and rejects unknown keys: a typo in data is an error, not a silent default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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

# An engine's name: a key of the engine registry (engines/__init__.py REGISTRY), which the
# inventory contract is checked against; the records name no engine themselves.
EngineName = str
PoolName = Literal["nodes", "prefill", "decode"]
Role = Literal["node", "prefill", "decode", "router", "spare"]

# The lab stand-in's fault modes (k2_lab_fault; die_after and slow take =<seconds>).
LAB_FAULTS = ("exit_at_start", "never_healthy", "wrong_answer", "die_after", "slow")
TIMED_LAB_FAULTS = ("die_after", "slow")
# The most serving instances one pool may hold (k2_instances and its PD forms).
MAX_INSTANCES = 64


class Record(BaseModel):
    """Base of all records: immutable, strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- what the inventory says


class HostSpec(Record):
    """One inventory host as k2provision sees it."""

    name: str
    address: str
    pool: PoolName | Literal["router", "spare"]
    local_ip: str
    ib_devices: tuple[str, ...] = ()
    # Lab plans only: the stand-in fault this host's engine containers run with (K2_LAB_FAULT).
    lab_fault: str | None = None
    weights_port: int | None = None
    """The port the weights relay listens on here (k2_weights_port, a k2_weights role
    variable), which the plan checks against the engine's ports."""
    address_from: str = "ansible_host"
    """The variable that set `address` (ansible_host or its alias ansible_ssh_host, as Ansible
    resolves them: core/connection.py); empty where the inventory name is the address."""
    ssh_port: int = 22
    """The port Ansible reaches this host's sshd on, which no listener of the plan may take."""
    ssh_port_from: str = ""
    """The variable that set `ssh_port` (ansible_port or ansible_ssh_port); empty: neither."""
    monitoring_server: bool = True
    """k2_monitoring_server as this host sets it: where it is the monitoring host, whether it
    runs Prometheus and Grafana."""

    @property
    def address_setting(self) -> str:
        """`ansible_host=gpu1.example`, or the inventory name where it is the address."""
        if not self.address_from:
            return f"the inventory name {self.name} (no ansible_host)"
        return f"{self.address_from}={self.address}"

    @property
    def ssh_port_setting(self) -> str:
        """`ansible_ssh_port=2222`, or `22 (Ansible's default: no ansible_port)`."""
        if not self.ssh_port_from:
            return f"{self.ssh_port} (Ansible's default: no ansible_port or ansible_ssh_port)"
        return f"{self.ssh_port_from}={self.ssh_port}"


# Every numeric knob has a range: a value outside it is a typo or a misunderstanding, and it is
# refused with the range before anything runs. docs/inventory.md lists these ranges.
Port = Annotated[int, Field(ge=1, le=65535)]


# Characters a path or a name may hold: none that a shell reads specially ($ ` ; & | < > ( )
# quotes, backslash, glob characters, whitespace), so a value means the same quoted or not.
# Not `-` first: a word is one argv item (`--served-model-name NAME`, `docker run ... IMAGE`),
# and a leading `-` would make a parser read it as a flag (argparse refuses `--x -y` where click
# takes it, and docker's image position has no `--flag=value` form), so it is refused for every
# engine alike rather than rendered in a form one parser happens to accept.
SHELL_SAFE_WORD = r"^[A-Za-z0-9_./:@+=%~,^][A-Za-z0-9_./:@+=%~,^-]*$"
_SHELL_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./@+=%~-]+$")


def _absolute_path(value: str) -> str:
    parts = set(value.split("/"))
    if not value.startswith("/") or {".", ".."} & parts or not _SHELL_SAFE_PATH.match(value):
        raise ValueError(
            "expected an absolute path of letters, digits and . _ - / @ + = % ~ (no '..')"
        )
    return value


# An absolute, normalised path that can stand in a `docker run -v SRC:DST:ro` volume.
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
# A word of shell-inert characters: a name passed as one argv item.
Word = Annotated[str, Field(pattern=SHELL_SAFE_WORD)]
NUMERIC_ANNOTATIONS: tuple[Any, ...] = (int, float, int | None, float | None)


INTEGER_ANNOTATIONS: tuple[Any, ...] = (int, int | None)
_INTEGER_TEXT = re.compile(r"^-?(0|[1-9][0-9]*)$")


def integer_spelling_problem(value: Any) -> str | None:
    """Why `value` is not an integer as the contract writes one: digits alone, with no leading
    zero and no fraction (None when it is, or when it is no number at all, for the type check to
    say). `01` and `1.0` would be read as 1 by one reader and as text by another (a check that
    compares the text sees a fleet, the plan sees one instance), so both are refused."""
    if isinstance(value, bool):
        return "is true/false, not a number"
    if isinstance(value, float):
        return "has a fraction part: write 1, not 1.0"
    if isinstance(value, str) and not _INTEGER_TEXT.match(value):
        if re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
            return "is not plain digits: it has a leading zero, a sign or a space"
        if re.fullmatch(r"\s*[+-]?[0-9]*\.[0-9]*\s*", value) and any(c.isdigit() for c in value):
            return "has a fraction part: write 1, not 1.0"
    return None


def reject_bool_number(value: Any, info: ValidationInfo, fields: dict[str, Any]) -> Any:
    """true/false is not a number (pydantic would read it as 1/0), and an integer is written as
    plain digits (pydantic would read `01` and `1.0` as 1, while other readers do not)."""
    field = fields.get(info.field_name or "")
    if field is None:
        return value
    if isinstance(value, bool) and field.annotation in NUMERIC_ANNOTATIONS:
        raise ValueError("Input should be a number, not a boolean")
    if field.annotation in INTEGER_ANNOTATIONS and (why := integer_spelling_problem(value)):
        raise ValueError(f"the value {why}")
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
    vllm_port: Port = Field(
        default=8100,
        description="each vLLM server's HTTP port in a fleet, on its k2_local_ip behind the "
        "router (which takes k2_api_port); a single vLLM instance serves on k2_api_port",
    )
    trtllm_port: Port = Field(
        default=8200,
        description="each TensorRT-LLM server's HTTP port in a fleet, on its instance head's "
        "k2_local_ip behind the router (which takes k2_api_port); a single TensorRT-LLM "
        "instance serves on k2_api_port",
    )
    router_metrics_port: Port = Field(
        default=29000, description="the PD router's Prometheus metrics, on its k2_local_ip"
    )
    ssh_port: Port = Field(
        default=2233, description="sshd inside engine containers, for mpirun (TensorRT-LLM)"
    )
    router_port: Port = Field(
        default=8080,
        description="each router's HTTP port on its k2_local_ip behind the front (two or more "
        "[router] hosts); a router alone serves the endpoint on k2_api_port",
    )
    front_address: Word | None = Field(
        default=None,
        description="the endpoint's floating address with its prefix (e.g. 10.10.0.100/24), "
        "held by one [router] host at a time (keepalived); needed with two or more [router] "
        "hosts, in the network of each one's address",
    )
    front_vrid: int = Field(
        default=51,
        ge=1,
        le=255,
        description="the front's VRRP virtual router id, unique among the VRRP instances of "
        "its network",
    )
    front_interface: Word | None = Field(
        default=None,
        description="the interface the front's address is added to (default: on each [router] "
        "host, the interface that holds its address, found at apply)",
    )
    served_model_name: Word = Field(
        default="kimi-k2", description="the model id clients send and /v1/models lists"
    )
    config_dir: AbsolutePath = Field(
        default="/etc/k2provision", description="where hosts keep launch scripts and configs"
    )
    compile_cache_dir: AbsolutePath | None = Field(
        default=None,
        description="host directory for the engines' compile and JIT caches (DeepGEMM, "
        "torch.compile/Inductor, Triton, FlashInfer, ...), mounted into every engine "
        "container so restarts do not recompile; default: k2-compile-cache beside "
        "k2_model_dir",
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
    # Tokens one prefill rank takes per chunk. SGLang's `--chunked-prefill-size` is per
    # instance and divided by the attention-DP size, so the render multiplies this by the
    # pool's DP: the production 4P12D value, 524288 over DP 32, is 16384 per rank, and a
    # smaller pool keeps the same per-rank chunk (and the same activation memory per GPU).
    prefill_chunk_per_rank: int = Field(
        default=16384,
        ge=256,
        le=262144,
        description="SGLang PD: prefill chunk per rank in tokens (rendered as "
        "--chunked-prefill-size, per rank x the pool's attention-DP size)",
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
    vllm_all2all_backend: Literal[
        "deepep_low_latency", "deepep_high_throughput", "allgather_reducescatter"
    ] = Field(
        default="deepep_low_latency",
        description="vLLM dp_ep across nodes: the expert-parallel all-to-all (the DeepEP "
        "kernels are what vLLM's expert-parallel deployment guide names for multi-node)",
    )
    vllm_redundant_experts: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="vLLM dp_ep: spare expert slots for EPLB (default: one per GPU; none for "
        "INT4 experts, whose Marlin MoE method has no EPLB in vLLM 0.33.0)",
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
    ktransformers_gpu_experts: int = Field(
        default=0,
        ge=0,
        le=384,
        description="KTransformers: routed experts per layer kept on the GPU (the rest run on "
        "the CPU with kt-kernel)",
    )
    ktransformers_cpuinfer: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="KTransformers: kt-kernel CPU threads (default: the host's physical cores "
        "minus its GPUs, found at launch)",
    )
    decode_redundant_experts: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="SGLang PD: spare expert slots in the decode pool (default: one per GPU)",
    )
    prefill_redundant_experts: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="SGLang PD: spare expert slots in the prefill pool (default: one per GPU)",
    )
    reserve_gib: float = Field(
        default=4.0,
        ge=0,
        le=256,
        description="GiB per GPU kept free beyond what the fit counts (activations, CUDA "
        "graphs and communication buffers are counted): fragmentation, other processes, "
        "estimate error",
    )
    multimodal: bool | None = Field(
        default=None,
        description="serve images with a multimodal model (default: on when the model has a "
        "vision tower)",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto",
        description="KV cache dtype for SGLang and vLLM (auto: the engine's default, BF16 for "
        "these checkpoints); TensorRT-LLM keeps trtllm_kv_cache_dtype",
    )
    vllm_decode_context_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="vLLM decode context parallelism (default: a node's GPUs where the "
        "recipes show it pays; 1: off)",
    )
    # A config.json (on the controller, e.g. in a local mirror of the model) whose
    # architecture numbers override the catalog's.
    model_config_json: Word | None = Field(
        default=None,
        description="a config.json on the controller whose numbers override the catalog's "
        "(relative: to the inventory's directory)",
    )
    socket_ifname: Word | None = Field(
        default=None,
        description="the socket interface of NCCL, Gloo and Open MPI (e.g. bond0; default: on "
        "each host, the interface that holds its k2_local_ip, found at launch)",
    )
    image: Word | None = Field(default=None, description="override the engine image")
    router_image: Word | None = Field(
        default=None,
        description="the image the router runs in (default: built from containers/router)",
    )
    api_key_file: AbsolutePath | None = Field(
        default=None,
        description="a file on the controller holding the endpoint's API key (it may be "
        "ansible-vault encrypted); the endpoint then refuses requests without "
        "`Authorization: Bearer KEY`",
    )
    tls_cert_file: AbsolutePath | None = Field(
        default=None,
        description="a PEM certificate (chain) on the controller the endpoint serves TLS with",
    )
    tls_key_file: AbsolutePath | None = Field(
        default=None,
        description="the private key of k2_tls_cert_file, a file on the controller (it may be "
        "ansible-vault encrypted)",
    )
    tls_ca_file: AbsolutePath | None = Field(
        default=None,
        description="the CA certificate on the controller that signed k2_tls_cert_file: verify "
        "checks the endpoint's certificate against it (default: the hosts' trust store)",
    )
    router_max_concurrent_requests: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="requests the router lets through at once (default: PD, the decode "
        "instances' running-request capacity, summed; a fleet of replicas, no limit)",
    )
    router_queue_size: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="requests the PD router holds waiting beyond those, answering 429 past "
        "it (default: as many again)",
    )
    router_queue_timeout_s: int = Field(
        default=60, ge=1, le=3600, description="seconds a request may wait in the router's queue"
    )
    canary_percent: int = Field(
        default=0,
        ge=0,
        le=50,
        description="behind the front, the share of requests a fleet's change first takes "
        "alone (0: no canary; `apply --canary PCT` for one run): the first wave's instances "
        "go behind the last router only, HAProxy sends it this share, and after "
        "k2_canary_hold_s the change goes on or is rolled back",
    )
    canary_hold_s: int = Field(
        default=300, ge=10, le=3600, description="seconds a canary serves before its verdict"
    )
    canary_max_error_pct: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="the most failed requests (HTTP 5xx, per cent) a canary may answer, counted "
        "by the front's HAProxy, its probes included",
    )
    canary_max_latency_ratio: float = Field(
        default=1.5,
        ge=1,
        le=100,
        description="how much slower (median of probes sent to each side through the routers) "
        "a canary may answer than the instances that did not change",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_bool_number(value, info, cls.model_fields)

    @model_validator(mode="after")
    def _tls_pair(self) -> Tunables:
        if problem := tls_pair_problem(self.tls_cert_file, self.tls_key_file):
            raise ValueError(problem)
        return self


def tls_pair_problem(cert_file: object, key_file: object) -> str | None:
    """Why k2_tls_cert_file and k2_tls_key_file (None: unset) are not a pair: one given alone.
    A rule of the values as given, so that it is also reported beside another field's error."""
    if (cert_file is None) == (key_file is None):
        return None
    given, missing = ("cert", "key") if key_file is None else ("key", "cert")
    value = cert_file if key_file is None else key_file
    return (
        f"k2_tls_{given}_file={value} is set without k2_tls_{missing}_file; expected both (the "
        "endpoint serves TLS with the certificate and its private key) or neither; fix: set "
        f"k2_tls_{missing}_file to the {'private key' if missing == 'key' else 'certificate'} "
        f"of the pair, or unset k2_tls_{given}_file"
    )


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
    # How many serving instances each pool holds: its hosts split in inventory order into
    # this many equal, consecutive groups (k2_instances for [nodes], k2_prefill_instances and
    # k2_decode_instances for PD's pools).
    instances: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    prefill_instances: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    decode_instances: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    # A fleet's rolling change: how many instances of a pool are replaced at once, and how
    # long (seconds) a stopping instance may take to answer its in-flight requests.
    max_unavailable: int = Field(default=1, ge=1, le=MAX_INSTANCES)
    drain_timeout: int = Field(default=300, ge=1, le=3600)
    hosts: tuple[HostSpec, ...]
    router: str | None = None
    """The host of the first (or only) router."""
    routers: tuple[str, ...] = ()
    """Every router's host, the first being `router`: [router]'s hosts (two or more: behind
    the front, k2_front_address), else the default router's host; () without a router."""
    monitoring: tuple[str, ...] = ()
    """The inventory's [monitoring] hosts: Prometheus and Grafana run on the first (none: on
    the endpoint's host)."""
    lab: bool = False
    tunables: Tunables = Tunables()
    drained: tuple[str, ...] = ()
    """The hosts `k2provision drain` took out (the inventory's state file,
    core/host_state.py): their instances are kept stopped and out of the routers."""
    replaced: tuple[tuple[str, str], ...] = ()
    """(failed host, spare) for each spare `k2provision heal` put in a failed host's place
    (the state file): the spare holds the failed host's ranks and role, and the failed host
    is in no pool."""
    # Warning lines (core/safety_gates.py), one per safety gate the inventory switches off
    # outside the lab; the plan carries them first among its warnings.
    switched_off: tuple[str, ...] = ()
    # Warning lines about inventory settings that have nothing to act on, or a placement the
    # documentation advises against (core/inventory.py), carried into the plan's warnings.
    notes: tuple[str, ...] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_bool_number(value, info, cls.model_fields)

    def pool(self, name: PoolName) -> tuple[HostSpec, ...]:
        """Hosts of one pool, in inventory order."""
        return tuple(h for h in self.hosts if h.pool == name)

    def instance_count(self, name: PoolName) -> int:
        """How many instances the pool `name` holds."""
        return {"prefill": self.prefill_instances, "decode": self.decode_instances}.get(
            name, self.instances
        )

    @property
    def router_hosts(self) -> tuple[str, ...]:
        """Every router's host: `routers`, else `router` alone (a record built without it)."""
        return self.routers or ((self.router,) if self.router else ())

    @property
    def front(self) -> bool:
        """Several routers share the endpoint behind a floating address."""
        return len(self.router_hosts) > 1

    @property
    def fleet(self) -> bool:
        """Some pool holds more than one instance."""
        return max(self.instances, self.prefill_instances, self.decode_instances) > 1

    def host(self, name: str) -> HostSpec:
        """The host called `name` (KeyError if absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


# ---------------------------------------------------------------- catalog


QuantScheme = Literal["bf16", "fp16", "fp8_block", "fp8_channel", "int4_group", "nvfp4", "mxfp4"]
KvDtype = Literal["bf16", "fp8"]


class WeightFormat(Record):
    """How one class of weights is stored: element width plus one scale per group of elements."""

    scheme: QuantScheme
    bits: int = Field(gt=0, le=32)
    group_size: int = Field(default=0, ge=0)  # elements sharing one scale; 0: no scales
    scale_bytes: float = Field(default=0.0, ge=0)  # bytes of one scale

    @property
    def bytes_per_param(self) -> float:
        """Average bytes one weight element takes, its share of the scales included."""
        scales = self.scale_bytes / self.group_size if self.group_size else 0.0
        return self.bits / 8 + scales

    @property
    def label(self) -> str:
        """Short human name, e.g. "INT4 g32" or "FP8 128x128"."""
        if self.scheme == "fp8_block":
            side = round(self.group_size**0.5)
            return f"FP8 {side}x{side}"
        names = {"int4_group": "INT4", "nvfp4": "NVFP4", "mxfp4": "MXFP4"}
        if self.scheme in names:
            return f"{names[self.scheme]} g{self.group_size}"
        return {"bf16": "BF16", "fp16": "FP16", "fp8_channel": "FP8"}[self.scheme]


class Quantization(Record):
    """The storage format of every weight class, as read from a config.json."""

    routed_experts: WeightFormat
    attention: WeightFormat
    shared_experts: WeightFormat
    dense_mlp: WeightFormat  # the first dense layers' MLPs
    # The config.json field this was read from ("quantization_config",
    # "text_config.quantization_config", or "torch_dtype" for unquantized weights).
    source: str

    @property
    def label(self) -> str:
        """The routed experts' format (most of the bytes), plus the rest's when it differs."""
        rest = sorted({self.attention.label, self.shared_experts.label, self.dense_mlp.label})
        experts = self.routed_experts.label
        if rest == [experts]:
            return experts
        return f"{experts} + {'/'.join(rest)}"

    def schemes(self) -> set[str]:
        """Every storage scheme used."""
        return {
            w.scheme
            for w in (self.routed_experts, self.attention, self.shared_experts, self.dense_mlp)
        }


class VisionSpec(Record):
    """A vision tower (MoonViT) and its projector into the language model."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    patch_size: int = Field(gt=0)
    merge_kernel: tuple[int, int] = (2, 2)
    pos_emb_height: int = Field(default=64, gt=0)
    pos_emb_width: int = Field(default=64, gt=0)


class EngineSupport(Record):
    """The first release of an engine that serves a model (None: no release known to); each
    engine module's SUPPORT holds its own, per model."""

    min_version: str | None
    source: str


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
    quantization: Quantization
    vision: VisionSpec | None = None
    checkpoint_gib: float
    shard_count: int
    # Default download patterns (hub file names): weights and their index, configs, the
    # remote code, the tokenizer (`tiktoken.model`) and the chat template.
    allow_patterns: tuple[str, ...] = ("*.safetensors", "*.json", "*.py", "*.model", "*.jinja")
    # The engines' parser names for this model's tool calls and reasoning (None: none).
    tool_parser: str | None = "kimi_k2"
    reasoning_parser: str | None = None
    # vLLM decode context parallelism pays for this model (the vLLM recipes' supports_dcp).
    decode_context_parallel: bool = False
    sources: tuple[str, ...] = ()

    @property
    def multimodal(self) -> bool:
        """True when the checkpoint carries a vision tower."""
        return self.vision is not None

    @property
    def weight_block_size(self) -> tuple[int, int]:
        """The block of FP8 block-quantized weights ((128, 128) when none are)."""
        for w in (self.quantization.routed_experts, self.quantization.attention):
            if w.scheme == "fp8_block":
                side = round(w.group_size**0.5)
                return (side, side)
        return (128, 128)


class GpuSpec(Record):
    """A GPU model: what nvidia-smi calls it, its memory, and the system it comes in."""

    key: str
    product_pattern: str
    memory_mib: int
    # nvidia-smi's total minus the total cudaMemGetInfo reports: memory the driver keeps
    # before any process allocates, which no engine's memory fraction can use.
    driver_reserved_mib: int
    fp8: bool
    fp4: bool = False
    sm: int
    """CUDA compute capability x 10 (80 Ampere, 90 Hopper, 100 datacenter Blackwell): which
    kernels an engine's release has for it."""
    nvswitch: bool
    min_driver: str

    @property
    def usable_gib(self) -> float:
        """GPU memory as CUDA, and so every engine's memory fraction, sees it."""
        return (self.memory_mib - self.driver_reserved_mib) / 1024


class EngineRelease(Record):
    """The engine release the renders target, and its container image."""

    engine: EngineName
    version: str
    image: str
    """The published image: what is pulled, or the base the engine's build starts FROM."""
    min_driver: str
    build: str = ""
    """The directory under containers/ whose build is the image the engine runs in (FROM
    `image`, adding what the image lacks); empty: `image` runs as published."""


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
    # Decode context parallelism (vLLM): each token's KV lives on one of `dcp` GPUs of a
    # tensor-parallel group instead of on all of them.
    dcp: int = 1

    @property
    def attention_tp(self) -> int:
        """How many GPUs split one attention layer's heads."""
        return self.tp // self.dp if self.dp_attention else self.tp


class WorkerRegistration(Record):
    """How a fleet's router takes one instance (back) as its worker."""

    body: dict[str, str | int]
    """The router's ``POST /workers`` body: the URL, and what else the router needs to know."""
    answers_alone: bool = True
    """A chat completion sent to the instance's URL alone is answered (one PD half is not)."""
    at_launch: bool = False
    """The router starts without this worker and the launch registers it with `body`, which
    names what the router cannot learn from the server itself (a vLLM server's model id)."""
    peers_forget_s: int = 0
    """Seconds the instance must stay down when it is replaced before its successor starts,
    so that other instances drop what they keep of it (0: nothing to wait for)."""

    @model_serializer(mode="wrap")
    def _no_default_at_launch(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.at_launch:
            data.pop("at_launch", None)
        if not self.peers_forget_s:
            data.pop("peers_forget_s", None)
        return data


class PoolPlan(Record):
    """One pool of hosts: one serving instance, or a fleet of equal instances (`instances`,
    each a PoolPlan of its own hosts, named `instance`). `gpus`, `parallel` and `mem_fraction`
    are per instance; `hosts` and `master` are the pool's (its first instance's master)."""

    name: PoolName
    hosts: tuple[str, ...]
    master: str
    master_address: str
    gpus: int
    parallel: Parallel
    mem_fraction: float
    instance: str = ""
    """The instance's name (``prefill-2``); empty on a pool and on a single instance."""
    url: str = ""
    """Where the router reaches the instance; empty on a pool and on a single instance."""
    instances: tuple[PoolPlan, ...] = ()
    """The pool's instances when it holds more than one; empty: the pool is one instance."""
    router_worker: WorkerRegistration | None = None
    """How the router takes the instance back after a rolling change; None outside a fleet."""

    @model_serializer(mode="wrap")
    def _no_empty_instance(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A single-instance pool serializes (and digests) as before fleets existed.
        data: dict[str, Any] = handler(self)
        for key in ("instance", "url", "instances", "router_worker"):
            if not data.get(key):
                data.pop(key, None)
        return data

    def members(self) -> tuple[PoolPlan, ...]:
        """The pool's instances: itself when it is one."""
        return self.instances or (self,)

    def ref(self) -> InstanceRef | None:
        """What names this instance to a container's spec (None for a single instance)."""
        if not self.instance:
            return None
        return InstanceRef(name=self.instance, hosts=self.hosts, master=self.master)


def registered_at_launch(pools: Sequence[PoolPlan]) -> tuple[dict[str, str | int], ...]:
    """The ``POST /workers`` bodies of the workers a router cannot name itself
    (WorkerRegistration.at_launch: a vLLM fleet's), in the pools' order; () when the router
    takes every worker from its command line."""
    return tuple(
        dict(i.router_worker.body)
        for pool in pools
        for i in pool.members()
        if i.router_worker is not None and i.router_worker.at_launch
    )


class InstanceRef(Record):
    """The instance a process serves in a fleet: its name, hosts and master."""

    name: str
    hosts: tuple[str, ...]
    master: str


class MemoryReserve(Record):
    """GiB per GPU an engine holds besides weights and KV cache, by what holds it."""

    activations: float  # the largest forward pass (prefill chunk or batch) and the sampler
    cuda_graphs: float  # captured graphs for the chosen batch sizes
    comm_buffers: float  # NCCL, custom all-reduce and expert all-to-all (DeepEP) buffers
    all2all: float = 0.0  # of comm_buffers: the expert all-to-all (DeepEP) buffers
    runtime: float  # CUDA context growth, kernel modules, library workspaces
    encoder: float = 0.0  # vision encoder profiling and its embedding cache
    margin: float  # k2_reserve_gib: what no engine accounts for (fragmentation, other users)
    # Terms scaled to a published measurement, and which: empty when none is.
    calibration: str = ""

    @property
    def total(self) -> float:
        """Everything reserved."""
        return (
            self.activations
            + self.cuda_graphs
            + self.comm_buffers
            + self.runtime
            + self.encoder
            + self.margin
        )


class FitReport(Record):
    """Memory arithmetic for one pool, per GPU, in GiB and tokens."""

    pool: PoolName
    gpu_memory_gib: float  # nvidia-smi's total
    usable_gib: float  # what CUDA reports (the driver keeps the rest)
    mem_fraction: float  # the engine's memory fraction as rendered, derived from this fit
    budget_gib: float  # what that fraction grants weights and KV cache
    weights_gib: float
    vision_gib: float = 0.0  # of weights_gib: the vision tower and projector
    reserve: MemoryReserve
    reserve_gib: float  # reserve.total, rounded
    kv_gib: float
    kv_dtype: KvDtype = "bf16"
    kv_bytes_per_token: int  # per GPU, over the layers it holds
    kv_tokens_per_gpu: int  # tokens one GPU's cache stores
    kv_tokens_per_replica: int  # tokens one serving replica holds (x dcp)
    kv_tokens_total: int
    context_length: int
    fits: bool


class ImageSource(Record):
    """An image the plan runs, the hosts that run it, and where it comes from: pulled as
    published (once, on the first host that needs it), or built from containers/`build`
    under a tag derived from that build's content. Either way it reaches every other host
    from a peer that holds it, streamed and verified by image ID (role k2_container_runtime)."""

    ref: str
    build: str = ""
    hosts: tuple[str, ...]


class WeightsInfo(Record):
    """The checkpoint the plan serves: what the weights phase moves and preflight makes room for."""

    checkpoint_gib: float
    shard_count: int
    allow_patterns: tuple[str, ...]


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
    `numa-nodes` (NUMA nodes of the host) and `secret-file PATH` (the contents of a file the
    launch phase wrote there, never echoed: an API key for an engine that takes it only on its
    command line).
    """

    name: str
    kind: Literal["ifname-of", "cidr-of", "physical-cores-minus", "numa-nodes", "secret-file"]
    arg: str = ""

    @property
    def ref(self) -> str:
        """How argv and env refer to the value."""
        return "${" + self.name + "}"


class RouterRegistrar(Record):
    """What a router's launch script registers with the router once it answers: the workers
    it cannot name itself (a vLLM fleet's, by model id), so that a router that starts or
    restarts serves them without waiting for an apply."""

    url: str
    """The router's own API, from its host."""
    workers: tuple[dict[str, str | int], ...]
    """Each worker's ``POST /workers`` body."""
    key_file: str = ""
    """The endpoint's API key file on the host ("" without a key)."""


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
    # Lab plans only: K2_LAB_FAULT of the container (a stand-in fault mode; see k2_lab_fault).
    lab_fault: str | None = None
    # Fleets only: the instance the process serves, so its container's spec hash names it.
    instance: InstanceRef | None = None
    # Ranks of an instance on several hosts only: the digest of every rank's spec (each
    # host's process and files). It is part of each rank's own spec, so a change to any rank
    # changes them all, and a re-apply replaces the whole instance: a rank started alone
    # waits for peers that left the group long ago.
    instance_spec: str = ""
    # A fleet's router only: the workers its launch script registers with it once it answers.
    registrar: RouterRegistrar | None = None

    @model_serializer(mode="wrap")
    def _no_empty_resolve(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.resolve:
            data.pop("resolve", None)
        for key in ("lab_fault", "instance", "registrar"):
            if getattr(self, key) is None:
                data.pop(key, None)
        if not self.instance_spec:
            data.pop("instance_spec", None)
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
    # The host directory of the engine's compile and JIT caches (plan/caches.py).
    compile_cache: str = ""
    reasons: dict[str, str] = {}


class PortBinding(Record):
    """A TCP port one of a host's serving processes listens on, and the variable that sets it."""

    setting: str
    """The inventory variable of the port (``k2_sglang_port``)."""
    port: int
    process: str
    container: str
    """The container that holds the port once it runs (a converged host's ports are its own)."""
    bind: str
    """The address it binds: the host's k2_local_ip, or a wildcard (every interface)."""
    public: bool = False
    """The endpoint, the one port users reach; every other port serves the cluster itself."""
    wildcard_why: str = ""
    """Why a port other than the endpoint binds every interface (the pinned engine fixes it)."""


class HostPlan(Record):
    """Everything one host does: its addresses and RDMA devices, its role, rank, processes,
    files and the ports they bind. The roles read a host's part here, never the inventory."""

    name: str
    address: str
    local_ip: str
    """The address the engines bind and advertise (``k2_local_ip``; default ``address``)."""
    ib_devices: tuple[str, ...] = ()
    """RDMA devices the engines use on this host (``k2_ib_devices``); empty: none named."""
    role: Role
    pool: PoolName | Literal["router", "spare"]
    node_rank: int
    """The host's rank in its instance."""
    gpus: int
    processes: tuple[Process, ...] = ()
    files: dict[str, str] = {}
    ports: tuple[PortBinding, ...] = ()
    instance: str = ""
    """Fleets only: the instance the host serves in (``decode-2``)."""

    @model_serializer(mode="wrap")
    def _no_empty_instance(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.instance:
            data.pop("instance", None)
        return data


class CanarySettings(Record):
    """A fleet's canary (k2_canary_percent, k2_canary_hold_s, k2_canary_max_error_pct,
    k2_canary_max_latency_ratio): the inventory's values, their defaults those of `Tunables`."""

    percent: int = 0
    """The share of requests the first wave takes alone behind its router; 0: no canary."""
    hold_s: int = 300
    max_error_pct: float = 1.0
    max_latency_ratio: float = 1.5


class FleetSettings(Record):
    """How a fleet's rolling change proceeds (k2_max_unavailable, k2_drain_timeout): the
    inventory's values, their defaults those of `Cluster`."""

    max_unavailable: int
    """Instances of a pool replaced at once."""
    drain_timeout: int
    """Seconds a stopping instance may take to answer its in-flight requests."""
    canary: CanarySettings = CanarySettings()
    """How a change behind the front is tried on a share of requests first (k2_canary_*)."""
    drained: tuple[str, ...] = ()
    """The instances `k2provision drain` took out (those holding a drained host), in the
    plan's order: kept stopped and out of every router until `k2provision return`."""
    drained_hosts: tuple[str, ...] = ()
    """Every host of those instances (the named ones and their instances' other hosts): no
    process of the plan runs there."""
    drained_named: tuple[str, ...] = ()
    """The hosts `k2provision drain` named, as the state file lists them (what `return`
    takes)."""
    replaced: dict[str, str] = {}
    """failed host -> the spare `k2provision heal` put in its place: the failed host is in
    no pool and in no play (plan.yml leaves it out), until `k2provision return` undoes it."""
    spares: tuple[str, ...] = ()
    """The [spare] hosts no instance uses: prepared, holding the weights, serving nothing."""

    @model_serializer(mode="wrap")
    def _no_empty_drained(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Nothing drained, replaced or spare serializes (and digests) as before these existed.
        data: dict[str, Any] = handler(self)
        for key in ("drained", "drained_hosts", "drained_named", "replaced", "spares"):
            if not data.get(key):
                data.pop(key, None)
        return data


class RouterRef(Record):
    """One router of the plan: its host and the URL its API answers on (where the launch
    registers workers and a rolling change takes them out and back)."""

    host: str
    url: str
    server: str = ""
    """Its server name in the front's HAProxy backend (behind a front only)."""

    @model_serializer(mode="wrap")
    def _no_empty_server(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.server:
            data.pop("server", None)
        return data


class FrontHost(Record):
    """A host of the front: it runs HAProxy and keepalived beside its router."""

    name: str
    address: str
    priority: int
    """Its VRRP priority: the highest healthy one holds the address."""


class FrontPlan(Record):
    """The front tier: one floating address (keepalived, VRRP) held by one of `hosts` at a
    time, whose HAProxy spreads requests over every router of `routers` that answers its
    health check."""

    address: str
    """The floating address, without its prefix."""
    prefix: int
    vrid: int
    interface: str | None
    """None: on each host, the interface that holds its address (found at apply)."""
    port: int
    """The endpoint's port HAProxy listens on, on every address of its host."""
    hosts: tuple[FrontHost, ...]
    routers: tuple[RouterRef, ...]
    """Every router behind the front, each on its k2_local_ip and k2_router_port."""
    router_health_path: str
    """What HAProxy asks each router (its liveness)."""
    request_timeout_s: int
    """How long HAProxy lets one request run (the routers' own limit)."""
    maxconn: int
    """Connections each HAProxy holds at once."""
    backend: str
    """HAProxy's backend of the routers (each a server named as its RouterRef.server)."""
    admin_socket: str
    """HAProxy's runtime API on each front host (root only): how a router leaves the front
    before it changes, and comes back."""


class AccessFiles(Record):
    """The endpoint's API key and TLS files as the roles use them: each inventory file on the
    controller (k2_api_key_file, k2_tls_cert_file, k2_tls_key_file, k2_tls_ca_file; None where
    unset), and the CA as the launch phase places it on the endpoint's host for the checks
    asked from there. Paths only: no file's content enters the plan."""

    api_key_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_ca_file: str | None
    host_ca_file: str | None
    """The CA on the endpoint's host (under config_dir), None without k2_tls_ca_file."""


class Plan(Record):
    """The whole decision: an exact description of what runs where."""

    engine: EngineName
    engine_version: str
    engine_min_driver: str
    """The oldest NVIDIA driver the engine release's image runs on (preflight checks it)."""
    layout: str
    model: str
    model_dir: AbsolutePath
    gpu: str
    endpoint: str
    endpoint_host: str
    served_model_name: str
    config_dir: str
    ssh_port: int
    """The port of the mpirun ssh mesh (``k2_ssh_port``): its sshd listens there on every host."""
    mesh_served: bool
    """The engine's containers serve the ssh mesh: a rendered process binds ``k2_ssh_port``
    (the engine declares the listener). Role k2_ssh_mesh then checks every pair from inside
    them."""
    lab: bool
    fleet: FleetSettings
    access: AccessFiles
    container: ContainerOptions
    pools: tuple[PoolPlan, ...]
    fit: tuple[FitReport, ...]
    weights: WeightsInfo
    warnings: tuple[str, ...]
    hosts: tuple[HostPlan, ...]
    images: tuple[ImageSource, ...] = ()
    """Every image the hosts' processes run, in the order the hosts first use them."""
    routers: tuple[RouterRef, ...] = ()
    """Every router, where the launch registers workers and a rolling change takes them out
    and back; () without a router."""
    front: FrontPlan | None = None
    """The front tier in front of several routers; None with one router or none."""

    def host(self, name: str) -> HostPlan:
        """The plan of host `name` (KeyError if absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)
