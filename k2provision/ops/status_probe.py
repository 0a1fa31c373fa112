"""What `status` asks each host, and what the answer means. Pure.

One shell script per host (`probe_script`) gathers everything in one SSH round trip: the host's
clock, GPU memory (nvidia-smi, when the host has it), and per planned process its container
(`docker container inspect`), whether an exec'd process is alive, its health gate now, and the
tail of its log. Each part is a section that starts with a marker line; `parse_sections` splits
the answer and `host_status` judges it against the plan: state, uptime, drift (the container's
spec-hash label against the plan's), gate, restarts, the last error-looking log line, and one
problem line per thing that is wrong.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from k2provision.core.facts import FACTS, FactParseError, parse_ibstat
from k2provision.core.gpu_health import host_gpu_health
from k2provision.core.records import HealthGate, HostPlan, Plan, Process
from k2provision.ops.host_probe import (
    MARK,
    Section,
    exec_liveness,
    log_command,
    log_section,
    parse_liveness,
    parse_sections,
    url_probe,
)
from k2provision.plan.containers import LABEL_HASH, spec_hash

LOG_TAIL = 200
GATE_TIMEOUT_S = 5
_ERROR_LINE = re.compile(
    r"\b(error|exception|traceback|fatal|panic|failed|refused|killed|oom)\b", re.IGNORECASE
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _q(word: str) -> str:
    return shlex.quote(word)


def _gate_command(process: Process, gate: HealthGate) -> str:
    if gate.url is not None:
        return f"{url_probe(gate.url, timeout_s=GATE_TIMEOUT_S)} 2>&1; echo '{MARK} rc 0'"
    argv = " ".join(_q(a) for a in gate.command)
    return (
        f"timeout {GATE_TIMEOUT_S} docker exec {_q(process.container)} {argv} >/dev/null 2>&1; "
        f'echo "{MARK} rc $?"'
    )


def probe_script(host: HostPlan) -> str:
    """The one script `status` runs on `host`: every section it needs, each after a marker."""
    lines = [
        # Where the container runtime's errors go, for the inspect sections' error part.
        "k2_err=$(mktemp) && trap 'rm -f \"$k2_err\"' EXIT || k2_err=/dev/null",
        f'echo "{MARK} now $(date +%s)"',
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"echo '{MARK} gpus'; nvidia-smi --query-gpu=index,memory.used,memory.total "
        "--format=csv,noheader,nounits 2>&1; "
        f"else echo '{MARK} no-gpus'; fi",
        # The GPU health gate's checks, now: fatal XIDs since boot, ECC and row remaps.
        f"echo '{MARK} xids'; {shlex.join(FACTS['kernel_xids'].argv)} 2>/dev/null",
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"echo '{MARK} smi-xml'; nvidia-smi -q -x 2>/dev/null; "
        f"echo '{MARK} nvlink'; {shlex.join(FACTS['nvlink'].argv)} 2>/dev/null; fi",
    ]
    if host.ib_devices:  # the preflight gate's RDMA port state, now
        lines.append(
            f"if command -v ibstat >/dev/null 2>&1; then echo '{MARK} ibstat'; "
            f"{shlex.join(FACTS['ibstat'].argv)} 2>/dev/null; fi"
        )
    for p in host.processes:
        name = _q(p.name)
        if p.exec_in:
            lines.append(f"echo '{MARK} alive {name}'; {exec_liveness(p)}; echo \"{MARK} rc 0\"")
        else:
            # The JSON goes to the section, the runtime's error to one of its own (podman warns
            # on stderr even when the inspect succeeds): "no such container" is a missing
            # container, any other error a failed look, and status says which.
            inspect = f'docker container inspect {_q(p.container)} 2>"$k2_err"'
            lines.append(
                f"k2_out=$({inspect}); k2_rc=$?; "
                f"echo '{MARK} inspect {name}'; printf '%s\\n' \"$k2_out\"; "
                f'echo "{MARK} rc $k2_rc"; [ "$k2_rc" = 0 ] || '
                f"{{ echo '{MARK} inspect-error {name}'; cat \"$k2_err\"; }}"
            )
        if p.health is not None:
            lines.append(f"echo '{MARK} gate {name}'; {_gate_command(p, p.health)}")
        lines.append(log_section(p.name, log_command(p, LOG_TAIL)))
    lines.append(f"echo '{MARK} end'")
    return "\n".join(lines) + "\n"


def parse_time(text: str) -> float | None:
    """Docker's or podman's StartedAt -> seconds since the epoch (None if unreadable)."""
    text = text.strip()
    if not text or text.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?", text)
    if not m:
        return None
    fraction = (m.group(2) or ".0")[:7]
    zone = m.group(3) or "Z"
    zone = "+00:00" if zone == "Z" else zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"
    try:
        return datetime.fromisoformat(f"{m.group(1)}{fraction}{zone}").timestamp()
    except ValueError:
        return None


def plain_line(line: str) -> str:
    """A log line without terminal colour codes or other control characters."""
    return _CONTROL.sub("", _ANSI.sub("", line))


def last_error_line(lines: list[str]) -> str:
    """The last line of a log that looks like an error, without colour codes ("" when none
    does)."""
    for line in reversed(lines):
        text = plain_line(line).strip()
        if _ERROR_LINE.search(text):
            return text[:300]
    return ""


def human_duration(seconds: int | None) -> str:
    """72 -> '1m12s', 90061 -> '1d1h'; '-' for None."""
    if seconds is None:
        return "-"
    seconds = max(0, seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory, as nvidia-smi reports it (MiB)."""

    index: int
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class ProcessStatus:
    """One planned process on one host, now."""

    host: str
    process: str
    container: str
    exec_in: bool
    state: str
    """running, exited/created/... (the container's state), missing, or not running."""
    uptime_s: int | None
    spec: str
    """current (label matches the plan), drift, or '-' (no container to compare)."""
    planned_hash: str
    running_hash: str
    gate: str
    """'-' (no gate), 'ok', or 'failing: <what it got>'."""
    restarts: int | None
    last_error: str
    problems: tuple[str, ...]


