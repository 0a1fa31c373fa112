"""The memory fit: what one GPU of a pool holds, engine by engine, and the fraction to render.

Per GPU: weights (each class in its own format, split the way the layout splits it), the
runtime reserve (activations of the largest forward pass and of the sampler, CUDA graphs for
the captured batch sizes, NCCL / custom all-reduce / DeepEP buffers, the vision encoder's
profiling), a safety margin (k2_reserve_gib) for what no engine accounts for, and the KV cache
in what remains, in the KV dtype actually rendered.

Each engine sizes its KV cache its own way, and the fit follows that way (docs/fit.md has the
derivations and the calibration against published engine figures):

- vLLM 0.33.0 (vllm/v1/worker/gpu_worker.py determine_available_memory): KV = utilization x
  total - weights - profiled peak activations - non-torch memory - CUDA graph memory (counted
  since 0.21); blocks = KV // page; tokens = blocks x block size (x DCP size).
- SGLang 0.5.23 (mem_cache/kv_cache_configurator.py _profile_available_bytes): KV = free
  memory after loading - (1 - mem_fraction_static) x free memory before loading; the rest
  of the GPU must hold activations, graphs and buffers.
- TensorRT-LLM 1.2 (KvCacheConfig.free_gpu_memory_fraction): KV = fraction x the memory
  free after weights and warm-up; graphs and buffers allocated later need the rest.
- KTransformers 0.3: routed experts in host memory; the GPU holds the rest and the cache.

The fraction each engine is given is derived here: the largest that leaves the counted
reserve plus the margin outside the engine's static pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.records import (
    EngineName,
    FitReport,
    GpuSpec,
    KvDtype,
    MemoryReserve,
    ModelSpec,
    Parallel,
    PoolName,
    Tunables,
)

MIB = 1024**2
KV_DTYPE_BYTES: dict[KvDtype, int] = {"bf16": 2, "fp8": 1}

# vLLM caps the utilization it is given at the value its recipes recommend to maximize the
# KV cache ("Set --gpu-memory-utilization=0.95", vllm-project/recipes Kimi-K2-Instruct).
VLLM_MAX_UTILIZATION = 0.95
# FlashMLA pages (vLLM's default MLA backend on Hopper and Blackwell).
VLLM_MLA_BLOCK_SIZE = 64
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
# vLLM samples at most max_num_seqs rows: FP32 logits, their sorted copy and int64 indices
# (the top-k/top-p path of v1/sample/ops/topk_topp_sampler.py) are four FP32-sized copies.
SAMPLER_COPIES = 4


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
class VllmRelease:
    """The parts of vLLM's memory accounting that changed between releases."""

    version: str
    default_utilization: float
    counts_cuda_graphs: bool


VLLM_PINNED = VllmRelease(version="0.33.0", default_utilization=0.92, counts_cuda_graphs=True)


# ---------------------------------------------------------------- weights per GPU


def weights_per_gpu(f: PoolFit) -> tuple[float, float]:
    """(all weights, of which vision) in bytes on the most loaded GPU of the pool."""
    spec, p = f.spec, f.parallel
    w = catalog.weights(spec)
    vision = w.vision if f.vision_loaded else 0.0
    if f.engine == "ktransformers":
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
    """vLLM's encoder profiling: the tower's activations for its largest dummy input (a
    3000x3000 image, kimi_k25.py MaxImageTokenMeta) plus the embeddings kept for it."""
    v = spec.vision
    if v is None:
        return 0.0
    patches = math.ceil(3000 / v.patch_size) ** 2
    per_patch = (6 * v.hidden_size + 2 * v.intermediate_size) * 2
    merged = patches // (v.merge_kernel[0] * v.merge_kernel[1])
    return (patches * per_patch + merged * spec.hidden_size * 2) / GIB


