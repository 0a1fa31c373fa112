"""Engines: one module per engine, each all that is engine-specific.

Each engine module implements the `Engine` protocol of engines/base.py (where the shared
types live): its layouts and pool shapes, how they split the MLP weights and which MoE kernel
paths they take per weight format, KV dtypes, text-only serving, memory accounting
(`reserve`, `kv_budget`, on engines/memory.py's shared arithmetic), the tunables only it reads,
the ports it takes and the addresses it cannot, container needs, bench client and published
figures, served name, warnings, and `render(deployment) -> dict[host, HostRender]` (processes,
files and the ports they bind) with `endpoint(deployment) -> str`. REGISTRY maps engine
names (core/records.py ENGINES) to those modules; the plan asks REGISTRY[cluster.engine] and
names no engine. Engine modules import from engines/base.py, never from this package, so the
registry's imports run one way.

May import: ``k2provision.core`` and ``k2provision.errors``; nothing from plan/, ops/, run/
or commands/.
"""

from __future__ import annotations

from k2provision.engines import ktransformers, sglang, trtllm, vllm
from k2provision.engines.base import Engine

# Modules satisfy Engine structurally.
REGISTRY: dict[str, Engine] = {
    "sglang": sglang,
    "trtllm": trtllm,
    "vllm": vllm,
    "ktransformers": ktransformers,
}
