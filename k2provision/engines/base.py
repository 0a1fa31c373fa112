"""The types every engine module shares: what a renderer gets, what it returns, its interface.

A module of its own so that engine modules import these types without importing the registry
(engines/__init__.py), which imports the engine modules: imports run one way only.
"""

from __future__ import annotations

from typing import Protocol

from k2provision.core.records import (
    Cluster,
    EngineRelease,
    KvDtype,
    ModelSpec,
    PoolName,
    PoolPlan,
    Process,
    Record,
)


class Deployment(Record):
    """What a renderer needs: the cluster, the model, the release and the decided pools."""

    cluster: Cluster
    model: ModelSpec
    release: EngineRelease
    pools: tuple[PoolPlan, ...]
    context_length: int
    image: str
    # Decided by the plan's memory fit (the fit counts exactly what is rendered):
    kv_cache_dtype: KvDtype = "bf16"
    multimodal: bool = False  # the vision tower is loaded and image input is served
    language_model_only: bool = False  # a multimodal model served text-only (vLLM)

    def pool(self, name: PoolName) -> PoolPlan:
        """The pool called `name` (KeyError if the layout has none)."""
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


class HostRender(Record):
    """One host's share of a rendering."""

    processes: tuple[Process, ...] = ()
    files: dict[str, str] = {}


class Renderer(Protocol):
    """The interface every engine module implements."""

    def render(self, deployment: Deployment) -> dict[str, HostRender]:
        """Processes and files per host name."""
        ...

    def endpoint(self, deployment: Deployment) -> str:
        """The OpenAI-compatible base URL clients use."""
        ...
