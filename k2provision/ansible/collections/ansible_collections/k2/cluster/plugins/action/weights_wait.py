"""Action k2.cluster.weights_wait: follow one relay (relay.pyz on a host) to its end.

The relay runs detached on the host and writes its JSON-lines events to a log there. This
action reads the end of that log over the host's own connection every ``interval`` seconds
until the relay's ``summary`` line appears, and returns that summary. Each new ``progress``
event is appended, as one JSON line naming the host, to ``progress_file`` on the controller
(when given): ``k2provision weights`` draws its live bar from it, and anyone running plain
ansible-playbook can ``tail -f`` it. A host that stops answering (it died mid-transfer) is
reported as lost instead of failing the task, so the other hosts' relays can finish.

Options: log, pidfile (paths on the host), label (the host's name in progress lines),
progress_file, interval (s), timeout (s), start_timeout (s), lost_after (failed polls).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import Any

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from k2provision.weights.kernel import events

ALIVE = "K2RELAY-ALIVE="
TAIL_LINES = 400


def parse_log(text: str) -> tuple[list[dict[str, Any]], bool | None]:
    """The relay events in ``text`` (unparsable lines skipped) and the liveness marker."""
    alive: bool | None = None
    for line in text.splitlines():
        if line.startswith(ALIVE):
            alive = line[len(ALIVE) :].strip() == "1"
    return events.parse_events(text), alive


def _append(path: str, record: dict[str, Any]) -> None:
    if not path:
        return
    line = json.dumps(record, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary fields a progress reader needs (no per-host detail of the seed's)."""
    keys = ("status", "verified", "files", "message", "bytes_received", "bytes_sent", "seconds")
    out = {k: summary[k] for k in keys if k in summary}
    for k in ("received", "repaired", "skipped", "missing", "failed"):
        if isinstance(summary.get(k), list):
            out[k] = len(summary[k])
    return out


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """Poll a relay's log until its summary; changed when bytes were written on this host."""

    TRANSFERS_FILES = False
    _supports_check_mode = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self._task.args
        log = str(args["log"])
        pidfile = str(args.get("pidfile", ""))
        label = str(args.get("label", ""))
        progress_file = str(args.get("progress_file") or "")
        interval = float(args.get("interval", 2))
        timeout = float(args.get("timeout", 21600))
        start_timeout = float(args.get("start_timeout", 60))
        lost_after = int(args.get("lost_after", 3))
        command = f"tail -n {TAIL_LINES} {shlex.quote(log)} 2>/dev/null; "
        if pidfile:
            command += (
                f'if kill -0 "$(cat {shlex.quote(pidfile)} 2>/dev/null)" 2>/dev/null; '
                f"then echo {ALIVE}1; else echo {ALIVE}0; fi"
            )
        else:
            command += "true"
        started = time.monotonic()
        failures = 0
        dead_polls = 0
        last: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        while True:
            elapsed = time.monotonic() - started
            try:
                res = self._low_level_execute_command(command, sudoable=True)
            except AnsibleConnectionFailure as exc:
                failures += 1
                if failures >= lost_after:
                    message = f"{label}: lost during the transfer ({str(exc).strip()[:300]})"
                    _append(progress_file, {"host": label, "event": "lost", "t": time.time()})
                    result.update(
                        changed=False,
                        status="lost",
                        lost=True,
                        message=message,
                        summary={},
                        last_progress=last,
                    )
                    return result
                time.sleep(interval)
                continue
            failures = 0
            events, alive = parse_log(str(res.get("stdout", "")))
            progress = [e for e in events if e.get("event") == "progress"]
            if progress and progress[-1] != last:
                last = progress[-1]
                record = {"host": label, "event": "progress", "t": time.time()}
                record.update(
                    {k: last.get(k) for k in ("rx", "tx", "written", "total", "rate", "file")}
                )
                _append(progress_file, record)
            summary = next((e for e in reversed(events) if e.get("event") == "summary"), None)
            if summary is not None:
                moved = bool(summary.get("received")) or bool(summary.get("repaired"))
                _append(
                    progress_file,
                    {"host": label, "event": "summary", "t": time.time(), **_brief(summary)},
                )
                result.update(
                    changed=moved,
                    status=str(summary.get("status", "")),
                    lost=False,
                    message=str(summary.get("message", "")),
                    summary=summary,
                    last_progress=last,
                )
                return result
            dead_polls = dead_polls + 1 if alive is False else 0
            said = any(not ln.startswith(ALIVE) for ln in str(res.get("stdout", "")).splitlines())
            # A relay that wrote something and is gone ended badly; one that never wrote a
            # line may still be starting (the start task returns before it runs).
            if (alive is False and dead_polls >= 2 and (said or elapsed > start_timeout)) or (
                elapsed > timeout
            ):
                tail = [str(e.get("message") or e.get("reason") or "") for e in events[-3:]]
                raw = str(res.get("stdout", "")).strip().splitlines()
                why = "; ".join(t for t in tail if t) or (raw[-2] if len(raw) > 1 else "no output")
                status = "timeout" if elapsed > timeout else "exited"
                message = (
                    f"{label}: the relay ended without a summary ({why[:500]})"
                    if status == "exited"
                    else f"{label}: no summary from the relay within {timeout:g} s"
                )
                _append(progress_file, {"host": label, "event": status, "t": time.time()})
                result.update(
                    changed=False,
                    status=status,
                    lost=False,
                    message=message,
                    summary={},
                    last_progress=last,
                )
                return result
            time.sleep(interval)
