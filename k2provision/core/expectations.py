"""What the plan needs from one host, and the verdict on what the host has. Pure.

The preflight role collects command output on each host (``nvidia-smi -q -x``, ``ibstat``,
``df``, ``ss``...) and hands the texts here through the ``k2.cluster.preflight_*`` filters:

- :func:`expectations_for` turns the Plan and the catalog into the
  :class:`~k2provision.core.preflight.Expectations` of one host: GPU model, count and memory, the
  driver the engine image needs, fabric manager on NVSwitch boards, RDMA ports on multi-host
  plans, room for the checkpoint at the model dir, the TCP ports the plan binds there.
- :func:`host_facts` parses the collected texts into :class:`~k2provision.core.facts.HostFacts`
  (a text that is absent or does not parse is a fact not collected).
- :func:`evaluate_host` and :func:`evaluate_cluster` run the checks of
  :mod:`k2provision.core.preflight` and sort the problems into those that refuse the host now
  and those the prepare phase will fix (a driver that role ``k2_nvidia_driver`` installs).

Nothing here runs a command or imports ansible.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.facts import (
    FACT_COMMANDS,
    FACTS,
    FactParseError,
    HostFacts,
    parse_ibstat,
    parse_nvidia_smi_topo,
)
from k2provision.core.preflight import (
    Expectations,
    Problem,
    check_host,
    check_same_driver,
    derive_ib_devices,
)
from k2provision.core.records import Plan
from k2provision.core.versions import version_tuple

__all__ = [
    "DCGM_CHECKS",
    "DRIVER_CHECKS",
    "FACT_TEXTS",
    "GPU_CHECKS",
    "HARDWARE_CHECKS",
    "IB_CHECKS",
    "PreflightOptions",
    "Verdict",
    "evaluate_cluster",
    "evaluate_host",
    "expectations_for",
    "host_facts",
    "ib_devices_from_texts",
    "image_id_mismatches",
    "planned_ports",
]

GPU_CHECKS = frozenset({"gpu_facts", "gpu_model", "gpu_count", "gpu_memory"})
"""What the GPUs are: only new hardware fixes these."""
DCGM_CHECKS = frozenset({"dcgm"})
"""DCGM on a GPU host, which the GPU health gate's diagnostic needs."""
DRIVER_CHECKS = frozenset(
    {"driver", "driver_mismatch", "persistence_mode", "fabric_state", "fabric_manager"}
)
"""What role k2_nvidia_driver installs and configures (driver, fabric manager, persistence)."""
IB_CHECKS = frozenset({"ib_port", "ib_rate", "ib_ports"})
HARDWARE_CHECKS = GPU_CHECKS | DRIVER_CHECKS | IB_CHECKS | DCGM_CHECKS
"""Checks that need GPUs and HCAs; the lab profile (``k2_lab``) has neither and skips them."""

FACT_TEXTS = tuple(fact.key for fact in FACT_COMMANDS)
"""Keys of the texts the roles collect (each the stdout of one command of
:data:`~k2provision.core.facts.FACT_COMMANDS`, or None)."""

_HW_TEXTS = frozenset(fact.key for fact in FACT_COMMANDS if fact.hardware)

DEFAULT_IB_RATE_GBPS = 400.0
"""NDR InfiniBand, the compute fabric of HGX H200 systems: one 400 Gb/s rail per GPU."""


