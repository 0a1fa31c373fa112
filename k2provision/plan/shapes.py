"""Pool shapes and their evaluation: the parallel layout of each pool, the sizes the model's
dimensions allow, the KV dtype and multimodal serving as rendered, and the memory fit. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from k2provision.core.records import (
    Cluster,
    FitReport,
    GpuSpec,
    KvDtype,
    ModelSpec,
    Parallel,
    PoolName,
)
from k2provision.engines import REGISTRY
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


def pool_names(layout: str) -> list[PoolName]:
    """The pools a layout has."""
    return ["prefill", "decode"] if layout == "pd" else ["nodes"]


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
        found = divisibility_problems(shape, spec)
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
