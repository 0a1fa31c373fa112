"""What the plan needs from one host, and the verdict on what the host has. Pure.

The preflight role collects command output on each host (``nvidia-smi -q -x``, ``ibstat``,
``df``, ``ss``...) and hands the texts here through the ``k2.cluster.preflight_*`` filters:

- :func:`expectations_for` turns the Plan and the catalog into the
  :class:`~k2provision.preflight.Expectations` of one host: GPU model, count and memory, the
  driver the engine image needs, fabric manager on NVSwitch boards, RDMA ports on multi-host
  plans, room for the checkpoint at the model dir, the TCP ports the plan binds there.
- :func:`host_facts` parses the collected texts into :class:`~k2provision.facts.HostFacts`
  (a text that is absent or does not parse is a fact not collected).
- :func:`evaluate_host` and :func:`evaluate_cluster` run the checks of
  :mod:`k2provision.preflight` and sort the problems into those that refuse the host now
  and those the prepare phase will fix (a driver that role ``k2_nvidia_driver`` installs).

Nothing here runs a command or imports ansible.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from k2provision import catalog
from k2provision.catalog import GIB
from k2provision.facts import (
    FactParseError,
    HostFacts,
    parse_clock_sync,
    parse_df_bytes,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_kernel_release,
    parse_listening_ports,
    parse_nvidia_smi_topo,
    parse_nvidia_smi_xml,
    parse_os_release,
    parse_service_state,
)
from k2provision.models import Plan
from k2provision.preflight import (
    Expectations,
    Problem,
    check_host,
    check_same_driver,
    derive_ib_devices,
    version_tuple,
)

__all__ = [
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
DRIVER_CHECKS = frozenset(
    {"driver", "driver_mismatch", "persistence_mode", "fabric_state", "fabric_manager"}
)
"""What role k2_nvidia_driver installs and configures (driver, fabric manager, persistence)."""
IB_CHECKS = frozenset({"ib_port", "ib_rate", "ib_ports"})
HARDWARE_CHECKS = GPU_CHECKS | DRIVER_CHECKS | IB_CHECKS
"""Checks that need GPUs and HCAs; the lab profile (``k2_lab``) has neither and skips them."""

FACT_TEXTS = (
    "nvidia_smi_xml",
    "nvidia_smi_topo",
    "ibstat",
    "ibv_devinfo",
    "df_avail",
    "du_model_dir",
    "ss",
    "clock",
    "os_release",
    "uname",
    "fabric_manager",
    "containers",
)
"""Keys of the texts the preflight role collects (each the stdout of one command, or None)."""

_HW_TEXTS = frozenset(
    {"nvidia_smi_xml", "nvidia_smi_topo", "ibstat", "ibv_devinfo", "fabric_manager"}
)

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
    ib_devices: tuple[str, ...] = ()
    """RDMA devices the plan uses on this host (``k2_ib_devices``); each must be Active."""
    ib_rate_gbps: float | None = DEFAULT_IB_RATE_GBPS
    min_active_ib_ports: int | None = Field(default=None, ge=0)
    """Active ports at ``ib_rate_gbps`` a host needs when ``ib_devices`` is empty; None: one
    per GPU on plans that span hosts, none on a single-host plan."""
    disk_gib: float | None = Field(default=None, ge=0)
    """Room the weights need at the model dir; None: the catalog's checkpoint size."""
    require_clock_sync: bool | None = None
    """Refuse a host whose clock sync state cannot be read; None: on hardware hosts, not in the
    lab (an unsynchronized clock that was read is refused either way)."""
    require_persistence_mode: bool = True
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

_BIND_FLAGS: dict[str, str] = {
    "--disaggregation-bootstrap-port": "k2_bootstrap_port",
    "--data-parallel-rpc-port": "k2_dp_rpc_port",
}


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


def _add_port(ports: dict[str, int], setting: str, port: int, process: str) -> None:
    if ports.get(setting, port) != port:
        setting = f"{setting} ({process})"
    ports[setting] = port


def planned_ports(
    plan: Plan, host: str, running_containers: Collection[str] = ()
) -> dict[str, int]:
    """TCP ports the plan's processes bind on ``host``, keyed by the variable that sets each.

    A port counts when a process that serves on this host binds it: the port of its HTTP
    health gate, the PD bootstrap and DP RPC ports, the torch rendezvous of
    ``--dist-init-addr``, a Ray head's port, and the ``Port`` of the mesh sshd. Processes of a
    container that already runs (a converged host) are left out: their ports are theirs.
    """
    host_plan = plan.host(host)
    ports: dict[str, int] = {}
    for proc in host_plan.processes:
        if proc.container in running_containers or proc.health is None:
            continue
        argv = list(proc.argv)
        if proc.health.url is not None:
            port = urlsplit(proc.health.url).port
            if port is not None:
                # SGLang's own servers listen on k2_sglang_port; KTransformers (an SGLang
                # server too) and every other front end on the public k2_api_port.
                server = plan.engine == "sglang" and any(
                    a.endswith("sglang.launch_server") for a in argv
                )
                _add_port(ports, "k2_sglang_port" if server else "k2_api_port", port, proc.name)
        for flag, setting in _BIND_FLAGS.items():
            value = _flag_value(argv, flag)
            if value is not None and value.isdigit():
                _add_port(ports, setting, int(value), proc.name)
        rendezvous = _flag_value(argv, "--dist-init-addr")
        if rendezvous is not None and rendezvous.rpartition(":")[2].isdigit():
            _add_port(ports, "k2_dist_port", int(rendezvous.rpartition(":")[2]), proc.name)
        if argv[:2] == ["ray", "start"] and "--head" in argv:
            value = _flag_value(argv, "--port")
            if value is not None and value.isdigit():
                _add_port(ports, "k2_ray_port", int(value), proc.name)
    sshd_config = host_plan.files.get(f"{plan.config_dir}/ssh/sshd_config")
    owners = {p.container for p in host_plan.processes}
    if sshd_config is not None and not owners & set(running_containers):
        match = re.search(r"^Port\s+(\d+)\s*$", sshd_config, re.MULTILINE)
        if match is not None:
            _add_port(ports, "k2_ssh_port", int(match.group(1)), "sshd")
    return ports


