"""What the inventory contract needs to know of a layout: its name, the host groups it takes
and how many hosts it runs on.

The engines own their layouts (each engine module's LAYOUTS, gathered by the registry in
engines/__init__.py); the contract is handed them (`EngineLayouts`) by whoever reads an
inventory, so that this package names no engine and no layout.
"""

from __future__ import annotations

from collections.abc import Mapping

from k2provision.core.records import PoolName, Record


class Layout(Record):
    """One way an engine lays a model out over hosts."""

    name: str
    pools: tuple[PoolName, ...] = ("nodes",)
    """The inventory groups that hold its GPU hosts, one pool each: [nodes], or [prefill]
    and [decode] for prefill/decode disaggregation."""
    one_host: bool = False
    """It runs on exactly one host."""

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run in pools of their own, behind a router."""
        return "prefill" in self.pools


EngineLayouts = Mapping[str, tuple[Layout, ...]]
"""Every engine's name and its layouts, in the registry's order."""


def find_layout(engines: EngineLayouts, engine: str, name: str) -> Layout | None:
    """The layout `name` of `engine`, None when the engine has no such layout."""
    return next((layout for layout in engines.get(engine, ()) if layout.name == name), None)


def layouts_with_pool(engines: EngineLayouts, pool: PoolName) -> list[str]:
    """The names of the layouts that take hosts in [pool], each once, in registry order."""
    names = [layout.name for found in engines.values() for layout in found if pool in layout.pools]
    return list(dict.fromkeys(names))