@dataclass(frozen=True)
class HostStatus:
    """One host, now: reachable or why not, its GPUs' memory, its processes."""

    host: str
    role: str
    unreachable: str = ""
    gpus: tuple[GpuMemory, ...] | None = None
    """None where the host has no nvidia-smi."""
    processes: tuple[ProcessStatus, ...] = ()
    gpu_health: tuple[str, ...] = ()
    """What the GPU health gate would refuse the host for, now."""
    ib_ports: tuple[str, ...] = ()
    """The host's planned RDMA devices without an Active port, now."""

    @property
    def problems(self) -> list[str]:
        """What is wrong on this host, one item each."""
        if self.unreachable:
            return [f"unreachable: {self.unreachable}"]
        return [
            *self.gpu_health,
            *self.ib_ports,
            *(p for proc in self.processes for p in proc.problems),
        ]

    def as_json(self) -> dict[str, Any]:
        """The host's entry in `status --format json`."""
        return {
            "host": self.host,
            "role": self.role,
            "reachable": not self.unreachable,
            "unreachable": self.unreachable,
            "gpus": None if self.gpus is None else [asdict(g) for g in self.gpus],
            "processes": [asdict(p) for p in self.processes],
            "gpu_health": list(self.gpu_health),
            "ib_ports": list(self.ib_ports),
            "problems": self.problems,
        }


def parse_gpus(section: Section | None) -> tuple[GpuMemory, ...] | None:
    """nvidia-smi's `index, memory.used, memory.total` CSV -> GPUs (None: no nvidia-smi)."""
    if section is None:
        return None
    gpus = []
    for line in section.text:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            gpus.append(GpuMemory(int(parts[0]), int(parts[1]), int(parts[2])))
    return tuple(gpus)


def _gate_verdict(gate: HealthGate | None, section: Section | None) -> str:
    if gate is None:
        return "-"
    if section is None:
        return "failing: not probed"
    if gate.url is not None:
        got = " ".join(section.text).strip()
        if got == str(gate.expect_status):
            return "ok"
        if got.isdigit():
            return f"failing: HTTP {got} (expected {gate.expect_status})"
        reason = got.removeprefix("no answer").strip()
        return f"failing: no answer ({reason})" if reason else "failing: no answer"
    if section.rc == 0:
        return "ok"
    return f"failing: {' '.join(gate.command)} exited {section.rc}"


def _container_status(
    plan: Plan,
    host: HostPlan,
    process: Process,
    sections: dict[tuple[str, str], Section],
    now: float | None,
    error: str | None,
) -> tuple[str, int | None, str, str, int | None]:
    """(state, uptime, spec, running hash, restarts) of a process that is a container;
    `error`: inspect_error's answer for it."""
    planned = spec_hash(plan.container, process, host.files)
    section = sections.get(("inspect", process.name))
    if section is None:
        return "unknown", None, "-", "", None
    if section.rc != 0:
        return ("missing" if error is None else "unknown"), None, "-", "", None
    try:
        info = json.loads("\n".join(section.text))[0]
    except (ValueError, IndexError, KeyError):
        return "unknown", None, "-", "", None
    state = info.get("State") or {}
    labels = (info.get("Config") or {}).get("Labels") or {}
    running_hash = str(labels.get(LABEL_HASH, ""))
    started = parse_time(str(state.get("StartedAt", "")))
    running = bool(state.get("Running"))
    uptime = round(now - started) if running and now is not None and started is not None else None
    restarts = info.get("RestartCount")
    return (
        "running" if running else str(state.get("Status") or "stopped"),
        uptime,
        "current" if running_hash == planned else "drift",
        running_hash,
        int(restarts) if isinstance(restarts, int) else None,
    )


