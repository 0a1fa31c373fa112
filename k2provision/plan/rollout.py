"""A fleet's rolling change: which instances a new spec replaces, and in what order. Pure.

The look (plan/converge.py) says, per host, which containers differ from the plan, as typed
differences (a re-specced container is ``Drift.OTHER_SPEC``; no decision reads their words). In a
fleet (a pool of several instances behind one router) a changed instance is replaced while
the others serve: :func:`changed_instances` groups the differing containers by the instance
that runs them, and :func:`rollout_waves` orders those instances into waves of at most
``k2_max_unavailable`` instances, pool by pool in the plan's order, never taking every
instance of a pool out at once. A single-instance plan has no rollout (an empty order): its
launch replaces what differs, as it always has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from k2provision.core.records import Plan, PoolPlan
from k2provision.plan.converge import Difference, Drift

__all__ = [
    "RolloutWave",
    "changed_instances",
    "fleet_instances",
    "restarted_instances",
    "rollout_lines",
    "rollout_waves",
    "rolls",
]


@dataclass(frozen=True)
class RolloutWave:
    """Instances replaced together: out of the router, drained, started, smoke-tested, back."""

    instances: tuple[str, ...]
    urls: tuple[str, ...]
    """Each instance's URL, as the router lists its worker."""
    hosts: tuple[str, ...]
    """Every host the wave's instances run on, in the plan's order."""
    containers: Mapping[str, tuple[str, ...]]
    """host -> the containers of the wave's engine ranks there (what is drained and replaced)."""
    stages: tuple[int, ...]
    """The launch stages those containers start in, in order."""
    workers: tuple[Mapping[str, str | int], ...] = ()
    """Each instance's ``POST /workers`` body: how the router takes it back."""
    smoke_urls: tuple[str, ...] = ()
    """The URLs of the instances that answer a chat completion alone (smoke-tested directly;
    one PD half does not, so its checks are its health gates and the router's)."""
    alone_in_pool: str = ""
    """The pool the wave takes wholly out (its only instance), else empty: meanwhile the
    router has no worker of that pool, and requests needing it wait or fail."""
    down_s: int = 0
    """Seconds between stopping the wave's containers and starting the new ones (or, on a
    rollback, the previous ones): the longest its instances' peers take to drop what they
    cached of them (WorkerRegistration.peers_forget_s; a PD prefill instance's decode peers)."""


def fleet_instances(plan: Plan) -> tuple[PoolPlan, ...]:
    """Every instance of every pool that holds several, in the plan's order (empty: no fleet)."""
    return tuple(i for pool in plan.pools for i in pool.instances)


def _instance_containers(plan: Plan, instance: PoolPlan) -> dict[str, set[str]]:
    """host -> the containers of the instance's engine ranks there (not the router's)."""
    return {
        host.name: {
            p.container
            for p in host.processes
            if p.instance is not None and p.instance.name == instance.instance
        }
        for host in plan.hosts
        if host.name in instance.hosts
    }


def _respecced_containers(found: Sequence[Difference]) -> set[str]:
    """The containers a host's look finds running another spec. A missing or stopped
    container serves nothing: the launch starts it."""
    return {d.name for d in found if d.subject == "container" and d.drift is Drift.OTHER_SPEC}


def changed_instances(
    plan: Plan, differences: Mapping[str, Sequence[Difference]]
) -> tuple[str, ...]:
    """The fleet's instances a container of which runs another spec than the plan's, in the
    plan's order.

    `differences` is, per host, the look's launch differences (k2_converge.found.launch); a
    host the look did not answer for is left out of it.
    """
    changed = []
    for instance in fleet_instances(plan):
        owned = _instance_containers(plan, instance)
        if any(
            owned[host] & _respecced_containers(differences.get(host, ()))
            for host in instance.hosts
        ):
            changed.append(instance.instance)
    return tuple(changed)


def rolls(plan: Plan) -> bool:
    """Whether the plan's instances are replaced one wave at a time behind the router: a
    fleet (several instances in a pool)."""
    return len(fleet_instances(plan)) > 1


def restarted_instances(plan: Plan, containers: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The fleet's instances a restart of `containers` (host -> names) recreates, in the plan's
    order: those whose engine containers it names. Empty when the plan does not roll."""
    if not rolls(plan):
        return ()
    return tuple(
        instance.instance
        for instance in fleet_instances(plan)
        if any(
            owned & set(containers.get(host, ()))
            for host, owned in _instance_containers(plan, instance).items()
        )
    )


def rollout_waves(
    plan: Plan, changed: Sequence[str], max_unavailable: int
) -> tuple[RolloutWave, ...]:
    """The order `changed` instances are replaced in: waves of at most `max_unavailable`,
    one pool at a time, in the plan's order. A wave takes at most N-1 of a pool's N instances
    out, so each pool of several keeps one serving whatever `max_unavailable` says; a pool of
    one instance (a fleet's PD pool may be) cannot, and its wave says so."""
    if max_unavailable < 1:
        raise ValueError(f"k2_max_unavailable={max_unavailable}: expected 1 or more")
    waves: list[RolloutWave] = []
    for pool in plan.pools:
        members = [i for i in pool.instances if i.instance in changed]
        width = max(1, min(max_unavailable, len(pool.instances) - 1))
        alone = pool.name if len(pool.instances) == 1 else ""
        for start in range(0, len(members), width):
            waves.append(_wave(plan, members[start : start + width], alone))
    return tuple(waves)


def _wave(plan: Plan, group: Sequence[PoolPlan], alone_in_pool: str) -> RolloutWave:
    names = {i.instance for i in group}
    ranks = [
        (host.name, p)
        for host in plan.hosts
        for p in host.processes
        if p.instance is not None and p.instance.name in names and not p.exec_in
    ]
    containers: dict[str, tuple[str, ...]] = {}
    for host, process in ranks:
        containers[host] = (*containers.get(host, ()), process.container)

    def body(instance: PoolPlan) -> dict[str, str | int]:
        worker = instance.router_worker
        return dict(worker.body) if worker else {"url": instance.url}

    def alone(instance: PoolPlan) -> bool:
        return instance.router_worker is None or instance.router_worker.answers_alone

    return RolloutWave(
        instances=tuple(i.instance for i in group),
        urls=tuple(i.url for i in group),
        hosts=tuple(containers),
        containers=containers,
        stages=tuple(sorted({p.stage for _, p in ranks})),
        workers=tuple(body(i) for i in group),
        smoke_urls=tuple(i.url for i in group if alone(i)),
        alone_in_pool=alone_in_pool,
        down_s=max(
            (i.router_worker.peers_forget_s for i in group if i.router_worker is not None),
            default=0,
        ),
    )


def rollout_lines(waves: Sequence[RolloutWave]) -> list[str]:
    """The rollout order as `apply --check` shows it, one line per wave."""
    lines = []
    for n, w in enumerate(waves, start=1):
        checked = "smoke-tested" if len(w.smoke_urls) == len(w.instances) else "health-checked"
        down = (
            f", down {w.down_s} s (until its peers drop what they cached of it)" if w.down_s else ""
        )
        line = (
            f"{n}. {', '.join(w.instances)} on {', '.join(w.hosts)}: out of the router, "
            f"drained{down}, replaced, {checked}, back in"
        )
        if w.alone_in_pool:
            line += (
                f" (the only instance of [{w.alone_in_pool}]: requests that need it wait or "
                "fail meanwhile)"
            )
        lines.append(line)
    return lines
