"""A strict schema of TensorRT-LLM's extra-llm-api-options YAML (`trtllm-serve --config`).

TensorRT-LLM cannot be installed on a machine without its GPU wheels, so the YAML that
k2provision renders is checked against this mirror instead. The models below copy the field
names, types and defaults of `TorchLlmArgs` and the sub-configs it nests, as defined in
`tensorrt_llm/llmapi/llm_args.py` of NVIDIA/TensorRT-LLM. Like the engine itself they forbid
unknown keys, so a stale or misspelled key fails here, before a host is touched.

Source mirrored: the stored revision of `tensorrt_llm/llmapi/llm_args.py` from the 1.2 release
line: the last revision before the 1.3 line (its MTP validator still says the
`mtp_eagle_one_model` flag "will do nothing in release 1.3"; `CudaGraphConfig` is still one
class with `batch_sizes`, `max_batch_size` and `enable_padding`; `KvCacheConfig` carries
`use_kv_cache_manager_v2` and `max_util_for_resume`; `CacheTransceiverConfig.backend` accepts
DEFAULT, UCX, NIXL, MOONCAKE and MPI). It is newer than the 1.2.0rc2.post2 documentation and
older than 1.3.0rc7. The exact 1.2.1 tag could not be fetched; `TRTLLM_VERSION` names the
release this mirror stands for, and a test ties it to the pinned release in the catalog, so a
bump of the pin forces a review of this file. The renames in `RENAMED` come from comparing this
revision with the 0.20-era file (commit fcd3f31682808ae56118ae43c1d7864a3a945e6f) and from
NVIDIA/TensorRT-LLM pull request 6003 (`cuda_graph_config.padding_enabled` ->
`enable_padding`, July 2025).

Only fields read in that source are modelled. Keys that exist in TorchLlmArgs but hold Python
objects or configs this project does not model (`lora_config`, `sparse_attention_config`, ...)
are rejected with their own message (`UNMODELED`): a render must never emit them, and an
override that needs one must extend this mirror first.

Validators that merely normalise values in the engine are mirrored as checks that reject the
values the engine would reject, never as rewrites: what validates here is exactly what is written.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from k2provision.errors import K2Error

TRTLLM_VERSION = "1.2.1"


class TrtllmOptionsError(K2Error):
    """An extra-llm-api-options mapping that the pinned TensorRT-LLM release would refuse."""


class _Strict(BaseModel):
    """Base of every mirrored config: unknown keys are errors, as in TensorRT-LLM."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- sub-configs


class CudaGraphConfig(_Strict):
    """`cuda_graph_config`: CUDA graphs for decode-only batches of these sizes."""

    batch_sizes: list[int] | None = None
    max_batch_size: NonNegativeInt = 0
    enable_padding: bool = False

    @model_validator(mode="after")
    def _max_matches_sizes(self) -> CudaGraphConfig:
        if (
            self.batch_sizes
            and self.max_batch_size
            and self.max_batch_size != max(self.batch_sizes)
        ):
            raise ValueError(
                f"max_batch_size {self.max_batch_size} must equal max(batch_sizes) "
                f"{max(self.batch_sizes)} when both are given"
            )
        return self


MoeBackend = Literal[
    "AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"
]


class MoeConfig(_Strict):
    """`moe_config`: MoE kernel backend and chunking."""

    backend: MoeBackend = "AUTO"
    max_num_tokens: int | None = None
    load_balancer: dict[str, Any] | str | None = None
    disable_finalize_fusion: bool = False
    use_low_precision_moe_combine: bool = False


class AttentionDpConfig(_Strict):
    """`attention_dp_config`: load balancing of the attention data-parallel scheduler."""

    enable_balance: bool = False
    timeout_iters: int = 50
    batching_wait_iters: int = 10

    @model_validator(mode="after")
    def _non_negative_when_balancing(self) -> AttentionDpConfig:
        if self.enable_balance and (self.batching_wait_iters < 0 or self.timeout_iters < 0):
            raise ValueError(
                "timeout_iters and batching_wait_iters must be >= 0 when enable_balance is true"
            )
        return self


# The engine types `dtype` as a free string; the PyTorch backend accepts these values only.
KvCacheDtype = Literal["auto", "fp8", "nvfp4"]