def inspect_error(sections: dict[tuple[str, str], Section], process: Process) -> str | None:
    """The runtime's error when the look at `process`'s container failed for another reason
    than its absence; None when it did not fail or the container is not there."""
    section = sections.get(("inspect-error", process.name))
    if section is None:
        return None
    text = " ".join(line.strip() for line in section.text if line.strip())
    if not text or "no such container" in text.lower() or "no such object" in text.lower():
        return None
    return text if len(text) <= 200 else text[:199] + "…"


def process_status(
    plan: Plan, host: HostPlan, process: Process, sections: dict[tuple[str, str], Section]
) -> ProcessStatus:
    """Judge one planned process from its host's probe sections."""
    now_section = sections.get(("now", ""))
    now = float(now_section.text[0]) if now_section and now_section.text[0].isdigit() else None
    planned = spec_hash(plan.container, process, host.files)
    problems: list[str] = []
    where = f"{host.name}: {process.name} ({process.container})"
    if process.exec_in:
        alive = sections.get(("alive", process.name))
        liveness, started = parse_liveness(" ".join(alive.text) if alive else "")
        running = liveness == "running"
        state = "running" if running else "not running"
        uptime = int(now - started) if running and now and started is not None else None
        spec, running_hash, restarts = "-", "", None
        if not running:
            problems.append(f"{where}: exec'd process is not running")
    else:
        error = inspect_error(sections, process)
        state, uptime, spec, running_hash, restarts = _container_status(
            plan, host, process, sections, now, error
        )
        if state == "missing":
            problems.append(f"{where}: container is missing")
        elif error is not None:
            problems.append(f"{where}: docker container inspect failed: {error}")
        elif state != "running":
            problems.append(f"{where}: container is {state}")
        if spec == "drift":
            problems.append(
                f"{where}: drift: container runs spec {running_hash or '(no label)'}, "
                f"the plan's is {planned}; fix: k2provision apply"
            )
    gate = _gate_verdict(process.health, sections.get(("gate", process.name)))
    if gate.startswith("failing") and state == "running":
        problems.append(f"{where}: health gate {gate}")
    log = sections.get(("log", process.name))
    return ProcessStatus(
        host=host.name,
        process=process.name,
        container=process.container,
        exec_in=process.exec_in,
        state=state,
        uptime_s=uptime,
        spec=spec,
        planned_hash=planned,
        running_hash=running_hash,
        gate=gate,
        restarts=restarts,
        last_error=last_error_line(log.text) if log and log.rc == 0 else "",
        problems=tuple(problems),
    )


def host_status(plan: Plan, host: HostPlan, output: str) -> HostStatus:
    """A reached host's probe answer, judged against its part of the plan."""
    sections = parse_sections(output)
    if ("end", "") not in sections:
        return HostStatus(host.name, host.role, unreachable="the probe's answer was cut short")
    return HostStatus(
        host=host.name,
        role=host.role,
        gpus=parse_gpus(sections.get(("gpus", ""))),
        processes=tuple(process_status(plan, host, p, sections) for p in host.processes),
        gpu_health=gpu_health_now(host.name, sections),
        ib_ports=ib_ports_now(host, sections),
    )


def gpu_health_now(host: str, sections: dict[tuple[str, str], Section]) -> tuple[str, ...]:
    """The GPU health gate's verdict from the probe's kernel-log and nvidia-smi sections."""
    xids = sections.get(("xids", ""))
    smi = sections.get(("smi-xml", ""))
    smi_xml = "\n".join(smi.text) if smi is not None and smi.text else None
    nvlink = sections.get(("nvlink", ""))
    try:
        verdict = host_gpu_health(
            host,
            kernel_log="\n".join(xids.text) if xids else "",
            smi_xml=smi_xml,
            nvlink_status="\n".join(nvlink.text) if nvlink is not None else None,
        )
    except ET.ParseError as exc:
        return (f"nvidia-smi -q -x is unreadable ({exc}): run it on {host}",)
    return verdict.problems


def ib_ports_now(host: HostPlan, sections: dict[tuple[str, str], Section]) -> tuple[str, ...]:
    """The preflight gate's RDMA check, now: each planned device of `host` without an Active
    port (nothing where the host names no device or has no ibstat)."""
    section = sections.get(("ibstat", ""))
    if not host.ib_devices or section is None:
        return ()
    try:
        ports = parse_ibstat("\n".join(section.text))
    except FactParseError as exc:
        return (f"ibstat is unreadable ({exc}): run it on {host.name}",)
    found = []
    for device in host.ib_devices:
        mine = [p for p in ports if p.ca == device]
        if not any(p.active for p in mine):
            states = ", ".join(f"port {p.port} {p.state}" for p in mine) or "absent"
            found.append(
                f"RDMA device {device}: {states}, expected an Active port; check its cable and "
                f"switch port (`ibstat {device}`)"
            )
    return tuple(found)