class PreflightOptions(BaseModel):
    """How strictly to judge a host; the role's variables, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hardware: bool = True
    """False in the lab profile: GPU, driver, fabric manager and RDMA checks do not apply."""
    driver_managed: bool = False
    """True when role k2_nvidia_driver installs the driver in the prepare phase: a missing or
    old driver, a stopped fabric manager and persistence mode off are then deferred to it
    rather than refused here."""
    ib_rate_gbps: float | None = DEFAULT_IB_RATE_GBPS
    min_active_ib_ports: int | None = Field(default=None, ge=0)
    """Active ports at ``ib_rate_gbps`` a host needs when the plan names no RDMA devices for it
    (``k2_ib_devices``); None: one per GPU on plans that span hosts, none on a single-host
    plan."""
    disk_gib: float | None = Field(default=None, ge=0)
    """Room the weights need at the model dir; None: the catalog's checkpoint size."""
    require_clock_sync: bool | None = None
    """Refuse a host whose clock sync state cannot be read; None: on hardware hosts, not in the
    lab (an unsynchronized clock that was read is refused either way)."""
    require_persistence_mode: bool = True
    require_dcgm: bool = True
    """Refuse a GPU host without a DCGM diagnostic (core.gpu_health.DCGM_FIX says what it
    needs); the lab profile skips it with the other hardware checks."""
    os_ids: tuple[str, ...] = ("ubuntu", "debian")
    only: tuple[str, ...] = ()
    """Keep only problems of these checks (empty: all)."""


class Verdict(BaseModel):
    """Problems sorted by what happens next: refused now, or fixed by the prepare phase."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    refuse: tuple[Problem, ...] = ()
    defer: tuple[Problem, ...] = ()
    skipped: tuple[str, ...] = ()
    """Checks that did not apply (lab profile, a host without GPUs)."""
    summary: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Plain data for Ansible: one line per problem, plus the summary."""
        return {
            "refuse": [p.line() for p in self.refuse],
            "defer": [p.line() for p in self.defer],
            "skipped": list(self.skipped),
            "summary": self.summary,
        }


# ---------------------------------------------------------------- plan -> expectations


def planned_ports(
    plan: Plan, host: str, running_containers: Collection[str] = ()
) -> dict[str, int]:
    """TCP ports the plan's processes bind on ``host`` (the plan's ``ports``), keyed by the
    variable that sets each. Ports of a container that already runs (a converged host) are
    left out: they are its own."""
    ports: dict[str, int] = {}
    for binding in plan.host(host).ports:
        # A host daemon's port (the front's HAProxy: container "") is role k2_front_tier's, which
        # runs after this check and holds it from its first run on.
        if not binding.container or binding.container in running_containers:
            continue
        setting = binding.setting
        if ports.get(setting, binding.port) != binding.port:
            setting = f"{setting} ({binding.process})"
        ports[setting] = binding.port
    return ports


def _gpu_hosts(plan: Plan) -> list[str]:
    return [h.name for h in plan.hosts if h.gpus > 0]


def _min_driver(plan: Plan) -> tuple[str, str]:
    """The newer of the GPU's and the engine release's minimum driver, and who needs it."""
    gpu = catalog.gpu(plan.gpu)
    if version_tuple(plan.engine_min_driver) >= version_tuple(gpu.min_driver):
        return plan.engine_min_driver, f"the {plan.engine} {plan.engine_version} image"
    return gpu.min_driver, f"the {gpu.key} GPU"


def expectations_for(
    plan: Plan,
    host: str,
    options: PreflightOptions | None = None,
    *,
    model_dir_used_bytes: int = 0,
    running_containers: Collection[str] = (),
) -> Expectations:
    """What ``host`` must offer for ``plan``: the catalog's GPU and checkpoint numbers, the
    engine image's driver floor, and the ports this host binds.

    ``model_dir_used_bytes`` (what the model dir already holds) is subtracted from the room
    the weights need, so a host whose weights are in place is not refused for a full disk.
    """
    options = options or PreflightOptions()
    host_plan = plan.host(host)
    gpu = catalog.gpu(plan.gpu)
    min_driver, required_by = _min_driver(plan)
    gpus = host_plan.gpus if host_plan.gpus > 0 else 1
    if options.disk_gib is not None:
        weights = int(options.disk_gib * GIB)
    else:
        weights = int(plan.weights.checkpoint_gib * GIB)
    spans_hosts = len(_gpu_hosts(plan)) > 1
    if options.min_active_ib_ports is not None:
        min_ports = options.min_active_ib_ports
    else:
        min_ports = gpus if spans_hosts and host_plan.gpus > 0 else 0
    return Expectations(
        gpu_model=gpu.key,
        product_pattern=gpu.product_pattern,
        gpus_per_node=gpus,
        min_gpu_memory_mib=gpu.memory_mib,
        min_driver=min_driver,
        driver_required_by=required_by,
        fabric_manager=gpu.nvswitch and gpus >= 8,
        ib_rate_gbps=options.ib_rate_gbps,
        min_active_ib_ports=min_ports,
        ib_devices=host_plan.ib_devices,
        model_dir=plan.model_dir,
        instance=host_plan.pool,
        disk_bytes_needed=max(0, weights - max(0, model_dir_used_bytes)),
        ports_free=planned_ports(plan, host, running_containers),
        require_clock_sync=options.require_clock_sync is not False,
        require_persistence_mode=options.require_persistence_mode,
        require_dcgm=options.require_dcgm,
        os_ids=options.os_ids,
    )