class KvCacheConfig(_Strict):
    """`kv_cache_config`: size, dtype and reuse of the paged KV cache."""

    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: Annotated[list[PositiveInt], Field(min_length=1)] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: Annotated[float, Field(ge=0, le=1)] | None = 0.9
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: NonNegativeInt = 0
    dtype: KvCacheDtype = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = 32
    use_kv_cache_manager_v2: bool = False
    max_util_for_resume: Annotated[float, Field(ge=0, le=1)] = 0.95


class CacheTransceiverConfig(_Strict):
    """`cache_transceiver_config`: KV transfer between disaggregated context/generation servers."""

    backend: Literal["DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"] | None = None
    transceiver_runtime: Literal["CPP", "PYTHON"] | None = None
    max_tokens_in_buffer: int | None = None
    kv_transfer_timeout_ms: PositiveInt | None = None
    kv_transfer_sender_future_timeout_ms: PositiveInt | None = 1000


class DynamicBatchConfig(_Strict):
    """`scheduler_config.dynamic_batch_config` (TensorRT backend only, per the engine)."""

    enable_batch_size_tuning: bool = True
    enable_max_num_tokens_tuning: bool = False
    dynamic_batch_moving_average_window: int = 128


class SchedulerConfig(_Strict):
    """`scheduler_config`: capacity and chunking policies."""

    capacity_scheduler_policy: Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"] = (
        "GUARANTEED_NO_EVICT"
    )
    context_chunking_policy: Literal["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"] | None = None
    dynamic_batch_config: DynamicBatchConfig | None = None
    waiting_queue_policy: Literal["fcfs"] = "fcfs"


class PeftCacheConfig(_Strict):
    """`peft_cache_config`: LoRA adapter cache sizes."""

    num_host_module_layer: int = 0
    num_device_module_layer: int = 0
    optimal_adapter_size: int = 8
    max_adapter_size: int = 64
    num_put_workers: int = 1
    num_ensure_workers: int = 1
    num_copy_streams: int = 1
    max_pages_per_block_host: int = 24
    max_pages_per_block_device: int = 8
    device_cache_percent: float = 0.02
    host_cache_size: int = 1024**3
    lora_prefetch_dir: str | None = None


class TorchCompileConfig(_Strict):
    """`torch_compile_config`."""

    enable_fullgraph: bool = True
    enable_inductor: bool = False
    enable_piecewise_cuda_graph: bool = False
    capture_num_tokens: list[PositiveInt] | None = None
    enable_userbuffers: bool = True
    max_num_streams: PositiveInt = 1


Nvfp4Backend = Literal["cutlass", "cublaslt", "cutedsl", "cuda_core"]
DEFAULT_NVFP4_BACKENDS: tuple[Nvfp4Backend, ...] = ("cutlass", "cublaslt", "cuda_core")


class Nvfp4GemmConfig(_Strict):
    """`nvfp4_gemm_config`: NVFP4 GEMM backends to auto-select from."""

    allowed_backends: Annotated[list[Nvfp4Backend], Field(min_length=1)] = Field(
        default_factory=lambda: list(DEFAULT_NVFP4_BACKENDS)
    )


class CpConfig(_Strict):
    """`cp_config`: context parallelism (the engine upper-cases `cp_type`)."""

    cp_type: str = "ULYSSES"
    tokens_per_block: int | None = None
    use_nccl_for_alltoall: bool | None = None
    fifo_version: int | None = None
    cp_anchor_size: int | None = None
    block_size: int | None = None


class KvCacheConnectorConfig(_Strict):
    """`kv_connector_config`: a KV cache connector loaded by import path."""

    connector_module: str
    connector_scheduler_class: str
    connector_worker_class: str


class LayerwiseBenchmarksConfig(_Strict):
    """`layer_wise_benchmarks_config`."""

    calibration_mode: Literal["NONE", "MARK", "COLLECT"] = "NONE"
    calibration_file_path: str | None = None
    calibration_layer_indices: list[int] | None = None


# ---------------------------------------------------------------- speculative decoding


class _DecodingBase(_Strict):
    """Fields every `speculative_config` shares."""

    max_draft_len: NonNegativeInt | None = None
    max_total_draft_tokens: int | None = None
    speculative_model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("speculative_model", "speculative_model_dir"),
    )
    max_concurrency: NonNegativeInt | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    acceptance_window: NonNegativeInt | None = None
    acceptance_length_threshold: NonNegativeFloat | None = None
    allow_advanced_sampling: bool = False


