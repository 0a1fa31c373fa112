"""Ansible inventory -> validated Cluster, through Ansible's own inventory loader.

Forms: an INI file, a YAML file, or a directory of them (several sources, with group_vars/ and
host_vars/ beside a file or inside the directory), read as ansible-playbook reads them.

Group contract: `[nodes]` for single-pool layouts; `[prefill]` and `[decode]` for PD
disaggregation; optional `[router]` (PD only, one host). Rank order in a pool is the order of
the pool's group as Ansible resolves it (`groups['nodes']` in a play: the group's own hosts,
then its child groups'), not the order hosts first appear in the file. Every problem found is
reported at once, one line each, before anything touches a host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from k2provision.core import (
    address_rules,
    bounded_read,
    connection,
    front_rules,
    network,
    role_specs,
    safety_gates,
    vault,
)
from k2provision.core.directory_rules import directory_problems
from k2provision.core.host_state import read_state, state_path
from k2provision.core.inventory_checks import (
    address_problem,
    cluster_values,
    host_name_problem,
    ib_devices,
    instance_split_problem,
    ip_problem,
    lab_fault_problem,
    port_problem,
)
from k2provision.core.layouts import EngineLayouts, Layout, find_layout, layouts_with_pool
from k2provision.core.records import (
    Cluster,
    HostSpec,
    PoolName,
    Tunables,
    integer_spelling_problem,
    tls_pair_problem,
)
from k2provision.core.variables import (
    CLUSTER_VARS,
    INSTANCE_VARS,
    TUNABLE_VARS,
    known_names,
    shorten_hosts,
    show,
    unknown_name_problem,
    value_range,
)
from k2provision.errors import InventoryError

# The inventory keys besides k2_ variables that the contract reads: the address and SSH port
# in both of Ansible's spellings (core/connection.py resolves them as Ansible does).
INVENTORY_KEYS = connection.CONNECTION_VARS
DEFAULT_MODEL = "moonshotai/Kimi-K2-Instruct"
POOL_GROUPS: tuple[PoolName, ...] = ("nodes", "prefill", "decode")
# Cluster fields read as the inventory sets them, their defaults those of `Cluster` alone.
DEFAULTED_CLUSTER_FIELDS = (
    "context_length",
    "instances",
    "prefill_instances",
    "decode_instances",
    "max_unavailable",
    "drain_timeout",
    "lab",
)
# The weights relay listens on every host during the weights phase (role k2_weights).
RELAY_PORT_VAR = "k2_weights_port"
# Ansible's file-based inventory plugins, in the order Ansible tries them.
_FILE_PLUGINS = {"yaml": "YAML", "ini": "INI"}
_YAML_SUFFIXES = (".yml", ".yaml", ".json")


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


# ---------------------------------------------------------------- reading, as Ansible does


def read_inventory(
    path: str | Path, extra_keys: tuple[str, ...] = ()
) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Load an inventory with Ansible's loader: (group -> hosts in order, host -> merged vars).

    The vars kept are the k2_ variables and INVENTORY_KEYS, plus `extra_keys` (the SSH
    connection variables, for the commands that reach hosts themselves)."""
    path = Path(path)
    if not path.exists():
        raise InventoryError(
            [
                f"{path}: no such inventory file or directory; fix: pass an INI or YAML "
                "inventory, or a directory of them (see inventory/prod.ini)"
            ]
        )
    _load_collections()
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    vault.open_vault(loader)
    leaves = _leaf_sources(path)
    problems = [
        line for leaf in _read_files(path, leaves) if (line := _bounds_problem(leaf, loader))
    ]
    if problems:
        raise InventoryError(problems)
    problems = [line for leaf in leaves if (line := _source_problem(leaf, loader))]
    if problems:
        raise InventoryError(problems)

    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=manager)
    except AnsibleError as exc:  # a vaulted inventory file that no secret given opens
        raise InventoryError([_ansible_problem(str(path), exc)]) from None
    groups = {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}
    host_vars: dict[str, dict[str, Any]] = {}
    for host in manager.get_hosts():
        try:
            every = variables.get_vars(host=host)
        except AnsibleError as exc:  # a vaulted vars file that no secret given opens
            problems.append(_ansible_problem(host.name, exc))
            continue
        host_vars[host.name] = {
            str(k): _kept_value(host.name, str(k), v, every, loader, problems, extra_keys)
            for k, v in every.items()
            if str(k).startswith("k2_") or str(k) in INVENTORY_KEYS or str(k) in extra_keys
        }
    if problems:
        raise InventoryError(problems)
    return groups, host_vars


