"""Ansible INI inventory -> validated Cluster, through Ansible's own inventory loader.

Group contract: `[nodes]` for single-pool layouts; `[prefill]` and `[decode]` for PD
disaggregation; optional `[router]`. Rank 0 of a pool is its first host in inventory order.
Every problem found is reported at once, one line each, before anything touches a host.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from k2provision.errors import InventoryError
from k2provision.models import ENGINES, LAYOUTS, Cluster, HostSpec, PoolName, Tunables

CLUSTER_VARS = (
    "k2_engine",
    "k2_layout",
    "k2_model",
    "k2_model_dir",
    "k2_gpu",
    "k2_gpus_per_node",
    "k2_context_length",
    "k2_lab",
)
HOST_VARS = ("k2_ib_devices", "k2_local_ip")
TUNABLE_VARS = tuple(f"k2_{name}" for name in Tunables.model_fields)
# Set by the playbooks themselves (registered results, the wrapper's extra-vars).
PLAYBOOK_VARS = ("k2_planned", "k2_expected_plan_digest")
ROLES_DIR = Path(__file__).resolve().parents[1] / "roles"
DEFAULT_MODEL = "moonshotai/Kimi-K2-Instruct"


def role_prefixes() -> tuple[str, ...]:
    """`k2_<role>_` for every role shipped: their variables may be set in the inventory."""
    if not ROLES_DIR.is_dir():
        return ()
    return tuple(f"{p.name}_" for p in ROLES_DIR.iterdir() if p.name.startswith("k2_"))


def is_known_variable(name: str) -> bool:
    """True for the inventory contract's variables, role variables and playbook internals."""
    return name in (*CLUSTER_VARS, *HOST_VARS, *TUNABLE_VARS, *PLAYBOOK_VARS) or name.startswith(
        role_prefixes()
    )


POOL_GROUPS: tuple[PoolName, ...] = ("nodes", "prefill", "decode")


def plain_value(value: Any) -> Any:
    """Strip Ansible's tagged types down to plain Python values."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    return value


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def _as_list(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


def read_inventory(path: str | Path) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Load an inventory with Ansible's loader: (group -> hosts in order, host -> merged vars)."""
    path = Path(path)
    if not path.exists():
        raise InventoryError(
            [
                f"{path}: no such inventory file; fix: pass the path of an INI inventory "
                "(see inventory/prod.ini)"
            ]
        )
    reason = _ini_parse_error(path)
    if reason:
        raise InventoryError(
            [
                f"{path}: not a valid INI inventory: {reason}; fix: correct the file "
                "(ansible-inventory -i FILE --list shows what Ansible reads)"
            ]
        )
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    host_vars = {
        h.name: {
            str(k): plain_value(v)
            for k, v in variables.get_vars(host=h).items()
            if str(k).startswith(("k2_", "ansible_host"))
        }
        for h in manager.get_hosts()
    }
    return groups, host_vars