def _gpu_hosts(plan: Plan) -> list[str]:
    return [h.name for h in plan.hosts if h.gpus > 0]


def _min_driver(plan: Plan) -> tuple[str, str]:
    """The newer of the GPU's and the engine release's minimum driver, and who needs it."""
    gpu = catalog.gpu(plan.gpu)
    release = catalog.RELEASES[plan.engine]
    if version_tuple(release.min_driver) >= version_tuple(gpu.min_driver):
        return release.min_driver, f"the {plan.engine} {release.version} image"
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
        weights = int(catalog.model(plan.model).checkpoint_gib * GIB)
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
        ib_devices=options.ib_devices,
        model_dir=plan.model_dir,
        disk_bytes_needed=max(0, weights - max(0, model_dir_used_bytes)),
        ports_free=planned_ports(plan, host, running_containers),
        require_clock_sync=options.require_clock_sync is not False,
        require_persistence_mode=options.require_persistence_mode,
        os_ids=options.os_ids,
    )


# ---------------------------------------------------------------- texts -> facts


_EMPTY_IS_AN_ANSWER = frozenset({"ss", "containers", "du_model_dir"})
"""Commands whose empty output means something (no listener, no container)."""


def _text(texts: Mapping[str, Any], key: str) -> str | None:
    """The collected text, or None when the command did not run or gave nothing usable."""
    value = texts.get(key)
    if value is None:
        return None
    text = str(value)
    return text if text.strip() or key in _EMPTY_IS_AN_ANSWER else None


def _du_bytes(text: str | None) -> int:
    """``du -s -B1 DIR``: the first field of the last line (0 when absent or unreadable)."""
    if text is None:
        return 0
    fields = text.strip().splitlines()[-1].split() if text.strip() else []
    return int(fields[0]) if fields and fields[0].isdigit() else 0


def _containers(texts: Mapping[str, Any]) -> tuple[str, ...]:
    text = _text(texts, "containers")
    return tuple(line.strip() for line in text.splitlines() if line.strip()) if text else ()


def host_facts(host: str, texts: Mapping[str, Any]) -> tuple[HostFacts, list[Problem]]:
    """Parse what the role collected. A text that is absent leaves its fact None; one that
    does not parse does too, and adds a problem naming the command and the parser's reason.
    """
    unreadable: list[Problem] = []

    def parse(key: str, command: str, parser: Any) -> Any:
        text = _text(texts, key)
        if text is None:
            return None
        try:
            return parser(text)
        except FactParseError as exc:
            unreadable.append(
                Problem(
                    host=host,
                    check=f"unreadable_{key}",
                    value="unparsable output",
                    expected=f"what `{command}` prints",
                    message=f"cannot read the output of `{command}`: {exc}",
                    fix=f"run `{command}` on the host and check its output",
                )
            )
            return None

    def listening(text: str) -> Any:
        return parse_listening_ports(text) if text.strip() else ()

    ports = parse("ibstat", "ibstat", parse_ibstat)
    if ports is None:
        ports = parse("ibv_devinfo", "ibv_devinfo -v", parse_ibv_devinfo)
    facts = HostFacts(
        host=host,
        gpus=parse("nvidia_smi_xml", "nvidia-smi -q -x", parse_nvidia_smi_xml),
        topology=parse("nvidia_smi_topo", "nvidia-smi topo -m", parse_nvidia_smi_topo),
        ib_ports=ports,
        model_dir_free_bytes=parse("df_avail", "df -B1 --output=avail", parse_df_bytes),
        listening=parse("ss", "ss -Hltn", listening),
        clock=parse("clock", "timedatectl show", parse_clock_sync),
        os=parse("os_release", "cat /etc/os-release", parse_os_release),
        kernel=parse("uname", "uname -r", parse_kernel_release),
        fabric_manager=parse(
            "fabric_manager", "systemctl is-active nvidia-fabricmanager", parse_service_state
        ),
    )
    return facts, unreadable


def ib_devices_from_texts(topology_text: str, ibstat_text: str | None = None) -> list[str]:
    """``k2_ib_devices`` for a host that does not name them: each GPU's nearest NIC from
    ``nvidia-smi topo -m``, restricted to devices with an Active port when ``ibstat`` output is
    given."""
    topology = parse_nvidia_smi_topo(topology_text)
    usable = None
    if ibstat_text is not None and ibstat_text.strip():
        usable = {p.ca for p in parse_ibstat(ibstat_text) if p.active}
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
        model_dir_used_bytes=_du_bytes(_text(texts, "du_model_dir")),
        running_containers=_containers(texts),
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
