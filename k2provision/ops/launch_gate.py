"""Waiting on a launch stage's health gates while watching its processes. Pure.

k2.cluster.launch_gate (an action plugin) runs one probe per poll on a host: the state of each
of the host's processes in the stage (a container's status and exit code, or whether an exec'd
process's pid is alive) and, for each of its health gates, the HTTP status of the URL or the
exit status of the command. This module builds that probe, reads its answer, and words the
failure: a process that exited is reported at once, not after the gate's timeout, and a gate
that times out is named with its URL or command and timeout. Either way the process's last log
lines come with it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k2provision.core.records import HealthGate, Process
from k2provision.ops.host_probe import exec_liveness, log_command, log_source, url_probe

LOG_LINES = 50
# Container states that mean "not started yet" rather than "gone".
STARTING_STATES = frozenset({"created", "configured", "initialized"})
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


def probe_command(processes: Sequence[Process], python: str = "python3") -> str:
    """One shell command printing `S<i> <state> [<code>]` per process and `G<i> <result>` per
    health gate (an HTTP status, `no answer <reason>`, or a command's exit status)."""
    parts: list[str] = []
    for i, p in enumerate(processes):
        container = shlex.quote(p.container)
        if p.exec_in:
            parts.append(f"echo S{i} $({exec_liveness(p)})")
        else:
            parts.append(
                f"echo S{i} $(docker container inspect -f "
                f"{shlex.quote('{{.State.Status}} {{.State.ExitCode}}')} {container} "
                "2>/dev/null || echo missing)"
            )
        gate = p.health
        if gate is None:
            continue
        if gate.url is not None:
            probe = url_probe(gate.url, python)
            parts.append(f'echo G{i} "$({probe} 2>/dev/null || echo error probe)"')
        else:
            parts.append(
                f"docker exec {container} {shlex.join(gate.command)} >/dev/null 2>&1; echo G{i} $?"
            )
    return "; ".join(parts) if parts else "true"


def parse_probe(stdout: str) -> tuple[dict[int, ProcState], dict[int, str]]:
    """(process index -> state, gate index -> result) from a probe's output."""
    states: dict[int, ProcState] = {}
    gates: dict[int, str] = {}
    for line in stdout.splitlines():
        words = line.split()
        if len(words) < 2 or len(words[0]) < 2 or not words[0][1:].isdigit():
            continue
        index = int(words[0][1:])
        if words[0][0] == "S":
            state = words[1]
            state = "starting" if state in STARTING_STATES else state
            code = words[2] if len(words) > 2 and state not in {"running", "starting"} else ""
            states[index] = ProcState(state, code)
        elif words[0][0] == "G":
            gates[index] = " ".join(words[1:])
    return states, gates


def gate_passed(gate: HealthGate, result: str | None) -> bool:
    if result is None:
        return False
    if gate.url is not None:
        return result == str(gate.expect_status)
    return result == "0"


def logs_command(process: Process, lines: int = LOG_LINES) -> str:
    """The process's last `lines` log lines: its container's log, or an exec'd process's file."""
    return f"{log_command(process, lines)} 2>&1"


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
        f"last {len(shown)} log lines ({log_source(process)}):",
        *(f"  | {line}" for line in shown),
    ]
    if not shown:
        details[-1] = f"no log lines ({log_source(process)} is empty or unreadable)"
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