# ---------------------------------------------------------------- texts -> facts


def host_facts(host: str, texts: Mapping[str, Any]) -> tuple[HostFacts, list[Problem]]:
    """Parse what a role collected (``{key: text or None}``, keys of :data:`FACT_TEXTS`).

    Each fact takes the first of its commands' texts that parses; a fact none of whose texts
    is there stays None. When texts are there but none parses, the first one's parser error
    becomes a problem naming the command and the reason.
    """
    values: dict[str, Any] = {}
    failures: dict[str, tuple[str, FactParseError]] = {}
    for fact in FACT_COMMANDS:
        if fact.field in values:
            continue
        raw = texts.get(fact.key)
        text = fact.text(0, None if raw is None else str(raw))
        if text is None:
            continue
        try:
            values[fact.field] = fact.parse(text)
        except FactParseError as exc:
            failures.setdefault(fact.field, (fact.key, exc))
    unreadable = [
        Problem(
            host=host,
            check=f"unreadable_{key}",
            value="unparsable output",
            expected=f"what `{FACTS[key].label}` prints",
            message=f"cannot read the output of `{FACTS[key].label}`: {exc}",
            fix=FACTS[key].fix or f"run `{FACTS[key].label}` on the host and check its output",
        )
        for field, (key, exc) in failures.items()
        if field not in values
    ]
    return HostFacts(host=host, **values), unreadable


def ib_devices_from_texts(texts: Mapping[str, Any]) -> list[str]:
    """``k2_ib_devices`` for a host that does not name them: each GPU's nearest NIC from
    ``nvidia-smi topo -m``, restricted to devices with an Active port when ``ibstat`` output is
    there. Without a topology there is nothing to derive from (an empty list)."""
    topology_text, ibstat_text = texts.get("nvidia_smi_topo"), texts.get("ibstat")
    if topology_text is None or not str(topology_text).strip():
        return []
    topology = parse_nvidia_smi_topo(str(topology_text))
    usable = None
    if ibstat_text is not None and str(ibstat_text).strip():
        usable = {p.ca for p in parse_ibstat(str(ibstat_text)) if p.active}
    return derive_ib_devices(topology, usable)


# ---------------------------------------------------------------- verdicts


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.1f} GiB"


def _summary(facts: HostFacts, exp: Expectations, hardware: bool) -> str:
    parts: list[str] = []
    if facts.os is not None:
        parts.append(facts.os.pretty_name or facts.os.id)
    if facts.kernel is not None:
        parts.append(f"kernel {facts.kernel}")
    if hardware and facts.gpus is not None:
        names = "/".join(facts.gpus.products) or "no GPU"
        parts.append(f"{facts.gpus.count} x {names}, driver {facts.gpus.driver_version}")
    if hardware and facts.ib_ports is not None:
        active = sum(1 for p in facts.ib_ports if p.active)
        parts.append(f"{active}/{len(facts.ib_ports)} RDMA ports Active")
    parts.append(
        f"{_gib(facts.model_dir_free_bytes)} free at {exp.model_dir} "
        f"({_gib(exp.disk_bytes_needed)} needed)"
    )
    if exp.ports_free:
        parts.append("ports " + ",".join(str(p) for p in sorted(set(exp.ports_free.values()))))
    if facts.clock is not None:
        parts.append("clock " + ("synchronized" if facts.clock.synchronized else "NOT synced"))
    return f"{facts.host}: " + "; ".join(parts)


