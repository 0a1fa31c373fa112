"""Action k2.cluster.launch_gate: wait for one launch stage's health gates on this host.

Every ``delay`` seconds it asks the host one batch of the registry's questions
(k2provision.ops.launch_gate.probe): the state of each of the host's processes in the stage and
each of its health gates (an https gate under the registry's one certificate policy). It ends

- passed: every gate of this host answered (a host without gates in the stage waits, watching
  its processes, until every host with gates in the stage has ended);
- failed: one of its processes exited (reported at once, with its exit code), an https gate
  answered with a certificate the one policy does not trust (at once), or a gate did not
  pass within its timeout (the plan's, or ``timeout_cap`` when smaller): ``k2_failure`` names
  the process, the reason and the gate, with the process's last 50 log lines;
- aborted: another host of the stage failed first (``k2_aborted_by``).

The hosts of a stage learn of each other's end through marker files on the controller (one
directory per ``run_id`` and stage). The task itself does not fail: the launch role stops the
stage and fails the host with ``k2_failure``. Read-only on the host; skipped under --check.

Options: plan (the registered plan), stage (int), hosts (the play's hosts), run_id (one per
run, the same on every host), delay (s between probes), timeout_cap (s; 0: the plan's).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

from k2provision.core.records import HealthGate
from k2provision.ops import launch_gate as lg

# Marker directories of earlier runs are removed once they are this old.
MARKERS_KEPT_S = 86400


def _marker_dir(run_id: str, stage: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id) or "run"
    root = Path(tempfile.gettempdir()) / f"k2-launch-{os.getuid()}"
    path = root / safe / f"stage-{stage}"
    path.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        with contextlib.suppress(OSError):
            if old.name != safe and time.time() - old.stat().st_mtime > MARKERS_KEPT_S:
                shutil.rmtree(old, ignore_errors=True)
    return path


def _mark(directory: Path, host: str, outcome: str) -> None:
    (directory / f"{host}.{outcome}").write_text(outcome + "\n")


def _ended(directory: Path) -> tuple[set[str], list[str]]:
    """(hosts that ended, hosts that failed) according to the markers."""
    ended: set[str] = set()
    failed: list[str] = []
    for marker in sorted(directory.iterdir()):
        host, _, outcome = marker.name.rpartition(".")
        ended.add(host)
        if outcome == "failed":
            failed.append(host)
    return ended, failed


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """Probe until the gates pass, a process exits, a gate times out or a peer failed."""

    TRANSFERS_FILES = False
    _supports_check_mode = False

    def _run(self, command: str) -> str:
        res = self._low_level_execute_command(command, sudoable=True)
        return str(res.get("stdout", ""))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        plan = args["plan"]
        stage = int(args["stage"])
        hosts = [str(h) for h in args.get("hosts") or []]
        delay = max(1.0, float(args.get("delay", 5)))
        cap = int(args.get("timeout_cap") or 0)
        host = str(task_vars.get("inventory_hostname", ""))
        interpreter = str(task_vars.get("ansible_python_interpreter") or "python3")
        python = interpreter if interpreter.startswith("/") else "python3"

        procs = lg.stage_processes(plan, host, stage)
        result.update(changed=False, k2_failure=None, k2_aborted_by=None, k2_passed=[])
        if not procs:
            return result
        markers = _marker_dir(str(args["run_id"]), stage)
        own_gates: dict[int, HealthGate] = {
            i: p.health for i, p in enumerate(procs) if p.health is not None
        }
        waited_on = [h for h in lg.gate_hosts(plan, stage, hosts) if h != host]
        limit = (
            max(lg.gate_timeout(g, cap) for g in own_gates.values())
            if own_gates
            else lg.stage_timeout(plan, stage, hosts, cap) + 30
        )
        asked = lg.probe(procs, str(plan.get("config_dir") or ""), python)
        command = asked.script()
        passed: set[int] = set()
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            states, gates = lg.read_probe(asked, self._run(command))
            bad: tuple[int, str] | None = None
            for i, proc in enumerate(procs):
                state = states.get(i, lg.ProcState("missing"))
                if state.dead:
                    bad = (i, state.reason())
                    break
                if state.state == "starting" and proc.exec_in and elapsed > lg.PID_GRACE_S:
                    bad = (i, f"did not start within {lg.PID_GRACE_S:g} s (no pid file)")
                    break
                untrusted = lg.hopeless(own_gates[i], gates.get(i)) if i in own_gates else ""
                if untrusted:
                    bad = (i, untrusted)
                    break
            passed |= {i for i, g in own_gates.items() if lg.gate_passed(g, gates.get(i))}
            if bad is None:
                late = [
                    i
                    for i, g in own_gates.items()
                    if i not in passed and elapsed > lg.gate_timeout(g, cap)
                ]
                if late:
                    missed = own_gates[late[0]]
                    answer = gates.get(late[0])
                    last = answer.text if answer is not None else "no answer"
                    bad = (
                        late[0],
                        f"did not pass its health gate within {lg.gate_timeout(missed, cap)} s "
                        f"(last answer: {last})",
                    )
            if bad is not None:
                index, reason = bad
                proc = procs[index]
                gate = proc.health or next(iter(own_gates.values()), None)
                gate_desc = (
                    lg.gate_text(gate, lg.gate_timeout(gate, cap))
                    if gate
                    else (
                        "none of its own; the stage's gates are on " + (", ".join(waited_on) or "-")
                    )
                )
                log_batch, log_ticket = lg.logs_probe(proc)
                log = list(log_batch.read(self._run(log_batch.script()))[log_ticket].lines)
                _mark(markers, host, "failed")
                result["k2_failure"] = lg.failure(host, proc, reason, gate_desc, log)
                return result
            ended, failed = _ended(markers)
            others_failed = [h for h in failed if h != host]
            if others_failed:
                result["k2_aborted_by"] = others_failed[0]
                return result
            peers_ended = all(h in ended for h in waited_on) or elapsed > limit
            if len(passed) == len(own_gates) and (own_gates or peers_ended):
                _mark(markers, host, "passed")
                result["k2_passed"] = [procs[i].name for i in sorted(passed)]
                return result
            time.sleep(delay)
