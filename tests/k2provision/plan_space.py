"""Every plan the catalog admits: each (engine, layout, model, GPU type, node count 1-32,
context length) that `build_plan` accepts, and the built plans with their renders.

A plan is admitted when `build_plan` returns one. The enumeration gates each candidate with the
plan's own refusals (plan/support.py model_problems, plan/shapes.py evaluate) before building
it, since building a refused plan also searches its fixes; `refused_sample` gives a few of the
gated-out candidates so that a test can confirm that build_plan refuses them too, and a built
plan confirms that it admits the rest.

Building all of them takes half a minute, so `built` builds one plan per distinct
(engine, layout, weight formats, GPU type, node counts): the models of one weight format and
the context lengths differ in parsers, names and memory, not in how weights are split or which
kernels run them. `plan_of` builds any one on demand.

PD plans: the two pools are separate serving instances whose shapes, fits and renders depend
on their own node counts only, so the enumeration pairs every admitted prefill count with the
fewest-node admitted decode pool and every admitted decode count with the fewest-node prefill
pool (at most 32 nodes in all): every pool shape the plan admits is rendered at least once.

Plans are built once per process (functools.cache): tests share them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from k2provision.core import catalog
from k2provision.core.records import (
    Cluster,
    EngineName,
    HostSpec,
    Plan,
    PoolName,
    Tunables,
)
from k2provision.engines import REGISTRY, layout_named
from k2provision.engines.base import layout_names
from k2provision.plan.assemble import build_plan
from k2provision.plan.shapes import evaluate, pool_names
from k2provision.plan.support import model_problems

MAX_NODES = 32
GPUS_PER_NODE = 8
# The model's own maximum (None: what `models` tabulates) and a common shorter one.
CONTEXTS: tuple[int | None, ...] = (None, 32768)


@dataclass(frozen=True)
class Admitted:
    """One admitted plan and what it was built from."""

    engine: EngineName
    layout: str
    model: str
    gpu: str
    counts: tuple[tuple[PoolName, int], ...]
    context: int | None
    cluster: Cluster

    @property
    def nodes(self) -> int:
        """GPU nodes in all (the router host is not one)."""
        return sum(n for _, n in self.counts)

    @property
    def label(self) -> str:
        pools = "+".join(f"{name}={n}" for name, n in self.counts)
        return f"{self.engine}/{self.layout} {self.model} {self.gpu} {pools} ctx={self.context}"


def cluster(
    engine: EngineName,
    layout: str,
    model: str,
    gpu: str,
    counts: dict[PoolName, int],
    context: int | None,
) -> Cluster:
    """A cluster of `counts` hosts per pool (and a router host for PD) with default tunables."""
    hosts: list[HostSpec] = []
    for pool, count in counts.items():
        for _ in range(count):
            n = len(hosts) + 1
            address = f"10.{n // 250}.{n % 250}.1"
            hosts.append(HostSpec(name=f"h{n}", address=address, pool=pool, local_ip=address))
    router = None
    if layout == "pd":
        router = "r0"
        hosts.append(
            HostSpec(name=router, address="10.250.0.1", pool="router", local_ip="10.250.0.1")
        )
    return Cluster(
        inventory="(plan space)",
        engine=engine,
        layout=layout,
        model=model,
        model_dir=f"/models/{model.rsplit('/', 1)[-1]}",
        gpu=gpu,
        gpus_per_node=GPUS_PER_NODE,
        context_length=context,
        hosts=tuple(hosts),
        router=router,
        tunables=Tunables(),
    )


def _passes_gates(c: Cluster, counts: dict[PoolName, int]) -> bool:
    spec = catalog.model(c.model)
    gpu = catalog.gpu(c.gpu)
    context = c.context_length or spec.max_position_embeddings
    return not evaluate(c, counts, spec, gpu, context)[2]


def _pool_counts(
    engine: EngineName, layout: str, model: str, gpu: str, context: int | None
) -> dict[PoolName, list[int]]:
    """Per pool, the node counts (1-32) whose pool passes the plan's gates on its own."""
    if layout == "single":
        return {"nodes": [1]}
    names = pool_names(layout_named(engine, layout))
    probe = cluster(engine, layout, model, gpu, {}, context)
    out: dict[PoolName, list[int]] = {}
    for name in names:
        # Pools are judged separately (plan/shapes.py evaluate reports per pool).
        other = {n: 1 for n in names if n != name}
        out[name] = [
            n
            for n in range(1, MAX_NODES + 1)
            if name
            not in evaluate(
                probe,
                {**other, name: n},
                catalog.model(model),
                catalog.gpu(gpu),
                context or catalog.model(model).max_position_embeddings,
            )[2]
        ]
    return out


