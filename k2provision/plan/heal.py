"""Heal: which spare takes which failed host's place, and what the circuit breaker allows.
Pure.

A host of a fleet instance that is unreachable or fails its GPU gate is replaced by a spare
(a [spare] host: prepared, holding the weights, serving nothing): the spare takes the failed
host's place in its pool group, so its ranks, its role and, where the failed host was the
master, the instance's master (core/inventory.py `substituted`). The substitution goes into
the inventory's state file (core/host_state.py), which every later plan reads; the apply
that follows starts the instance on its new hosts and puts it behind the routers. Without a
free spare the instance stays down, and heal says so.

The circuit breaker keeps an unattended heal (`k2provision watch`) from taking a fleet apart
on a false signal (a network partition makes every host look dead): never more than
`max_hosts` hosts taken out within `window_s` seconds, counting those taken out before, and
never a host whose instance is the last one of its pool still serving.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from k2provision.core.host_state import HostState, Replacement, TakenOut
from k2provision.core.records import Plan
from k2provision.plan.rollout import fleet_instances

__all__ = ["Failure", "HealChoice", "heal_choice", "heal_lines", "state_after", "timestamp"]


@dataclass(frozen=True)
class Failure:
    """A host that cannot serve, and why (`unreachable: ...`, a GPU gate's finding)."""

    host: str
    why: str


@dataclass(frozen=True)
class HealChoice:
    """What a heal does: the spares it puts in failed hosts' places, the instances they
    rebuild, the instances that stay down (a line each, with the reason), the failures it
    leaves to others (not a fleet instance's host), and the breaker's refusal ("": none)."""

    replacements: tuple[Replacement, ...] = ()
    instances: tuple[str, ...] = ()
    stays_down: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    refused: str = ""
    failures: tuple[Failure, ...] = ()


def timestamp(now: datetime) -> str:
    """`now` as the state file records it (UTC, seconds)."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None


def recent(state: HostState, now: datetime, window_s: int) -> tuple[TakenOut, ...]:
    """The hosts taken out within the last `window_s` seconds (an entry whose time cannot be
    read counts: the breaker errs on the side of doing nothing)."""
    since = now - timedelta(seconds=window_s)
    return tuple(t for t in state.taken_out if (_when(t.at) or now) >= since)


def heal_choice(
    plan: Plan,
    failures: Sequence[Failure],
    down: Collection[str],
    state: HostState,
    now: datetime,
    max_hosts: int,
    window_s: int,
) -> HealChoice:
    """What healing `failures` does. `down`: the fleet's instances not serving now (a
    failed host of a serving instance is taken out only if another instance of its pool
    still serves); `state`: the inventory's state file (the spares in use, what was taken
    out when); the breaker allows `max_hosts` hosts per `window_s` seconds."""
    members = {h: i for i in fleet_instances(plan) for h in i.hosts}
    pools = {i.instance: p.name for p in plan.pools for i in p.instances}
    failed = {f.host for f in failures}
    ignored, chosen = [], []
    for f in failures:
        instance = members.get(f.host)
        if instance is None:
            ignored.append(f"{f.host}: {f.why} (not a host of a fleet instance: heal replaces "
                           "those only)")  # fmt: skip
        elif instance.instance in plan.fleet.drained:
            ignored.append(f"{f.host}: {f.why} (its instance {instance.instance} is drained)")
        elif any(r.host == f.host for r in plan.routers):
            ignored.append(f"{f.host}: {f.why} (it runs a router too, which a spare cannot "
                           "take over: give the router a host of its own, [router])")  # fmt: skip
        else:
            chosen.append(f)
    if not chosen:
        return HealChoice(ignored=tuple(ignored), failures=tuple(failures))
    # The last serving instance of a pool is never taken out.
    refusals = []
    for f in chosen:
        instance = members[f.host]
        pool = pools[instance.instance]
        serving = [
            i.instance
            for i in fleet_instances(plan)
            if pools[i.instance] == pool
            and i.instance not in down
            and i.instance not in plan.fleet.drained
            and not set(i.hosts) & failed
        ]
        if instance.instance not in down and not serving:
            refusals.append(
                f"{f.host} ({f.why}) serves in {instance.instance}, the last instance of "
                f"[{pool}] still serving: taking it out is an outage of [{pool}]"
            )
    before = recent(state, now, window_s)
    if len(before) + len(chosen) > max_hosts:
        earlier = ", ".join(f"{t.host} at {t.at}" for t in before) or "none"
        refusals.append(
            f"taking out {', '.join(f.host for f in chosen)} would make "
            f"{len(before) + len(chosen)} host(s) within {window_s} s (earlier: {earlier}); "
            f"at most {max_hosts} allowed"
        )
    if refusals:
        return HealChoice(
            ignored=tuple(ignored),
            failures=tuple(failures),
            refused="circuit breaker: " + "; ".join(refusals) + "; nothing was changed; fix: "
            "look at the hosts (k2provision status), then heal them by name when they are "
            "truly lost (k2provision heal INVENTORY HOST, --max-hosts to allow more)",
        )
    free = [s for s in plan.fleet.spares if s not in failed]
    replacements, stays_down, instances = [], [], []
    for f in chosen:
        name = members[f.host].instance
        if free:
            spare = free.pop(0)
            replacements.append(Replacement(f.host, spare, timestamp(now)))
            instances.append(name)
        else:
            in_use = ", ".join(f"{r.spare} for {r.host}" for r in state.replaced)
            stays_down.append(
                f"{name} stays down: {f.host} ({f.why}) has no spare to take its place "
                f"([spare]: {', '.join(plan.fleet.spares) or 'none free'}"
                f"{'; in use: ' + in_use if in_use else ''}); fix: add a prepared host to "
                f"[spare] and apply, or repair {f.host} and k2provision return it"
            )
    return HealChoice(
        replacements=tuple(replacements),
        instances=tuple(dict.fromkeys(instances)),
        stays_down=tuple(stays_down),
        ignored=tuple(ignored),
        failures=tuple(failures),
    )


def state_after(state: HostState, choice: HealChoice, window_s: int, now: datetime) -> HostState:
    """The state file once `choice` is recorded: its replacements added, its hosts logged as
    taken out (entries older than the window dropped)."""
    why = {f.host: f.why for f in choice.failures}
    return HostState(
        drained=state.drained,
        replaced=(*state.replaced, *choice.replacements),
        taken_out=(
            *recent(state, now, window_s),
            *(TakenOut(r.host, r.at, why.get(r.host, "")) for r in choice.replacements),
        ),
    )


def heal_lines(plan: Plan, choice: HealChoice) -> list[str]:
    """What the heal does, as it shows it before it runs."""
    by_host = {h: i for i in fleet_instances(plan) for h in i.hosts}
    why = {f.host: f.why for f in choice.failures}
    lines = [
        f"{r.host} ({why.get(r.host, 'named')}): {r.spare} takes its place in "
        f"{by_host[r.host].instance} (its ranks and role"
        f"{', and the master' if by_host[r.host].master == r.host else ''}); the instance "
        "starts there behind its health gates and joins every router"
        for r in choice.replacements
    ]
    return lines + list(choice.stays_down) + [f"left alone: {line}" for line in choice.ignored]
