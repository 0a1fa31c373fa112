"""Which planned processes `logs TARGET` reads, and which --since it takes. Pure.

The commands that read them are the registry's log question's (plan/host_questions.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from k2provision.core.records import Plan, Process
from k2provision.errors import K2Error

POOLS = ("nodes", "prefill", "decode")
ROUTER = "router"
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d(T\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?)?$")
_EPOCH = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class LogSource:
    """One planned process on one host, as `logs` names it (`host/process`)."""

    host: str
    process: Process

    @property
    def label(self) -> str:
        """The prefix of its lines."""
        return f"{self.host}/{self.process.name}"


def is_router(process: Process) -> bool:
    """The PD router (on a [router] host, or beside the first prefill server)."""
    return process.name.endswith(ROUTER)


def select_sources(
    plan: Plan, groups: Mapping[str, Sequence[str]], target: str | None
) -> list[LogSource]:
    """The processes TARGET names: a host, a pool (prefill, decode, nodes: its engine
    processes), `router`, a planned process name, or any inventory group; all when None."""
    every = [LogSource(h.name, p) for h in plan.hosts for p in h.processes]
    if target is None:
        return every
    pools = {h.name: h.pool for h in plan.hosts}
    if target in pools:
        chosen = [s for s in every if s.host == target]
    elif target == ROUTER:
        chosen = [s for s in every if is_router(s.process)]
    elif target in POOLS:
        chosen = [s for s in every if pools[s.host] == target and not is_router(s.process)]
    elif any(s.process.name == target for s in every):
        chosen = [s for s in every if s.process.name == target]
    elif target in groups:
        members = set(groups[target])
        chosen = [s for s in every if s.host in members]
    else:
        names = sorted({*pools, *groups, ROUTER, *(s.process.name for s in every)} - {"all"})
        raise K2Error(
            [
                f"TARGET {target}: not a host, group, pool or process of this plan; expected "
                f"one of {', '.join(names)} (or none for all)"
            ]
        )
    if not chosen:
        raise K2Error([f"TARGET {target}: no planned process runs there; nothing to read"])
    return chosen


def since_problem(since: str) -> str:
    """One line when --since is not a duration (10m, 1h30m), a date/time or a Unix time."""
    if _DURATION.match(since) or _TIMESTAMP.match(since) or _EPOCH.match(since):
        return ""
    return (
        f"--since {since}: expected a duration (10m, 1h30m), a time (2026-01-31T12:00:00Z) "
        "or Unix seconds"
    )
