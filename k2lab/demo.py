"""What `lab up N` deploys when no --group/--var is given: the first candidate the planner accepts.

The lab's hosts have no GPUs, but its inventory still describes a real deployment (k2_gpu and
k2_gpus_per_node keep their defaults: 8 x H200 per host), planned by the product's own planner
exactly as `apply` will plan it. Which layout fits N such hosts depends on the model catalog and
the memory fit, both of which change as the product grows, so the choice is computed, never
written down: candidates are tried in this order and the first that plans wins.

1. SGLang PD (the most moving parts: two pools, the router, KV transfer): prefill/decode
   splits from the even split outwards (prefill = N // 2 first, then N // 2 + 1, N // 2 - 1, ...);
2. SGLang TP over every host;
3. vLLM DP+EP, then vLLM TP+PP, then vLLM TP;
4. TensorRT-LLM TP+EP;
5. KTransformers on one host;
6. any other layout the product knows (each registered engine's LAYOUTS), in its order.

Within a layout, models go in catalog order with the default model first, and for each model
the context lengths of CONTEXT_LENGTHS in order. Weights come from the synthetic test source.

The search asks the planner with the groups and variables the inventory will hold; the winner
is then confirmed through the inventory file itself (Ansible's loader, as `apply` reads it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from k2lab.config import MAX_HOSTS, LabConfig
from k2lab.errors import LabError
from k2lab.inventory import InventoryHost, VarValue, layout_groups, render_inventory
from k2provision.core import catalog
from k2provision.core.inventory import DEFAULT_MODEL
from k2provision.engines import REGISTRY, layout_named
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import cluster_from_groups, load_cluster

LAYOUT_ORDER: tuple[tuple[str, str], ...] = (
    ("sglang", "pd"),
    ("sglang", "tp"),
    ("vllm", "dp_ep"),
    ("vllm", "tp_pp"),
    ("vllm", "tp"),
    ("trtllm", "tp_ep"),
    ("ktransformers", "single"),
)
CONTEXT_LENGTHS: tuple[int, ...] = (32768, 8192)
FIXED_VARS: dict[str, VarValue] = {"k2_weights_source": "synthetic"}
VALID_SCAN_LIMIT = 32
"""How far a refusal looks for the host counts that do plan, to name them."""


@dataclass(frozen=True)
class DemoLayout:
    """One candidate: the inventory groups (counts, in order) and the cluster variables."""

    engine: str
    layout: str
    model: str
    context_length: int
    groups: dict[str, int] = field(default_factory=dict)
    instances: int = 1
    """Serving instances behind one router (k2_instances): a fleet when above 1."""
    front_address: str = ""
    """A fleet's front (several routers behind it): k2_front_address, the lab's floating
    address; "" with one router."""

    @property
    def all_vars(self) -> dict[str, VarValue]:
        """The `[all:vars]` the lab writes for this candidate (k2_lab=true is always added)."""
        return {
            "k2_engine": self.engine,
            "k2_layout": self.layout,
            "k2_model": self.model,
            "k2_context_length": self.context_length,
            **({"k2_instances": self.instances} if self.instances > 1 else {}),
            **({"k2_front_address": self.front_address} if self.front_address else {}),
            **FIXED_VARS,
        }

    def describe(self) -> str:
        pools = " + ".join(f"{count} {name}" for name, count in self.groups.items())
        fleet = f", {self.instances} instances" if self.instances > 1 else ""
        if self.front_address:
            fleet += f" behind the front {self.front_address}"
        return (
            f"{self.engine} {self.layout} ({pools}{fleet}), {self.model}, "
            f"context {self.context_length}"
        )


def layouts() -> list[tuple[str, str]]:
    """LAYOUT_ORDER, then every other (engine, layout) the product knows."""
    known = [(name, layout.name) for name, engine in REGISTRY.items() for layout in engine.LAYOUTS]
    return [p for p in LAYOUT_ORDER if p in known] + [p for p in known if p not in LAYOUT_ORDER]


def models() -> list[str]:
    """The catalog's models, the default model first."""
    return [DEFAULT_MODEL, *(m for m in catalog.MODELS if m != DEFAULT_MODEL)]


def _pd_splits(n: int) -> list[int]:
    """Prefill sizes 1..n-1, the even split first, then outwards (ties: more prefill first)."""
    half = n // 2
    return sorted(range(1, n), key=lambda p: (abs(p - half), -p))


def group_choices(
    engine: str, layout: str, n: int, instances: int = 1, routers: int = 1, spares: int = 0
) -> list[dict[str, int]]:
    """Ways to place n hosts in a layout's groups, in the order they are tried. A fleet
    (`instances` above 1) puts its `routers` on the first hosts, alone, its replicas on the
    next and its `spares` last: a change to a replica then never restarts a router with it."""
    disaggregated = layout_named(engine, layout).disaggregated
    if instances > 1:
        fits = not disaggregated and n > routers + spares
        groups = {"router": routers, "nodes": n - routers - spares}
        return [{**groups, "spare": spares} if spares else groups] if fits else []
    if disaggregated:
        return [{"prefill": p, "decode": n - p} for p in _pd_splits(n)]
    return [{"nodes": n}]


