"""Waiting on a launch stage's health gates while watching its processes. Pure.

k2.cluster.launch_gate (an action plugin) asks a host once per poll, in one batch of the
registry's questions (plan/host_questions.py): the state of each of the host's processes in
the stage (a container's status and exit code, or whether an exec'd process's pid is alive)
and, for each of its health gates, the HTTP status of the URL or the exit status of the
command. This module builds that batch, reads its records, and words the
failure: a process that exited is reported at once, not after the gate's timeout, and a gate
that times out is named with its URL or command and timeout. Either way the process's last log
lines come with it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from k2provision.core.records import HealthGate, Process
from k2provision.plan.host_questions import gate_question, hq, log_question, state_question

LOG_LINES = 50
# An exec'd process whose pid file is still missing after this long never started.
PID_GRACE_S = 15.0


@dataclass(frozen=True)
class ProcState:
    """What one probe saw of a process: `running`, `starting`, `exited` (with the exit code,
    when known) or `missing`."""

    state: str
    code: str = ""

    @property
    def dead(self) -> bool:
        return self.state in {"exited", "missing", "stopped", "dead"}

    def reason(self) -> str:
        if self.state == "missing":
            return "its container is gone"
        code = f" with code {self.code}" if self.code not in ("", "?") else ""
        return f"exited{code} before passing its health gate"


def gate_text(gate: HealthGate, timeout_s: int) -> str:
    """The gate as a person would check it by hand."""
    what = (
        f"GET {gate.url} answering {gate.expect_status}"
        if gate.url is not None
        else f"`{shlex.join(gate.command)}` in the container exiting 0"
    )
    return f"{what}, timeout {timeout_s} s"


def gate_timeout(gate: HealthGate, cap_s: int) -> int:
    """The gate's own timeout, or `cap_s` when that is set (> 0) and smaller."""
    return min(gate.timeout_s, cap_s) if cap_s > 0 else gate.timeout_s


@dataclass(frozen=True)
class Probe:
    """One poll's questions: each process's state and each of its health gates, by index."""

    batch: hq.Batch
    states: tuple[hq.Ticket[hq.ContainerState | hq.ExecState], ...]
    gates: Mapping[int, hq.Ticket[hq.GateAnswer]] = field(default_factory=dict)

    def script(self) -> str:
        return self.batch.script()


def probe(processes: Sequence[Process], config_dir: str, python: str = "python3") -> Probe:
    """The batch asking, per process, its state and its health gate's answer."""
    batch = hq.Batch()
    states: list[hq.Ticket[hq.ContainerState | hq.ExecState]] = []
    gates: dict[int, hq.Ticket[hq.GateAnswer]] = {}
    for i, p in enumerate(processes):
        states.append(batch.add(f"state {i}", state_question(p)))
        if p.health is not None:
            gates[i] = batch.add(f"gate {i}", gate_question(p, p.health, config_dir, python))
    return Probe(batch, tuple(states), gates)


def proc_state(record: hq.ContainerState | hq.ExecState) -> ProcState:
    """A process's state record as the gate judges it."""
    if isinstance(record, hq.ExecState):
        return ProcState(record.state)
    phase = record.phase
    if phase in {"running", "starting", "missing"} or record.exit_code is None:
        return ProcState(phase)
    return ProcState(phase, str(record.exit_code))


def read_probe(asked: Probe, stdout: str) -> tuple[dict[int, ProcState], dict[int, hq.GateAnswer]]:
    """(process index -> state, gate index -> answer) from a poll's output."""
    answers = asked.batch.read(stdout)
    states = {i: proc_state(answers[t]) for i, t in enumerate(asked.states)}
    return states, {i: answers[t] for i, t in asked.gates.items()}


def hopeless(gate: HealthGate, answer: hq.GateAnswer | None) -> str:
    """Why the gate's answer can never pass by waiting (its server answers with a certificate
    the one certificate policy does not trust), else ""."""
    if answer is None or not answer.untrusted:
        return ""
    return (
        f"its health gate {gate.url} answers with a certificate that is not trusted "
        f"({answer.reason}); fix: k2_tls_ca_file names the CA that signed k2_tls_cert_file, "
        "and the certificate names the address in the URL"
    )


def gate_passed(gate: HealthGate, answer: hq.GateAnswer | None) -> bool:
    if answer is None:
        return False
    return answer.passes(gate.expect_status if gate.url is not None else 0)


def logs_probe(process: Process, lines: int = LOG_LINES) -> tuple[hq.Batch, hq.Ticket[hq.LogTail]]:
    """The process's last `lines` log lines: its container's log, or an exec'd process's file."""
    batch = hq.Batch()
    return batch, batch.add("log", log_question(process, lines))


def failure(
    host: str,
    process: Process,
    reason: str,
    gate: str,
    log_lines: Sequence[str],
) -> dict[str, Any]:
    """The failure of one process, as the launch role reports it: `summary` is the one line
    (host, process, reason), `details` the gate it missed and its last log lines."""
    shown = list(log_lines)[-LOG_LINES:]
    details = [
        f"gate: {gate}",
        f"last {len(shown)} log lines ({log_question(process).source}):",
        *(f"  | {line}" for line in shown),
    ]
    if not shown:
        details[-1] = f"no log lines ({log_question(process).source} is empty or unreadable)"
    return {
        "host": host,
        "process": process.name,
        "container": process.container,
        "reason": reason,
        "gate": gate,
        "log": shown,
        "summary": f"{host}: {process.name}: {reason}",
        "details": "\n".join(details),
    }


def stage_processes(plan: Mapping[str, Any], host: str, stage: int) -> list[Process]:
    """The processes `host` runs in `stage` of a registered plan."""
    for entry in plan.get("hosts", []):
        if entry.get("name") == host:
            procs = [Process.model_validate(p) for p in entry.get("processes", [])]
            return [p for p in procs if p.stage == stage]
    return []


def gate_hosts(plan: Mapping[str, Any], stage: int, among: Sequence[str]) -> list[str]:
    """Hosts of `among` that own a health gate in `stage`."""
    return [
        str(entry["name"])
        for entry in plan.get("hosts", [])
        if entry.get("name") in among
        and any(p.health is not None for p in stage_processes(plan, entry["name"], stage))
    ]


def stage_timeout(plan: Mapping[str, Any], stage: int, among: Sequence[str], cap_s: int) -> int:
    """The longest gate timeout of `stage` over the hosts `among` (0: no gates)."""
    timeouts = [
        gate_timeout(p.health, cap_s)
        for host in among
        for p in stage_processes(plan, host, stage)
        if p.health is not None
    ]
    return max(timeouts, default=0)
