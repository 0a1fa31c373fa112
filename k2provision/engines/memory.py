"""The engine-neutral arithmetic of the memory fit: what a pool is, its weights per GPU, and
the activation, CUDA graph and buffer sizes every engine's reserve is built from. Pure.

Each engine's own accounting (what it reserves, how it turns a memory fraction into KV cache)
lives in its module behind `reserve` and `kv_budget` (engines/base.py); plan/fit.py combines
them. docs/fit.md has the derivations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.records import (
    EngineName,
    GpuSpec,
    KvDtype,
    ModelSpec,
    Parallel,
    PoolName,
    Tunables,
)

MIB = 1024**2
KV_DTYPE_BYTES: dict[KvDtype, int] = {"bf16": 2, "fp8": 1}

# CUDA graph memory per captured graph beyond the largest capture's activations: SGLang
# reserves 2 MB per decode batch row (arg_groups/memory_hook.py reserve_for_graph_mb); vLLM
# measures at least 1 MiB per graph (gpu_model_runner.py profile_cudagraph_memory).
GRAPH_MIB_PER_GRAPH = 2
# Non-torch memory per GPU that vLLM's profiler measured: 1.79 GiB at TP1 and 3.58 GiB at TP2
# (H100, vLLM PR #10511), 7.16 GiB at TP8 (H200, DeepSeek-R1). At TP1 it is the runtime's
# own (CUDA context growth as kernel modules load, library workspaces); each doubling of
# the NVLink group adds as much again for NCCL / custom all-reduce buffers, up to a node
# (rings across nodes add no per-peer buffers).
RUNTIME_GIB = 1.79
COLLECTIVES_GIB_PER_DOUBLING = 1.79
# DeepEP normal-mode (prefill) NVLink and RDMA buffers: DeepEP's own size hints for a
# 7168-wide BF16 hidden state stay under 1 GiB per rank.
DEEPEP_NORMAL_GIB = 1.0


@dataclass(frozen=True)
class PoolFit:
    """Everything about one pool that the fit depends on."""

    engine: EngineName
    layout: str
    pool: PoolName
    nodes: int
    gpus: int  # GPUs the pool uses
    gpus_per_node: int
    parallel: Parallel
    spec: ModelSpec
    gpu: GpuSpec
    context_length: int
    kv_dtype: KvDtype
    vision_loaded: bool
    tunables: Tunables


@dataclass(frozen=True)
class KvBudget:
    """How an engine turns the GPU's memory into KV cache: the fraction rendered, the memory
    it governs and the KV cache left in it (GiB per GPU)."""

    fraction: float
    budget_gib: float
    kv_gib: float


def floor2(x: float) -> float:
    """`x` rounded down to the hundredths a memory fraction is rendered with."""
    return math.floor(x * 100) / 100


# ---------------------------------------------------------------- weights per GPU


def weights_per_gpu(f: PoolFit, routed_experts_on_host: bool = False) -> tuple[float, float]:
    """(all weights, of which vision) in bytes on the most loaded GPU of the pool."""
    spec, p = f.spec, f.parallel
    w = catalog.weights(spec)
    vision = w.vision if f.vision_loaded else 0.0
    if routed_experts_on_host:
        # Routed experts live in host memory; everything else sits on the one GPU.
        on_gpu = w.total - w.routed_experts - w.vision
        return on_gpu + vision, vision
    stages = p.pp
    expert_shards = max(p.tp, p.ep) * stages
    redundant_per_gpu = p.redundant_experts / p.ep if p.ep > 1 else 0.0
    split = p.attention_tp * stages
    embeddings = w.embeddings / p.attention_tp / min(stages, 2)
    total = (
        w.routed_experts / expert_shards
        + redundant_per_gpu * catalog.one_expert_all_layers_bytes(spec)
        + w.attention_replicated / stages
        + (w.attention_split + w.shared_experts + w.dense_mlp) / split
        + w.gates / stages
        + embeddings
        + vision
    )
    return total, vision


def kv_bytes_per_token(f: PoolFit) -> int:
    """KV cache bytes of one token on one GPU: every layer of its pipeline stage, in the KV
    dtype rendered."""
    layers_per_gpu = -(-f.spec.num_hidden_layers // f.parallel.pp)
    return catalog.kv_bytes_per_token_per_layer(f.spec, KV_DTYPE_BYTES[f.kv_dtype]) * layers_per_gpu


# ---------------------------------------------------------------- the runtime reserve


def forward_bytes_per_token(spec: ModelSpec, p: Parallel) -> float:
    """Working set of one token in a forward pass on one GPU: the residual stream, MLA's
    expanded query/key/value for the local heads, and the MoE's permuted copies (one per
    chosen expert) with their gate/up and activation outputs."""
    h = spec.hidden_size
    heads = spec.num_attention_heads / p.attention_tp
    residual = 4 * h * 2
    mla = (
        heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) * 2 * 2
        + heads * spec.v_head_dim * 2 * 2
        + (spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
    )
    moe_width = spec.moe_intermediate_size / (p.tp if p.ep == 1 else 1)
    moe = (
        spec.num_experts_per_tok * h * 2 * 2
        + spec.num_experts_per_tok * 2 * moe_width * 2 * 2
        + spec.n_routed_experts * 4
    )
    return residual + mla + moe


def activations_gib(tokens: int, spec: ModelSpec, p: Parallel) -> float:
    """The forward pass of `tokens` tokens on one GPU."""
    return tokens * forward_bytes_per_token(spec, p) / GIB


def collective_buffers_gib(group: int, gpus_per_node: int) -> float:
    """NCCL / custom all-reduce buffers per GPU for a group of `group` GPUs."""
    local = max(1, min(group, gpus_per_node))
    return COLLECTIVES_GIB_PER_DOUBLING * math.log2(local)


def deepep_low_latency_gib(spec: ModelSpec, p: Parallel, tokens_per_rank: int) -> float:
    """DeepEP's low-latency RDMA buffer (csrc/config.hpp LowLatencyLayout): two send and two
    receive buffers of experts x tokens x one combine message (BF16 hidden + scales)."""
    experts = spec.n_routed_experts + p.redundant_experts
    scales = spec.hidden_size // 128
    combine_msg = scales * 4 + spec.hidden_size * 2
    return 4 * experts * tokens_per_rank * combine_msg / GIB


def vision_profile_gib(spec: ModelSpec) -> float:
    """The encoder's profiling: the tower's activations for its largest dummy input (a
    3000x3000 image, kimi_k25.py MaxImageTokenMeta) plus the embeddings kept for it."""
    v = spec.vision
    if v is None:
        return 0.0
    patches = math.ceil(3000 / v.patch_size) ** 2
    per_patch = (6 * v.hidden_size + 2 * v.intermediate_size) * 2
    merged = patches // (v.merge_kernel[0] * v.merge_kernel[1])
    return (patches * per_patch + merged * spec.hidden_size * 2) / GIB


def encoder_gib(f: PoolFit) -> float:
    """The encoder's profiling when the vision tower is loaded, rounded as reserves are."""
    return round(vision_profile_gib(f.spec) if f.vision_loaded else 0.0, 2)


def graph_gib(capture_tokens: int, graphs: int, spec: ModelSpec, p: Parallel) -> float:
    """CUDA graphs: the largest capture's activations plus a fixed share per graph."""
    return (
        capture_tokens * forward_bytes_per_token(spec, p) + graphs * GRAPH_MIB_PER_GRAPH * MIB
    ) / GIB
