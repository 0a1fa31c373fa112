"""Drain and return: which instances a host list takes out or brings back, and what it costs.
Pure.

`k2provision drain HOST...` takes out every fleet instance holding one of the hosts: out of
every router, its in-flight requests answered within the plan's drain timeout, stopped, and
its hosts recorded as drained (core/host_state.py), so the plan keeps it stopped
(FleetSettings.drained) until `k2provision return HOST...`, which starts it behind its
health gates and puts it back into every router. An instance is back only when none of its
hosts is drained any more. Taking out the last serving instance of a pool is an outage: it
is refused unless the operator says yes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k2provision.core.records import Plan, PoolPlan
from k2provision.errors import K2Error
from k2provision.plan.rollout import fleet_instances

__all__ = ["HostWork", "drain_choice", "drain_lines", "return_choice"]


@dataclass(frozen=True)
class HostWork:
    """What a drain or a return does: the instances it moves (in the plan's order), the hosts
    the state file holds after it, and the pools it leaves with no serving instance."""

    instances: tuple[str, ...]
    drained_after: tuple[str, ...]
    outage: tuple[str, ...] = ()
    """Pools left with no serving instance (a drain that needs --yes)."""


def _instances_of(plan: Plan, hosts: Sequence[str], command: str) -> list[PoolPlan]:
    """The fleet instances holding `hosts`; K2Error naming each host that holds none."""
    known = {h.name for h in plan.hosts}
    members = fleet_instances(plan)
    problems = []
    for host in hosts:
        if host not in known:
            problems.append(
                f"{command}: {host} is not a host of the inventory; expected one of "
                f"{', '.join(sorted(known))}; fix: name a host of an instance"
            )
        elif not any(host in i.hosts for i in members):
            problems.append(
                f"{command}: {host} serves in no instance of a fleet (a router or monitoring "
                "host, or a single instance); expected a host of a pool of k2_instances > 1; "
                "fix: name an instance's host (k2provision stop stops a single instance)"
            )
    if not hosts:
        problems.append(f"{command}: no host named; fix: name the hosts, e.g. {command} h3")
    if problems:
        raise K2Error(problems)
    return [i for i in members if set(i.hosts) & set(hosts)]


def drain_choice(plan: Plan, hosts: Sequence[str]) -> HostWork:
    """What draining `hosts` does: the instances holding them that serve now (an instance
    drained already is left as it is), and the pools that would have none serving."""
    chosen = _instances_of(plan, hosts, "drain")
    moving = [i.instance for i in chosen if i.instance not in plan.fleet.drained]
    out = {*plan.fleet.drained, *moving}
    outage = tuple(
        pool.name
        for pool in plan.pools
        if pool.instances
        and any(i.instance in moving for i in pool.instances)
        and all(i.instance in out for i in pool.instances)
    )
    after = tuple(dict.fromkeys([*plan.fleet.drained_named, *hosts]))
    return HostWork(instances=tuple(moving), drained_after=after, outage=outage)


def return_choice(plan: Plan, hosts: Sequence[str]) -> HostWork:
    """What returning `hosts` does: the drained instances none of whose hosts stays drained
    after it; K2Error for a named host that is not drained."""
    _instances_of(plan, hosts, "return")
    named = plan.fleet.drained_named
    if not_drained := [h for h in hosts if h not in named]:
        raise K2Error(
            [
                f"return: {h} is not drained (drained: {', '.join(named) or 'none'}); "
                f"expected a host k2provision drain took out; fix: name a drained host"
                for h in not_drained
            ]
        )
    after = tuple(h for h in named if h not in hosts)
    back = tuple(
        i.instance
        for i in fleet_instances(plan)
        if i.instance in plan.fleet.drained and not set(i.hosts) & set(after)
    )
    return HostWork(instances=back, drained_after=after)


def drain_lines(plan: Plan, work: HostWork, returning: bool = False) -> list[str]:
    """What the run does, one line per instance, as the command shows it before it starts."""
    by_name = {i.instance: i for i in fleet_instances(plan)}
    routers = ", ".join(r.host for r in plan.routers) or "no router"
    lines = []
    for name in work.instances:
        instance = by_name[name]
        where = f"{name} ({', '.join(instance.hosts)})"
        if returning:
            lines.append(
                f"{where}: started behind its health gates, then back into every router ({routers})"
            )
        else:
            lines.append(
                f"{where}: out of every router ({routers}), up to "
                f"{plan.fleet.drain_timeout} s to answer what it holds, stopped"
            )
    return lines