def candidate_counts(
    engine: EngineName, layout: str, model: str, gpu: str, context: int | None
) -> Iterator[dict[PoolName, int]]:
    """The node counts whose pools pass the plan's gates (PD: paired as the module says)."""
    per_pool = _pool_counts(engine, layout, model, gpu, context)
    if layout != "pd":
        for n in per_pool["nodes"]:
            yield {"nodes": n}
        return
    prefill, decode = per_pool["prefill"], per_pool["decode"]
    if not prefill or not decode:
        return
    pairs = {(p, decode[0]) for p in prefill} | {(prefill[0], d) for d in decode}
    for p, d in sorted(pairs):
        if p + d <= MAX_NODES:
            yield {"prefill": p, "decode": d}


def combinations() -> Iterator[tuple[EngineName, str, str, str, int | None]]:
    """Every (engine, layout, model, GPU type, context) the enumeration covers."""
    for engine, declared in REGISTRY.items():
        for layout in layout_names(declared.LAYOUTS):
            for model in catalog.MODELS:
                for gpu in catalog.GPUS:
                    for context in CONTEXTS:
                        yield engine, layout, model, gpu, context


def served(engine: EngineName, layout: str, model: str, gpu: str, context: int | None) -> bool:
    """No refusal that no layout can fix (release, hardware format, KV dtype, context)."""
    c = cluster(engine, layout, model, gpu, {}, context)
    spec = catalog.model(model)
    return not model_problems(c, spec, catalog.gpu(gpu), context or spec.max_position_embeddings)[0]


@functools.cache
def admitted() -> tuple[Admitted, ...]:
    """Every admitted combination (not yet built)."""
    out = []
    for engine, layout, model, gpu, context in combinations():
        if not served(engine, layout, model, gpu, context):
            continue
        for counts in candidate_counts(engine, layout, model, gpu, context):
            c = cluster(engine, layout, model, gpu, counts, context)
            if not _passes_gates(c, counts):
                continue
            out.append(
                Admitted(
                    engine=engine,
                    layout=layout,
                    model=model,
                    gpu=gpu,
                    counts=tuple(counts.items()),
                    context=context,
                    cluster=c,
                )
            )
    return tuple(out)


@functools.cache
def plan_of(a: Admitted) -> Plan:
    """The plan of one admitted combination, built once per process."""
    return build_plan(a.cluster)


def weight_formats(model: str) -> str:
    """What decides how a model's weights split and which kernels run them."""
    q = catalog.model(model).quantization
    return "/".join(w.label for w in (q.routed_experts, q.shared_experts, q.dense_mlp))


@functools.cache
def built() -> tuple[tuple[Admitted, Plan], ...]:
    """One admitted combination per (engine, layout, weight formats, GPU type, node counts),
    with its plan."""
    seen: dict[tuple[str, str, str, str, tuple[tuple[PoolName, int], ...]], Admitted] = {}
    for a in admitted():
        seen.setdefault((a.engine, a.layout, weight_formats(a.model), a.gpu, a.counts), a)
    return tuple((a, plan_of(a)) for a in seen.values())


def refused_sample() -> Iterator[Cluster]:
    """Candidates the gates refuse, per (engine, layout, model, GPU type) of one pool at the
    model's own context: the smallest node count not admitted, and the smallest above the
    fewest admitted (build_plan must refuse each)."""
    for engine, layout, model, gpu, context in combinations():
        if context is not None or layout in ("single", "pd"):
            continue
        if not served(engine, layout, model, gpu, context):
            continue
        fine = _pool_counts(engine, layout, model, gpu, context)["nodes"]
        above = fine[0] if fine else 0
        picks = {
            next((n for n in range(1, MAX_NODES + 1) if n not in fine), None),
            next((n for n in range(above + 1, MAX_NODES + 1) if n not in fine), None),
        }
        for n in sorted(p for p in picks if p is not None):
            yield cluster(engine, layout, model, gpu, {"nodes": n}, context)
