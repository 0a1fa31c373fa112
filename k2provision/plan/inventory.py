"""The inventory contract (core/inventory.py) read against the registered engines: what every
caller that turns an inventory into a cluster uses, so that the engines and layouts it
accepts are the registry's (engines/__init__.py), asked at call time.

Pure but for reading the inventory's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from k2provision.core import inventory
from k2provision.core.host_state import HostState
from k2provision.core.records import Cluster
from k2provision.engines import engine_layouts


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate an inventory; raise InventoryError listing every problem."""
    return inventory.load_cluster(path, engine_layouts())


def cluster_from_groups(
    source: str,
    groups: Mapping[str, list[str]],
    host_vars: Mapping[str, Mapping[str, Any]],
    state: HostState | None = None,
) -> Cluster:
    """Validate groups and variables (as Ansible resolved them) into a Cluster; `state`: the
    inventory's state file (core/host_state.py: the drained hosts, the spares in failed
    hosts' places)."""
    state = state or HostState()
    return inventory.cluster_from_groups(
        source,
        groups,
        host_vars,
        engine_layouts(),
        state.drained,
        tuple(state.substitutes.items()),
    )