# ---------------------------------------------------------------- the endpoint


@dataclass(frozen=True)
class RouterWorker:
    """One worker the PD router lists (sglang-router 0.3.2 `GET /workers`)."""

    url: str
    kind: str
    healthy: bool
    load: int | None = None
    """Requests the router has in flight on the worker (its `load`), when it says."""


@dataclass(frozen=True)
class EndpointStatus:
    """The plan's endpoint now: /v1/models, and for PD the router's readiness and workers."""

    url: str
    models: tuple[str, ...] = ()
    error: str = ""
    router_ready: bool | None = None
    """None: not a PD plan (no router to ask)."""
    router_detail: str = ""
    workers: tuple[RouterWorker, ...] = ()

    @property
    def answers(self) -> bool:
        """True when /v1/models answered with the served model(s)."""
        return not self.error and bool(self.models)

    @property
    def problems(self) -> list[str]:
        """What is wrong with the endpoint, one item each."""
        found = [] if self.answers else [f"endpoint {self.url}: {self.error or 'no models'}"]
        if self.router_ready is False:
            found.append(f"router {self.url}/readiness: {self.router_detail}")
        return found

    def as_json(self) -> dict[str, Any]:
        """The endpoint's entry in `status --format json`."""
        return {
            "url": self.url,
            "answers": self.answers,
            "models": list(self.models),
            "error": self.error,
            "router": None
            if self.router_ready is None
            else {
                "ready": self.router_ready,
                "detail": self.router_detail,
                "workers": [asdict(w) for w in self.workers],
            },
        }


def model_ids(body: Any) -> tuple[str, ...]:
    """The model ids of an OpenAI `/v1/models` answer (() when it is not one)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return ()
    return tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)


def router_workers(body: Any) -> tuple[RouterWorker, ...]:
    """sglang-router's `GET /workers` answer -> its workers."""
    workers = body.get("workers") if isinstance(body, dict) else None
    if not isinstance(workers, list):
        return ()
    return tuple(
        RouterWorker(
            url=str(w.get("url", "")),
            kind=str(w.get("worker_type", "")),
            healthy=bool(w.get("is_healthy")),
            load=w["load"] if isinstance(w.get("load"), int) else None,
        )
        for w in workers
        if isinstance(w, dict)
    )


def readiness_detail(status: int | None, body: Any) -> str:
    """sglang-router's `/readiness` answer in words: `ready (2/2 workers healthy)`."""
    if status is None:
        return "no answer"
    if isinstance(body, dict) and "healthy_workers" in body:
        word = str(body.get("status", "ready" if status == 200 else "not ready"))
        total = body.get("total_workers", "?")
        return f"{word} ({body['healthy_workers']}/{total} workers healthy)"
    return f"HTTP {status}"


# ---------------------------------------------------------------- a fleet's instances


@dataclass(frozen=True)
class InstanceStatus:
    """One instance of a fleet, now: its hosts' verdict and the router's view of its worker."""

    instance: str
    hosts: tuple[str, ...]
    url: str
    router: str
    """healthy, unhealthy, or not in the router."""
    host_problems: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        """Serving: every host of it fine and the router sending it requests."""
        return not self.host_problems and self.router == "healthy"

    @property
    def problem(self) -> str:
        """Why the instance is down, in one line ("" when it is up)."""
        if self.up:
            return ""
        why = [f"router: {self.router}"] if self.router != "healthy" else []
        why += [f"host {h} has a problem" for h in self.host_problems]
        return f"instance {self.instance} ({', '.join(self.hosts)}, {self.url}) down: " + "; ".join(
            why
        )


def fleet_status(
    plan: Plan, hosts: Sequence[HostStatus], workers: Sequence[RouterWorker]
) -> tuple[InstanceStatus, ...]:
    """Each instance of a fleet (none for a single instance): up when its hosts have no
    problem and the router lists its URL healthy."""
    troubled = {h.host for h in hosts if h.problems}
    by_url = {w.url.rstrip("/"): w for w in workers}
    found = []
    for pool in plan.pools:
        for instance in pool.instances:
            worker = by_url.get(instance.url.rstrip("/"))
            router = (
                "not in the router"
                if worker is None
                else "healthy"
                if worker.healthy
                else "unhealthy"
            )
            found.append(
                InstanceStatus(
                    instance=instance.instance,
                    hosts=instance.hosts,
                    url=instance.url,
                    router=router,
                    host_problems=tuple(h for h in instance.hosts if h in troubled),
                )
            )
    return tuple(found)
