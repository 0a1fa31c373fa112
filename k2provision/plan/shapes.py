"""Pool shapes and their evaluation: the parallel layout of each pool, the sizes the model's
dimensions allow, the KV dtype and multimodal serving as rendered, and the memory fit. Pure."""

from __future__ import annotations

from collections.abc import Callable
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
from k2provision.plan.fit import PoolFit, fit_pool

# Engines whose pinned release renders an FP8 KV cache for MLA on Hopper and Blackwell:
# SGLang --kv-cache-dtype fp8_e4m3, vLLM --kv-cache-dtype fp8, TensorRT-LLM
# kv_cache_config.dtype fp8.
FP8_KV_ENGINES = ("sglang", "vllm", "trtllm")
# Engines whose pinned release can leave a multimodal model's vision tower unloaded
# (vLLM --language-model-only; SGLang 0.5.23's --language-model-only does not accept
# KimiK25ForConditionalGeneration: server_args.py LANGUAGE_MODEL_ONLY_ARCHITECTURES).
TEXT_ONLY_ENGINES = ("vllm",)
# Layouts whose vLLM engine splits attention with tensor parallelism (where DCP applies).
DCP_LAYOUTS = ("tp", "tp_pp")


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


def _shape_tp(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=nodes * gpn)


def _shape_dp_attention_ep(nodes: int, gpn: int, redundant: int = 0) -> Parallel:
    n = nodes * gpn
    return Parallel(tp=n, dp=n, ep=n, dp_attention=True, redundant_experts=redundant)


def _shape_vllm_tp_pp(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=gpn, pp=nodes)


def _shape_vllm_dp_ep(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=1, dp=nodes * gpn, ep=nodes * gpn)


def _shape_trtllm(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=nodes * gpn, dp=nodes * gpn, ep=gpn, dp_attention=True)


def _shape_single(nodes: int, gpn: int) -> Parallel:
    return Parallel(tp=1)


SHAPES: dict[tuple[str, str], Callable[[int, int], Parallel]] = {
    ("sglang", "tp"): _shape_tp,
    ("vllm", "tp"): _shape_tp,
    ("vllm", "tp_pp"): _shape_vllm_tp_pp,
    ("vllm", "dp_ep"): _shape_vllm_dp_ep,
    ("trtllm", "tp_ep"): _shape_trtllm,
    ("ktransformers", "single"): _shape_single,
}


def pool_names(layout: str) -> list[PoolName]:
    """The pools a layout has."""
    return ["prefill", "decode"] if layout == "pd" else ["nodes"]


def dcp_size(cluster: Cluster, spec: ModelSpec, parallel: Parallel) -> int:
    """vLLM decode context parallelism: k2_vllm_decode_context_parallel_size, else the GPUs
    of a node where the model's recipes show it pays (vllm-project/recipes: Kimi-K2-Thinking
    TP8+DCP8 on 8xH200, +43% output throughput; Kimi-K2 TP8+PP2 with -dcp 8)."""
    if cluster.engine != "vllm" or cluster.layout not in DCP_LAYOUTS:
        return 1
    chosen = cluster.tunables.vllm_decode_context_parallel_size
    if chosen is not None:
        return chosen
    if not spec.decode_context_parallel:
        return 1
    size = cluster.gpus_per_node
    return size if parallel.tp % size == 0 else 1


def pool_shapes(cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec) -> list[PoolShape]:
    """Parallel shapes for a layout given how many nodes each pool has."""
    gpn = cluster.gpus_per_node
    shapes = []
    t = cluster.tunables
    for name, nodes in counts.items():
        if cluster.layout == "pd":
            # One spare expert slot per GPU of each pool (EPLB rebalances them) unless the
            # inventory says otherwise, as the production 4P12D config does (32 + 96).
            redundant = t.decode_redundant_experts if name == "decode" else (
                t.prefill_redundant_experts
            )
            parallel = _shape_dp_attention_ep(
                nodes, gpn, nodes * gpn if redundant is None else redundant
            )
        else:
            parallel = SHAPES[(cluster.engine, cluster.layout)](nodes, gpn)
            dcp = dcp_size(cluster, spec, parallel)
            if dcp != 1:
                parallel = parallel.model_copy(update={"dcp": dcp})
            if (cluster.engine, cluster.layout) == ("vllm", "dp_ep"):
                spare = t.vllm_redundant_experts
                parallel = parallel.model_copy(
                    update={"redundant_experts": nodes * gpn if spare is None else spare}
                )
        gpus = 1 if cluster.engine == "ktransformers" else nodes * gpn
        shapes.append(PoolShape(name=name, nodes=nodes, gpus=gpus, parallel=parallel))
    return shapes


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
    if cluster.engine == "trtllm":
        kv: KvDtype = "fp8" if t.trtllm_kv_cache_dtype == "fp8" and gpu.fp8 else "bf16"
    else:
        kv = "fp8" if t.kv_cache_dtype == "fp8" else "bf16"
    wanted = spec.multimodal if t.multimodal is None else t.multimodal
    multimodal = wanted and spec.multimodal
    text_only = spec.multimodal and not multimodal and cluster.engine in TEXT_ONLY_ENGINES
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
    return (
        f"tp {p.tp}"
        + (f", pp {p.pp}" if p.pp > 1 else "")
        + (f", dp {p.dp}, ep {p.ep}" if p.ep > 1 else "")
        + (f", dcp {p.dcp}" if p.dcp > 1 else "")
    )


def nodes_text(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"
