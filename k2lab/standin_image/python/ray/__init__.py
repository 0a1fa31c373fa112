"""Stand-in `ray` module: the slice of Ray's driver API that k2provision's health checks
use (`ray.init(address=...)`, `ray.nodes()`), backed by the stand-in head's node table.
Part of the test double for the engines' GPU kernels; never installed outside that image.
"""

from __future__ import annotations

from typing import Any

from k2standin import ray_cluster

__version__ = "0.0.0+k2standin"
_state: dict[str, str] = {}


def init(address: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Connect to a running cluster (never starts one); raises ConnectionError."""
    del kwargs
    resolved = ray_cluster.resolve_address(address)
    if resolved is None:
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to "
            "by setting `address`."
        )
    ray_cluster.fetch_nodes(resolved)
    _state["address"] = resolved
    return {"address": resolved}


def is_initialized() -> bool:
    return "address" in _state


def _require() -> str:
    if "address" not in _state:
        raise RuntimeError("Ray has not been started yet. Call ray.init() first.")
    return _state["address"]


def nodes() -> list[dict[str, Any]]:
    return ray_cluster.fetch_nodes(_require())


def cluster_resources() -> dict[str, float]:
    total: dict[str, float] = {}
    for node in nodes():
        if node.get("Alive"):
            for key, value in node.get("Resources", {}).items():
                total[key] = total.get(key, 0.0) + float(value)
    return total


def available_resources() -> dict[str, float]:
    return cluster_resources()


def shutdown() -> None:
    _state.pop("address", None)
