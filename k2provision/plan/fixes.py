"""The fixes that work: every change suggested for a cluster that does not fit (node counts,
layouts, redundant experts, GPUs per node, KV dtype, context) is evaluated again and offered
only when that plan fits. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from k2provision.core.layouts import Layout
from k2provision.core.records import Cluster, GpuSpec, ModelSpec, PoolName
from k2provision.engines import REGISTRY, layout_of
from k2provision.engines.base import BatchTunable
from k2provision.plan.shapes import (
    PoolShape,
    all_pools_fit,
    choices,
    evaluate,
    nodes_text,
    pool_shapes,
    sizes_text,
)

MAX_SEARCH_NODES = 64


def _on(n: int, shape: PoolShape, gpn: int, gpu: GpuSpec) -> str:
    """ "2 nodes x 8 h100 (tp 16; 16 GPUs)"."""
    return f"{nodes_text(n)} x {gpn} {gpu.key} ({sizes_text(shape.parallel)}; {shape.gpus} GPUs)"


def _counts_by_size(layout: Layout) -> Iterator[dict[PoolName, int]]:
    """Node counts for a layout, fewest nodes first."""
    if layout.one_host:
        yield {"nodes": 1}
    elif layout.disaggregated:
        for total in range(2, MAX_SEARCH_NODES // 2 + 1):
            for prefill in range(1, total):
                yield {"prefill": prefill, "decode": total - prefill}
    else:
        for n in range(1, MAX_SEARCH_NODES + 1):
            yield {"nodes": n}


def search_limit(layout: Layout) -> int:
    """The most nodes the search tries for a layout (per pool where it has two)."""
    if layout.one_host:
        return 1
    return MAX_SEARCH_NODES // len(layout.pools)


def smallest_for_layout(
    cluster: Cluster, layout: Layout, spec: ModelSpec, gpu: GpuSpec, context: int, below: int
) -> tuple[dict[PoolName, int], int] | None:
    """The fewest nodes (fewer than `below` GPUs) on which `layout` fits: (counts, GPUs)."""
    trial = cluster.model_copy(update={"layout": layout.name})
    single_gpu = REGISTRY[cluster.engine].SINGLE_GPU
    for counts in _counts_by_size(layout):
        gpus = 1 if single_gpu else sum(counts.values()) * cluster.gpus_per_node
        if gpus >= below:
            return None
        if all_pools_fit(trial, counts, spec, gpu, context):
            return counts, gpus
    return None


def smallest_fit(
    cluster: Cluster, spec: ModelSpec, gpu: GpuSpec, context: int
) -> tuple[Layout, dict[PoolName, int], int] | None:
    """The layout of the engine with the fewest GPUs that fits: (layout, counts, GPUs)."""
    best: tuple[Layout, dict[PoolName, int], int] | None = None
    for layout in REGISTRY[cluster.engine].LAYOUTS:
        below = best[2] if best else 10**9
        found = smallest_for_layout(cluster, layout, spec, gpu, context, below)
        if found is not None:
            best = (layout, *found)
    return best


def _describe_layout(
    cluster: Cluster, layout: Layout, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec
) -> str:
    trial = cluster.model_copy(update={"layout": layout.name})
    shapes = pool_shapes(trial, counts, spec)
    pools = " + ".join(
        nodes_text(s.nodes)
        + (f" [{s.name}]" if len(layout.pools) > 1 else "")
        + f" ({sizes_text(s.parallel)})"
        for s in shapes
    )
    return f"k2_layout={layout.name} on {pools} x {cluster.gpus_per_node} {gpu.key}"


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
    """Whether `pool` has no fit problem with these instance counts at `context`."""
    return pool not in evaluate(cluster, counts, spec, gpu, context)[2]


def _batch_knobs(cluster: Cluster, pool: PoolName) -> list[BatchTunable]:
    """The engine's batch tunables that bound `pool` in this layout."""
    return [
        knob
        for knob in REGISTRY[cluster.engine].BATCH_TUNABLES
        if cluster.layout in knob.layouts and pool in knob.pools
    ]


