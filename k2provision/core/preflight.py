"""Preflight: pure assertions over host facts, each failure one line for a person.

``check_host(facts, expectations)`` judges one host, ``check_same_driver(hosts)`` compares
hosts with each other and ``check_cluster`` does both. Every :class:`Problem` names the host,
the value found, the value expected and the fix; ``str(problem)`` is that one line::

    gpu-07: driver 535.104.05 is older than 570.0 required by the sglang image; fix: upgrade \
the driver (role nvidia_driver, k2_nvidia_driver_branch) or pin an older image (k2_image)

A fact that was not collected (None in :class:`~k2provision.core.facts.HostFacts`) fails the checks
that need it: preflight refuses rather than guesses.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from k2provision.core.facts import FACTS, GpuInventory, HostFacts, IbPort, Topology, nearest_nics
from k2provision.core.gpu_health import DCGM_FIX, down_links
from k2provision.core.versions import version_at_least, version_tuple

__all__ = [
    "Expectations",
    "Problem",
    "check_cluster",
    "check_host",
    "check_same_driver",
    "derive_ib_devices",
]

GIB = 1024**3


class Problem(BaseModel):
    """One reason a host (or the cluster) cannot go ahead."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    check: str
    """Short name of the check (``driver``, ``ib_port``, ``disk``...), stable for tests and logs."""
    value: str
    """What the host has."""
    expected: str
    """What the plan needs."""
    fix: str
    message: str
    """The sentence naming value and expectation; :meth:`line` adds host and fix."""

    def line(self) -> str:
        """``host: message; fix: fix``: the one line a person reads."""
        return f"{self.host}: {self.message}; fix: {self.fix}"

    def __str__(self) -> str:
        return self.line()


