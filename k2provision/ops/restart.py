"""What `restart` restarts: the named hosts' processes, widened to the instances they belong to.

Pure: a plan and names in, the restart set out. The ranks of one serving pool (a multi-node
TP or DP+EP instance, a Ray cluster, an mpirun world, one PD pool) only work together: the
engine's collectives are set up once at start, so a rank that comes back alone joins nothing.
Naming one host of a pool therefore restarts every rank of that pool, in the plan's stage
order. A process that runs without GPUs (the PD router) belongs to no instance and restarts
alone; an exec'd process restarts with the container it runs in. The CLI shows the set with
its reasons before anything happens; playbooks/restart.yml reads it through the
k2.cluster.restart_set filter, so plain ansible-playbook restarts the same processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k2provision.core.records import Plan, PoolPlan, Process
from k2provision.errors import K2Error
from k2provision.plan.shapes import sizes_text

NAMED = "named"


@dataclass(frozen=True)
class RestartStep:
    """One process to restart, on one host, and why it is in the set."""

    host: str
    process: str
    container: str
    stage: int
    exec_in: bool
    reason: str


@dataclass(frozen=True)
class RestartSet:
    """The processes a restart recreates, in stage order, and the names it was asked for."""

    named: tuple[str, ...]
    """The hosts asked for (pools and `router` resolved), in the plan's order."""
    hosts: tuple[str, ...]
    """Every host with something to restart, in the plan's order."""
    steps: tuple[RestartStep, ...]

    def containers(self, host: str) -> tuple[str, ...]:
        """The containers recreated on `host` (an exec'd process restarts with its container)."""
        return tuple(dict.fromkeys(s.container for s in self.steps if s.host == host))

    @property
    def widened(self) -> tuple[RestartStep, ...]:
        """Steps on hosts nobody named: what the instance rule added."""
        return tuple(s for s in self.steps if s.reason != NAMED)


def _joins_instance(process: Process) -> bool:
    """An engine rank (on GPUs, or exec'd into one) is part of its pool's instance."""
    return process.gpus or process.exec_in


def _selected(plan: Plan, names: Sequence[str]) -> set[tuple[str, str]]:
    """(host, process) pairs `names` select: a host's every process, a pool's engine ranks,
    `router` the processes without GPUs (the PD router)."""
    hosts = {h.name: h for h in plan.hosts}
    pools: dict[str, tuple[str, ...]] = {p.name: p.hosts for p in plan.pools}
    # A fleet's instances are named too (decode-2): a pool's engine ranks, one instance's.
    pools.update({i.instance: i.hosts for p in plan.pools for i in p.instances})
    routers = {(h.name, p.name) for h in plan.hosts for p in h.processes if not _joins_instance(p)}
    chosen: set[tuple[str, str]] = set()
    unknown: list[str] = []
    for name in names:
        if name in hosts:
            chosen.update((name, p.name) for p in hosts[name].processes)
        elif name in pools:
            chosen.update(
                (h, p.name) for h in pools[name] for p in hosts[h].processes if _joins_instance(p)
            )
        elif name == "router" and routers:
            chosen.update(routers)
        else:
            unknown.append(name)
    if unknown:
        choices = ", ".join([*hosts, *pools, *(["router"] if routers else [])])
        raise K2Error(
            f"restart: {name!r} (--limit, or k2_restart_hosts) is not a host or pool of the "
            f"plan; expected one of: {choices}; fix: name hosts from the inventory "
            "(comma-separated) or a pool"
            for name in unknown
        )
    return chosen


def _pool_of(plan: Plan, host: str) -> PoolPlan | None:
    """The instance whose ranks `host` runs: its pool, or in a fleet its instance alone."""
    return next((i for p in plan.pools for i in p.members() if host in i.hosts), None)


def restart_set(plan: Plan, names: Sequence[str] | None = None) -> RestartSet:
    """The processes restarting `names` (hosts, pools or `router`; None: every host) restarts.

    Raises K2Error naming each name the plan does not know, or when none is given.
    """
    wanted = [n.strip() for n in names or () if n.strip()]
    if names is not None and not wanted:
        raise K2Error(
            [
                "restart: no host named (--limit, or k2_restart_hosts); expected hosts or pools "
                "of the plan, comma-separated; fix: name them, or leave --limit out to restart "
                "every host"
            ]
        )
    drained = plan.fleet.drained_hosts
    if named_drained := [n for n in wanted if n in drained]:
        raise K2Error(
            [
                f"restart: {', '.join(named_drained)} drained (instances "
                f"{', '.join(plan.fleet.drained)}); expected serving hosts; fix: k2provision "
                f"return {' '.join(named_drained)} INVENTORY brings them back"
            ]
        )
    every = [h.name for h in plan.hosts]
    chosen = _selected(plan, wanted if names is not None else every)
    # A drained host's processes stay stopped, whatever names a pool it is in.
    chosen = {(host, name) for host, name in chosen if host not in drained}
    named_hosts = {host for host, _ in chosen}
    widen: dict[str, str] = {}  # host -> why its instance's ranks restart too
    for host in plan.hosts:
        pool = _pool_of(plan, host.name)
        if host.name in drained:
            continue
        joins = any((host.name, p.name) in chosen and _joins_instance(p) for p in host.processes)
        if pool is None or len(pool.hosts) < 2 or not joins:
            continue
        why = (
            f"same {pool.instance or pool.name} instance as {host.name} "
            f"({sizes_text(pool.parallel)} over "
            f"{', '.join(pool.hosts)}): its ranks only work together"
        )
        for other in pool.hosts:
            widen.setdefault(other, why)
    steps: list[RestartStep] = []
    for host in plan.hosts:
        for proc in host.processes:
            if (host.name, proc.name) in chosen:
                reason = NAMED
            elif host.name in widen and _joins_instance(proc):
                reason = widen[host.name]
            else:
                continue
            steps.append(
                RestartStep(
                    host=host.name,
                    process=proc.name,
                    container=proc.container,
                    stage=proc.stage,
                    exec_in=proc.exec_in,
                    reason=reason,
                )
            )
    order = {h.name: i for i, h in enumerate(plan.hosts)}
    hosts = tuple(h.name for h in plan.hosts if any(s.host == h.name for s in steps))
    steps.sort(key=lambda s: (s.stage, order[s.host]))
    named = tuple(h for h in order if h in named_hosts)
    return RestartSet(named=named, hosts=hosts, steps=tuple(steps))
