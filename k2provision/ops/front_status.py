"""What `status` asks a front host, and what the front's answers mean. Pure.

Each front host is asked, in its status probe's batch (the registry's tool questions), whether
it holds the floating address, whether HAProxy and keepalived run, how its HAProxy counts each
router (``show stat`` on its runtime API: a router left drained by a stopped change gets no
request), and what its router's ``GET /workers`` lists (asked on the host, on the router's
private address, with the endpoint's key where the launch placed it there).
:func:`front_host_status` reads one host's answers; :func:`front_problems` judges the front as
a whole: exactly one holder of the address, every front host answering, every router listing
every instance healthy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from k2provision.core.endpoint_guard import API_KEY, guard_path
from k2provision.core.records import Plan, RouterRef
from k2provision.plan.host_questions import hq
from k2provision.plan.rollout import serving_members


class HostLike(Protocol):
    """What front_view reads of a host's status (status_probe.HostStatus)."""

    @property
    def host(self) -> str: ...

    @property
    def unreachable(self) -> str: ...

    @property
    def front(self) -> FrontHostStatus | None: ...


@dataclass(frozen=True)
class FrontTickets:
    """What `status` asks one front host."""

    address: hq.Ticket[hq.ToolOutput]
    daemons: hq.Ticket[hq.ToolOutput]
    servers: hq.Ticket[hq.ToolOutput]
    workers: hq.Ticket[hq.ToolOutput] | None


@dataclass(frozen=True)
class FrontHostStatus:
    """One front host, now: whether it holds the address, its daemons, its router's workers."""

    holds: bool
    haproxy: bool
    keepalived: bool
    router: str
    """Its router's URL behind the front ("" where it runs none)."""
    workers: tuple[tuple[str, bool], ...] | None
    """(URL, healthy) of each worker its router lists; None: the router answered nothing."""
    router_error: str = ""
    instances: tuple[str, ...] = ()
    """The plan's instance URLs, each of which the router must list healthy."""
    servers: tuple[tuple[str, str], ...] = ()
    """(router host, status) of each router of the plan as this host's HAProxy counts it
    (UP, DOWN, DRAIN, MAINT, or `unknown` where HAProxy did not say)."""

    @property
    def problems(self) -> list[str]:
        """What is wrong here: a daemon not running, a router that lacks an instance."""
        found = [
            f"{name} is not running (the front's {what} here is gone)"
            for name, running, what in (
                ("haproxy", self.haproxy, "HTTP spreader"),
                ("keepalived", self.keepalived, "address failover"),
            )
            if not running
        ]
        found += [
            f"HAProxy here counts the router on {name} {status}: it sends it no request"
            + (
                f"; fix: `k2provision restart INVENTORY --limit {name}` replaces that router "
                "and puts it back once it lists every worker (a router change that stopped "
                "left it out)"
                if status in ("DRAIN", "MAINT")
                else ""
            )
            for name, status in self.servers
            if self.haproxy and status != "UP"
        ]
        if not self.router:
            return found
        if self.workers is None:
            return [*found, f"router {self.router} answers nothing: {self.router_error}"]
        healthy = {url.rstrip("/") for url, ok in self.workers if ok}
        missing = [u for u in self.instances if u.rstrip("/") not in healthy]
        if missing:
            found.append(
                f"router {self.router} lists {len(self.instances) - len(missing)} of "
                f"{len(self.instances)} instances healthy; not: {', '.join(missing)}"
            )
        return found

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def front_tickets(plan: Plan, host: str, batch: hq.Batch) -> FrontTickets | None:
    """The front's questions for `host`, added to its batch (None: not a front host)."""
    front = plan.front
    if front is None or host not in {h.name for h in front.hosts}:
        return None
    router = _router_on(plan, host)
    key_file = guard_path(plan.config_dir, API_KEY)
    return FrontTickets(
        address=batch.add(
            "front address",
            hq.ToolQuestion(("ip", "-o", "-4", "addr", "show", "to", f"{front.address}/32")),
        ),
        daemons=batch.add(
            "front daemons", hq.ToolQuestion(("pgrep", "-l", "-x", "haproxy|keepalived"))
        ),
        servers=batch.add("front servers", hq.HaproxyQuestion(front.admin_socket)),
        workers=None
        if router is None
        else batch.add(
            "front router",
            hq.HttpBodyQuestion(f"{router.url}/workers", key_file),
        ),
    )


