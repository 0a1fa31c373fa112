"""Pool shapes and their evaluation: the parallel layout of each pool, the sizes the model's
dimensions and weight formats allow (and the MoE kernel paths the engine has for them), the
KV dtype and multimodal serving as rendered, and the memory fit. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from k2provision.core.layouts import Layout
from k2provision.core.records import (
    Cluster,
    FitReport,
    GpuSpec,
    KvDtype,
    ModelSpec,
    Parallel,
    PoolName,
    WeightFormat,
)
from k2provision.engines import REGISTRY
from k2provision.engines.base import WeightSlices
from k2provision.plan.fit import PoolFit, fit_pool


@dataclass(frozen=True)
class PoolShape:
    """The parallel shape of one pool before host names are attached."""

    name: PoolName
    nodes: int
    gpus: int
    parallel: Parallel


@dataclass(frozen=True)
class Choices:
    """What the plan decides besides shapes; the fit counts exactly these."""

    kv_dtype: KvDtype
    vision_loaded: bool
    multimodal: bool
    language_model_only: bool


def pool_names(layout: Layout) -> list[PoolName]:
    """The pools a layout has."""
    return list(layout.pools)


def pool_shapes(cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec) -> list[PoolShape]:
    """Parallel shapes for a layout given how many nodes each pool has."""
    engine = REGISTRY[cluster.engine]
    return [
        PoolShape(
            name=name,
            nodes=nodes,
            gpus=1 if engine.SINGLE_GPU else nodes * cluster.gpus_per_node,
            parallel=engine.pool_shape(cluster, name, nodes, spec),
        )
        for name, nodes in counts.items()
    ]


def divisibility_problems(shape: PoolShape, spec: ModelSpec) -> list[str]:
    """Sizes that the model's dimensions do not allow."""
    p = shape.parallel
    problems = []
    if spec.num_attention_heads % p.attention_tp:
        problems.append(
            f"attention tensor parallel size {p.attention_tp} does not divide the model's "
            f"{spec.num_attention_heads} attention heads"
        )
    if p.ep > 1 and (spec.n_routed_experts + p.redundant_experts) % p.ep:
        problems.append(
            f"expert parallel size {p.ep} does not divide {spec.n_routed_experts} experts"
            + (f" + {p.redundant_experts} redundant" if p.redundant_experts else "")
        )
    if p.pp > spec.num_hidden_layers:
        problems.append(f"pipeline size {p.pp} exceeds the model's {spec.num_hidden_layers} layers")
    if p.pp > 1 and p.tp * p.pp != shape.gpus:
        problems.append(f"tp {p.tp} x pp {p.pp} does not use the pool's {shape.gpus} GPUs")
    if p.dcp > 1 and p.tp % p.dcp:
        problems.append(
            f"decode context parallel size {p.dcp} does not divide tensor parallel size {p.tp}"
        )
    return problems


# The smallest slice each stored format allows, per rank, of a dimension split by TP.
# FP8 128x128 blocks: the gate/up output and the down input of every slice hold whole blocks
# (SGLang 0.5.23 layers/quantization/fp8.py:1588 Fp8MoEMethod.create_weights and :570
# validate_block_quant_shapes; vLLM 0.33.0 model_executor/layers/quantization/utils/
# fp8_utils.py:1296 validate_fp8_block_shape and :1347 validate_fp8_block_shape_moe:
# "... is not divisible by weight quantization block_n = 128").
FP8_BLOCK_SLICE = 128
# INT4 groups of 32 through the Marlin MoE kernels (what both releases run compressed-tensors
# INT4 experts with): the down projection's input holds whole groups and a Marlin thread
# tile of 64 (vLLM 0.33.0 model_executor/layers/quantization/utils/marlin_utils.py:356
# check_moe_marlin_supports_config, `intermediate % max(64, group_size)`; SGLang 0.5.23
# compressed_tensors_wNa16_moe.py creates `intermediate_size_per_partition // group_size`
# scales and repacks for the same Marlin kernel).
MARLIN_MIN_SLICE = 64


def slice_quantum(fmt: WeightFormat) -> int:
    """What a per-rank slice of a weight stored in `fmt` must be a multiple of."""
    if fmt.scheme == "fp8_block":
        return FP8_BLOCK_SLICE
    if fmt.scheme == "int4_group":
        return max(MARLIN_MIN_SLICE, fmt.group_size)
    return 1