class MTPDecodingConfig(_DecodingBase):
    """Multi-token prediction (DeepSeek-V3-style MTP layers)."""

    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: PositiveInt = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True
    begin_thinking_phase_token: int = 128798
    end_thinking_phase_token: int = 128799


class EagleDecodingConfig(_DecodingBase):
    """EAGLE (treated as EAGLE3 on the PyTorch backend)."""

    decoding_type: Literal["Eagle"] = "Eagle"
    eagle_choices: list[list[int]] | None = None
    greedy_sampling: bool | None = True
    posterior_threshold: float | None = None
    use_dynamic_tree: bool | None = False
    dynamic_tree_max_topK: int | None = None  # the engine's own spelling
    num_eagle_layers: int | None = None
    max_non_leaves_per_layer: int | None = None
    eagle3_one_model: bool | None = True
    eagle3_layers_to_capture: set[int] | None = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"


class Eagle3DecodingConfig(EagleDecodingConfig):
    """EAGLE3."""

    decoding_type: Literal["Eagle3"] = "Eagle3"  # type: ignore[assignment]


class NGramDecodingConfig(_DecodingBase):
    """Prompt-lookup n-gram drafting."""

    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True


class DraftTargetDecodingConfig(_DecodingBase):
    """A separate draft model."""

    decoding_type: Literal["Draft_Target"] = "Draft_Target"


class PARDDecodingConfig(_DecodingBase):
    """Parallel drafting with mask tokens."""

    decoding_type: Literal["PARD"] = "PARD"
    mask_token_id: int | None = None


class AutoDecodingConfig(_DecodingBase):
    """Let the engine pick a draft-model-free method."""

    decoding_type: Literal["AUTO"] = "AUTO"


# Medusa and Lookahead exist in the source but do not support the PyTorch backend;
# SaveState and User_Provided carry Python objects or training-only settings.
SpeculativeConfig = Annotated[
    MTPDecodingConfig
    | EagleDecodingConfig
    | Eagle3DecodingConfig
    | NGramDecodingConfig
    | DraftTargetDecodingConfig
    | PARDDecodingConfig
    | AutoDecodingConfig,
    Field(discriminator="decoding_type"),
]
SPECULATIVE_TYPES = ("MTP", "Eagle", "Eagle3", "NGram", "Draft_Target", "PARD", "AUTO")

AllreduceStrategy = Literal[
    "AUTO",
    "NCCL",
    "UB",
    "MINLATENCY",
    "ONESHOT",
    "TWOSHOT",
    "LOWPRECISION",
    "MNNVL",
    "NCCL_SYMMETRIC",
]


# ---------------------------------------------------------------- the top level