def _router_on(plan: Plan, host: str) -> RouterRef | None:
    return next((r for r in plan.routers if r.host == host), None)


def front_host_status(
    plan: Plan, host: str, answers: hq.Answers, asked: FrontTickets
) -> FrontHostStatus:
    """One front host's answers, read."""
    daemons = {line.split()[-1] for line in answers[asked.daemons].text.splitlines() if line}
    router = _router_on(plan, host)
    workers: tuple[tuple[str, bool], ...] | None = None
    error = ""
    if asked.workers is not None:
        text = answers[asked.workers].text.strip()
        try:
            body = json.loads(text)
            workers = tuple(
                (str(w.get("url", "")), bool(w.get("is_healthy")))
                for w in body.get("workers", [])
                if isinstance(w, dict)
            )
        except (ValueError, AttributeError):
            error = text[:200] or "no answer"
    counted = (
        hq.haproxy_servers(answers[asked.servers].text, plan.front.backend) if plan.front else {}
    )
    servers = tuple(
        (r.host, counted[r.server].status if r.server in counted else "unknown")
        for r in plan.routers
    )
    return FrontHostStatus(
        holds=bool(answers[asked.address].text.strip()),
        haproxy="haproxy" in daemons,
        keepalived="keepalived" in daemons,
        router=router.url if router else "",
        workers=workers,
        router_error=error,
        # What each router must list healthy: every instance but the drained.
        instances=tuple(i.url for i in serving_members(plan) if i.url),
        servers=servers,
    )


def front_problems(plan: Plan, fronts: dict[str, FrontHostStatus], reached: set[str]) -> list[str]:
    """The front as a whole: one holder of the address (two is a split brain: clients reach
    either), and every front host reached (`fronts`: the reached front hosts' answers)."""
    front = plan.front
    if front is None:
        return []
    names = [h.name for h in front.hosts]
    holders = [name for name in names if name in fronts and fronts[name].holds]
    found = [
        f"front host {name} is down (unreachable): the address has one holder fewer to move to"
        for name in names
        if name not in reached
    ]
    if len(holders) > 1:
        found.append(
            f"split brain: {', '.join(holders)} each hold the front's address {front.address}; "
            f"fix: check that VRRP (IP protocol 112) passes between them and that VRRP id "
            f"{front.vrid} is this front's alone"
        )
    elif not holders:
        found.append(
            f"no front host holds the address {front.address}: the endpoint is down; fix: "
            "check keepalived on " + ", ".join(names)
        )
    return found


def holder_line(plan: Plan, fronts: dict[str, FrontHostStatus]) -> str:
    """`front 10.0.0.100 held by lab1` (or by nobody, or by several)."""
    if plan.front is None:
        return ""
    holders = [name for name, f in fronts.items() if f.holds]
    return f"front {plan.front.address}: held by {', '.join(holders) or 'no host'}"


def front_view(plan: Plan, hosts: Sequence[HostLike]) -> tuple[list[str], list[str]]:
    """What `status` shows of the front (the holder, then each front host: its daemons and its
    router's workers) and the front's own problems (:func:`front_problems`)."""
    if plan.front is None:
        return [], []
    fronts = {h.host: h.front for h in hosts if h.front is not None}
    reached = {h.host for h in hosts if not h.unreachable}
    lines = [holder_line(plan, fronts)]
    for name in (h.name for h in plan.front.hosts):
        f = fronts.get(name)
        if f is None:
            lines.append(f"  front host {name}: unreachable")
            continue
        listed = (
            f"{sum(ok for _, ok in f.workers)}/{len(f.instances)} instances healthy"
            if f.workers is not None
            else f"no answer ({f.router_error})"
        )
        counts = ", ".join(f"{host} {status}" for host, status in f.servers)
        lines.append(
            f"  front host {name}: {'holds the address, ' if f.holds else ''}"
            f"haproxy {'up' if f.haproxy else 'DOWN'}, keepalived "
            f"{'up' if f.keepalived else 'DOWN'}, router {f.router}: {listed}"
            + (f"; its HAProxy counts the routers {counts}" if f.haproxy and counts else "")
        )
    return lines, front_problems(plan, fronts, reached)
