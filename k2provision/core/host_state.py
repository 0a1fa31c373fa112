"""The hosts' state the operator's commands set, beside the inventory: which hosts are
drained, which spare stands in for which failed host, and what was taken out when.

`k2provision drain HOST...` records its hosts as drained and `k2provision return HOST...`
takes them off; `k2provision heal` records a spare in a failed host's place (and `return`
undoes it); every host heal takes out is logged with its time, which the heal's circuit
breaker counts. Every plan reads the file (the CLI's and the one ``ansible-playbook``
computes), so no run starts a drained host's instance again, a healed instance runs on its
spare, and the inventory itself is never edited during an incident. The file sits next to
the inventory it belongs to, hidden (Ansible's directory inventories skip names that start
with a dot): ``inventory/prod.ini`` keeps its state in ``inventory/.prod.ini.k2state.yml``.
An absent file: nothing drained, nothing replaced.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from k2provision.errors import InventoryError

__all__ = [
    "HostState",
    "Replacement",
    "TakenOut",
    "read_drained",
    "read_state",
    "state_path",
    "write_drained",
    "write_state",
]


@dataclass(frozen=True)
class Replacement:
    """A spare serving in a failed host's place (`k2provision heal`), since `at` (UTC,
    ISO 8601)."""

    host: str
    spare: str
    at: str


@dataclass(frozen=True)
class TakenOut:
    """A host heal took out of its instance, when (UTC, ISO 8601) and why."""

    host: str
    at: str
    why: str


@dataclass(frozen=True)
class HostState:
    """Everything the state file holds."""

    drained: tuple[str, ...] = ()
    replaced: tuple[Replacement, ...] = ()
    taken_out: tuple[TakenOut, ...] = field(default=())

    @property
    def substitutes(self) -> dict[str, str]:
        """failed host -> the spare in its place."""
        return {r.host: r.spare for r in self.replaced}


def state_path(inventory: str | Path) -> Path:
    """Where the state of the cluster `inventory` describes is kept."""
    source = Path(inventory)
    return source.parent / f".{source.name}.k2state.yml"


def _refused(path: Path, found: Any, expected: str) -> InventoryError:
    return InventoryError(
        [
            f"{path}: expected {expected}, found {found!r:.80}; fix: restore it, or remove it "
            "when no host is drained or replaced"
        ]
    )


def _records(path: Path, data: Mapping[str, Any], key: str, names: Sequence[str]) -> list[Any]:
    """`data[key]`: a list of mappings each with string `names`; InventoryError otherwise."""
    items = data.get(key, [])
    wanted = f"'{key}' a list of mappings with {', '.join(names)}"
    if not isinstance(items, list):
        raise _refused(path, items, wanted)
    for item in items:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(n), str) and item.get(n) for n in names
        ):
            raise _refused(path, item, wanted)
    return items


def read_state(inventory: str | Path) -> HostState:
    """The state recorded for `inventory`; empty when there is no state file. A file that
    does not hold what this module writes raises InventoryError naming it and the fix."""
    path = state_path(inventory)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return HostState()
    except OSError as error:
        raise InventoryError(
            [f"{path}: unreadable ({error.strerror}); fix: its permissions"]
        ) from None
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise InventoryError(
            [f"{path}: not YAML ({error}); fix: restore it, or remove it when no host is drained"]
        ) from None
    if not isinstance(data, dict):
        raise _refused(path, data, "a mapping with 'drained', 'replaced' and 'taken_out'")
    drained = data.get("drained", [])
    if not isinstance(drained, list) or not all(isinstance(h, str) and h for h in drained):
        raise _refused(path, drained, "'drained' a list of host names")
    replaced = _records(path, data, "replaced", ("host", "spare", "at"))
    taken = _records(path, data, "taken_out", ("host", "at", "why"))
    return HostState(
        drained=tuple(dict.fromkeys(drained)),
        replaced=tuple(Replacement(r["host"], r["spare"], r["at"]) for r in replaced),
        taken_out=tuple(TakenOut(t["host"], t["at"], t["why"]) for t in taken),
    )


def write_state(inventory: str | Path, state: HostState) -> Path:
    """Record `state` for `inventory` (the file removed when it holds nothing), atomically."""
    path = state_path(inventory)
    data: dict[str, Any] = {}
    if state.drained:
        data["drained"] = list(dict.fromkeys(state.drained))
    if state.replaced:
        data["replaced"] = [vars(r) for r in state.replaced]
    if state.taken_out:
        data["taken_out"] = [vars(t) for t in state.taken_out]
    if not data:
        path.unlink(missing_ok=True)
        return path
    text = (
        "# Written by k2provision drain/return/heal: what no run may start, and the spares\n"
        "# serving in failed hosts' places.\n" + yaml.safe_dump(data, sort_keys=False)
    )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def read_drained(inventory: str | Path) -> tuple[str, ...]:
    """The drained hosts recorded for `inventory`, in the order they were drained."""
    return read_state(inventory).drained


def write_drained(inventory: str | Path, drained: Sequence[str]) -> Path:
    """Record `drained` for `inventory`, the rest of its state kept."""
    return write_state(inventory, replace(read_state(inventory), drained=tuple(drained)))
