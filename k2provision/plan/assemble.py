"""Cluster + model + hardware -> Plan: parallel layout, ranks, memory fit, rendered launches.

Pure: no I/O beyond reading a k2_model_config_json. `build_plan` refuses a cluster that cannot
serve the model, naming the numbers and only fixes that work: every suggested change (node
counts, layouts, redundant experts, GPUs per node, KV dtype, context) is planned again and
offered only when that plan fits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.preflight import version_at_least
from k2provision.core.records import (
    LAYOUTS,
    Cluster,
    ContainerOptions,
    EngineName,
    EngineRelease,
    FitReport,
    GpuSpec,
    HostPlan,
    KvDtype,
    ModelSpec,
    Parallel,
    Plan,
    PoolName,
    PoolPlan,
    WeightsInfo,
)
from k2provision.core.templating import host_values_path, host_values_script, launch_script
from k2provision.engines import REGISTRY
from k2provision.engines.base import Deployment
from k2provision.engines.common import multi_host, socket_warnings
from k2provision.engines.trtllm import served_model_name as trtllm_served_name
from k2provision.errors import PlanError
from k2provision.plan.fit import PoolFit, fit_pool
from k2provision.plan.ports import host_ports

LAB_IMAGE = "localhost/k2-standin:lab"
MAX_SEARCH_NODES = 64
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


def _fits(
    cluster: Cluster, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec, context: int
) -> bool:
    return not evaluate(cluster, counts, spec, gpu, context)[2]


def _sizes(p: Parallel) -> str:
    return (
        f"tp {p.tp}"
        + (f", pp {p.pp}" if p.pp > 1 else "")
        + (f", dp {p.dp}, ep {p.ep}" if p.ep > 1 else "")
        + (f", dcp {p.dcp}" if p.dcp > 1 else "")
    )


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _on(n: int, shape: PoolShape, gpn: int, gpu: GpuSpec) -> str:
    """"2 nodes x 8 h100 (tp 16; 16 GPUs)"."""
    return f"{_nodes(n)} x {gpn} {gpu.key} ({_sizes(shape.parallel)}; {shape.gpus} GPUs)"


# ---------------------------------------------------------------- fixes that work


def _counts_by_size(layout: str) -> Iterator[dict[PoolName, int]]:
    """Node counts for a layout, fewest nodes first."""
    if layout == "single":
        yield {"nodes": 1}
    elif layout == "pd":
        for total in range(2, MAX_SEARCH_NODES // 2 + 1):
            for prefill in range(1, total):
                yield {"prefill": prefill, "decode": total - prefill}
    else:
        for n in range(1, MAX_SEARCH_NODES + 1):
            yield {"nodes": n}


def smallest_for_layout(
    cluster: Cluster, layout: str, spec: ModelSpec, gpu: GpuSpec, context: int, below: int
) -> tuple[dict[PoolName, int], int] | None:
    """The fewest nodes (fewer than `below` GPUs) on which `layout` fits: (counts, GPUs)."""
    trial = cluster.model_copy(update={"layout": layout})
    for counts in _counts_by_size(layout):
        gpus = 1 if layout == "single" else sum(counts.values()) * cluster.gpus_per_node
        if gpus >= below:
            return None
        if _fits(trial, counts, spec, gpu, context):
            return counts, gpus
    return None


def smallest_fit(
    cluster: Cluster, spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[str, dict[PoolName, int], int] | None:
    """The layout of the engine with the fewest GPUs that fits: (layout, counts, GPUs)."""
    best: tuple[str, dict[PoolName, int], int] | None = None
    for layout in LAYOUTS[cluster.engine]:
        below = best[2] if best else 10**9
        found = smallest_for_layout(cluster, layout, spec, gpu, context, below)
        if found is not None:
            best = (layout, *found)
    return best


def _describe_layout(
    cluster: Cluster, layout: str, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec
) -> str:
    trial = cluster.model_copy(update={"layout": layout})
    shapes = pool_shapes(trial, counts, spec)
    pools = " + ".join(
        _nodes(s.nodes) + (f" [{s.name}]" if layout == "pd" else "") + f" ({_sizes(s.parallel)})"
        for s in shapes
    )
    return f"k2_layout={layout} on {pools} x {cluster.gpus_per_node} {gpu.key}"


def nearby_counts(
    cluster: Cluster,
    pool: PoolName,
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> list[int]:
    """The nearest node counts below and above the requested one for which `pool` fits."""
    asked = counts[pool]
    limit = max(MAX_SEARCH_NODES, 2 * asked)
    below = next(
        (
            n
            for n in range(asked - 1, 0, -1)
            if pool not in evaluate(cluster, {**counts, pool: n}, spec, gpu, context)[2]
        ),
        None,
    )
    above = next(
        (
            n
            for n in range(asked + 1, limit + 1)
            if pool not in evaluate(cluster, {**counts, pool: n}, spec, gpu, context)[2]
        ),
        None,
    )
    return [n for n in (below, above) if n is not None]


def _shape_of(
    cluster: Cluster, pool: PoolName, counts: dict[PoolName, int], spec: ModelSpec
) -> PoolShape:
    return next(s for s in pool_shapes(cluster, counts, spec) if s.name == pool)


def _pool_fits(
    cluster: Cluster,
    pool: PoolName,
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> bool:
    return pool not in evaluate(cluster, counts, spec, gpu, context)[2]


def fixes(
    cluster: Cluster,
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> dict[PoolName, list[str]]:
    """Changes that make each failing pool fit, each planned again before it is offered.

    PD pools are separate serving instances, so a pool's fix is judged on that pool; a
    change to the whole cluster (layout, GPUs per node, KV dtype, context) only when it
    makes every pool fit."""
    _, reports, problems = evaluate(cluster, counts, spec, gpu, context)
    t = cluster.tunables
    gpn = cluster.gpus_per_node
    out: dict[PoolName, list[str]] = {pool: [] for pool in problems}

    def works(c: Cluster, ctx: int | None = None) -> bool:
        return _fits(c, counts, spec, gpu, ctx or context)

    for pool, found in problems.items():
        # Node counts near what was asked, all else equal.
        near = nearby_counts(cluster, pool, counts, spec, gpu, context)
        if near:
            label = "" if cluster.layout != "pd" else f" [{pool}]"
            options = " or ".join(
                _on(n, _shape_of(cluster, pool, {**counts, pool: n}, spec), gpn, gpu)
                for n in near
            )
            out[pool].append(f"{cluster.engine} {cluster.layout}{label} fits on {options}")
        # Redundant experts that let the decode pool's expert parallelism divide.
        if pool == "decode" and any("expert parallel size" in p for p in found):
            ep = counts["decode"] * cluster.gpus_per_node
            spare = (-spec.n_routed_experts) % ep
            for r in (spare, spare + ep):
                if r == t.decode_redundant_experts:
                    continue
                trial = cluster.model_copy(
                    update={"tunables": t.model_copy(update={"decode_redundant_experts": r})}
                )
                if _pool_fits(trial, pool, counts, spec, gpu, context):
                    out[pool].append(
                        f"k2_decode_redundant_experts={r} ({spec.n_routed_experts} + {r} expert "
                        f"slots over ep {ep}) on these {_nodes(counts['decode'])}"
                    )
                    break

    shared: list[str] = []
    # GPUs per node, when the count given cannot split the model's heads or experts.
    if spec.num_attention_heads % gpn or spec.n_routed_experts % gpn:
        for g in (8, 4, 2, 1):
            trial = cluster.model_copy(update={"gpus_per_node": g})
            if works(trial):
                shared.append(f"k2_gpus_per_node={g} if the hosts have {g} GPUs each")
                break
    # Every other layout of the engine: on these hosts, or on the fewest that fit (for PD
    # pools only when no change to the pools themselves works).
    if cluster.engine != "ktransformers" and (cluster.layout != "pd" or not any(out.values())):
        for layout in LAYOUTS[cluster.engine]:
            if layout == cluster.layout:
                continue
            trial = cluster.model_copy(update={"layout": layout})
            same: dict[PoolName, int] = {"nodes": sum(counts.values())}
            if layout != "pd" and cluster.layout != "pd" and works(trial):
                shared.append(_describe_layout(cluster, layout, same, spec, gpu) + " fits")
                continue
            alt = smallest_for_layout(cluster, layout, spec, gpu, context, 10**9)
            if alt is not None:
                alt_sizes, alt_gpus = alt
                shared.append(
                    f"{_describe_layout(cluster, layout, alt_sizes, spec, gpu)} "
                    f"({alt_gpus} GPUs) fits"
                )
    # vLLM decode context parallelism that divides the TP group (more tokens per replica).
    if cluster.engine == "vllm" and cluster.layout in DCP_LAYOUTS:
        current = dcp_size(cluster, spec, SHAPES[("vllm", cluster.layout)](1, gpn))
        for size in (gpn, 4, 2, 1):
            if size == current:
                continue
            trial = cluster.model_copy(
                update={
                    "tunables": t.model_copy(update={"vllm_decode_context_parallel_size": size})
                }
            )
            if works(trial):
                shared.append(
                    f"k2_vllm_decode_context_parallel_size={size} (each token's KV on one "
                    f"GPU of {size})"
                )
                break
    # An FP8 KV cache, where the engine renders one for MLA.
    c = choices(cluster, spec, gpu)
    if c.kv_dtype == "bf16" and gpu.fp8 and cluster.engine in ("sglang", "vllm"):
        trial = cluster.model_copy(
            update={"tunables": t.model_copy(update={"kv_cache_dtype": "fp8"})}
        )
        if works(trial):
            shared.append("k2_kv_cache_dtype=fp8 (an FP8 KV cache holds twice the tokens)")
    # Text-only serving of a multimodal model, where the engine can drop the vision tower.
    if c.vision_loaded and cluster.engine in TEXT_ONLY_ENGINES:
        trial = cluster.model_copy(update={"tunables": t.model_copy(update={"multimodal": False})})
        if works(trial):
            shared.append("k2_multimodal=false (text only: the vision tower is not loaded)")
    # A shorter context, only when the KV cache (not weights, sizes or buffers) falls short.
    if not any("does not divide" in p for ps in problems.values() for p in ps):
        held = min(r.kv_tokens_per_replica for r in reports)
        if 0 < held < context and works(cluster, ctx=held):
            shared.append(f"k2_context_length={held} or less (what one replica's KV cache holds)")
    # Every layout of the engine: the smallest that fits, when nothing nearer does.
    if not shared and not any(out.values()):
        best = smallest_fit(cluster, spec, gpu, context)
        if best is not None:
            best_layout, best_sizes, best_gpus = best
            shared.append(
                f"the smallest {cluster.engine} layout that fits is "
                f"{_describe_layout(cluster, best_layout, best_sizes, spec, gpu)} "
                f"({best_gpus} GPUs)"
            )
    return {pool: hints + shared for pool, hints in out.items()}


# ---------------------------------------------------------------- model and release checks


def resolve_model(cluster: Cluster) -> ModelSpec:
    """The catalog entry, with a local config.json's numbers when the inventory names one."""
    spec = catalog.model(cluster.model)
    if cluster.tunables.model_config_json:
        spec = catalog.model_from_config(spec, Path(cluster.tunables.model_config_json))
    return spec


