"""What `status` asks each host, and what the answer means. Pure.

One batch of the registry's questions per host (plan/host_questions.py; one SSH round trip):
the host's clock, GPU memory (nvidia-smi, when the host has it), the GPU health gate's checks,
and per planned process its state (its container, or whether an exec'd process is alive), its
health gate now, and the tail of its log. `host_status` judges the records against the plan:
state, uptime, drift (the container's spec-hash label against the plan's), gate, restarts,
the last error-looking log line, and one problem line per thing that is wrong.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from k2provision.core.endpoint_guard import API_KEY, guard_path
from k2provision.core.facts import FACTS, FactParseError, parse_ibstat
from k2provision.core.gpu_health import host_gpu_health
from k2provision.core.records import HealthGate, HostPlan, Plan, Process
from k2provision.engines import REGISTRY
from k2provision.ops.front_status import (
    FrontHostStatus,
    FrontTickets,
    front_host_status,
    front_tickets,
)
from k2provision.ops.rank_liveness import stuck_ranks
from k2provision.plan.containers import spec_hash
from k2provision.plan.host_questions import gate_question, hq, log_question, state_question
from k2provision.plan.monitoring import rank_load_targets

GpuMemory = hq.GpuMemory

LOG_TAIL = 200
_ERROR_LINE = re.compile(
    r"\b(error|exception|traceback|fatal|panic|failed|refused|killed|oom)\b", re.IGNORECASE
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class ProcessTickets:
    """What `status` asks about one planned process."""

    state: hq.Ticket[hq.ContainerState | hq.ExecState]
    gate: hq.Ticket[hq.GateAnswer] | None
    log: hq.Ticket[hq.LogTail]


@dataclass(frozen=True)
class StatusProbe:
    """The questions `status` asks one host, in one batch."""

    batch: hq.Batch
    clock: hq.Ticket[hq.Clock]
    gpus: hq.Ticket[hq.GpuMemories]
    xids: hq.Ticket[hq.ToolOutput]
    smi_xml: hq.Ticket[hq.ToolOutput]
    nvlink: hq.Ticket[hq.ToolOutput]
    ibstat: hq.Ticket[hq.ToolOutput] | None
    processes: Mapping[str, ProcessTickets]
    front: FrontTickets | None = None
    loads: Mapping[str, hq.Ticket[hq.ToolOutput]] = field(default_factory=dict)
    """instance -> its rank-load route's answer, on an instance's first host with DP
    attention (plan/monitoring.py rank_load_targets): whether a rank is stuck."""


def status_probe(plan: Plan, host: HostPlan) -> StatusProbe:
    """Every question `status` asks `host`."""
    batch = hq.Batch()
    clock = batch.add("clock", hq.ClockQuestion())
    gpus = batch.add("gpus", hq.GpuMemoryQuestion())
    # The GPU health gate's checks, now: fatal XIDs since boot, ECC and row remaps, NVLinks.
    xids = batch.add("xids", hq.ToolQuestion(FACTS["kernel_xids"].argv))
    smi_xml = batch.add("smi-xml", hq.ToolQuestion(("nvidia-smi", "-q", "-x")))
    nvlink = batch.add("nvlink", hq.ToolQuestion(FACTS["nvlink"].argv))
    ibstat = (  # the preflight gate's RDMA port state, now
        batch.add("ibstat", hq.ToolQuestion(FACTS["ibstat"].argv)) if host.ib_devices else None
    )
    processes = {}
    for p in host.processes:
        gate = (
            batch.add(
                f"gate {p.name}",
                # Status answers within its probe's time: a gate's command gets a few seconds.
                gate_question(p, p.health, plan.config_dir, command_timeout_s=hq.ANSWER_TIMEOUT_S),
            )
            if p.health is not None
            else None
        )
        processes[p.name] = ProcessTickets(
            state=batch.add(f"state {p.name}", state_question(p)),
            gate=gate,
            log=batch.add(f"log {p.name}", log_question(p, LOG_TAIL)),
        )
    front = front_tickets(plan, host.name, batch)
    key_file = guard_path(plan.config_dir, API_KEY)
    loads = {
        t.instance: batch.add(
            f"loads {t.instance}",
            hq.HttpBodyQuestion(f"http://{t.address}{t.path}?{urlencode(t.params)}", key_file),
        )
        for t in rank_load_targets(plan)
        if t.host == host.name and host.processes
    }
    return StatusProbe(batch, clock, gpus, xids, smi_xml, nvlink, ibstat, processes, front, loads)


def probe_script(plan: Plan, host: HostPlan) -> str:
    """The one script `status` runs on `host`."""
    return status_probe(plan, host).batch.script()


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
    front: FrontHostStatus | None = None
    """A front host's address, daemons and router's workers (None: no front host)."""
    stuck_ranks: tuple[str, ...] = ()
    """An instance's DP ranks here that hold requests and advance no more (rank_liveness)."""
    drained: bool = False
    """Drained (`k2provision drain`): its processes are meant to be stopped, and what the
    host shows (unreachable during its work, a GPU the gate refuses) is no problem."""

    @property
    def problems(self) -> list[str]:
        """What is wrong on this host, one item each (none on a drained host)."""
        if self.drained:
            return []
        if self.unreachable:
            return [f"unreachable: {self.unreachable}"]
        return [
            *self.gpu_health,
            *self.ib_ports,
            *self.stuck_ranks,
            *(p for proc in self.processes for p in proc.problems),
            *(self.front.problems if self.front else ()),
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
            "front": self.front.as_json() if self.front else None,
            "gpu_health": list(self.gpu_health),
            "ib_ports": list(self.ib_ports),
            "stuck_ranks": list(self.stuck_ranks),
            "drained": self.drained,
            "problems": self.problems,
        }