def _sort(
    problems: Sequence[Problem], options: PreflightOptions, gpus_known: bool
) -> tuple[list[Problem], list[Problem]]:
    """Split into (refuse, defer). With the driver managed by the prepare phase, what it
    installs is deferred; so are the GPU checks when no driver answers yet (it verifies
    them after installing)."""
    refuse: list[Problem] = []
    defer: list[Problem] = []
    for problem in problems:
        base = problem.check
        if options.only and base not in options.only:
            continue
        deferrable = base in DRIVER_CHECKS or (base in GPU_CHECKS and not gpus_known)
        (defer if options.driver_managed and deferrable else refuse).append(problem)
    return refuse, defer


def evaluate_host(
    plan: Plan, host: str, texts: Mapping[str, Any], options: PreflightOptions | None = None
) -> Verdict:
    """The verdict on one host from the texts collected there."""
    options = options or PreflightOptions()
    facts, unreadable = host_facts(host, texts)
    host_plan = plan.host(host)
    hardware = options.hardware and host_plan.gpus > 0
    required = options.require_clock_sync
    clock_required = (hardware if required is None else required) or facts.clock is not None
    exp = expectations_for(
        plan,
        host,
        options.model_copy(update={"require_clock_sync": clock_required}),
        model_dir_used_bytes=facts.model_dir_used_bytes or 0,
        running_containers=facts.containers or (),
    )
    skipped: tuple[str, ...] = ()
    if not hardware:
        exp = exp.model_copy(
            update={"fabric_manager": False, "ib_devices": (), "min_active_ib_ports": 0}
        )
        skipped = tuple(sorted(HARDWARE_CHECKS))
    problems = [
        p
        for p in unreadable + check_host(facts, exp)
        if hardware
        or (p.check not in HARDWARE_CHECKS and p.check.removeprefix("unreadable_") not in _HW_TEXTS)
    ]
    refuse, defer = _sort(problems, options, facts.gpus is not None)
    return Verdict(
        refuse=tuple(refuse),
        defer=tuple(defer),
        skipped=skipped,
        summary=_summary(facts, exp, hardware),
    )


def evaluate_cluster(
    plan: Plan, texts_by_host: Mapping[str, Mapping[str, Any]], options: PreflightOptions
) -> Verdict:
    """Checks across hosts: every GPU host of the plan runs the same driver."""
    if not options.hardware:
        return Verdict(skipped=("driver_mismatch",))
    gpu_hosts = set(_gpu_hosts(plan))
    facts = [
        host_facts(host, texts)[0] for host, texts in texts_by_host.items() if host in gpu_hosts
    ]
    refuse, defer = _sort(check_same_driver(facts), options, gpus_known=True)
    return Verdict(refuse=tuple(refuse), defer=tuple(defer))


# ---------------------------------------------------------------- images across hosts


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def image_id_mismatches(ids_by_host: Mapping[str, Mapping[str, str] | None]) -> list[str]:
    """One line per group of hosts whose copy of an image differs from the one most hosts
    hold (``{host: {image: image ID}}``; the newest ID wins a tie). Every host of a plan must
    run the same bits, or ranks disagree in ways no log explains."""
    by_image: dict[str, dict[str, list[str]]] = {}
    for host, ids in ids_by_host.items():
        for image, image_id in (ids or {}).items():
            by_image.setdefault(image, {}).setdefault(image_id, []).append(host)
    lines: list[str] = []
    for image, groups in sorted(by_image.items()):
        if len(groups) < 2:
            continue
        reference = max(groups, key=lambda image_id: (len(groups[image_id]), image_id))
        for image_id, hosts in sorted(groups.items()):
            if image_id == reference:
                continue
            lines.append(
                f"{', '.join(hosts)}: image {image} is {_short(image_id)}, expected "
                f"{_short(reference)} as on {', '.join(groups[reference])}; fix: refer to the "
                f"image by digest (name@sha256:...) or load one archive everywhere, remove the "
                f"odd copy (`docker rmi {image}` there) and run prepare again"
            )
    return lines