def support_problems(
    spec: ModelSpec, engine: EngineName, release: EngineRelease, image: str | None
) -> tuple[list[str], list[str]]:
    """(problems, warnings) about whether the pinned engine release serves the model."""
    support = spec.support.get(engine)
    others = [
        e for e, s in spec.support.items() if e != engine and s.min_version is not None and (
            version_at_least(catalog.RELEASES[e].version, s.min_version)
        )
    ]
    alternatives = f"k2_engine={' or '.join(others)}" if others else "another model"
    if support is None or support.min_version is None:
        source = f" ({support.source})" if support else ""
        return (
            [
                f"k2_model={spec.id}: no {engine} release is known to serve it{source}; "
                f"fix: choose {alternatives}"
            ],
            [],
        )
    if version_at_least(release.version, support.min_version):
        return [], []
    if image:
        return [], [
            f"k2_image={image}: {spec.id} needs {engine} >= {support.min_version} "
            f"({support.source}) and the command lines follow {engine} {release.version}; "
            "make sure the image's release serves both"
        ]
    return (
        [
            f"k2_model={spec.id} needs {engine} >= {support.min_version} ({support.source}), "
            f"but the pinned release is {release.version}; fix: set k2_image to an image of "
            f"{engine} {support.min_version} or later, or choose {alternatives}"
        ],
        [],
    )