def _gate_verdict(gate: HealthGate | None, answer: hq.GateAnswer | None) -> str:
    if gate is None:
        return "-"
    if answer is None:
        return "failing: not probed"
    if gate.url is not None:
        if answer.passes(gate.expect_status):
            return "ok"
        if answer.code is not None:
            return f"failing: HTTP {answer.code} (expected {gate.expect_status})"
        return f"failing: {answer.text}"
    if answer.passes(0):
        return "ok"
    return f"failing: {' '.join(gate.command)} exited {answer.code}"


def _container_status(
    planned: str, state: hq.ContainerState, now: int | None
) -> tuple[str, int | None, str, str, int | None]:
    """(state, uptime, spec, running hash, restarts) of a process that is a container."""
    if not state.found:
        return ("unknown" if state.error else "missing"), None, "-", "", None
    started = parse_time(state.started_at)
    uptime = (
        round(now - started) if state.running and now is not None and started is not None else None
    )
    return (
        "running" if state.running else state.status or "stopped",
        uptime,
        "current" if state.spec_hash == planned else "drift",
        state.spec_hash,
        state.restarts,
    )


def process_status(
    plan: Plan,
    host: HostPlan,
    process: Process,
    answers: hq.Answers,
    asked: ProcessTickets,
    now: int | None,
) -> ProcessStatus:
    """Judge one planned process from its host's answers."""
    planned = spec_hash(plan.container, process, host.files)
    problems: list[str] = []
    where = f"{host.name}: {process.name} ({process.container})"
    record = answers[asked.state]
    if isinstance(record, hq.ExecState):
        running = record.state == "running"
        state = "running" if running else "not running"
        uptime = now - record.started if running and now and record.started is not None else None
        spec, running_hash, restarts = "-", "", None
        if not running:
            problems.append(f"{where}: exec'd process is not running")
    else:
        state, uptime, spec, running_hash, restarts = _container_status(planned, record, now)
        if state == "missing":
            problems.append(f"{where}: container is missing")
        elif record.error:
            problems.append(f"{where}: docker container inspect failed: {record.error}")
        elif state != "running":
            problems.append(f"{where}: container is {state}")
        if spec == "drift":
            problems.append(
                f"{where}: drift: container runs spec {running_hash or '(no label)'}, "
                f"the plan's is {planned}; fix: k2provision apply"
            )
    gate = _gate_verdict(process.health, answers[asked.gate] if asked.gate else None)
    if gate.startswith("failing") and state == "running":
        problems.append(f"{where}: health gate {gate}")
    log = answers[asked.log]
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
        last_error=last_error_line(list(log.lines)) if log.rc == 0 else "",
        problems=tuple(problems),
    )


