"""Engines: one module per engine, each all that is engine-specific.

Each engine module implements the `Engine` protocol of engines/base.py (where the shared
types live): its pinned release and image, the models it serves, its layouts and pool shapes,
how they split the MLP weights and which MoE kernel paths they take per weight format, KV
dtypes, text-only serving, memory accounting (`reserve`, `kv_budget`, on engines/memory.py's
shared arithmetic), the tunables only it reads, the ports it takes and the addresses it
cannot, container needs, metric names, bench client and published figures, served name,
warnings, and `render(deployment) -> dict[host, HostRender]` (processes, files and the ports
they bind) with `endpoint(deployment) -> str`. What several engines answer alike they share
by assignment (`endpoint = master_endpoint`, from engines/common.py).

REGISTRY maps engine names to those modules, and is the one list of engines: the inventory
contract, the plan, the dashboards and the tables ask it (through the functions below, at
call time), and name no engine. Adding an engine is its module and one line here. Engine
modules import from engines/base.py, never from this package, so the registry's imports run
one way.

May import: ``k2provision.core`` and ``k2provision.errors``; nothing from plan/, ops/, run/
or commands/.
"""

from __future__ import annotations

from k2provision.core.layouts import EngineLayouts, Layout, find_layout
from k2provision.core.records import Cluster, EngineRelease, EngineSupport
from k2provision.engines import ktransformers, sglang, trtllm, vllm
from k2provision.engines.base import Engine, MetricNames

# Modules satisfy Engine structurally.
REGISTRY: dict[str, Engine] = {
    "sglang": sglang,
    "trtllm": trtllm,
    "vllm": vllm,
    "ktransformers": ktransformers,
}


def engine_layouts() -> EngineLayouts:
    """Every registered engine and its layouts, in registry order: what the inventory contract
    checks k2_engine and k2_layout against."""
    return {name: engine.LAYOUTS for name, engine in REGISTRY.items()}


def layout_named(engine: str, name: str) -> Layout:
    """The layout `name` as `engine` declares it (KeyError when it has none)."""
    found = find_layout(engine_layouts(), engine, name)
    if found is None:
        raise KeyError(f"{engine} has no layout {name}")
    return found


def layout_of(cluster: Cluster) -> Layout:
    """The cluster's layout as its engine declares it (the inventory contract checked that
    the engine has it)."""
    return layout_named(cluster.engine, cluster.layout)


def release(engine: str) -> EngineRelease:
    """The pinned release of `engine`."""
    return REGISTRY[engine].RELEASE


def support(engine: str, model: str) -> EngineSupport | None:
    """What `engine` says of serving the catalog model `model` (None: nothing)."""
    return REGISTRY[engine].SUPPORT.get(model)


def metric_dialects() -> list[MetricNames]:
    """The metric names of every engine the plan scrapes, each set once, in registry order
    (engines that share a server share its names)."""
    found: list[MetricNames] = []
    for engine in REGISTRY.values():
        if engine.METRICS is not None and engine.METRICS not in found:
            found.append(engine.METRICS)
    return found