class Expectations(BaseModel):
    """What the plan needs from every host it will use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_model: str
    """Catalog key, e.g. ``h200``."""
    product_pattern: str
    """Regular expression the nvidia-smi product name must match (case-insensitive), e.g.
    ``\\bH200\\b``."""
    gpus_per_node: int = Field(gt=0)
    min_gpu_memory_mib: int = Field(ge=0)
    min_driver: str
    driver_required_by: str = "the engine image"
    """Who needs ``min_driver``; it completes the sentence ``... required by <this>``."""
    fabric_manager: bool | None = None
    """Whether nvidia-fabricmanager must run; None derives it (see :attr:`needs_fabric_manager`)."""
    ib_rate_gbps: float | None = None
    """Link rate every counted port must reach (400 for NDR); None skips the rate test."""
    min_active_ib_ports: int = Field(default=0, ge=0)
    """Active ports at ``ib_rate_gbps`` a host must have; used when ``ib_devices`` is empty."""
    ib_devices: tuple[str, ...] = ()
    """RDMA devices the plan will use (``k2_ib_devices``); each must have an Active port."""
    model_dir: str = "the model directory"
    disk_bytes_needed: int = Field(default=0, ge=0)
    """Free bytes needed at ``model_dir``; 0 skips the disk check."""
    instance: str = "its instance"
    """The serving instance the host belongs to (its pool), named when a GPU fails."""
    ports_free: dict[str, int] = Field(default_factory=dict)
    """Setting name -> TCP port the plan binds (``{"k2_sglang_port": 30000}``)."""
    require_clock_sync: bool = True
    require_persistence_mode: bool = False
    require_dcgm: bool = False
    """Refuse a GPU host whose driver answers but whose DCGM diagnostic gave nothing (no
    ``dcgmi``, no host engine): the health gate cannot judge its GPUs."""
    os_ids: tuple[str, ...] = ("ubuntu", "debian")
    """Accepted os-release IDs (or ID_LIKE entries); empty skips the check."""

    @field_validator("product_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        re.compile(value)
        return value

    @field_validator("min_driver")
    @classmethod
    def _is_version(cls, value: str) -> str:
        version_tuple(value)
        return value

    @property
    def needs_fabric_manager(self) -> bool:
        """Explicit ``fabric_manager`` if set; otherwise NVSwitch systems, which for the GPUs
        this project targets means 8-GPU HGX boards (``gpus_per_node >= 8``)."""
        if self.fabric_manager is not None:
            return self.fabric_manager
        return self.gpus_per_node >= 8


# ---------------------------------------------------------------- one host

_COLLECTED_BY = {
    "gpu_facts": "nvidia_smi_xml",
    "fabric_manager": "fabric_manager",
    "ib_ports": "ibstat",
    "disk": "df_avail",
    "port": "ss",
    "clock": "clock",
    "os": "os_release",
    "dcgm": "dcgm_diag",
}
"""The fact command (:data:`~k2provision.core.facts.FACTS`) whose output each check reads."""


def _not_collected(host: str, check: str, what: str, expected: str, fix: str = "") -> Problem:
    command = FACTS[_COLLECTED_BY[check]].label
    return Problem(
        host=host,
        check=check,
        value="not collected",
        expected=expected,
        message=f"{what} was not collected (`{command}` gave nothing usable), {expected} required",
        fix=fix or f"make `{command}` work on the host and run preflight again",
    )


def _plural(items: Collection[object], word: str) -> str:
    return f"{word}{'' if len(items) == 1 else 's'}"


def _gpu_list(indexes: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indexes)


def _check_gpus(host: str, inv: GpuInventory, exp: Expectations) -> list[Problem]:
    problems: list[Problem] = []
    pattern = re.compile(exp.product_pattern, re.IGNORECASE)
    wrong = [g for g in inv.gpus if not pattern.search(g.product_name)]
    if wrong:
        names = ", ".join(dict.fromkeys(g.product_name for g in wrong))
        problems.append(
            Problem(
                host=host,
                check="gpu_model",
                value=names,
                expected=exp.gpu_model,
                message=(
                    f"GPU model is {names} on {len(wrong)} of {inv.count} GPUs, expected "
                    f"{exp.gpu_model} (product name matching {exp.product_pattern!r})"
                ),
                fix=(
                    f"use {exp.gpu_model} hosts, or set k2_gpu to the model this host has "
                    "(the plan's memory arithmetic depends on it)"
                ),
            )
        )
    if inv.count != exp.gpus_per_node:
        problems.append(
            Problem(
                host=host,
                check="gpu_count",
                value=str(inv.count),
                expected=str(exp.gpus_per_node),
                message=(
                    f"{inv.count} {_plural(inv.gpus, 'GPU')} visible to the driver, "
                    f"{exp.gpus_per_node} expected per node"
                ),
                fix=(
                    "check `nvidia-smi -L` and the kernel log for GPUs that fell off the bus, "
                    "or set k2_gpus_per_node to what the host has"
                ),
            )
        )
    small = [g for g in inv.gpus if g.memory_total_mib < exp.min_gpu_memory_mib]
    if small:
        least = min(g.memory_total_mib for g in small)
        verb = "has" if len(small) == 1 else "have"
        problems.append(
            Problem(
                host=host,
                check="gpu_memory",
                value=f"{least} MiB",
                expected=f"{exp.min_gpu_memory_mib} MiB",
                message=(
                    f"GPU {_gpu_list([g.index for g in small])} {verb} {least} MiB, less than "
                    f"the {exp.min_gpu_memory_mib} MiB the plan assumes"
                ),
                fix=(
                    f"use GPUs with at least {exp.min_gpu_memory_mib} MiB (k2_gpu names the model)"
                    ", or a layout with more GPUs per model replica"
                ),
            )
        )
    try:
        old = not version_at_least(inv.driver_version, exp.min_driver)
    except ValueError:
        problems.append(
            Problem(
                host=host,
                check="driver",
                value=inv.driver_version,
                expected=exp.min_driver,
                message=f"driver version {inv.driver_version} cannot be compared with "
                f"{exp.min_driver} required by {exp.driver_required_by}",
                fix="check `nvidia-smi --query-gpu=driver_version --format=csv,noheader`",
            )
        )
    else:
        if old:
            problems.append(
                Problem(
                    host=host,
                    check="driver",
                    value=inv.driver_version,
                    expected=exp.min_driver,
                    message=(
                        f"driver {inv.driver_version} is older than {exp.min_driver} required by "
                        f"{exp.driver_required_by}"
                    ),
                    fix=(
                        "upgrade the driver (role nvidia_driver, k2_nvidia_driver_branch) or pin "
                        "an older image (k2_image)"
                    ),
                )
            )
    if exp.require_persistence_mode:
        off = [g.index for g in inv.gpus if g.persistence_mode is not True]
        if off:
            problems.append(
                Problem(
                    host=host,
                    check="persistence_mode",
                    value="off",
                    expected="Enabled",
                    message=f"persistence mode is off on GPU {_gpu_list(off)}, expected Enabled",
                    fix="run nvidia-persistenced (role nvidia_driver enables it)",
                )
            )
    stuck = [
        g
        for g in inv.gpus
        if g.fabric_state not in (None, "Completed") or g.fabric_status not in (None, "Success")
    ]
    if stuck:
        states = ", ".join(
            dict.fromkeys(f"{g.fabric_state or 'N/A'}/{g.fabric_status or 'N/A'}" for g in stuck)
        )
        problems.append(
            Problem(
                host=host,
                check="fabric_state",
                value=states,
                expected="Completed/Success",
                message=(
                    f"NVLink fabric state of GPU {_gpu_list([g.index for g in stuck])} is "
                    f"{states}, expected Completed/Success (CUDA fails with error 802 until then)"
                ),
                fix=(
                    f"restart nvidia-fabricmanager at exactly driver version {inv.driver_version} "
                    "(role nvidia_driver installs and holds both) and check its journal"
                ),
            )
        )
    return problems


def _check_fabric_manager(f: HostFacts, exp: Expectations) -> list[Problem]:
    if not exp.needs_fabric_manager:
        return []
    driver = f.gpus.driver_version if f.gpus is not None else "the driver's version"
    fix = (
        f"install nvidia-fabricmanager at exactly {driver} and `systemctl enable --now "
        "nvidia-fabricmanager` (role nvidia_driver installs and holds both)"
    )
    if f.fabric_manager is None:
        return [
            _not_collected(
                f.host, "fabric_manager", "nvidia-fabricmanager state", "active", fix=fix
            )
        ]
    if f.fabric_manager == "active":
        return []
    return [
        Problem(
            host=f.host,
            check="fabric_manager",
            value=f.fabric_manager,
            expected="active",
            message=(
                f"nvidia-fabricmanager is {f.fabric_manager}, expected active on an NVSwitch "
                f"system ({exp.gpus_per_node} GPUs per node)"
            ),
            fix=fix,
        )
    ]


def _rate_ok(port: IbPort, exp: Expectations) -> bool:
    """Ports whose rate is unknown (plain ``ibv_devinfo``) are not held against the host."""
    return exp.ib_rate_gbps is None or port.rate_gbps is None or port.rate_gbps >= exp.ib_rate_gbps


def _port_state(port: IbPort) -> str:
    phys = f" ({port.physical_state})" if port.physical_state else ""
    return f"{port.state}{phys}"


def _gbps(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g} Gb/s"


def _check_ib(f: HostFacts, exp: Expectations) -> list[Problem]:
    if not exp.ib_devices and exp.min_active_ib_ports == 0:
        return []
    if f.ib_ports is None:
        wanted = ", ".join(exp.ib_devices) or f"{exp.min_active_ib_ports} Active ports"
        return [_not_collected(f.host, "ib_ports", "RDMA port state", wanted)]
    problems: list[Problem] = []
    rate = f" at {_gbps(exp.ib_rate_gbps)}" if exp.ib_rate_gbps is not None else ""
    if exp.ib_devices:
        present = ", ".join(sorted({p.ca for p in f.ib_ports})) or "none"
        for device in exp.ib_devices:
            ports = [p for p in f.ib_ports if p.ca == device]
            if not ports:
                problems.append(
                    Problem(
                        host=f.host,
                        check="ib_port",
                        value="absent",
                        expected=f"Active{rate}",
                        message=(
                            f"RDMA device {device} is absent (present: {present}), "
                            f"expected Active{rate}"
                        ),
                        fix=(
                            "check the HCA and its driver (`ibstat`, `rdma link`), or set "
                            "k2_ib_devices to devices this host has"
                        ),
                    )
                )
                continue
            active = [p for p in ports if p.active]
            if not active:
                states = ", ".join(f"{p.name} {_port_state(p)}" for p in ports)
                problems.append(
                    Problem(
                        host=f.host,
                        check="ib_port",
                        value=states,
                        expected=f"Active{rate}",
                        message=f"RDMA port {states}, expected Active{rate}",
                        fix=(
                            f"check the cable and the switch port of {device} (`ibstat {device}`: "
                            "Polling sees no peer, Disabled is switched off), or drop it from "
                            "k2_ib_devices"
                        ),
                    )
                )
            elif not any(_rate_ok(p, exp) for p in active):
                best = max(active, key=lambda p: p.rate_gbps or 0.0)
                problems.append(
                    Problem(
                        host=f.host,
                        check="ib_rate",
                        value=_gbps(best.rate_gbps),
                        expected=_gbps(exp.ib_rate_gbps),
                        message=(
                            f"RDMA port {best.name} is Active at {_gbps(best.rate_gbps)}, "
                            f"expected {_gbps(exp.ib_rate_gbps)}"
                        ),
                        fix=(
                            f"check the cable, transceiver and switch port speed of {device} "
                            f"(`ibstat {device}`), or drop it from k2_ib_devices"
                        ),
                    )
                )
        return problems
    good = [p for p in f.ib_ports if p.active and _rate_ok(p, exp)]
    if len(good) < exp.min_active_ib_ports:
        bad = [p for p in f.ib_ports if p not in good]
        shown = ", ".join(
            f"{p.name} {_port_state(p) if not p.active else _gbps(p.rate_gbps)}" for p in bad
        )
        problems.append(
            Problem(
                host=f.host,
                check="ib_ports",
                value=f"{len(good)} Active{rate}",
                expected=f"{exp.min_active_ib_ports} Active{rate}",
                message=(
                    f"RDMA ports: {len(good)} Active{rate}, expected "
                    f"{exp.min_active_ib_ports} Active{rate} (others: {shown or 'none'})"
                ),
                fix=(
                    "check cables and switch ports of the listed devices (`ibstat`), or lower "
                    "the expected port count for this fabric"
                ),
            )
        )
    return problems


def _check_disk(f: HostFacts, exp: Expectations) -> list[Problem]:
    if exp.disk_bytes_needed == 0:
        return []
    need = f"{exp.disk_bytes_needed / GIB:.1f} GiB free at {exp.model_dir}"
    if f.model_dir_free_bytes is None:
        return [_not_collected(f.host, "disk", f"free space at {exp.model_dir}", need)]
    if f.model_dir_free_bytes >= exp.disk_bytes_needed:
        return []
    free_gib, need_gib = f.model_dir_free_bytes / GIB, exp.disk_bytes_needed / GIB
    return [
        Problem(
            host=f.host,
            check="disk",
            value=f"{free_gib:.1f} GiB",
            expected=f"{need_gib:.1f} GiB",
            message=(
                f"{free_gib:.1f} GiB free at {exp.model_dir}, {need_gib:.1f} GiB needed for the "
                "weights"
            ),
            fix="free space there, or set k2_model_dir to a filesystem with room",
        )
    ]


def _check_ports(f: HostFacts, exp: Expectations) -> list[Problem]:
    if not exp.ports_free:
        return []
    if f.listening is None:
        wanted = ", ".join(str(p) for p in exp.ports_free.values())
        return [_not_collected(f.host, "port", "listening ports", f"ports {wanted} free")]
    problems: list[Problem] = []
    for setting, port in exp.ports_free.items():
        holders = [s for s in f.listening if s.port == port]
        if holders:
            where = ", ".join(f"{s.address}:{s.port}" for s in holders)
            problems.append(
                Problem(
                    host=f.host,
                    check="port",
                    value=where,
                    expected=f"port {port} free",
                    message=(
                        f"port {port} ({setting}) is taken by a listener on {where}, expected "
                        f"port {port} free"
                    ),
                    fix=(
                        f"stop what listens there (`ss -ltnp 'sport = :{port}'`) or set "
                        f"{setting} to a free port"
                    ),
                )
            )
    return problems


def _check_clock(f: HostFacts, exp: Expectations) -> list[Problem]:
    if not exp.require_clock_sync:
        return []
    if f.clock is None:
        return [_not_collected(f.host, "clock", "clock synchronization", "synchronized")]
    if f.clock.synchronized:
        return []
    return [
        Problem(
            host=f.host,
            check="clock",
            value=f.clock.detail,
            expected="synchronized",
            message=f"clock is not synchronized ({f.clock.source}: {f.clock.detail})",
            fix=(
                "enable NTP (chrony or systemd-timesyncd) with a reachable server; multi-host "
                "runs need agreeing clocks for timeouts and logs"
            ),
        )
    ]


def _check_os(f: HostFacts, exp: Expectations) -> list[Problem]:
    if not exp.os_ids:
        return []
    accepted = ", ".join(exp.os_ids)
    if f.os is None:
        return [_not_collected(f.host, "os", "the OS", f"one of {accepted}")]
    if f.os.id in exp.os_ids or any(like in exp.os_ids for like in f.os.id_like):
        return []
    return [
        Problem(
            host=f.host,
            check="os",
            value=f.os.pretty_name or f.os.id,
            expected=accepted,
            message=f"OS is {f.os.pretty_name or f.os.id}, expected one of {accepted}",
            fix="use an Ubuntu or Debian host (the roles install packages with apt)",
        )
    ]


def check_gpu_health(f: HostFacts, exp: Expectations) -> list[Problem]:
    """The GPU health gate: fatal XIDs since the driver last loaded (k2provision/core/gpu_health.py
    cites NVIDIA's catalogue), uncorrectable ECC, pending or failed row remaps, NVLinks down,
    failed DCGM diagnostics, and a DCGM that did not answer on a host whose driver does. Each
    names the instance the host would break and what to do."""
    drain = f"drain {f.host} (it would break the {exp.instance} instance)"
    found: list[Problem] = []

    def problem(check: str, value: str, expected: str, fix: str) -> None:
        found.append(
            Problem(
                host=f.host,
                check=check,
                value=value,
                expected=expected,
                fix=f"{drain}; {fix}",
                message=f"{value}; expected {expected}",
            )
        )

    for event in f.xids or ():
        if event.fatal:
            problem(
                "gpu_xid",
                str(event),
                "no fatal XID since the NVIDIA driver loaded",
                "reboot the host or reload the NVIDIA driver (the gate counts XIDs since the "
                "driver's last load, so a GPU reset alone does not clear this), and replace the "
                "GPU if the XID returns",
            )
    for gpu in f.gpus.gpus if f.gpus is not None else ():
        name = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        if gpu.uncorrectable_ecc:
            problem(
                "gpu_ecc",
                f"{name} has {gpu.uncorrectable_ecc} uncorrectable ECC error(s)",
                "none",
                "reset the GPU to retire the rows; replace it if errors return",
            )
        if gpu.row_remap_failure:
            problem(
                "gpu_row_remap",
                f"{name} failed a row remap",
                "no remap failure",
                "replace the GPU (it has no spare rows left)",
            )
        elif gpu.row_remap_pending:
            problem(
                "gpu_row_remap",
                f"{name} has a row remap pending",
                "no pending remap",
                "reset the GPU (`nvidia-smi -r`) or reboot so the remap takes effect",
            )
    for link in down_links(f.nvlink or ()):
        problem(
            "gpu_nvlink",
            str(link),
            "every NVLink of every GPU up (a rate in GB/s)",
            f"check the fabric manager (`systemctl status nvidia-fabricmanager`), reset GPU "
            f"{link.gpu} (`nvidia-smi -r -i {link.gpu}`) or reboot; if the link stays down, "
            "have the baseboard serviced",
        )
    for result in f.gpu_diag or ():
        if result.failed:
            problem(
                "gpu_diag",
                f"DCGM diag `{result.test}` failed on GPU {result.gpu}: {result.info}".rstrip(": "),
                "every DCGM diagnostic passes",
                "run `dcgmi diag -r 3` on the host and replace the GPU it names",
            )
    if exp.require_dcgm and f.gpu_diag is None and f.gpus is not None:
        found.append(
            _not_collected(
                f.host,
                "dcgm",
                "DCGM's diagnostic",
                "DCGM (dcgmi and its host engine) on every GPU host",
                fix=DCGM_FIX,
            )
        )
    return found


def check_host(facts: HostFacts, expectations: Expectations) -> list[Problem]:
    """Every problem of one host, in a fixed order (GPUs first); empty means ready."""
    problems: list[Problem] = []
    if facts.gpus is None:
        problems.append(
            _not_collected(
                facts.host,
                "gpu_facts",
                "the GPU inventory",
                f"{expectations.gpus_per_node} x {expectations.gpu_model}",
                fix="check that the driver is loaded (`nvidia-smi`) or install it "
                "(role nvidia_driver)",
            )
        )
    else:
        problems += _check_gpus(facts.host, facts.gpus, expectations)
    problems += check_gpu_health(facts, expectations)
    problems += _check_fabric_manager(facts, expectations)
    problems += _check_ib(facts, expectations)
    problems += _check_disk(facts, expectations)
    problems += _check_ports(facts, expectations)
    problems += _check_clock(facts, expectations)
    problems += _check_os(facts, expectations)
    return problems


# ---------------------------------------------------------------- across hosts


def check_same_driver(hosts: Sequence[HostFacts]) -> list[Problem]:
    """Every host must run the same driver. The reference is the version most hosts run (the
    newest among equally common ones); each host that differs is one problem naming it."""
    versions = {h.host: h.gpus.driver_version for h in hosts if h.gpus is not None}
    if len(set(versions.values())) <= 1:
        return []
    counts = Counter(versions.values())

    def rank(version: str) -> tuple[int, tuple[int, ...]]:
        try:
            key = version_tuple(version)
        except ValueError:
            key = ()
        return counts[version], key

    reference = max(counts, key=rank)
    agreeing = sorted(host for host, v in versions.items() if v == reference)
    return [
        Problem(
            host=host,
            check="driver_mismatch",
            value=version,
            expected=reference,
            message=(
                f"driver {version} differs from {reference} on {', '.join(agreeing)}; every host "
                "must run the same driver"
            ),
            fix=(
                f"install driver {reference} here (role nvidia_driver, k2_nvidia_driver_branch), "
                "or move the whole cluster to one branch"
            ),
        )
        for host, version in versions.items()
        if version != reference
    ]


def check_cluster(hosts: Sequence[HostFacts], expectations: Expectations) -> list[Problem]:
    """Per-host problems of every host, then the cross-host ones."""
    problems = [p for facts in hosts for p in check_host(facts, expectations)]
    return problems + check_same_driver(hosts)


# ---------------------------------------------------------------- topology -> plan input


def derive_ib_devices(topology: Topology, usable: Collection[str] | None = None) -> list[str]:
    """RDMA devices for a host, in GPU order: GPU 0's nearest NIC(s) first, then GPU 1's...
    each listed once. This is the per-host ``k2_ib_devices`` (SGLang's
    ``--disaggregation-ib-device``) when the inventory gives none. ``usable`` restricts the
    candidates, e.g. to ports that are Active."""
    devices: list[str] = []
    for _, names in sorted(nearest_nics(topology, usable).items()):
        devices += [name for name in names if name not in devices]
    return devices