def split_problems(slices: WeightSlices, spec: ModelSpec) -> list[str]:
    """Per-rank slices of the MLP weights that their stored format cannot be cut into."""
    q = spec.quantization
    weights = (
        ("each routed expert's", spec.moe_intermediate_size, slices.expert, q.routed_experts),
        (
            "the shared experts'",
            spec.moe_intermediate_size * spec.n_shared_experts,
            slices.shared,
            q.shared_experts,
        ),
        ("the dense MLP's", spec.intermediate_size, slices.dense, q.dense_mlp),
    )
    problems = []
    for what, size, ranks, fmt in weights:
        quantum = slice_quantum(fmt)
        if ranks <= 1 or not size:
            continue
        if size % ranks or (size // ranks) % quantum:
            per_rank = f"{size // ranks}" if size % ranks == 0 else f"{size}/{ranks}"
            need = f"a multiple of {quantum} ({fmt.label})" if quantum > 1 else "whole"
            problems.append(
                f"{what} intermediate size {size} split over {ranks} ranks gives {per_rank} "
                f"per rank, which must be {need}: the loader refuses the split"
            )
    return problems


def load_problems(cluster: Cluster, shape: PoolShape, spec: ModelSpec) -> list[str]:
    """Why the pinned release would fail to load or run the model in this pool: weight slices
    its loader cannot cut, or no MoE kernel path for the weight format."""
    engine = REGISTRY[cluster.engine]
    slices = engine.weight_slices(cluster, shape.name, shape.parallel)
    return [
        *engine.kernel_path_problems(cluster, shape.name, spec),
        *split_problems(slices, spec),
    ]


def choices(cluster: Cluster, spec: ModelSpec, gpu: GpuSpec) -> Choices:
    """KV dtype and multimodal serving as they will be rendered."""
    t = cluster.tunables
    engine = REGISTRY[cluster.engine]
    kv = engine.kv_dtype(t, gpu)
    wanted = spec.multimodal if t.multimodal is None else t.multimodal
    multimodal = wanted and spec.multimodal
    text_only = spec.multimodal and not multimodal and engine.TEXT_ONLY
    return Choices(
        kv_dtype=kv,
        vision_loaded=spec.multimodal and not text_only,
        multimodal=multimodal or (spec.multimodal and not text_only),
        language_model_only=text_only,
    )


def _fit(
    cluster: Cluster, shape: PoolShape, spec: ModelSpec, gpu: GpuSpec, context: int
) -> FitReport:
    c = choices(cluster, spec, gpu)
    return fit_pool(
        PoolFit(
            engine=cluster.engine,
            layout=cluster.layout,
            pool=shape.name,
            nodes=shape.nodes,
            gpus=shape.gpus,
            gpus_per_node=cluster.gpus_per_node,
            parallel=shape.parallel,
            spec=spec,
            gpu=gpu,
            context_length=context,
            kv_dtype=c.kv_dtype,
            vision_loaded=c.vision_loaded,
            tunables=cluster.tunables,
        )
    )


def fit_problem(report: FitReport) -> str:
    """One clause saying why a pool's memory does not fit."""
    used = report.weights_gib + report.reserve_gib
    return (
        f"{report.weights_gib} GiB of weights + {report.reserve_gib} GiB reserve per GPU "
        f"(activations {report.reserve.activations}, CUDA graphs {report.reserve.cuda_graphs}, "
        f"buffers {report.reserve.comm_buffers}, runtime {report.reserve.runtime}, "
        f"margin {report.reserve.margin}) of "
        f"{report.usable_gib} GiB leave {report.kv_gib} GiB: KV cache for "
        f"{report.kv_tokens_per_replica} tokens, {report.context_length} needed"
        + (" (weights and reserve alone exceed the GPU)" if used >= report.usable_gib else "")
    )


def evaluate(
    cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[list[PoolShape], list[FitReport], dict[PoolName, list[str]]]:
    """Shapes, fits and per-pool problems of one candidate layout."""
    shapes = pool_shapes(cluster, counts, spec)
    reports = []
    problems: dict[PoolName, list[str]] = {}
    for shape in shapes:
        report = _fit(cluster, shape, spec, gpu, context)
        reports.append(report)
        found = divisibility_problems(shape, spec) + load_problems(cluster, shape, spec)
        if not report.fits:
            found.append(fit_problem(report))
        if found:
            problems[shape.name] = found
    return shapes, reports, problems


def all_pools_fit(
    cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec, context: int
) -> bool:
    return not evaluate(cluster, counts, spec, gpu, context)[2]


def sizes_text(p: Parallel) -> str:
    """The one description of a parallel layout, sizes above 1 only:
    'tp 96, dp 96 (attn), ep 96, +96 spare experts' or 'tp 8, pp 2, dcp 8'."""
    parts = [f"tp {p.tp}"]
    if p.pp > 1:
        parts.append(f"pp {p.pp}")
    if p.dp > 1:
        parts.append(f"dp {p.dp}" + (" (attn)" if p.dp_attention else ""))
    if p.ep > 1:
        parts.append(f"ep {p.ep}")
    if p.redundant_experts:
        parts.append(f"+{p.redundant_experts} spare experts")
    if p.dcp > 1:
        parts.append(f"dcp {p.dcp}")
    return ", ".join(parts)


def nodes_text(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"
