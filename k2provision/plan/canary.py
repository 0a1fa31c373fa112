"""A canary: a fleet's change tried on a share of the requests first, then kept or rolled
back on its own. Pure.

Behind a front of two or more routers (plan/front.py) the first wave of a rolling change
(plan/rollout.py) can serve a share of the requests alone before the rest follow. The last
router of the front (the canary's) leaves HAProxy and drops every worker; the wave leaves the
other routers, is replaced, passes its gates and smoke test, and goes into that router alone;
HAProxy's weights then send it ``percent`` % of the requests (the front balances round-robin,
so a weight is a share). For ``hold_s`` seconds the run probes both sides through their
routers (the same short chat completion, one after the other) and counts on every front host
what each router answered. :func:`canary_verdict` then keeps the change (the canary joins every
router, its router takes every worker back at its weight, the other waves follow) or rolls it
back (the previous spec comes back into every router) and fails the run naming the figures.

Why these figures: HAProxy counts each router's requests and 5xx answers exactly (health checks
excluded); a latency from it is an average over its last 1024 requests, old spec included, and
the router's own duration histogram ends at the response headers, before a streamed answer's
first token; so latency is measured by probes sent to both sides at once, which also judge a
canary that took no traffic.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from k2provision.core.front_rules import canary_pd_problem
from k2provision.core.records import CanarySettings, Plan, RouterRef
from k2provision.plan.rollout import RolloutWave, disaggregated, serving_members, worker_body

__all__ = [
    "LATENCY_FLOOR_S",
    "CanaryRollout",
    "Verdict",
    "canary_lines",
    "canary_problem",
    "canary_rollout",
    "canary_verdict",
]

LATENCY_FLOOR_S = 0.05
"""A canary's median probe slower than the others' by less than this is not judged slow (the
jitter of one short request, whatever the ratio)."""


@dataclass(frozen=True)
class CanaryRollout:
    """The first wave of a change behind the front, serving `settings.percent` % alone."""

    router: RouterRef
    """The canary's router (the front's last): it lists the canary's instances only."""
    others: tuple[RouterRef, ...]
    front_hosts: tuple[str, ...]
    wave: RolloutWave
    weights: tuple[tuple[str, int], ...]
    """(HAProxy server, weight) of every router while the canary is held."""
    worker_urls: tuple[str, ...]
    """Every worker of the plan: what the canary's router drops first and lists at the end."""
    workers: tuple[Mapping[str, str | int], ...]
    """Every worker's ``POST /workers`` body, in the plan's order."""
    settings: CanarySettings


def canary_problem(plan: Plan, percent: int) -> str:
    """Why this plan cannot try a change on `percent` % of requests first ("" when it can)."""
    if percent <= 0:
        return ""
    given = f"--canary {percent}"
    if disaggregated(plan):
        return canary_pd_problem(given)
    if plan.front is None or len(plan.front.routers) < 2:
        return (
            f"{given}: a canary needs the front tier (two or more [router] hosts behind "
            "k2_front_address), whose HAProxy sends the canary's router its share; this "
            "plan has none; fix: add the front (docs/fleets.md), or apply without --canary"
        )
    if sum(len(p.instances) for p in plan.pools) < 2:
        return (
            f"{given}: a canary needs a fleet of two or more instances (one keeps serving the "
            "old spec); fix: set k2_instances to 2 or more, or apply without --canary"
        )
    return ""


def canary_rollout(
    plan: Plan, waves: Sequence[RolloutWave], settings: CanarySettings
) -> CanaryRollout | None:
    """The canary of a change whose rollout is `waves` (None: no canary asked, nothing
    changes, or the plan cannot hold one: see :func:`canary_problem`)."""
    if not waves or settings.percent <= 0 or canary_problem(plan, settings.percent):
        return None
    assert plan.front is not None
    *others, router = plan.front.routers
    each = round((100 - settings.percent) / len(others))
    members = serving_members(plan)
    return CanaryRollout(
        router=router,
        others=tuple(others),
        front_hosts=tuple(h.name for h in plan.front.hosts),
        wave=waves[0],
        weights=(*((r.server, each) for r in others), (router.server, settings.percent)),
        worker_urls=tuple(i.url for i in members),
        workers=tuple(worker_body(i) for i in members),
        settings=settings,
    )