def candidates(
    n: int, instances: int = 1, routers: int = 1, front_address: str = "", spares: int = 0
) -> Iterator[DemoLayout]:
    """Every candidate for n hosts (and `instances` behind `routers` routers, fronted at
    `front_address` when there are several, with `spares`), in the documented order."""
    for engine, layout in layouts():
        for model in models():
            for groups in group_choices(engine, layout, n, instances, routers, spares):
                for context in CONTEXT_LENGTHS:
                    yield DemoLayout(
                        engine, layout, model, context, groups, instances, front_address
                    )


def inventory_text(cfg: LabConfig, n: int, choice: DemoLayout) -> str:
    """The inventory `lab up n` writes for `choice` on the lab instance `cfg`."""
    names = [cfg.host_name(i) for i in range(1, n + 1)]
    return render_inventory(
        [InventoryHost(name, cfg.host_ip(i)) for i, name in enumerate(names, start=1)],
        instance=cfg.name,
        ssh_port=cfg.ssh_port,
        private_key=str(cfg.private_key),
        known_hosts=str(cfg.known_hosts),
        groups=layout_groups(names, choice.groups),
        all_vars=choice.all_vars,
        proxy_url=cfg.proxy_url,
    )


def _plans_from_groups(cfg: LabConfig, n: int, choice: DemoLayout) -> bool:
    """The planner's verdict on the groups and variables the inventory will hold."""
    names = [cfg.host_name(i) for i in range(1, n + 1)]
    groups = layout_groups(names, choice.groups)
    shared: dict[str, VarValue] = {"k2_lab": True, **choice.all_vars}
    host_vars = {
        name: {**shared, "ansible_host": cfg.host_ip(i), "ansible_port": cfg.ssh_port}
        for i, name in enumerate(names, start=1)
    }
    try:
        build_plan(cluster_from_groups("lab", {"all": names, **groups}, host_vars))
    except K2Error:
        return False
    return True


def plans(text: str) -> bool:
    """True when the inventory `text` loads (Ansible's loader) and plans."""
    with tempfile.TemporaryDirectory(prefix="k2lab-demo-") as tmp:
        path = Path(tmp) / "lab.ini"
        path.write_text(text)
        try:
            build_plan(load_cluster(path))
        except K2Error:
            return False
    return True


def first_that_plans(
    cfg: LabConfig,
    n: int,
    *,
    confirm: Callable[[str], bool] = plans,
    instances: int = 1,
    routers: int = 1,
    spares: int = 0,
) -> DemoLayout | None:
    """The first candidate for n hosts whose inventory plans, or None."""
    front = cfg.floating_address() if routers > 1 else ""
    for choice in candidates(n, instances, routers, front, spares):
        if _plans_from_groups(cfg, n, choice) and confirm(inventory_text(cfg, n, choice)):
            return choice
    return None


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5"."""
    parts: list[str] = []
    for v in values:
        if parts and parts[-1].split("-")[-1] == str(v - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ", ".join(parts)


def valid_counts(cfg: LabConfig, limit: int | None = None) -> list[int]:
    """The host counts up to `limit` (VALID_SCAN_LIMIT) for which some candidate plans."""
    return [
        n
        for n in range(1, (limit or VALID_SCAN_LIMIT) + 1)
        if any(_plans_from_groups(cfg, n, c) for c in candidates(n))
    ]


def choose(
    cfg: LabConfig, n: int, instances: int = 1, routers: int = 1, spares: int = 0
) -> DemoLayout:
    """The demo layout for n hosts, or a LabError naming the host counts that have one."""
    if not 1 <= n <= MAX_HOSTS:
        raise LabError(f"lab up {n}: expected 1..{MAX_HOSTS} hosts")
    if spares and instances < 2:
        raise LabError(
            f"lab up {n} --spares {spares}: spares stand by for a fleet's hosts; fix: add "
            "--instances K (2 or more)"
        )
    if routers > 1 and instances < 2:
        raise LabError(
            f"lab up {n} --routers {routers}: routers front a fleet; fix: add --instances K "
            "(2 or more)"
        )
    choice = first_that_plans(cfg, n, instances=instances, routers=routers, spares=spares)
    if choice is not None:
        return choice
    if instances > 1:
        flags = f" --routers {routers}" if routers > 1 else ""
        flags += f" --spares {spares}" if spares else ""
        where = "the router on one host" if routers == 1 else f"the routers on {routers} hosts"
        raise LabError(
            f"lab up {n} --instances {instances}{flags}: no fleet plans on {n} hosts of "
            f"8 x h200 ({where}, {spares} spare(s), {instances} equal instances on the other "
            f"{n - routers - spares}); fix: give {instances} x the hosts of one instance plus "
            f"{routers + spares}, e.g. `lab up {instances + routers + spares} --instances "
            f"{instances}{flags}`"
        )
    valid = valid_counts(cfg)
    shown = _ranges(valid) if valid else "none"
    raise LabError(
        f"lab up {n}: no lab layout plans on {n} hosts of 8 x h200 (tried "
        f"{', '.join(f'{e} {layout}' for e, layout in layouts())} with "
        f"{', '.join(models())}); host counts that plan, up to {VALID_SCAN_LIMIT}: {shown}; "
        "fix: pick one of those, or give the layout yourself with --group and --var"
    )
