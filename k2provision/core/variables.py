"""The inventory contract's variables: their names, where each is set, and what each accepts.

One source for the checks (inventory.py), the error lines and the inventory reference's table
(docs/inventory.md): the ranges live on the fields of `Cluster` and `Tunables` in models.py.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Le
from pydantic.fields import FieldInfo

from k2provision.core import role_specs
from k2provision.core.records import LAB_FAULTS, TIMED_LAB_FAULTS, Cluster, PoolName, Tunables

# One value for the whole cluster ([all:vars] or group_vars/all), read into Cluster's fields.
CLUSTER_VARS = (
    "k2_engine",
    "k2_layout",
    "k2_model",
    "k2_model_dir",
    "k2_gpu",
    "k2_gpus_per_node",
    "k2_context_length",
    "k2_instances",
    "k2_prefill_instances",
    "k2_decode_instances",
    "k2_max_unavailable",
    "k2_drain_timeout",
    "k2_lab",
)
# The variable that says how many instances each pool holds.
INSTANCE_VARS: dict[PoolName, str] = {
    "nodes": "k2_instances",
    "prefill": "k2_prefill_instances",
    "decode": "k2_decode_instances",
}
# Per host.
HOST_VARS = ("k2_ib_devices", "k2_local_ip", "k2_lab_fault")
TUNABLE_VARS = tuple(f"k2_{name}" for name in Tunables.model_fields)
# Set by the playbooks themselves (registered results, the wrapper's extra-vars).
PLAYBOOK_VARS = (
    "k2_planned",
    "k2_expected_plan_digest",
    "k2_restart_hosts",
    "k2_restart_set",
    "k2_cancel_relays",
    "k2_cancel_stage",
    "k2_converge",
    "k2_rollout",
    "k2_rollout_replaced",
    "k2_instance_repairs",
    "k2_full_converge",
    "k2_accept_outage",
    "k2_apply_canary",
    "k2_drain_instances",
    "k2_return_instances",
    "k2_host_work",
    "k2_host_work_file",
    "k2_container_runtime_progress_file",
    "k2_host_work_instances",
    "k2_host_work_deferred",
)
# A host list longer than this is shown by its ends and its count.
HOSTS_SHOWN = 6


def field_of(variable: str) -> FieldInfo | None:
    """The model field behind a cluster variable or tunable (None for other names)."""
    name = variable.removeprefix("k2_")
    if variable in TUNABLE_VARS:
        return Tunables.model_fields[name]
    if variable in CLUSTER_VARS:
        return Cluster.model_fields[name]
    return None


def bounds(field: FieldInfo) -> tuple[float | None, float | None]:
    """A numeric field's inclusive (low, high) range; None where a side is open."""
    low: float | None = None
    high: float | None = None
    for item in field.metadata:
        if isinstance(item, Ge):
            low = float(item.ge)  # type: ignore[arg-type]
        elif isinstance(item, Le):
            high = float(item.le)  # type: ignore[arg-type]
    return low, high


def _number(value: float, integer: bool) -> str:
    return str(int(value)) if integer or value.is_integer() else str(value)


def value_range(variable: str) -> str:
    """What a variable accepts, as a short phrase ("an integer from 1 to 65535")."""
    special = {
        "k2_engine": "an engine of the registry (see k2_engine)",
        "k2_layout": "a layout of the engine (see k2_layout)",
        "k2_model": "a model of the catalog",
        "k2_gpu": "a GPU of the catalog",
        "k2_ib_devices": "RDMA device names (comma list or YAML list), each once",
        "k2_local_ip": "an IP address",
        "k2_lab_fault": "one of "
        + ", ".join(f"{f}=<seconds>" if f in TIMED_LAB_FAULTS else f for f in LAB_FAULTS)
        + ", or unset (lab only)",
    }
    if variable in special:
        return special[variable]
    field = field_of(variable)
    if field is None:
        return "see the inventory reference, docs/inventory.md"
    annotation = field.annotation
    optional = get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation)
    kind = next(a for a in get_args(annotation) if a is not type(None)) if optional else annotation
    low, high = bounds(field)
    if get_origin(kind) is Literal:
        text = "one of " + ", ".join(str(a) for a in get_args(kind))
    elif kind is bool:
        text = "true or false"
    elif kind in (int, float):
        noun = "an integer" if kind is int else "a number"
        integer = kind is int
        if low is not None and high is not None:
            text = f"{noun} from {_number(low, integer)} to {_number(high, integer)}"
        elif low is not None:
            text = f"{noun} of at least {_number(low, integer)}"
        else:
            text = noun
    elif any(
        getattr(m, "func", None) is not None
        for m in (*field.metadata, *getattr(kind, "__metadata__", ()))
    ):
        text = "an absolute path of letters, digits and . _ - / @ + = % ~ (no '..')"
    else:
        text = (
            "a word of letters, digits and . _ - / : @ + = % ~ , ^ (no spaces or shell "
            "metacharacters), not starting with - (it would be read as a flag)"
        )
    return f"{text}, or unset" if optional else text


def show(value: Any) -> str:
    """A value as it would be written in an inventory, quoted only where that helps."""
    if isinstance(value, str):
        return value if value and value.strip() == value and " " not in value else repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "(unset)"
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def shorten_hosts(names: Sequence[str]) -> str:
    """Host names for a message: all of them, or the ends and the count of a long list."""
    if len(names) <= HOSTS_SHOWN:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]}, {len(names)} hosts"


def known_names() -> tuple[str, ...]:
    """Every variable name an inventory may set."""
    return (
        *CLUSTER_VARS,
        *HOST_VARS,
        *TUNABLE_VARS,
        *PLAYBOOK_VARS,
        *role_specs.option_names(),
    )


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to a misspelt name, if any is near enough."""
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.75)
    return found[0] if found else None


def unknown_name_problem(name: str, hosts: Sequence[str]) -> str:
    """The line for a k2_ variable no role and no part of the contract knows."""
    role = role_specs.role_of(name)
    candidates = role_specs.options(role) if role else known_names()
    guess = closest(name, candidates) or closest(name, known_names())
    owner = f" (role {role} has no such option)" if role else ""
    hint = f"did you mean {guess}?" if guess else "see the inventory reference, docs/inventory.md"
    return f"{shorten_hosts(hosts)}: unknown variable {name}{owner}; fix: {hint}"