def vllm_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.33.0 picks for `vllm serve` on this GPU
    (engine/arg_utils.py get_batch_defaults)."""
    total = gpu.usable_gib
    if total >= 160:
        return 16384, 1024
    if total >= 70 and gpu.key != "a100":
        return 8192, 1024
    return 2048, 256


def _graph_gib(capture_tokens: int, graphs: int, spec: ModelSpec, p: Parallel) -> float:
    return (
        capture_tokens * forward_bytes_per_token(spec, p) + graphs * GRAPH_MIB_PER_GRAPH * MIB
    ) / GIB


def _vllm_capture_sizes(max_size: int) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 up to 256 and every 16 above."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, min(256, max_size) + 1, 8))
    sizes += list(range(272, max_size + 1, 16))
    return sizes


def vllm_reserve(f: PoolFit, release: VllmRelease = VLLM_PINNED) -> MemoryReserve:
    """What vLLM's profile counts besides weights, per GPU."""
    t = f.tunables
    p = f.parallel
    if f.layout == "dp_ep":
        batched, seqs = t.vllm_max_num_batched_tokens, t.vllm_max_num_seqs
    else:
        batched, seqs = vllm_batch_defaults(f.gpu)
    forward = batched * forward_bytes_per_token(f.spec, p) / GIB
    sampler = SAMPLER_COPIES * seqs * f.spec.vocab_size * 4 / GIB
    graphs = 0.0
    if release.counts_cuda_graphs:
        sizes = _vllm_capture_sizes(min(seqs * 2, 512))
        # FULL decode graphs and PIECEWISE graphs: one set each (FULL_AND_PIECEWISE).
        graphs = _graph_gib(sizes[-1], 2 * len(sizes), f.spec, p)
    group = p.tp if f.layout != "dp_ep" else p.ep
    return MemoryReserve(
        activations=round(max(forward, sampler), 2),
        cuda_graphs=round(graphs, 2),
        comm_buffers=round(collective_buffers_gib(group, f.gpus_per_node), 2),
        runtime=RUNTIME_GIB,
        encoder=round(vision_profile_gib(f.spec) if f.vision_loaded else 0.0, 2),
        margin=t.reserve_gib,
    )


def sglang_reserve(f: PoolFit) -> MemoryReserve:
    """What SGLang needs outside its static pool (weights + KV), per GPU."""
    t = f.tunables
    p = f.parallel
    spec = f.spec
    if f.pool == "decode":
        tokens = t.cuda_graph_max_bs_decode
        graph_rows = t.cuda_graph_max_bs_decode
        # DeepEP low-latency mode: its RDMA buffer, and inside the graphs, for every row a
        # local expert can receive (tokens per rank from every rank), the grouped GEMM
        # pipeline's tensors: the received row, gate/up output, activation, down output.
        local_experts = (spec.n_routed_experts + p.redundant_experts) / p.ep
        row = (2 * spec.hidden_size + 3 * spec.moe_intermediate_size) * 2
        received = local_experts * p.ep * tokens * row / GIB
        comm = deepep_low_latency_gib(spec, p, tokens)
        graphs = _graph_gib(tokens, graph_rows, spec, p) + received
    elif f.pool == "prefill":
        # The render gives SGLang per rank x DP, which 0.5.23 divides by the attention-DP size.
        tokens = t.prefill_chunk_per_rank
        comm = DEEPEP_NORMAL_GIB
        graphs = 0.0  # --deepep-mode normal disables CUDA graphs
    else:
        tokens = 8192 if f.gpu.usable_gib >= 60 else 4096  # 0.5.23's chunk default
        graph_rows = 512 if p.tp >= 4 else 256  # its decode max_bs default
        graphs = _graph_gib(graph_rows, graph_rows, spec, p)
        comm = 0.0
    comm += collective_buffers_gib(p.tp, f.gpus_per_node)
    return MemoryReserve(
        activations=round(tokens * forward_bytes_per_token(spec, p) / GIB, 2),
        cuda_graphs=round(graphs, 2),
        comm_buffers=round(comm, 2),
        runtime=RUNTIME_GIB,
        encoder=round(vision_profile_gib(spec) if f.vision_loaded else 0.0, 2),
        margin=t.reserve_gib,
    )


def trtllm_reserve(f: PoolFit) -> MemoryReserve:
    """TensorRT-LLM: warm-up activations for max_num_tokens, graphs for the padded batch
    sizes (powers of two up to 128), NCCL/MPI buffers."""
    t = f.tunables
    p = f.parallel
    graph_max = min(t.trtllm_max_batch_size, 128)
    graphs = int(math.log2(graph_max)) + 1
    return MemoryReserve(
        activations=round(t.trtllm_max_num_tokens * forward_bytes_per_token(f.spec, p) / GIB, 2),
        cuda_graphs=round(_graph_gib(graph_max, graphs, f.spec, p), 2),
        comm_buffers=round(collective_buffers_gib(p.tp, f.gpus_per_node), 2),
        runtime=RUNTIME_GIB,
        margin=t.reserve_gib,
    )


def ktransformers_reserve(f: PoolFit) -> MemoryReserve:
    """KTransformers: one GPU, no collectives; activations for its prefill chunk."""
    return MemoryReserve(
        activations=round(8192 * forward_bytes_per_token(f.spec, f.parallel) / GIB, 2),
        cuda_graphs=0.0,
        comm_buffers=0.0,
        runtime=RUNTIME_GIB,
        margin=f.tunables.reserve_gib,
    )


# ---------------------------------------------------------------- fractions and KV


def _floor2(x: float) -> float:
    return math.floor(x * 100) / 100


