"""ansible-runner event dicts -> typed events, and the per-host tally of a run. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "changed", "failed", "unreachable", "skipped"]

_RESULT_EVENTS: dict[str, Status] = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


@dataclass(frozen=True)
class PlayStarted:
    """A play (one phase) began."""

    name: str


@dataclass(frozen=True)
class TaskStarted:
    """A task began on the play's hosts."""

    play: str
    name: str


@dataclass(frozen=True)
class HostResult:
    """One host's outcome of one task."""

    host: str
    task: str
    status: Status
    message: str = ""
    ignored: bool = False
    differences: tuple[str, ...] = ()
    """What the look (playbooks/look.yml) found off the plan on this host, one line each."""


@dataclass(frozen=True)
class Stats:
    """The final recap: counts per host."""

    hosts: dict[str, dict[str, int]]


Event = PlayStarted | TaskStarted | HostResult | Stats


def _differences(res: Mapping[str, Any]) -> tuple[str, ...]:
    """The look's lines of what differs from the plan, a fleet's rollout order the look play
    sets (k2_rollout), what the images phase would build, pull and stream (check mode), and a
    canary's verdict (k2_rollout_canary_verdict); none for any other task."""
    lines = res.get("differences")
    found = tuple(str(line) for line in lines) if isinstance(lines, list) else ()
    facts = res.get("ansible_facts")
    rollout = facts.get("k2_rollout") if isinstance(facts, Mapping) else None
    order = rollout.get("lines") if isinstance(rollout, Mapping) else None
    if isinstance(order, list):
        found += tuple(f"rollout order: {line}" for line in order)
    for key in ("warning", "outage"):
        said = rollout.get(key) if isinstance(rollout, Mapping) else None
        if said:
            found += (f"rollout {key}: {said}",)
    images = facts.get("_k2_container_runtime_would") if isinstance(facts, Mapping) else None
    if isinstance(images, list):
        found += tuple(f"image {line}" for line in images)
    verdict = facts.get("k2_rollout_canary_verdict") if isinstance(facts, Mapping) else None
    if isinstance(verdict, Mapping) and verdict.get("figures"):
        found += (f"canary: {verdict['figures']}",)
    return found


def _message(res: Mapping[str, Any]) -> str:
    """The most useful one-line reason from a task result."""
    for key in ("msg", "stderr", "reason"):
        value = res.get(key)
        if value:
            return str(value).strip().splitlines()[0] if key != "msg" else str(value).strip()
    return ""


def parse_event(raw: Mapping[str, Any]) -> Event | None:
    """Typed view of one ansible-runner event; None for events the display does not use."""
    kind = raw.get("event", "")
    data: Mapping[str, Any] = raw.get("event_data") or {}
    if kind == "playbook_on_play_start":
        return PlayStarted(name=str(data.get("play", "")))
    if kind == "playbook_on_task_start":
        return TaskStarted(play=str(data.get("play", "")), name=str(data.get("task", "")))
    if kind in _RESULT_EVENTS:
        res: Mapping[str, Any] = data.get("res") or {}
        status = _RESULT_EVENTS[kind]
        if status == "ok" and res.get("changed"):
            status = "changed"
        return HostResult(
            host=str(data.get("host", "")),
            task=str(data.get("task", "")),
            status=status,
            message=_message(res) if status in {"failed", "unreachable"} else "",
            ignored=bool(data.get("ignore_errors")),
            differences=_differences(res),
        )
    if kind == "playbook_on_stats":
        hosts: dict[str, dict[str, int]] = {}
        for key, label in (
            ("ok", "ok"),
            ("changed", "changed"),
            ("failures", "failed"),
            ("dark", "unreachable"),
            ("skipped", "skipped"),
        ):
            for host, count in (data.get(key) or {}).items():
                hosts.setdefault(str(host), {})[label] = int(count)
        return Stats(hosts=hosts)
    return None


@dataclass
class Tally:
    """Per-host counts and first failure, built from HostResult events."""

    counts: dict[str, dict[Status, int]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def add(self, result: HostResult) -> None:
        """Count one result (ignored failures count as ok)."""
        status: Status = "ok" if result.ignored and result.status == "failed" else result.status
        per_host = self.counts.setdefault(result.host, {})
        per_host[status] = per_host.get(status, 0) + 1
        if status in {"failed", "unreachable"} and result.host not in self.failures:
            # The first line: a launch failure's message goes on with its log lines.
            first = result.message.strip().splitlines()[0] if result.message.strip() else ""
            self.failures[result.host] = f"{result.task}: {first}"

    def settle(self, recap: Mapping[str, Mapping[str, int]]) -> None:
        """Once Ansible's recap is in: a host it counts neither unreachable nor failed had its
        unreachable results ignored (a task's ignore_unreachable: a drain passing over a host
        that is down), which count as ok, as ignored failures do."""
        for host, per_host in self.counts.items():
            said = recap.get(host)
            if said is None or said.get("unreachable") or said.get("failed"):
                continue
            if unreached := per_host.pop("unreachable", 0):
                per_host["ok"] = per_host.get("ok", 0) + unreached
                if not per_host.get("failed"):
                    self.failures.pop(host, None)

    def total(self, status: Status) -> int:
        """Sum of one status over all hosts."""
        return sum(c.get(status, 0) for c in self.counts.values())