def _with_value(cluster: Cluster, field: str, value: int) -> Cluster:
    return cluster.model_copy(
        update={"tunables": cluster.tunables.model_copy(update={field: value})}
    )


def _largest_batch(
    cluster: Cluster, knob: BatchTunable, fits: Callable[[Cluster], bool]
) -> int | None:
    """The largest candidate of `knob` below its current value with which `fits` holds."""
    current = getattr(cluster.tunables, knob.field)
    return next(
        (
            value
            for value in knob.candidates
            if value < current and fits(_with_value(cluster, knob.field, value))
        ),
        None,
    )


def _batch_text(knob: BatchTunable, value: int) -> str:
    return f"{knob.variable}={value} ({knob.effect.format(value=value)})"


def _smaller_batch(
    cluster: Cluster,
    knob: BatchTunable,
    pool: PoolName,
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> str | None:
    """The largest value of `knob` below the current one that makes `pool` fit, as a hint."""
    value = _largest_batch(cluster, knob, _fits_at(pool, counts, spec, gpu, context))
    if value is None:
        return None
    current = getattr(cluster.tunables, knob.field)
    return (
        f"{knob.variable}={value} ({knob.effect.format(value=value)}; "
        f"{current} now) on these {nodes_text(counts[pool])}"
    )


def counts_with_smaller_batch(
    cluster: Cluster,
    knob: BatchTunable,
    pool: PoolName,
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> list[tuple[int, int]]:
    """The nearest node counts below and above the requested one at which `pool` fits with a
    smaller value of `knob`, each with the largest value that fits there: (nodes, value).
    SGLang PD decode on 80 GB GPUs fits at no node count at the default batch (its graphs
    and DeepEP buffers grow with the pool), so node counts alone offer nothing there."""
    asked = counts[pool]
    limit = max(MAX_SEARCH_NODES, 2 * asked)
    found: list[tuple[int, int]] = []
    for candidates in (range(asked - 1, 0, -1), range(asked + 1, limit + 1)):
        for n in candidates:
            value = _largest_batch(
                cluster, knob, _fits_at(pool, {**counts, pool: n}, spec, gpu, context)
            )
            if value is not None:
                found.append((n, value))
                break
    return found


def _fits_at(
    pool: PoolName, counts: dict[PoolName, int], spec: ModelSpec, gpu: GpuSpec, context: int
) -> Callable[[Cluster], bool]:
    """Whether a trial cluster's `pool` fits at these counts."""

    def fits(trial: Cluster) -> bool:
        return _pool_fits(trial, pool, counts, spec, gpu, context)

    return fits


def _pool_fixes(
    cluster: Cluster,
    pool: PoolName,
    found: list[str],
    counts: dict[PoolName, int],
    spec: ModelSpec,
    gpu: GpuSpec,
    context: int,
) -> list[str]:
    """The changes to `pool` alone (its node count, its redundant experts, its batch) that
    make it fit, each planned again."""
    hints: list[str] = []
    gpn = cluster.gpus_per_node
    label = f" [{pool}]" if len(layout_of(cluster).pools) > 1 else ""

    def fits_here(trial: Cluster) -> bool:
        return _pool_fits(trial, pool, counts, spec, gpu, context)

    def on(n: int) -> str:
        return _on(n, _shape_of(cluster, pool, {**counts, pool: n}, spec), gpn, gpu)

    # A smaller largest batch, where the engine sizes buffers or graphs by it.
    batch = [
        hint
        for knob in _batch_knobs(cluster, pool)
        if (hint := _smaller_batch(cluster, knob, pool, counts, spec, gpu, context)) is not None
    ]
    # Node counts near what was asked, all else equal; where none fits and no batch fits
    # here, the nearest counts at which a smaller batch fits.
    near = nearby_counts(cluster, pool, counts, spec, gpu, context)
    if near:
        options = " or ".join(on(n) for n in near)
        hints.append(f"{cluster.engine} {cluster.layout}{label} fits on {options}")
    elif not batch:
        for knob in _batch_knobs(cluster, pool):
            sized = counts_with_smaller_batch(cluster, knob, pool, counts, spec, gpu, context)
            if sized:
                options = " or ".join(
                    f"{on(n)} with {_batch_text(knob, value)}" for n, value in sized
                )
                hints.append(f"{cluster.engine} {cluster.layout}{label} fits on {options}")
    # Spare expert slots that let the pool's expert parallelism divide, where the engine takes
    # them (with a smaller batch where the slots divide but memory falls short).
    spare_field = REGISTRY[cluster.engine].SPARE_EXPERT_TUNABLES.get(pool)
    if spare_field and any("expert parallel size" in p for p in found):
        ep = counts[pool] * gpn
        spare = (-spec.n_routed_experts) % ep
        on_these = f"on these {nodes_text(counts[pool])}"
        for r in (spare, spare + ep):
            if r == getattr(cluster.tunables, spare_field):
                continue
            trial = _with_value(cluster, spare_field, r)
            experts = (
                f"k2_{spare_field}={r} ({spec.n_routed_experts} + {r} expert slots over ep {ep})"
            )
            if fits_here(trial):
                hints.append(f"{experts} {on_these}")
                break
            with_batch = [
                f"{experts} and {_batch_text(knob, value)} {on_these}"
                for knob in _batch_knobs(trial, pool)
                if (value := _largest_batch(trial, knob, fits_here)) is not None
            ]
            if with_batch:
                hints += with_batch
                break
    return hints + batch


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
        return all_pools_fit(c, counts, spec, gpu, ctx or context)

    for pool, found in problems.items():
        out[pool] = _pool_fixes(cluster, pool, found, counts, spec, gpu, context)

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
    current_layout = layout_of(cluster)
    if not current_layout.disaggregated or not any(out.values()):
        for layout in REGISTRY[cluster.engine].LAYOUTS:
            if layout.name == cluster.layout:
                continue
            trial = cluster.model_copy(update={"layout": layout.name})
            same: dict[PoolName, int] = {"nodes": sum(counts.values())}
            if layout.pools == current_layout.pools == ("nodes",) and works(trial):
                shared.append(_describe_layout(cluster, layout, same, spec, gpu) + " fits")
                continue
            alt = smallest_for_layout(cluster, layout, spec, gpu, context, 10**9)
            if alt is not None:
                alt_sizes, alt_gpus = alt
                shared.append(
                    f"{_describe_layout(cluster, layout, alt_sizes, spec, gpu)} "
                    f"({alt_gpus} GPUs) fits"
                )
    # Decode context parallelism that divides the TP group (more tokens per replica).
    engine = REGISTRY[cluster.engine]
    if cluster.layout in engine.DCP_LAYOUTS and engine.DCP_TUNABLE:
        current = engine.pool_shape(cluster, "nodes", 1, spec).dcp
        for size in (gpn, 4, 2, 1):
            if size == current:
                continue
            trial = cluster.model_copy(
                update={"tunables": t.model_copy(update={engine.DCP_TUNABLE: size})}
            )
            if works(trial):
                shared.append(
                    f"k2_{engine.DCP_TUNABLE}={size} (each token's KV on one GPU of {size})"
                )
                break
    # An FP8 KV cache, where the engine renders one for MLA.
    c = choices(cluster, spec, gpu)
    if c.kv_dtype == "bf16" and gpu.fp8 and engine.FP8_KV:
        trial = cluster.model_copy(
            update={"tunables": t.model_copy(update={"kv_cache_dtype": "fp8"})}
        )
        if works(trial):
            shared.append("k2_kv_cache_dtype=fp8 (an FP8 KV cache holds twice the tokens)")
    # Text-only serving of a multimodal model, where the engine can drop the vision tower.
    if c.vision_loaded and engine.TEXT_ONLY:
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