class ExtraLlmApiOptions(_Strict):
    """The top level of an extra-llm-api-options YAML: fields of BaseLlmArgs + TorchLlmArgs."""

    # BaseLlmArgs
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    custom_tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    revision: str | None = None
    tokenizer_revision: str | None = None
    model_kwargs: dict[str, Any] | None = None
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    gpus_per_node: int | None = None
    moe_cluster_parallel_size: int | None = None
    moe_tensor_parallel_size: int | None = None
    moe_expert_parallel_size: int | None = None
    enable_attention_dp: bool = False
    enable_lm_head_tp_in_adp: bool = False
    pp_partition: list[int] | None = None
    cp_config: CpConfig | None = None
    enable_lora: bool = False
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    iter_stats_max_iterations: int | None = None
    request_stats_max_iterations: int | None = None
    peft_cache_config: PeftCacheConfig | None = None
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache_transceiver_config: CacheTransceiverConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    max_batch_size: int | None = 2048
    max_input_len: int | None = 1024
    max_seq_len: int | None = None
    max_beam_width: int | None = 1
    max_num_tokens: int | None = 8192
    gather_generation_logits: bool = False
    num_postprocess_workers: int = 0
    postprocess_tokenizer_dir: str | None = None
    reasoning_parser: str | None = None
    otlp_traces_endpoint: str | None = None
    return_perf_metrics: bool = False
    perf_metrics_max_requests: NonNegativeInt = 0
    orchestrator_type: Literal["rpc", "ray"] | None = None
    env_overrides: dict[str, str] | None = None

    # TorchLlmArgs
    garbage_collection_gen0_threshold: int = 20000
    cuda_graph_config: CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)
    attention_dp_config: AttentionDpConfig | None = None
    disable_overlap_scheduler: bool = False
    moe_config: MoeConfig = Field(default_factory=MoeConfig)
    nvfp4_gemm_config: Nvfp4GemmConfig = Field(default_factory=Nvfp4GemmConfig)
    attn_backend: str = "TRTLLM"
    sampler_type: Literal["TRTLLMSampler", "TorchSampler", "auto"] = "auto"
    sampler_force_async_worker: bool = False
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    batch_wait_timeout_ms: NonNegativeFloat = 0
    batch_wait_timeout_iters: NonNegativeInt = 0
    batch_wait_max_tokens_ratio: Annotated[float, Field(ge=0, le=1)] = 0
    torch_compile_config: TorchCompileConfig | None = None
    enable_autotuner: bool = True
    enable_layerwise_nvtx_marker: bool = False
    load_format: str = "AUTO"
    enable_min_latency: bool = False
    stream_interval: PositiveInt = 1
    force_dynamic_quantization: bool = False
    allreduce_strategy: AllreduceStrategy | None = "AUTO"
    checkpoint_format: str | None = None
    kv_connector_config: KvCacheConnectorConfig | None = None
    mm_encoder_only: bool = False
    ray_worker_extension_cls: str | None = None
    enable_sleep: bool = False
    use_cute_dsl_blockscaling_mm: bool = False
    use_cute_dsl_blockscaling_bmm: bool = False
    disable_flashinfer_sampling: bool = False
    max_stats_len: int = 1000
    layer_wise_benchmarks_config: LayerwiseBenchmarksConfig = Field(
        default_factory=LayerwiseBenchmarksConfig
    )
    backend: Literal["pytorch"] = "pytorch"

    @field_validator("load_format")
    @classmethod
    def _known_load_format(cls, value: str) -> str:
        if value.upper() not in {"AUTO", "DUMMY", "VISION_ONLY"}:
            raise ValueError(f"invalid load_format {value!r}; expected auto, dummy or vision_only")
        return value

    @model_validator(mode="after")
    def _ray_only_fields(self) -> ExtraLlmApiOptions:
        if self.ray_worker_extension_cls is not None and self.orchestrator_type != "ray":
            raise ValueError(
                "ray_worker_extension_cls is only supported with orchestrator_type 'ray'"
            )
        return self


# ---------------------------------------------------------------- what the schema knows about keys

# Keys that TensorRT-LLM renamed or moved, by dotted path in an old YAML:
# path -> (what happened, advice).
RENAMED: dict[str, tuple[str, str]] = {
    "cuda_graph_config.padding_enabled": (
        "renamed enable_padding",
        "write `enable_padding: true` under cuda_graph_config",
    ),
    "use_cuda_graph": (
        "replaced by cuda_graph_config",
        "delete it; a `cuda_graph_config:` mapping enables CUDA graphs and `cuda_graph_config: "
        "null` disables them",
    ),
    "cuda_graph_batch_sizes": (
        "moved to cuda_graph_config.batch_sizes",
        "move the list under cuda_graph_config",
    ),
    "cuda_graph_max_batch_size": (
        "moved to cuda_graph_config.max_batch_size",
        "move it under cuda_graph_config",
    ),
    "cuda_graph_padding_enabled": (
        "moved to cuda_graph_config.enable_padding",
        "write `enable_padding: true` under cuda_graph_config",
    ),
    "moe_backend": ("moved to moe_config.backend", "write `backend:` under moe_config"),
    "moe_max_num_tokens": (
        "moved to moe_config.max_num_tokens",
        "write `max_num_tokens:` under moe_config",
    ),
    "moe_load_balancer": (
        "moved to moe_config.load_balancer",
        "write `load_balancer:` under moe_config",
    ),
    "kv_cache_dtype": ("moved to kv_cache_config.dtype", "write `dtype:` under kv_cache_config"),
    "autotuner_enabled": ("renamed enable_autotuner", "rename it enable_autotuner"),
    "enable_trtllm_sampler": (
        "replaced by sampler_type",
        "write `sampler_type: TRTLLMSampler` (or TorchSampler, auto)",
    ),
    "mixed_sampler": (
        "replaced by sampler_type",
        "delete it; choose the sampler with sampler_type",
    ),
    "torch_compile_config.torch_compile_fullgraph": (
        "renamed enable_fullgraph",
        "rename it enable_fullgraph",
    ),
    "torch_compile_config.torch_compile_inductor_enabled": (
        "renamed enable_inductor",
        "rename it enable_inductor",
    ),
    "torch_compile_config.torch_compile_piecewise_cuda_graph": (
        "renamed enable_piecewise_cuda_graph",
        "rename it enable_piecewise_cuda_graph",
    ),
    "torch_compile_config.torch_compile_enable_userbuffers": (
        "renamed enable_userbuffers",
        "rename it enable_userbuffers",
    ),
}

