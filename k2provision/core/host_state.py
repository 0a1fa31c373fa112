"""The hosts' state the operator's commands set, beside the inventory: which hosts are drained.

`k2provision drain HOST...` records its hosts here and `k2provision return HOST...` takes them
off; every plan reads the file (the CLI's and the one ``ansible-playbook`` computes), so no
apply, restart or rollout starts a drained host's instance again, and the inventory itself
is never edited during an incident. The file sits next to the inventory it belongs to, hidden
(Ansible's directory inventories skip names that start with a dot): ``inventory/prod.ini``
keeps its state in ``inventory/.prod.ini.k2state.yml``. An absent file: nothing drained.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from k2provision.errors import InventoryError

__all__ = ["read_drained", "state_path", "write_drained"]


def state_path(inventory: str | Path) -> Path:
    """Where the state of the cluster `inventory` describes is kept."""
    source = Path(inventory)
    return source.parent / f".{source.name}.k2state.yml"


def read_drained(inventory: str | Path) -> tuple[str, ...]:
    """The drained hosts recorded for `inventory`, in the order they were drained; () when
    there is no state file. A file that is not a mapping with a list of host names raises
    InventoryError naming it and the fix."""
    path = state_path(inventory)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
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
    drained = data.get("drained", []) if isinstance(data, dict) else None
    if not isinstance(drained, list) or not all(isinstance(h, str) and h for h in drained):
        raise InventoryError(
            [
                f"{path}: expected a mapping whose 'drained' is a list of host names, found "
                f"{data!r:.80}; fix: restore it, or remove it when no host is drained"
            ]
        )
    return tuple(dict.fromkeys(drained))


def write_drained(inventory: str | Path, drained: Sequence[str]) -> Path:
    """Record `drained` for `inventory` (the file removed when it is empty), atomically."""
    path = state_path(inventory)
    hosts = list(dict.fromkeys(drained))
    if not hosts:
        path.unlink(missing_ok=True)
        return path
    text = (
        "# Written by k2provision drain/return: the hosts no run starts an instance on.\n"
        + yaml.safe_dump({"drained": hosts}, sort_keys=False)
    )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