def _load_collections() -> None:
    """Let Ansible import plugins by their collection name (`plugin: ansible.builtin.generator`
    in a YAML inventory), as its own commands do at start; without it such a source parses to
    no hosts. Once per process."""
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()


def _ansible_problem(where: str, exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    fix = vault.VAULT_FIX if "vault" in first.lower() else "fix: correct the inventory"
    return f"{where}: Ansible cannot read the inventory: {first}; {fix}"


def _kept_value(
    host: str,
    name: str,
    value: Any,
    every: Any,
    loader: Any,
    problems: list[str],
    extra_keys: tuple[str, ...],
) -> Any:
    """A kept variable's value. A vaulted one is opened (a line naming it when no secret given
    opens it); the plan never holds its plain text: a role variable is kept as VAULTED (the
    playbook opens it on its own), a connection variable plain (it opens the SSH session), and
    a contract variable, which the plan would show, is refused."""
    if not vault.is_vaulted(value):
        return _templated(host, name, value, every, loader, problems)
    try:
        plain = vault.decrypted(value)
    except ValueError as why:
        problems.append(f"{host}: {name} is vaulted and cannot be opened: {why}; {vault.VAULT_FIX}")
        return vault.VAULTED
    if name in extra_keys:
        return plain
    if role_specs.role_of(name) is None:
        problems.append(
            f"{host}: {name} is vaulted, but it is a value the plan shows (and renders into "
            "launch scripts); expected Ansible Vault only for secrets the roles read (such as "
            f"k2_weights_hf_token); fix: write {name} in the clear"
        )
    return vault.VAULTED


def _leaf_sources(path: Path, seen: frozenset[str] = frozenset()) -> list[Path]:
    """The files Ansible reads as inventory sources under `path`, in its order. A directory
    link back to a directory above it is a loop: warned about and skipped, as Ansible goes on
    past the sources it cannot read."""
    from ansible.inventory.manager import IGNORED
    from ansible.utils.display import Display

    if not path.is_dir():
        return [path]
    real = os.path.realpath(path)
    if real in seen:
        Display().warning(f"{path} leads back to {real} (a symbolic link loop); skipped")
        return []
    found: list[Path] = []
    for name in sorted(os.listdir(path)):
        if not IGNORED.search(os.fsencode(name)):
            found.extend(_leaf_sources(path / name, seen | {real}))
    return found


def _read_files(path: Path, leaves: list[Path]) -> list[Path]:
    """Every file Ansible reads for this inventory: its sources and their vars files."""
    base = path if path.is_dir() else path.parent
    found = list(leaves)
    for vars_dir in ("group_vars", "host_vars"):
        for root, _, names in os.walk(base / vars_dir):
            found.extend(Path(root) / name for name in sorted(names))
    return found


def _plain_text(leaf: Path, loader: Any) -> str:
    """An inventory file's text as Ansible reads it: a file encrypted whole with ansible-vault
    is opened with the command's vault secrets (ValueError naming the fix when none opens it).
    OSError when it cannot be read."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import is_encrypted

    text = leaf.read_text(errors="replace")
    if not is_encrypted(text):
        return text
    try:
        plain: bytes = loader._vault.decrypt(text.encode())
        return plain.decode(errors="replace")
    except AnsibleError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(
            f"is encrypted with ansible-vault and no vault secret given opens it ({first}); "
            f"expected the password it was encrypted with; {vault.VAULT_FIX}"
        ) from None


def _bounds_problem(leaf: Path, loader: Any) -> str:
    """One line when an inventory file is not to be read: not a regular file, too large,
    vault-encrypted with no secret that opens it, or YAML whose aliases expand without bound
    ("" when it may be read)."""
    why = bounded_read.file_problem(leaf, bounded_read.INVENTORY_FILE_LIMIT)
    if why is None:
        try:
            text = _plain_text(leaf, loader)
        except OSError as exc:
            text, why = "", f"cannot be read ({exc.strerror or exc})"
        except ValueError as locked:
            return f"{leaf}: the inventory file {locked}"
        if why is None and leaf.suffix in (*_YAML_SUFFIXES, "") and leaf.suffix != ".json":
            why = bounded_read.yaml_expansion_problem(text)
    if why is None:
        return ""
    return (
        f"{leaf}: the inventory file {why}; expected a regular file of at most "
        f"{bounded_read.INVENTORY_FILE_LIMIT // bounded_read.MIB} MiB with bounded YAML "
        "aliases; fix: point the inventory at the real file, or trim it"
    )


def _plugin_name(leaf: Path, loader: Any) -> str | None:
    """The `plugin:` a YAML inventory source names (a plugin configuration), if any."""
    if leaf.suffix not in _YAML_SUFFIXES:
        return None
    import yaml

    try:
        data = yaml.safe_load(_plain_text(leaf, loader))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return str(data["plugin"]) if isinstance(data, dict) and "plugin" in data else None


def _claimed_by_other_plugin(leaf: Path, loader: Any) -> bool:
    """A dynamic source (an executable script, a YAML plugin config): Ansible's to judge."""
    from ansible.plugins.loader import inventory_loader

    if inventory_loader.get("script").verify_file(str(leaf)):
        return True
    return _plugin_name(leaf, loader) is not None


def _plugin_problem(leaf: Path, loader: Any) -> str:
    """One line when a YAML source names an inventory plugin Ansible cannot load."""
    from ansible.plugins.loader import inventory_loader

    name = _plugin_name(leaf, loader)
    if name is None or inventory_loader.get(name) is not None:
        return ""
    return (
        f"{leaf}: plugin: {show(name)} is no inventory plugin Ansible can load; expected a "
        "plugin's name, short or by collection (ansible.builtin.constructed); fix: correct the "
        "name or install its collection (ansible-doc -t inventory -l lists them)"
    )


def _source_problem(leaf: Path, loader: Any) -> str:
    """One line when no file plugin of Ansible's parses `leaf` ("" when one does), reading it
    through `loader` (which holds the command's vault secrets, as ansible-inventory's does).

    Asked directly, because InventoryManager only warns about an unparsable source and goes on
    without it."""
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    if _claimed_by_other_plugin(leaf, loader):
        return _plugin_problem(leaf, loader)
    reasons: dict[str, str] = {}
    full = str(leaf.resolve())
    for name in _FILE_PLUGINS:
        plugin = inventory_loader.get(name)
        try:
            if not plugin.verify_file(full):
                continue
            plugin.parse(InventoryData(), loader, full)
        except Exception as exc:  # the plugin's own reason is the message we want to show
            reasons[name] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            continue
        return ""
    if not reasons:
        return ""
    # The reason of the plugin the file's name points at: YAML for .yml/.yaml/.json, else INI.
    preferred = "yaml" if leaf.suffix in _YAML_SUFFIXES else "ini"
    kind = preferred if preferred in reasons else next(iter(reasons))
    return (
        f"{leaf}: not a valid {_FILE_PLUGINS[kind]} inventory: {reasons[kind]}; fix: correct "
        f"the file (ansible-inventory -i {leaf} --list shows what Ansible reads)"
    )


def _templated(
    host: str, name: str, value: Any, every: Any, loader: Any, problems: list[str]
) -> Any:
    """A contract variable's value as a play would see it (Jinja evaluated); role variables
    are left for the run, where their templates may need facts."""
    plain = plain_value(value)
    if not role_specs.is_template(plain) or role_specs.role_of(name):
        return plain
    from ansible.template import Templar

    try:  # the loader's tagged value: Ansible templates only what came from a trusted source
        return plain_value(Templar(loader=loader, variables=every).template(value))
    except Exception as exc:  # Ansible's reason (undefined variable, syntax) is the message
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        problems.append(
            f"{host}: {name}={show(value)} cannot be evaluated: {first}; fix: correct the "
            "template or write the value itself"
        )
        return plain


def load_cluster(path: str | Path, engines: EngineLayouts) -> Cluster:
    """Read and validate an inventory against the engines and their layouts (the engine
    registry's, engines/__init__.py engine_layouts); raise InventoryError listing every
    problem."""
    groups, host_vars = read_inventory(path)
    state = read_state(path)
    return cluster_from_groups(
        str(path), groups, host_vars, engines, state.drained, tuple(state.substitutes.items())
    )


# ---------------------------------------------------------------- the contract


def cluster_from_groups(
    source: str,
    groups: Mapping[str, list[str]],
    host_vars: Mapping[str, Mapping[str, Any]],
    engines: EngineLayouts,
    drained: Sequence[str] = (),
    replaced: Sequence[tuple[str, str]] = (),
) -> Cluster:
    """Validate groups and variables (as Ansible resolved them) into a Cluster, the engine
    and layout against `engines` (each engine's name and layouts); `drained`: the hosts the
    inventory's state file (core/host_state.py) records as drained; `replaced`: its (failed
    host, spare) pairs, each spare taking its failed host's place in the pool groups."""
    groups, problems = substituted(source, groups, replaced)
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
    if not pools:
        problems.append(
            f"{source}: no hosts in [nodes], [prefill] or [decode]; fix: put the GPU hosts in "
            "[nodes] (single pool) or in [prefill] and [decode] (PD disaggregation)"
        )
        raise InventoryError(problems)
    router_hosts = list(groups.get("router", []))
    spares = [h for h in groups.get("spare", []) if h not in pools and h not in router_hosts]
    problems += [
        f"{source}: host {h} is in [spare] and in a pool or [router]; expected a spare in "
        "[spare] alone (it serves nothing until k2provision heal puts it in a failed host's "
        "place); fix: remove it from one group"
        for h in groups.get("spare", [])
        if h not in spares
    ]
    # Pools in their groups' order: rank 0 of a pool is the first host of its group.
    members = [*pools, *(h for h in router_hosts if h not in pools), *spares]
    hv = {name: dict(host_vars.get(name, {})) for name in members}

    problems.extend(_variable_name_problems(hv))
    problems.extend(directory_problems(hv))
    values, disagreements = cluster_values(members, hv, (*CLUSTER_VARS, *TUNABLE_VARS))
    problems.extend(disagreements)

    engine = str(values.get("k2_engine", ""))
    layout = str(values.get("k2_layout", ""))
    chosen = find_layout(engines, engine, layout)
    if engine not in engines:
        problems.append(
            f"{source}: k2_engine={engine or '(unset)'} is not an engine; expected one of "
            f"{', '.join(engines)}; fix: set k2_engine in [all:vars]"
        )
    elif chosen is None:
        names = ", ".join(known.name for known in engines[engine])
        problems.append(
            f"{source}: k2_layout={layout or '(unset)'} is not a {engine} layout; expected one "
            f"of {names}; fix: set k2_layout in [all:vars]"
        )
    else:
        count = str(values.get("k2_instances", 1))
        fleet = count not in ("1", "")
        instances = int(count) if count.isdigit() and int(count) > 0 else 1
        problems.extend(_check_groups(source, engine, chosen, groups, engines, fleet, instances))
        problems.extend(
            f"{source}: {line}"
            for line in front_rules.count_problems(router_hosts, values.get("k2_front_address"))
        )

    hosts, host_problems = _hosts(members, {**pools, **dict.fromkeys(spares, "spare")}, hv)
    problems.extend(host_problems)
    tunables, tunable_problems = _tunables(source, values)
    problems.extend(tunable_problems)
    if router_hosts:
        router: str | None = router_hosts[0]
    else:
        disaggregated = chosen is not None and chosen.disaggregated
        router = next((h for h in pools if pools[h] == "prefill"), None) if disaggregated else None
    model_id = str(values.get("k2_model", DEFAULT_MODEL))
    fields = {
        "inventory": source,
        "engine": engine,
        "layout": layout,
        "model": model_id,
        "model_dir": values.get("k2_model_dir", f"/models/{model_id.rsplit('/', maxsplit=1)[-1]}"),
        "gpu": str(values.get("k2_gpu", "h200")).lower(),
        "gpus_per_node": values.get("k2_gpus_per_node", 8),
        "hosts": tuple(hosts),
        "router": router,
        "routers": tuple(router_hosts) or ((router,) if router else ()),
        "monitoring": tuple(groups.get("monitoring", [])),
        "tunables": tunables,
        "drained": tuple(drained),
        "replaced": tuple(replaced),
        # The rest as the inventory sets them; each unset one takes Cluster's default.
        **{
            name: values[f"k2_{name}"]
            for name in DEFAULTED_CLUSTER_FIELDS
            if f"k2_{name}" in values
        },
    }
    try:
        cluster = Cluster(**fields)
    except ValidationError as exc:
        problems.extend(_field_problems(source, exc, values))
        # The checks below still run, on the cluster without the refused values.
        fallback = _without_refused(fields, exc)
        if fallback is None:
            raise InventoryError(problems) from None
        cluster = fallback
    refused_gates, switched_off = safety_gates.gate_lines(hv, cluster.lab)
    problems += refused_gates
    cluster = cluster.model_copy(update={"switched_off": tuple(switched_off)})
    faulty = [h.name for h in cluster.hosts if h.lab_fault]
    if faulty and not cluster.lab:
        problems.append(
            f"{shorten_hosts(faulty)}: k2_lab_fault is set, but this is not a lab inventory "
            "(k2_lab is false); expected it only on lab hosts, where the stand-in engine runs; "
            "fix: remove k2_lab_fault"
        )
    if chosen is not None:
        problems.extend(_instance_problems(source, cluster, chosen))
        notes = [
            *_router_placement_notes(cluster, chosen, bool(router_hosts)),
            *_idle_setting_notes(cluster, chosen),
        ]
        cluster = cluster.model_copy(update={"notes": tuple(notes)})
    problems += [
        f"{state_path(source)}: host {name} is drained but not in the inventory; expected "
        f"drained hosts of {source}; fix: take {name} off the file's drained list (or put it back "
        "in the inventory)"
        for name in drained
        if name not in hv
    ]
    if problems:
        raise InventoryError(problems)
    problems = network.address_family_problems(cluster)
    problems += address_rules.cluster_rule_problems(cluster, {**hv[members[0]], **values}, hv)
    problems += front_rules.front_problems(cluster)
    if problems:
        raise InventoryError(problems)
    return cluster


def _variable_name_problems(hv: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Unknown k2_ names (with the likely intent), and role variables their spec refuses."""
    known = set(known_names())
    unknown: dict[str, list[str]] = {}
    refused: dict[tuple[str, str, str], list[str]] = {}
    internal: dict[tuple[str, str, str], list[str]] = {}
    for host, variables in hv.items():
        for name, value in variables.items():
            if not name.startswith("k2_"):
                continue
            if name not in known:
                unknown.setdefault(name, []).append(host)
            elif role_specs.role_of(name) and (why := role_specs.internal_problem(name)):
                internal.setdefault((name, show(value), why), []).append(host)
            elif (expected := role_specs.value_problem(name, value)) is not None:
                refused.setdefault((name, show(value), expected), []).append(host)
    problems = [unknown_name_problem(name, hosts) for name, hosts in sorted(unknown.items())]
    for (name, value, expected), hosts in refused.items():
        role = role_specs.role_of(name)
        problems.append(
            f"{shorten_hosts(hosts)}: {name}={value}: expected {expected} "
            f"(roles/{role}/meta/argument_specs.yml); fix: correct {name}"
        )
    problems += [
        f"{shorten_hosts(hosts)}: {name}={value} {why}"
        for (name, value, why), hosts in internal.items()
    ]
    return problems


def substituted(
    source: str, groups: Mapping[str, list[str]], replaced: Sequence[tuple[str, str]]
) -> tuple[dict[str, list[str]], list[str]]:
    """The groups with each spare in its failed host's place (the same position in the same
    pool group: its ranks and role), the spare out of [spare] and the failed host out of its
    pool group; and a line per pair the groups cannot take (the state file's)."""
    out = {name: list(hosts) for name, hosts in groups.items()}
    problems = []
    where = state_path(source)
    for failed, spare in replaced:
        pool = next((p for p in POOL_GROUPS if failed in out.get(p, [])), None)
        if pool is None:
            problems.append(
                f"{where}: {failed} is recorded as replaced by {spare}, but it is in no pool "
                f"group of {source} now; expected a host of [nodes], [prefill] or [decode]; "
                f"fix: put {failed} back in its pool group, or remove the entry from the file"
            )
        elif spare not in out.get("spare", []):
            problems.append(
                f"{where}: {spare} stands in for {failed}, but it is not in [spare] of "
                f"{source} (or stands in for another host too); expected a [spare] host; "
                f"fix: put {spare} back in [spare], or remove the entry from the file"
            )
        else:
            out[pool] = [spare if h == failed else h for h in out[pool]]
            out["spare"].remove(spare)
    return out, problems


def _hosts(
    members: list[str],
    pools: Mapping[str, PoolName | Literal["spare"]],
    hv: Mapping[str, Mapping[str, Any]],
) -> tuple[list[HostSpec], list[str]]:
    """HostSpecs in pool order, and a line per bad or repeated address or device list (a
    problem that several hosts share, such as one [all:vars] value, is one line)."""
    relay_ports = _relay_ports(hv)
    problems: list[str] = []
    shared: dict[str, list[str]] = {}
    hosts: list[HostSpec] = []
    addresses: dict[str, str] = {}
    local_ips: dict[str, str] = {}
    for name in members:
        v = hv[name]
        resolved = connection.host_address(name, v)
        address = str(resolved.value)
        if why_name := host_name_problem(name):
            problems.append(
                f"{name!r}: the host name {why_name}; expected letters, digits and . _ - : @ +; "
                "fix: rename the host in the inventory (ansible_host keeps its address)"
            )
        why = address_problem(address)
        if why and resolved.variable:
            problems.append(
                f"{name}: {resolved.variable}={show(v[resolved.variable])} {why}; fix: set "
                f"{resolved.variable} to the host's IP address or DNS name"
            )
        elif why:
            problems.append(
                f"{name}: without ansible_host the host name is its address, and it {why}; "
                "fix: set ansible_host to the host's IP address or DNS name"
            )
        port = connection.ssh_port(v)
        why_port = port_problem(port.value) if port.variable else None
        if port.variable and why_port:
            shared.setdefault(
                f"{port.variable}={show(port.value)} {why_port}; fix: set {port.variable} to the "
                "port the host's sshd listens on",
                [],
            ).append(name)
        if address in addresses:
            problems.append(
                f"{name}: address {address} is also {addresses[address]}'s; expected one "
                f"address per host; fix: correct {resolved.variable or 'ansible_host'} of one "
                "of them"
            )
        addresses.setdefault(address, name)
        local_ip = str(v.get("k2_local_ip", address))
        if "k2_local_ip" in v:
            if why := ip_problem(local_ip):
                shared.setdefault(
                    f"k2_local_ip={show(v['k2_local_ip'])} {why}; fix: set it to the IP address "
                    "the engine binds on this host (e.g. its RDMA network's)",
                    [],
                ).append(name)
            elif local_ip in local_ips:
                problems.append(
                    f"{name}: k2_local_ip={local_ip} is also {local_ips[local_ip]}'s; "
                    "expected one address per host; fix: correct k2_local_ip of one of them"
                )
        local_ips.setdefault(local_ip, name)
        devices, why = ib_devices(v.get("k2_ib_devices"))
        if why:
            shared.setdefault(
                f"k2_ib_devices={show(v['k2_ib_devices'])} {why}; expected "
                f"{value_range('k2_ib_devices')}; fix: e.g. k2_ib_devices=mlx5_0,mlx5_1",
                [],
            ).append(name)
        fault = v.get("k2_lab_fault")
        if fault is not None and (why_fault := lab_fault_problem(fault)):
            problems.append(
                f"{name}: k2_lab_fault={show(fault)} {why_fault}; expected "
                f"{value_range('k2_lab_fault')}; fix: correct or remove k2_lab_fault"
            )
            fault = None
        hosts.append(
            HostSpec(
                name=name,
                address=address,
                pool=pools.get(name, "router"),
                local_ip=local_ip,
                ib_devices=devices if not why else (),
                lab_fault=str(fault).strip() if fault is not None else None,
                weights_port=relay_ports.get(name),
                address_from=resolved.variable or "",
                ssh_port=connection.DEFAULT_SSH_PORT if why_port else int(str(port.value)),
                ssh_port_from=port.variable or "",
                monitoring_server=_monitoring_server(v),
            )
        )
    problems += [f"{shorten_hosts(names)}: {line}" for line, names in shared.items()]
    return hosts, problems


def _tunables(source: str, values: Mapping[str, Any]) -> tuple[Tunables, list[str]]:
    """The tunables the inventory sets, or the defaults and a line per refused value."""
    given = {name[3:]: values[name] for name in TUNABLE_VARS if name in values}
    config = given.get("model_config_json")
    if isinstance(config, str) and config and not os.path.isabs(config):
        # Relative to the inventory, as Ansible resolves group_vars/ beside it.
        base = Path(source) if Path(source).is_dir() else Path(source).parent
        given["model_config_json"] = os.path.abspath(base / config)
    try:
        return Tunables(**given), []
    except ValidationError as exc:
        problems = _field_problems(source, exc, values)
    # A field's error stops pydantic before the rules across fields: they are asked here too,
    # of the values as given, so that every problem is reported at once.
    if pair := tls_pair_problem(given.get("tls_cert_file"), given.get("tls_key_file")):
        problems.append(f"{source}: {pair}")
    return Tunables(), list(dict.fromkeys(problems))


# What a refused required field stands in as, so that the checks after it still run.
_STAND_INS = {"gpus_per_node": 8, "model_dir": "/models/model"}


def _without_refused(fields: Mapping[str, Any], exc: ValidationError) -> Cluster | None:
    """The cluster of `fields` with each refused one at its default (or a stand-in): for the
    checks that follow a field's error; None when it still cannot be built."""
    refused = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
    kept = {name: value for name, value in fields.items() if name not in refused}
    kept |= {name: _STAND_INS[name] for name in refused if name in _STAND_INS}
    try:
        return Cluster(**kept)
    except ValidationError:
        return None


def _field_problems(source: str, exc: ValidationError, values: Mapping[str, Any]) -> list[str]:
    problems = []
    for err in exc.errors():
        if not err["loc"]:  # a rule across fields: its message names its variables
            error = err.get("ctx", {}).get("error")
            problems.append(f"{source}: {error if error is not None else err['msg']}")
            continue
        field = str(err["loc"][0])
        variable = f"k2_{field}"
        if variable == "k2_engine":
            continue  # reported with the engine's own line
        value = values.get(variable, err.get("input"))
        spelling = integer_spelling_problem(value) if err["type"] == "value_error" else None
        why = f" ({spelling})" if spelling else ""
        problems.append(
            f"{source}: {variable}={show(value)} is refused{why}; expected "
            f"{value_range(variable)}; fix: correct {variable} in [all:vars] or group_vars/all"
        )
    return list(dict.fromkeys(problems))


def _monitoring_server(variables: Mapping[str, Any]) -> bool:
    """k2_monitoring_server as the role will read it (a template or a refused value: the
    role's default, since only the run can say)."""
    name = "k2_monitoring_server"
    value = role_specs.validated(name, variables.get(name, role_specs.default(name)))
    return value if isinstance(value, bool) else True


def _relay_ports(hv: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Each host's weights relay port (its own value, or the role's default)."""
    ports = {}
    for host, variables in hv.items():
        value = variables.get(RELAY_PORT_VAR, role_specs.default(RELAY_PORT_VAR))
        if value is not None and not port_problem(value):
            ports[host] = int(str(value))
    return ports


def _instance_problems(source: str, cluster: Cluster, layout: Layout) -> list[str]:
    """Instance counts the layout has no pool for, and pools they do not split evenly."""
    problems = []
    names = layout.pools
    for pool, variable in INSTANCE_VARS.items():
        count = cluster.instance_count(pool)
        if pool not in names:
            if count != 1:
                other = " and ".join(INSTANCE_VARS[n] for n in names)
                problems.append(
                    f"{source}: {variable}={count} counts the instances of [{pool}], which "
                    f"layout {cluster.layout} does not have; fix: remove {variable} and set "
                    f"{other}"
                )
            continue
        hosts = [h.name for h in cluster.pool(pool)]
        if hosts and (problem := instance_split_problem(pool, hosts, variable, count)):
            problems.append(f"{source}: {problem}")
    return problems


def _check_groups(
    source: str,
    engine: str,
    layout: Layout,
    groups: Mapping[str, list[str]],
    engines: EngineLayouts,
    fleet: bool = False,
    instances: int = 1,
) -> list[str]:
    """Which groups a layout needs, and which it must not have (`instances`: k2_instances,
    where it is a count)."""
    problems = []
    routers = groups.get("router", [])
    for need in layout.pools:
        if not groups.get(need):
            fix = (
                f"add a [{need}] group (see inventory/prod.ini)"
                if layout.disaggregated
                else f"add a [{need}] group listing the GPU hosts, master first"
            )
            problems.append(
                f"{source}: {engine} layout {layout.name} needs hosts in [{need}]; fix: {fix}"
            )
    for extra in POOL_GROUPS:
        if extra in layout.pools or not groups.get(extra):
            continue
        if layout.disaggregated:
            into = " or ".join(f"[{pool}]" for pool in layout.pools)
            problems.append(
                f"{source}: layout {layout.name} uses {into.replace(' or ', ' and ')}, but "
                f"[{extra}] has hosts; fix: move them into {into}"
            )
        else:
            owners = ", ".join(layouts_with_pool(engines, extra))
            problems.append(
                f"{source}: [{extra}] is only for layout {owners}, but k2_layout={layout.name}; "
                f"fix: set k2_layout={owners} or move the hosts into [nodes]"
            )
    if not layout.disaggregated and routers and not fleet:
        routed = ", ".join(layouts_with_pool(engines, "prefill"))
        problems.append(
            f"{source}: [router] ({shorten_hosts(routers)}) is only for layout {routed} and "
            f"fleets (k2_instances above 1), and one {engine} {layout.name} instance runs "
            "no router; fix: remove the [router] group, or set k2_instances"
        )
    # Several [router] hosts are the front tier: core/front_rules.py checks them.
    nodes = len(groups.get("nodes", []))
    if layout.one_host and not fleet and nodes != 1:
        problems.append(
            f"{source}: {engine} runs on exactly one host, [nodes] has {nodes}; fix: list one "
            "host in [nodes]"
        )
    elif layout.one_host and fleet and nodes != instances:
        problems.append(
            f"{source}: {engine} runs each instance on exactly one host, [nodes] has {nodes} "
            f"for k2_instances={instances}; fix: list {instances} hosts in [nodes], one per "
            f"instance, or set k2_instances={max(nodes, 1)}"
        )
    return problems


# Cluster variables and tunables read only by a fleet's rolling change, or only by a router:
# set where there is none, they change nothing, which is warned about rather than kept silently.
FLEET_ONLY_VARS = ("k2_max_unavailable", "k2_drain_timeout")
ROUTER_ONLY_VARS = (
    "k2_router_image",
    "k2_router_max_concurrent_requests",
    "k2_router_queue_size",
    "k2_router_queue_timeout_s",
    "k2_router_metrics_port",
)
# Read only by the front tier (two or more [router] hosts); k2_front_address is required there
# and refused elsewhere (core/front_rules.py).
FRONT_ONLY_VARS = (
    "k2_router_port",
    "k2_front_vrid",
    "k2_front_interface",
    "k2_canary_percent",
    "k2_canary_hold_s",
    "k2_canary_max_error_pct",
    "k2_canary_max_latency_ratio",
)


def _idle_setting_notes(cluster: Cluster, layout: Layout) -> list[str]:
    """A warning per setting the inventory gives that nothing in this cluster reads: fleet
    settings with one instance per pool, router settings with no router."""
    given = {
        name: value
        for name in (*FLEET_ONLY_VARS, *ROUTER_ONLY_VARS, *FRONT_ONLY_VARS)
        if (value := _set_value(cluster, name)) is not None
    }
    counts = " and ".join(f"{INSTANCE_VARS[pool]}=1" for pool in layout.pools)
    routed = layout.disaggregated or cluster.fleet
    notes = []
    for name, value in given.items():
        if name in FLEET_ONLY_VARS and not cluster.fleet:
            notes.append(
                f"{cluster.inventory}: {name}={show(value)} has nothing to act on: only a "
                f"fleet (several instances of a pool) reads it, and this cluster has one "
                f"instance per pool ({counts}); remove {name}, or set {counts.split('=')[0]}"
            )
        elif name in FRONT_ONLY_VARS and routed and not cluster.front:
            notes.append(
                f"{cluster.inventory}: {name}={show(value)} has nothing to act on: only the "
                f"front tier reads it, and one router ({cluster.router}) serves the endpoint; "
                "remove it, or list two or more hosts in [router] with k2_front_address"
            )
        elif name in (*ROUTER_ONLY_VARS, *FRONT_ONLY_VARS) and not routed:
            notes.append(
                f"{cluster.inventory}: {name}={show(value)} has nothing to act on: only a "
                f"router reads it, and one {cluster.engine} {cluster.layout} instance runs "
                f"none; remove {name}, or set {counts.split('=')[0]} for a fleet"
            )
    return notes


def _set_value(cluster: Cluster, name: str) -> Any:
    """The value the inventory set for a cluster variable or tunable (None when unset)."""
    field = name.removeprefix("k2_")
    if field in cluster.tunables.model_fields_set:
        return getattr(cluster.tunables, field)
    if field in cluster.model_fields_set and field in DEFAULTED_CLUSTER_FIELDS:
        return getattr(cluster, field)
    return None


def _router_placement_notes(cluster: Cluster, layout: Layout, named: bool) -> list[str]:
    """A warning when the router shares a host with an instance (the default without a
    [router] group, or a [router] host that is also a pool's): a restart of that instance
    restarts the router, and the endpoint with it (docs/fleets.md). `named`: the inventory has
    a [router] group."""
    if not (layout.disaggregated or cluster.fleet):
        return []
    first = cluster.pool("prefill" if layout.disaggregated else "nodes")
    host = cluster.router or (first[0].name if first else None)
    if host is None or cluster.host(host).pool == "router":
        return []
    pool = cluster.host(host).pool
    where = (
        f"[router] names a host of [{pool}]"
        if named
        else f"the first host of [{pool}], the default without a [router] group"
    )
    return [
        f"{host}: the router runs on an instance's host ({where}): a restart of that instance "
        "restarts the router too, which the endpoint does not survive (docs/fleets.md); "
        "fix: add a [router] group with one host of its own"
    ]