def fit_pool(f: PoolFit) -> FitReport:
    """The fit of one pool: derived memory fraction, KV capacity, and whether it holds one
    request of `context_length`."""
    weights_b, vision_b = weights_per_gpu(f)
    weights = weights_b / GIB
    usable = f.gpu.usable_gib
    if f.engine == "vllm":
        reserve = vllm_reserve(f)
        fraction = min(VLLM_MAX_UTILIZATION, _floor2(1 - reserve.margin / usable))
        budget = fraction * usable
        kv = budget - weights - (reserve.total - reserve.margin)
    elif f.engine == "sglang":
        reserve = sglang_reserve(f)
        # SGLang measures free memory once its runtime is up, before loading weights; the
        # buffers and graphs allocated later must fit in (1 - fraction) of that.
        before_load = usable - reserve.runtime
        fraction = _floor2(1 - (reserve.total - reserve.runtime) / before_load)
        budget = fraction * before_load
        kv = budget - weights
    elif f.engine == "trtllm":
        reserve = trtllm_reserve(f)
        free = usable - weights - reserve.activations - reserve.comm_buffers - reserve.runtime
        later = reserve.cuda_graphs + reserve.margin
        fraction = _floor2(1 - later / free) if free > later else 0.0
        budget = weights + fraction * max(free, 0.0)
        kv = fraction * max(free, 0.0)
    else:
        reserve = ktransformers_reserve(f)
        fraction = _floor2(1 - reserve.total / usable)
        budget = fraction * usable
        kv = budget - weights
    return _report(f, reserve, fraction, budget, weights, vision_b / GIB, kv)


def _report(
    f: PoolFit,
    reserve: MemoryReserve,
    fraction: float,
    budget: float,
    weights: float,
    vision: float,
    kv_gib: float,
) -> FitReport:
    p = f.parallel
    kv_gib = max(kv_gib, 0.0)
    layers_per_gpu = -(-f.spec.num_hidden_layers // p.pp)
    per_token = (
        catalog.kv_bytes_per_token_per_layer(f.spec, KV_DTYPE_BYTES[f.kv_dtype]) * layers_per_gpu
    )
    tokens = int(kv_gib * GIB // per_token)
    if f.engine == "vllm":
        block = VLLM_MLA_BLOCK_SIZE
        tokens = tokens // block * block
    replica = tokens * p.dcp
    groups = max(f.gpus // (p.attention_tp * p.pp), 1)
    return FitReport(
        pool=f.pool,
        gpu_memory_gib=round(f.gpu.memory_mib / 1024, 1),
        usable_gib=round(f.gpu.usable_gib, 1),
        mem_fraction=fraction,
        budget_gib=round(budget, 1),
        weights_gib=round(weights, 1),
        vision_gib=round(vision, 1),
        reserve=reserve,
        reserve_gib=round(reserve.total, 1),
        kv_gib=round(kv_gib, 1),
        kv_dtype=f.kv_dtype,
        kv_bytes_per_token=per_token,
        kv_tokens_per_gpu=tokens,
        kv_tokens_per_replica=replica,
        kv_tokens_total=replica * groups,
        context_length=f.context_length,
        fits=replica >= f.context_length,
    )


def vllm_kv_tokens(f: PoolFit, release: VllmRelease, utilization: float) -> int:
    """vLLM's "GPU KV cache size" for a release and utilization (x DCP, as vLLM logs it):
    the calibration entry point, following gpu_worker.determine_available_memory."""
    weights_b, _ = weights_per_gpu(f)
    reserve = vllm_reserve(f, release)
    kv = utilization * f.gpu.usable_gib - weights_b / GIB - (reserve.total - reserve.margin)
    per_token = catalog.kv_bytes_per_token_per_layer(
        f.spec, KV_DTYPE_BYTES[f.kv_dtype]
    ) * -(-f.spec.num_hidden_layers // f.parallel.pp)
    blocks = int(max(kv, 0.0) * GIB // (per_token * VLLM_MLA_BLOCK_SIZE))
    return blocks * VLLM_MLA_BLOCK_SIZE * f.parallel.dcp


# ---------------------------------------------------------------- calibration


@dataclass(frozen=True)
class CalibrationPoint:
    """A figure an engine published, and the settings it was measured at."""

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
        return vllm_kv_tokens(self.fit, self.release, self.utilization)


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
VLLM_2025_11 = VllmRelease(version="0.11.1rc", default_utilization=0.90, counts_cuda_graphs=False)
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
        release=VLLM_2025_11,
        utilization=0.90,
    ),
    CalibrationPoint(
        name="vllm-k2-thinking-tp8-dcp8",
        source=_RECIPE,
        settings="as above with --decode-context-parallel-size 8",
        published=5721088,
        unit='tokens ("GPU KV cache size", x DCP)',
        fit=_k2_thinking_tp8(8),
        release=VLLM_2025_11,
        utilization=0.90,
    ),
)