def model_problems(
    cluster: Cluster, spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[list[str], list[str]]:
    """(problems, warnings) that no layout can fix: release, hardware formats, context."""
    release = catalog.RELEASES[cluster.engine]
    problems, warnings = support_problems(spec, cluster.engine, release, cluster.tunables.image)
    schemes = spec.quantization.schemes()
    if schemes & {"fp8_block", "fp8_channel"} and not gpu.fp8:
        problems.append(
            f"k2_gpu={gpu.key}: {spec.id} ships FP8 weights, which {gpu.key} cannot run "
            "natively; fix: use Hopper or Blackwell GPUs (h200, h100, h20, h800, b200)"
        )
    if schemes & {"nvfp4", "mxfp4"} and not gpu.fp4:
        problems.append(
            f"k2_gpu={gpu.key}: {spec.id} ships FP4 ({spec.quantization.label}) weights, which "
            f"{gpu.key} cannot run natively; fix: use Blackwell GPUs (b200)"
        )
    t = cluster.tunables
    if cluster.engine in ("sglang", "vllm") and t.kv_cache_dtype == "fp8" and not gpu.fp8:
        problems.append(
            f"k2_kv_cache_dtype=fp8: {gpu.key} has no FP8; fix: set k2_kv_cache_dtype=auto"
        )
    if t.kv_cache_dtype == "fp8" and cluster.engine == "trtllm":
        problems.append(
            "k2_kv_cache_dtype=fp8: TensorRT-LLM's KV dtype is k2_trtllm_kv_cache_dtype "
            f"({t.trtllm_kv_cache_dtype}); fix: unset k2_kv_cache_dtype"
        )
    elif t.kv_cache_dtype == "fp8" and cluster.engine not in FP8_KV_ENGINES:
        problems.append(
            f"k2_kv_cache_dtype=fp8: {cluster.engine} renders no FP8 KV cache; fix: set "
            "k2_kv_cache_dtype=auto"
        )
    if t.multimodal and not spec.multimodal:
        problems.append(
            f"k2_multimodal=true: {spec.id} has no vision tower; fix: unset k2_multimodal "
            "or choose a multimodal model (Kimi-K2.5 and later)"
        )
    if spec.multimodal and t.multimodal is False and cluster.engine not in TEXT_ONLY_ENGINES:
        warnings.append(
            f"k2_multimodal=false: {cluster.engine} {release.version} has no text-only mode "
            f"for {spec.architectures[0]}: the vision tower stays loaded (and counted)"
        )
    if context > spec.max_position_embeddings:
        problems.append(
            f"k2_context_length={context} exceeds {spec.id}'s max_position_embeddings "
            f"{spec.max_position_embeddings}; fix: lower k2_context_length"
        )
    return problems, warnings


# ---------------------------------------------------------------- the plan


def build_plan(cluster: Cluster, spec: ModelSpec | None = None) -> Plan:
    """Decide everything about a deployment; raise PlanError when it cannot work."""
    if spec is None:
        spec = resolve_model(cluster)
    gpu = catalog.gpu(cluster.gpu)
    release = catalog.RELEASES[cluster.engine]
    context = cluster.context_length or spec.max_position_embeddings
    problems, warnings = model_problems(cluster, spec, gpu, context)
    if problems:
        raise PlanError(problems)

    names = pool_names(cluster.layout)
    counts: dict[PoolName, int] = {p: len(cluster.pool(p)) for p in names}
    shapes, reports, pool_problems = evaluate(cluster, counts, spec, gpu, context)
    if pool_problems:
        suggestions = fixes(cluster, counts, spec, gpu, context)
        for pool_name, found in pool_problems.items():
            count = counts[pool_name]
            hints = suggestions.get(pool_name, [])
            fix = "; fix: " + ", or ".join(hints) if hints else (
                f"; no change near this {cluster.engine} layout fits {gpu.key} GPUs; "
                "fix: choose larger GPUs or another engine"
            )
            for problem in found:
                problems.append(
                    f"[{pool_name}] ({_nodes(count)} x {cluster.gpus_per_node} {gpu.key}): "
                    f"{problem}{fix}"
                )
        raise PlanError(problems)

    c = choices(cluster, spec, gpu)
    warnings += [
        f"[{r.pool}] fits only {r.kv_tokens_per_replica} KV tokens per attention group, fewer "
        f"than 2 x k2_context_length ({context}): expect few concurrent long requests"
        for r in reports
        if r.kv_tokens_per_replica < 2 * context
    ]
    warnings += socket_warnings(cluster)
    if cluster.layout == "pd" and not cluster.tunables.router_image and not cluster.lab:
        warnings.append(
            f"the PD router runs in {cluster.tunables.image or release.image}, which is not "
            f"known to carry {catalog.ROUTER.package} {catalog.ROUTER.version}: build "
            "containers/router and set k2_router_image to the result"
        )
    if cluster.engine == "trtllm" and not cluster.tunables.image and not cluster.lab:
        warnings.append(
            f"{release.image} has no sshd for mpirun's port-{cluster.tunables.ssh_port} mesh: "
            "build containers/trtllm from it and set k2_image to the result"
        )
    if cluster.engine == "ktransformers":
        warnings.append(
            f"ktransformers keeps routed experts in host memory: the host needs about "
            f"{catalog.routed_expert_bytes(spec) / GIB:.0f} GiB of RAM for the "
            f"{spec.quantization.routed_experts.label} experts kt-kernel reads from the model "
            "directory; preflight checks it"
        )
        if not cluster.tunables.image and not cluster.lab:
            warnings.append(
                f"{release.image} is built here, not pulled: build containers/ktransformers "
                f"(kt-kernel {release.version} with its SGLang) and set k2_image to the result"
            )

    pools = tuple(
        PoolPlan(
            name=shape.name,
            hosts=tuple(h.name for h in cluster.pool(shape.name)),
            master=cluster.pool(shape.name)[0].name,
            master_address=cluster.pool(shape.name)[0].address,
            gpus=shape.gpus,
            parallel=shape.parallel,
            mem_fraction=report.mem_fraction,
        )
        for shape, report in zip(shapes, reports, strict=True)
    )
    image = cluster.tunables.image or (LAB_IMAGE if cluster.lab else release.image)
    deployment = Deployment(
        cluster=cluster,
        model=spec,
        release=release,
        pools=pools,
        context_length=context,
        image=image,
        kv_cache_dtype=c.kv_dtype,
        multimodal=c.multimodal,
        language_model_only=c.language_model_only,
    )
    renderer = REGISTRY[cluster.engine]
    rendered = renderer.render(deployment)
    endpoint = renderer.endpoint(deployment)
    host_plans = []
    for h in cluster.hosts:
        out = rendered.get(h.name)
        pool = next((p for p in pools if h.name in p.hosts), None)
        files = dict(out.files) if out else {}
        processes = out.processes if out else ()
        if cluster.lab and h.lab_fault:
            processes = tuple(p.model_copy(update={"lab_fault": h.lab_fault}) for p in processes)
        config_dir = cluster.tunables.config_dir
        for proc in processes:
            files[f"{config_dir}/launch/{proc.name}.sh"] = launch_script(proc, config_dir)
            if proc.resolve:
                files[host_values_path(config_dir)] = host_values_script()
        host_plans.append(
            HostPlan(
                name=h.name,
                address=h.address,
                local_ip=h.local_ip,
                ib_devices=h.ib_devices,
                role="router" if h.pool == "router" else ("node" if h.pool == "nodes" else h.pool),
                pool=h.pool,
                node_rank=pool.hosts.index(h.name) if pool else 0,
                gpus=0
                if pool is None
                else (1 if cluster.engine == "ktransformers" else cluster.gpus_per_node),
                processes=processes,
                files=files,
                ports=host_ports(processes, files, config_dir, cluster.engine),
            )
        )
    return Plan(
        engine=cluster.engine,
        engine_version=release.version,
        layout=cluster.layout,
        model=spec.id,
        model_dir=cluster.model_dir,
        gpu=gpu.key,
        endpoint=endpoint,
        endpoint_host=next(
            (h.name for h in cluster.hosts if h.address.lower() == urlsplit(endpoint).hostname),
            pools[0].master,
        ),
        # trtllm-serve has no served-model-name option: it lists the directory's base name.
        served_model_name=trtllm_served_name(cluster.model_dir)
        if cluster.engine == "trtllm"
        else cluster.tunables.served_model_name,
        config_dir=cluster.tunables.config_dir,
        ssh_port=cluster.tunables.ssh_port,
        lab=cluster.lab,
        container=container_options(cluster, deployment),
        pools=pools,
        fit=tuple(reports),
        weights=WeightsInfo(
            checkpoint_gib=spec.checkpoint_gib,
            shard_count=spec.shard_count,
            allow_patterns=spec.allow_patterns,
        ),
        warnings=tuple(warnings),
        hosts=tuple(host_plans),
    )


def container_options(cluster: Cluster, deployment: Deployment) -> ContainerOptions:
    """docker run options: exactly what the engine needs on this cluster, each with its reason
    (docs/engines.md, "Container privileges"), or the lab profile on hosts without hardware."""
    config_dir = cluster.tunables.config_dir
    volumes = (f"{cluster.model_dir}:{cluster.model_dir}:ro", f"{config_dir}:{config_dir}:ro")
    reasons = {
        "--network host": "engines bind and dial the hosts' own addresses; RDMA connection "
        "setup and RoCE GIDs live in the host's network namespace",
        "--ipc host": "CUDA IPC between the rank processes of a node and NCCL's shared-memory "
        "transport use the host's /dev/shm (Docker's 64 MiB one makes NCCL fail at init)",
        f"--volume {volumes[0]}": "the weights, read-only, at the path the plan names",
        f"--volume {volumes[1]}": "launch scripts and config files, read-only",
    }
    if cluster.lab:
        # Lab hosts have no GPUs or InfiniBand, and cannot grant unlimited memlock.
        return ContainerOptions(
            gpus=None,
            privileged=False,
            cap_add=(),
            devices=(),
            ulimits=("nofile=20000:20000", "nproc=4096:4096"),
            volumes=volumes,
            reasons={
                **reasons,
                "--ulimit nofile=20000:20000": "the lab host's own limit (no GPUs, no RDMA)",
                "--ulimit nproc=4096:4096": "bounds a runaway stand-in on a shared machine",
            },
        )
    reasons["--gpus all"] = "the node's GPUs (NVIDIA container toolkit)"
    caps: list[str] = []
    devices: list[str] = []
    ulimits = ["nofile=1048576:1048576"]
    reasons["--ulimit nofile=1048576:1048576"] = (
        "sockets per peer rank and per client (ZMQ, HTTP, NCCL); 1024 runs out at scale"
    )
    if multi_host(cluster):  # RDMA between hosts
        devices.append("/dev/infiniband")
        reasons["--device /dev/infiniband"] = (
            "RDMA verbs and connection manager: NCCL's IB transport, DeepEP (NVSHMEM IBGDA) "
            "and Mooncake's KV transfer; GPUDirect RDMA itself needs only nvidia-peermem (or "
            "DMA-BUF) on the host, and IBGDA the driver options the prepare phase sets"
        )
        caps.append("IPC_LOCK")
        reasons["--cap-add IPC_LOCK"] = "registering (pinning) RDMA buffers of many GB"
        ulimits.insert(0, "memlock=-1:-1")
        reasons["--ulimit memlock=-1:-1"] = "the RDMA registrations are not bounded by memlock"
    if cluster.engine in ("sglang", "ktransformers"):
        caps.append("SYS_NICE")
        reasons["--cap-add SYS_NICE"] = (
            "SGLang binds each rank's memory to its GPU's NUMA node with set_mempolicy/mbind, "
            "which Docker's default seccomp profile allows only with CAP_SYS_NICE"
        )
    if cluster.engine == "trtllm":
        caps.append("SYS_PTRACE")
        reasons["--cap-add SYS_PTRACE"] = (
            "Open MPI copies between the ranks of a node with process_vm_readv (CMA), which "
            "Docker's default seccomp profile allows only with CAP_SYS_PTRACE"
        )
        ulimits.insert(len(ulimits) - 1, "stack=67108864:67108864")
        reasons["--ulimit stack=67108864:67108864"] = (
            "the 64 MiB stack NVIDIA's TensorRT-LLM container instructions ask for"
        )
    return ContainerOptions(
        privileged=False,
        cap_add=tuple(caps),
        ulimits=tuple(ulimits),
        devices=tuple(devices),
        volumes=volumes,
        reasons=reasons,
    )


def plan_digest(plan: Plan) -> str:
    """A stable sha256 of the plan's content: equal plans, equal digests."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()