def _ini_parse_error(path: Path) -> str:
    """The INI plugin's own reason for rejecting `path` ("" when it parses).

    Asked directly, because InventoryManager only warns about an unparsable source."""
    from ansible.inventory.data import InventoryData
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import inventory_loader

    plugin = inventory_loader.get("ini")
    try:
        plugin.parse(InventoryData(), DataLoader(), str(path.resolve()))
    except Exception as exc:  # the plugin's error is the message we want to show
        return str(exc).splitlines()[0]
    return ""


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate an inventory; raise InventoryError listing every problem."""
    groups, host_vars = read_inventory(path)
    return cluster_from_groups(str(path), groups, host_vars)


def _unknown_vars(where: Mapping[str, list[str]]) -> list[str]:
    """One line per unknown k2_ variable, naming the hosts that set it and the likely intent."""
    known = (*CLUSTER_VARS, *HOST_VARS, *TUNABLE_VARS)
    problems = []
    for name, hosts in sorted(where.items()):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else "see the README's inventory reference"
        problems.append(f"{', '.join(hosts)}: unknown variable {name}; fix: {hint}")
    return problems


def cluster_from_groups(
    source: str, groups: Mapping[str, list[str]], host_vars: Mapping[str, Mapping[str, Any]]
) -> Cluster:
    """Validate groups and variables (as Ansible resolved them) into a Cluster."""
    problems: list[str] = []
    pools: dict[str, PoolName] = {}
    for pool in POOL_GROUPS:
        for name in groups.get(pool, []):
            if name in pools:
                problems.append(
                    f"{source}: host {name} is in both [{pools[name]}] and [{pool}]; "
                    "expected each host in exactly one pool; fix: remove it from one group"
                )
            else:
                pools[name] = pool
    router_hosts = list(groups.get("router", []))
    ordered = [h for h in groups.get("all", list(host_vars)) if h in pools]
    if not ordered:
        problems.append(
            f"{source}: no hosts in [nodes], [prefill] or [decode]; fix: put the GPU hosts in "
            "[nodes] (single pool) or in [prefill] and [decode] (PD disaggregation)"
        )
        raise InventoryError(problems)

    first = host_vars[ordered[0]]
    unknown: dict[str, list[str]] = {}
    for name in ordered + router_hosts:
        for var in host_vars.get(name, {}):
            if var.startswith("k2_") and not is_known_variable(var):
                unknown.setdefault(var, []).append(name)
        for var in (*CLUSTER_VARS, *TUNABLE_VARS):
            if host_vars.get(name, {}).get(var) != first.get(var):
                problems.append(
                    f"{name}: {var}={host_vars[name].get(var)!r} differs from "
                    f"{ordered[0]}'s {first.get(var)!r}; expected one value for the whole "
                    "cluster; fix: set it once in [all:vars] or group_vars/all"
                )
    problems = _unknown_vars(unknown) + list(dict.fromkeys(problems))

    engine = str(first.get("k2_engine", ""))
    layout = str(first.get("k2_layout", ""))
    if engine not in ENGINES:
        problems.append(
            f"{source}: k2_engine={engine or '(unset)'!s} is not an engine; expected one of "
            f"{', '.join(ENGINES)}; fix: set k2_engine in [all:vars]"
        )
    elif layout not in LAYOUTS[engine]:
        problems.append(
            f"{source}: k2_layout={layout or '(unset)'!s} is not a {engine} layout; expected one "
            f"of {', '.join(LAYOUTS[engine])}; fix: set k2_layout in [all:vars]"
        )
    else:
        problems.extend(_check_groups(source, engine, layout, groups))

    addresses: dict[str, str] = {}
    hosts: list[HostSpec] = []
    for name in ordered + [h for h in router_hosts if h not in pools]:
        hv = host_vars.get(name, {})
        address = str(hv.get("ansible_host", name))
        if address in addresses:
            problems.append(
                f"{name}: address {address} is also {addresses[address]}'s; expected one "
                "address per host; fix: correct ansible_host of one of them"
            )
        addresses[address] = name
        hosts.append(
            HostSpec(
                name=name,
                address=address,
                pool=pools.get(name, "router"),
                local_ip=str(hv.get("k2_local_ip", address)),
                ib_devices=_as_list(hv.get("k2_ib_devices")),
            )
        )

    tunables: dict[str, Any] = {name[3:]: first[name] for name in TUNABLE_VARS if name in first}
    model_id = str(first.get("k2_model", DEFAULT_MODEL))
    router = router_hosts[0] if router_hosts else None
    if router is None and layout == "pd":
        router = next((h.name for h in hosts if h.pool == "prefill"), None)
    if problems:
        raise InventoryError(problems)
    try:
        return Cluster(
            inventory=source,
            engine=engine,
            layout=layout,
            model=model_id,
            model_dir=str(
                first.get("k2_model_dir", f"/models/{model_id.rsplit('/', maxsplit=1)[-1]}")
            ),
            gpu=str(first.get("k2_gpu", "h200")).lower(),
            gpus_per_node=first.get("k2_gpus_per_node", 8),
            context_length=first.get("k2_context_length"),
            hosts=tuple(hosts),
            router=router,
            lab=_as_bool(first.get("k2_lab", False)),
            tunables=Tunables(**tunables),
        )
    except ValidationError as exc:
        raise InventoryError(
            f"{source}: k2_{'.'.join(str(p) for p in err['loc'])}={err.get('input')!r}: "
            f"{err['msg']}; fix: correct the variable in [all:vars]"
            for err in exc.errors()
        ) from None


def _check_groups(
    source: str, engine: str, layout: str, groups: Mapping[str, list[str]]
) -> list[str]:
    """Which groups a layout needs, and which it must not have."""
    problems = []
    if layout == "pd":
        for need in ("prefill", "decode"):
            if not groups.get(need):
                problems.append(
                    f"{source}: {engine} layout pd needs hosts in [{need}]; fix: add a "
                    f"[{need}] group (see inventory/prod.ini)"
                )
        if groups.get("nodes"):
            problems.append(
                f"{source}: layout pd uses [prefill] and [decode], but [nodes] has hosts; "
                "fix: move them into [prefill] or [decode]"
            )
    else:
        if not groups.get("nodes"):
            problems.append(
                f"{source}: {engine} layout {layout} needs hosts in [nodes]; fix: add a [nodes] "
                "group listing the GPU hosts, master first"
            )
        for extra in ("prefill", "decode"):
            if groups.get(extra):
                problems.append(
                    f"{source}: [{extra}] is only for layout pd, but k2_layout={layout}; fix: "
                    "set k2_layout=pd or move the hosts into [nodes]"
                )
        if layout == "single" and len(groups.get("nodes", [])) != 1:
            problems.append(
                f"{source}: {engine} runs on exactly one host, [nodes] has "
                f"{len(groups.get('nodes', []))}; fix: list one host in [nodes]"
            )
    return problems