def canary_lines(canary: CanaryRollout, first: int = 1) -> list[str]:
    """The canary's steps as `apply --check` shows them, numbered from `first` (the other
    waves follow it)."""
    s, w = canary.settings, canary.wave
    others = ", ".join(r.host for r in canary.others)
    weights = ", ".join(f"{server} {weight}" for server, weight in canary.weights)
    return [
        f"{first}. canary: the router on {canary.router.host} out of HAProxy on "
        f"{', '.join(canary.front_hosts)}, drained, every worker taken out of it",
        f"{first + 1}. canary: {', '.join(w.instances)} on {', '.join(w.hosts)}: out of the "
        f"router(s) on {others}, drained, replaced, checked, into the router on "
        f"{canary.router.host} alone; HAProxy weights {weights} ({s.percent} % of requests)",
        f"{first + 2}. canary: held {s.hold_s} s, probed beside the others; kept if its errors "
        f"are at most {s.max_error_pct:g} % and its median latency at most "
        f"x{s.max_latency_ratio:g} the others', else rolled back and the run fails; kept: "
        f"into every router, the router on {canary.router.host} takes every worker back, "
        "every router's weight as before",
    ]


@dataclass(frozen=True)
class Side:
    """What one side (the canary's router, or the others) answered while held."""

    requests: int
    """Requests the front sent it."""
    errors: int
    """Of those, 5xx answers (HAProxy's hrsp_5xx)."""
    probes: int
    probe_errors: int
    median_s: float | None
    """The median time of its probes answered 200 (None: none was)."""

    @property
    def error_pct(self) -> float:
        total = self.requests + self.probes
        return 100.0 * (self.errors + self.probe_errors) / total if total else 0.0

    def said(self) -> str:
        return (
            f"{self.error_pct:.1f} % errors ({self.errors + self.probe_errors} of "
            f"{self.requests + self.probes}, probes included)"
        )


@dataclass(frozen=True)
class Verdict:
    kept: bool
    figures: str
    """One line: the share, errors and latency of each side, the window, the outcome."""


def _counted(hosts: Sequence[Mapping[str, Any]], server: str, key: str) -> int:
    """`key` (requests or errors) of `server` summed over every front host's counters."""
    total = 0
    for host in hosts:
        row = (host.get("servers") or {}).get(server) or {}
        total += int(row.get(key) or 0)
    return total


def _side(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    servers: Sequence[str],
    probes: Mapping[str, Any],
) -> Side:
    def delta(key: str) -> int:
        return sum(max(0, _counted(after, s, key) - _counted(before, s, key)) for s in servers)

    times = [float(t) for t in probes.get("times") or []]
    return Side(
        requests=delta("requests"),
        errors=delta("errors"),
        probes=len(times) + int(probes.get("errors") or 0),
        probe_errors=int(probes.get("errors") or 0),
        median_s=statistics.median(times) if times else None,
    )


def _clock(epoch: Any) -> str:
    return datetime.fromtimestamp(float(epoch or 0), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def canary_verdict(
    canary: Mapping[str, Any],
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    probes: Mapping[str, Any],
) -> Verdict:
    """Keep the canary or roll it back. `canary` is the CanaryRollout as the role reads it;
    `before`/`after`: each front host's counters ({servers: {name: {requests, errors}}}) at
    the start and the end of the hold; `probes`: the probe module's answer ({canary: {times,
    errors, error}, others: {...}, started, ended})."""
    settings = CanarySettings.model_validate(canary["settings"])
    server = str(canary["router"]["server"])
    others = [str(r["server"]) for r in canary["others"]]
    mine = _side(before, after, [server], probes.get("canary") or {})
    rest = _side(before, after, others, probes.get("others") or {})
    total = mine.requests + rest.requests
    share = f"{100.0 * mine.requests / total:.1f} %" if total else "none"
    names = ", ".join(canary["wave"]["instances"])
    why = []
    if mine.error_pct > settings.max_error_pct:
        why.append(f"errors {mine.error_pct:.1f} % > {settings.max_error_pct:g} %")
    if mine.median_s is None:
        error = (probes.get("canary") or {}).get("error") or "no probe answered"
        why.append(f"no probe answered 200 ({error})")
    elif rest.median_s is not None:
        ratio = mine.median_s / rest.median_s if rest.median_s > 0 else float("inf")
        if ratio > settings.max_latency_ratio and mine.median_s - rest.median_s > LATENCY_FLOOR_S:
            why.append(f"median latency x{ratio:.2f} > x{settings.max_latency_ratio:g}")

    def median(side: Side) -> str:
        return "none" if side.median_s is None else f"{side.median_s:.3f} s"

    figures = (
        f"{names} behind the router on {canary['router']['host']} took {share} of the "
        f"front's {total} requests ({settings.percent} % asked) from "
        f"{_clock(probes.get('started'))} to {_clock(probes.get('ended'))}; canary "
        f"{mine.said()}, median probe {median(mine)}; the others {rest.said()}, median probe "
        f"{median(rest)}: " + ("kept" if not why else "rolled back: " + "; ".join(why))
    )
    return Verdict(kept=not why, figures=figures)