def host_status(plan: Plan, host: HostPlan, output: str) -> HostStatus:
    """A reached host's answer to `status_probe`, judged against its part of the plan."""
    asked = status_probe(plan, host)
    answers = asked.batch.read(output)
    if not answers.complete:
        return HostStatus(host.name, host.role, unreachable="the probe's answer was cut short")
    now = answers[asked.clock].now
    gpus = answers[asked.gpus]
    return HostStatus(
        host=host.name,
        role=host.role,
        gpus=gpus.gpus if gpus.present else None,
        processes=tuple(
            process_status(plan, host, p, answers, asked.processes[p.name], now)
            for p in host.processes
        ),
        gpu_health=gpu_health_now(host.name, answers, asked),
        ib_ports=ib_ports_now(host, answers[asked.ibstat] if asked.ibstat else None),
        stuck_ranks=stuck_ranks_now(plan, host.name, answers, asked, now),
        front=front_host_status(plan, host.name, answers, asked.front) if asked.front else None,
    )


def stuck_ranks_now(
    plan: Plan, host: str, answers: hq.Answers, asked: StatusProbe, now: int | None
) -> tuple[str, ...]:
    """One line per DP rank of an instance headed here that holds requests and has published
    no load for long (ops/rank_liveness.py), with the fix; nothing where the route did not
    answer (the health gate speaks for the instance then) or the engine publishes no time."""
    metrics = REGISTRY[plan.engine].METRICS
    names = metrics.rank_load if metrics is not None else None
    if names is None or now is None:
        return ()
    lines = []
    for instance, ticket in asked.loads.items():
        answer = answers[ticket]
        if not answer.present or answer.text.startswith("no answer"):
            continue
        for rank in stuck_ranks(answer.text, names, float(now)):
            lines.append(
                f"{rank.text(instance)}; fix: k2provision restart INVENTORY --limit {host}"
            )
    return tuple(lines)


def gpu_health_now(host: str, answers: hq.Answers, asked: StatusProbe) -> tuple[str, ...]:
    """The GPU health gate's verdict from the kernel log and nvidia-smi's answers."""
    smi = answers[asked.smi_xml]
    nvlink = answers[asked.nvlink]
    try:
        verdict = host_gpu_health(
            host,
            kernel_log=answers[asked.xids].text,
            smi_xml=smi.text if smi.present and smi.text else None,
            nvlink_status=nvlink.text if nvlink.present else None,
        )
    except ET.ParseError as exc:
        return (f"nvidia-smi -q -x is unreadable ({exc}): run it on {host}",)
    return verdict.problems


def ib_ports_now(host: HostPlan, ibstat: hq.ToolOutput | None) -> tuple[str, ...]:
    """The preflight gate's RDMA check, now: each planned device of `host` without an Active
    port (nothing where the host names no device or has no ibstat)."""
    if not host.ib_devices or ibstat is None or not ibstat.present:
        return ()
    try:
        ports = parse_ibstat(ibstat.text)
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
    drained: bool = False
    """Drained on purpose (`k2provision drain`): down, and no problem."""

    @property
    def up(self) -> bool:
        """Serving: every host of it fine and the router sending it requests."""
        return not self.drained and not self.host_problems and self.router == "healthy"

    @property
    def problem(self) -> str:
        """Why the instance is down, in one line ("" when it is up or drained)."""
        if self.up or self.drained:
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
                    drained=instance.instance in plan.fleet.drained,
                )
            )
    return tuple(found)