# Real TorchLlmArgs keys that this mirror deliberately does not model.
UNMODELED: dict[str, str] = {
    "model": "set the model as trtllm-serve's positional argument",
    "tokenizer": "set it with trtllm-serve --tokenizer",
    "lora_config": "LoRA is not part of k2provision's Kimi-K2 deployments",
    "sparse_attention_config": "sparse attention does not apply to Kimi-K2",
    "batched_logits_processor": "it holds a Python object, not YAML data",
    "decoding_config": "deprecated upstream; use speculative_config",
    "mpi_session": "it holds a Python object, not YAML data",
    "checkpoint_loader": "it holds a Python object; use checkpoint_format",
    "ray_placement_config": "it holds Ray placement groups, not YAML data",
    "build_config": "it configures the TensorRT engine backend; the PyTorch backend drops it",
}


def _dotted(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
    """A pydantic error location as a dotted key path, without discriminator tags."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "speculative_config" and parts[1] in SPECULATIVE_TYPES:
        del parts[1]
    return ".".join(parts)


def _model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through unions, Optional and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _model_types(arg)]


def _known_keys(path: str) -> list[str]:
    """Field names valid at the parent of `path` (for 'did you mean' hints)."""
    models: list[type[BaseModel]] = [ExtraLlmApiOptions]
    for part in path.split(".")[:-1]:
        found: list[type[BaseModel]] = []
        for model in models:
            field = model.model_fields.get(part)
            if field is None:
                continue
            found += _model_types(field.annotation)
        models = found
    return sorted({name for model in models for name in model.model_fields})


def _unknown_key_problem(path: str) -> str:
    head = f"{path}: unknown key in TensorRT-LLM {TRTLLM_VERSION}"
    if path in RENAMED:
        what, advice = RENAMED[path]
        return f"{head}; it was {what}; fix: {advice}"
    if path in UNMODELED:
        return (
            f"{path}: a TensorRT-LLM {TRTLLM_VERSION} key that k2provision does not model "
            f"({UNMODELED[path]}); fix: remove it"
        )
    leaf = path.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, _known_keys(path), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{head}; fix: {hint}remove it or use a key of llm_args.py's TorchLlmArgs"


def _value_fix(error_type: str) -> str:
    if error_type in {"literal_error", "union_tag_invalid", "union_tag_not_found"}:
        return "use one of the values listed"
    if error_type.startswith(("greater_than", "less_than", "too_short", "too_long")):
        return "use a value within the bound stated"
    if error_type == "value_error":
        return "make the values consistent as stated"
    if error_type == "missing":
        return "add the key"
    return "give a value of the type stated"


def validate_extra_llm_api_options(data: dict[str, Any]) -> ExtraLlmApiOptions:
    """Validate a parsed extra-llm-api-options mapping, or raise TrtllmOptionsError (one line per
    problem, naming the key, the release, and the fix)."""
    if not isinstance(data, dict):
        raise TrtllmOptionsError(
            [
                f"extra-llm-api-options: expected a mapping at the top level, got "
                f"{type(data).__name__}; fix: write `key: value` lines"
            ]
        )
    try:
        return ExtraLlmApiOptions.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = _dotted(err["loc"], data)
            if err["type"] == "extra_forbidden":
                problems.append(_unknown_key_problem(path))
            else:
                problems.append(
                    f"{path}: {err['msg']} (got {err.get('input')!r}) in TensorRT-LLM "
                    f"{TRTLLM_VERSION}; fix: {_value_fix(err['type'])}"
                )
        raise TrtllmOptionsError(problems) from None
