"""A fleet's rolling change: which instances a new spec replaces, and in what order. Pure.

The look (plan/converge.py) says, per host, which containers differ from the plan, as typed
differences (a re-specced container is ``Drift.OTHER_SPEC``; no decision reads their words). In a
fleet (a pool of several instances behind one router) a changed instance is replaced while
the others serve: :func:`changed_instances` groups the differing containers by the instance
that runs them, and :func:`rollout_waves` orders those instances into waves of at most
``k2_max_unavailable`` instances, pool by pool in the plan's order, never taking every
instance of a pool out at once. A single-instance plan has no rollout (an empty order): its
launch replaces what differs, as it always has.

Behind a front (plan/front.py) the routers roll too: :func:`router_waves` replaces each router
whose container runs another spec one at a time, before the instances roll. A draining
sglang-router still answers ``/health`` 200, so HAProxy would keep sending to it: each router
is first set to ``drain`` in HAProxy on every front host, and stops only when no request is in
flight through it there; its successor starts behind its health gate, must list every
worker of the plan healthy (a vLLM fleet's registered from the plan first), and only then
is set ``ready`` again. The other routers serve meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from k2provision.core.records import Plan, PoolPlan, RouterRef, registered_at_launch
from k2provision.plan.converge import Difference, Drift

__all__ = [
    "GenerationRollout",
    "RolloutWave",
    "RouterWave",
    "changed_instances",
    "disaggregated",
    "down_instances",
    "fleet_instances",
    "generation_lines",
    "generation_rollout",
    "mixing_warning",
    "pd_generation_groups",
    "pd_outage",
    "restarted_instances",
    "restarted_routers",
    "rollout_lines",
    "rollout_waves",
    "rolls",
    "router_lines",
    "router_waves",
    "start_first_lines",
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
    """The launch stages those containers and the processes exec'd into them start in, in
    order."""
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


@dataclass(frozen=True)
class RouterWave:
    """One router behind the front, replaced while the others serve: out of HAProxy on every
    front host, drained, replaced, checked, back."""

    host: str
    url: str
    """Its API (where its workers are listed, and a vLLM fleet's registered)."""
    server: str
    """Its server name in HAProxy's backend."""
    containers: tuple[str, ...]
    """Its containers on `host` (the router's)."""
    stages: tuple[int, ...]
    """The launch stages they start in."""
    front_hosts: tuple[str, ...]
    """The hosts whose HAProxy sends to it."""
    worker_urls: tuple[str, ...]
    """Every worker of the plan, as the router lists it: what it must list healthy before it
    takes requests again."""
    registrations: tuple[Mapping[str, str | int], ...] = ()
    """The ``POST /workers`` bodies of workers the router cannot name itself (a vLLM
    fleet's), registered with it before the check."""


def serving_members(plan: Plan) -> tuple[PoolPlan, ...]:
    """Every instance of every pool that serves, in the plan's order: all but the drained
    (FleetSettings.drained). What a router must list, and takes back after a change."""
    return tuple(
        i for pool in plan.pools for i in pool.members() if i.instance not in plan.fleet.drained
    )


def worker_body(instance: PoolPlan) -> dict[str, str | int]:
    """The instance's ``POST /workers`` body: how a router takes it (back)."""
    worker = instance.router_worker
    return dict(worker.body) if worker else {"url": instance.url}


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


def _down_containers(found: Sequence[Difference]) -> set[str]:
    """The containers a host's look finds missing or stopped (a spare's, a host's back from
    a reboot)."""
    return {
        d.name
        for d in found
        if d.subject == "container" and d.drift in (Drift.MISSING, Drift.STOPPED)
    }


def down_instances(plan: Plan, differences: Mapping[str, Sequence[Difference]]) -> tuple[str, ...]:
    """The fleet's serving instances a container of which is missing or stopped (an instance
    `k2provision heal` moved onto a spare, or one whose host came back), in the plan's order.
    Behind a front whose routers roll these start first, each as a wave: a new router must
    list every worker healthy before it takes requests."""
    return tuple(
        instance.instance
        for instance in serving_members(plan)
        if instance.instance in {i.instance for i in fleet_instances(plan)}
        and any(
            owned & _down_containers(differences.get(host, ()))
            for host, owned in _instance_containers(plan, instance).items()
        )
    )


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
    one pool at a time, in the plan's order. A wave takes at most N-1 of a pool's N serving
    instances out (the drained serve nothing), so each pool of several keeps one serving
    whatever `max_unavailable` says; a pool of one serving instance (a fleet's PD pool may be,
    or a pool whose others are drained) cannot, and its wave says so."""
    if max_unavailable < 1:
        raise ValueError(f"k2_max_unavailable={max_unavailable}: expected 1 or more")
    waves: list[RolloutWave] = []
    for pool in plan.pools:
        members = [i for i in pool.instances if i.instance in changed]
        serving = [i for i in pool.members() if i.instance not in plan.fleet.drained]
        width = max(1, min(max_unavailable, len(serving) - 1))
        alone = pool.name if len(serving) == 1 else ""
        for start in range(0, len(members), width):
            waves.append(_wave(plan, members[start : start + width], alone))
    return tuple(waves)


def instances_wave(plan: Plan, names: Sequence[str]) -> RolloutWave:
    """One wave of the fleet instances `names` (in the plan's order): what a drain takes out
    of the routers and stops, and a return starts and puts back."""
    return _wave(plan, [i for i in fleet_instances(plan) if i.instance in names], "")


def _wave(plan: Plan, group: Sequence[PoolPlan], alone_in_pool: str) -> RolloutWave:
    names = {i.instance for i in group}
    processes = [
        (host.name, p)
        for host in plan.hosts
        for p in host.processes
        if p.instance is not None and p.instance.name in names
    ]
    # Containers are started by their main command; a process exec'd into one of them (an
    # mpirun world's launch on its rank 0) is started in its own stage, inside them.
    ranks = [(host, p) for host, p in processes if not p.exec_in]
    containers: dict[str, tuple[str, ...]] = {}
    for host, process in ranks:
        containers[host] = (*containers.get(host, ()), process.container)

    def alone(instance: PoolPlan) -> bool:
        return instance.router_worker is None or instance.router_worker.answers_alone

    return RolloutWave(
        instances=tuple(i.instance for i in group),
        urls=tuple(i.url for i in group),
        hosts=tuple(containers),
        containers=containers,
        stages=tuple(sorted({p.stage for _, p in processes})),
        workers=tuple(worker_body(i) for i in group),
        smoke_urls=tuple(i.url for i in group if alone(i)),
        alone_in_pool=alone_in_pool,
        down_s=max(
            (i.router_worker.peers_forget_s for i in group if i.router_worker is not None),
            default=0,
        ),
    )


def _router_containers(plan: Plan, host: str) -> tuple[str, ...]:
    """The router's containers on `host`: its processes that join no instance (no GPUs)."""
    return tuple(p.container for p in plan.host(host).processes if not (p.gpus or p.exec_in))


def _router_waves(
    plan: Plan, rolled: Callable[[str, tuple[str, ...]], bool]
) -> tuple[RouterWave, ...]:
    """A wave for each router behind the plan's front that `rolled(host, containers)` picks,
    in the plan's order; () without a front."""
    if plan.front is None:
        return ()
    members = serving_members(plan)
    registrations = registered_at_launch(plan.pools)
    waves = []
    for router in plan.front.routers:
        containers = _router_containers(plan, router.host)
        if not containers or not rolled(router.host, containers):
            continue
        stages = {p.stage for p in plan.host(router.host).processes if p.container in containers}
        waves.append(
            RouterWave(
                host=router.host,
                url=router.url,
                server=router.server,
                containers=containers,
                stages=tuple(sorted(stages)),
                front_hosts=tuple(h.name for h in plan.front.hosts),
                worker_urls=tuple(i.url for i in members),
                registrations=registrations,
            )
        )
    return tuple(waves)


def router_waves(
    plan: Plan, differences: Mapping[str, Sequence[Difference]]
) -> tuple[RouterWave, ...]:
    """The routers behind the plan's front whose container the look found running another
    spec, one wave each, in the plan's order; () without a front (one router is replaced in
    place by the launch)."""
    return _router_waves(
        plan,
        lambda host, containers: bool(
            set(containers) & _respecced_containers(differences.get(host, ()))
        ),
    )


def restarted_routers(
    plan: Plan, containers: Mapping[str, Sequence[str]]
) -> tuple[RouterWave, ...]:
    """The routers behind the plan's front a restart of `containers` (host -> names)
    recreates, one wave each; () without a front."""
    return _router_waves(plan, lambda host, names: bool(set(names) & set(containers.get(host, ()))))


def router_lines(waves: Sequence[RouterWave], first: int = 1) -> list[str]:
    """The routers' order as `apply --check` shows it, one line per router, numbered from
    `first`."""
    return [
        f"{n}. router on {w.host}: out of HAProxy on {', '.join(w.front_hosts)}, drained, "
        f"replaced, lists {len(w.worker_urls)} workers healthy, back in"
        for n, w in enumerate(waves, start=first)
    ]


def start_first_lines(waves: Sequence[RolloutWave], first: int = 1) -> list[str]:
    """The instances started before the routers roll, as `apply --check` shows them."""
    return [
        f"{n}. {', '.join(w.instances)} on {', '.join(w.hosts)}: not running; started "
        "behind its health gates, checked, into every router, before the routers roll (a "
        "new router lists it)"
        for n, w in enumerate(waves, start=first)
    ]


def rollout_lines(waves: Sequence[RolloutWave], first: int = 1) -> list[str]:
    """The rollout order as `apply --check` shows it, one line per wave, numbered from
    `first` (after the routers' lines)."""
    lines = []
    for n, w in enumerate(waves, start=first):
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


# ---------------------------------------------------------------- PD generations

WEIGHT_UNIT = 10
"""HAProxy weight per prefill+decode group a router serves during a generation change."""


@dataclass(frozen=True)
class GenerationRollout:
    """A PD fleet's change of both pools behind a front, without a request ever prefilled by
    one generation and decoded by the other.

    sglang-router pairs any prefill it lists with any decode it lists, so each router holds
    one generation at a time: the last router of the front (`new_router`) is taken out of
    HAProxy and cleared of the changed instances; then the changed instances move in
    prefill+decode `groups` (the pools' ratio kept): out of the other routers (`old_routers`),
    replaced, into the new router alone, which goes back into HAProxy after the first group,
    weighted by the groups each side serves (`weights`). Before the last group leaves them,
    the old routers leave HAProxy; at the end each takes every worker of the new generation
    and comes back. Instances that did not change serve in every router throughout.
    """

    new_router: RouterRef
    old_routers: tuple[RouterRef, ...]
    front_hosts: tuple[str, ...]
    changed_urls: tuple[str, ...]
    """The changed instances' URLs: what the new router holds none of at the start."""
    groups: tuple[RolloutWave, ...]
    weights: tuple[tuple[tuple[str, int], ...], ...]
    """After each group but the last: (HAProxy server, weight) of every router."""
    workers: tuple[Mapping[str, str | int], ...]
    """Every worker's ``POST /workers`` body, in the plan's order."""
    worker_urls: tuple[str, ...]


def disaggregated(plan: Plan) -> bool:
    """Whether the plan serves from a prefill and a decode pool."""
    return {"prefill", "decode"} <= {p.name for p in plan.pools}


def _pool_changed(plan: Plan, pool: str, changed: Sequence[str]) -> list[PoolPlan]:
    return [i for p in plan.pools if p.name == pool for i in p.instances if i.instance in changed]


def _chunks(items: Sequence[PoolPlan], count: int) -> list[list[PoolPlan]]:
    """`items` in `count` consecutive chunks as even as can be."""
    return [
        list(items[n * len(items) // count : (n + 1) * len(items) // count]) for n in range(count)
    ]


def pd_generation_groups(plan: Plan, changed: Sequence[str]) -> int:
    """How many prefill+decode groups a change of `changed` instances moves in: 0 when it is
    no PD change of both pools (a change of one pool pairs every request within one
    generation of the other), else the smaller pool's changed instances."""
    if not disaggregated(plan):
        return 0
    prefill = _pool_changed(plan, "prefill", changed)
    decode = _pool_changed(plan, "decode", changed)
    return min(len(prefill), len(decode))


def generation_rollout(plan: Plan, changed: Sequence[str]) -> GenerationRollout | None:
    """The generation-safe order of a PD change of both pools (None when the change is none,
    or the plan cannot keep generations apart: one router, or one group)."""
    count = pd_generation_groups(plan, changed)
    if count < 2 or plan.front is None or len(plan.front.routers) < 2:
        return None
    prefill = _chunks(_pool_changed(plan, "prefill", changed), count)
    decode = _chunks(_pool_changed(plan, "decode", changed), count)
    groups = tuple(_wave(plan, [*p, *d], "") for p, d in zip(prefill, decode, strict=True))
    *old, new = plan.front.routers
    weights = tuple(
        (
            *((r.server, WEIGHT_UNIT * (count - moved)) for r in old),
            (new.server, WEIGHT_UNIT * moved * len(old)),
        )
        for moved in range(1, count)
    )
    members = serving_members(plan)
    return GenerationRollout(
        new_router=new,
        old_routers=tuple(old),
        front_hosts=tuple(h.name for h in plan.front.hosts),
        changed_urls=tuple(u for g in groups for u in g.urls),
        groups=groups,
        weights=weights,
        workers=tuple(worker_body(i) for i in members),
        worker_urls=tuple(i.url for i in members),
    )


def pd_outage(plan: Plan, differences: Mapping[str, Sequence[Difference]]) -> str:
    """What replacing a single-instance PD plan's changed servers costs ("" when nothing of
    it runs another spec, or the plan is no single-instance PD): the launch replaces the only
    prefill and decode instances in place, so the endpoint answers nothing until both pass
    their gates again, and a prefill of one spec may meet a decode of the other meanwhile."""
    if not disaggregated(plan) or rolls(plan):
        return ""
    engine_hosts = {h for pool in plan.pools for h in pool.hosts}
    changed = sorted(h for h in engine_hosts if _respecced_containers(differences.get(h, ())))
    if not changed:
        return ""
    return (
        f"this change replaces the only prefill and decode instance ({', '.join(changed)} run "
        "another spec) in place: the endpoint answers nothing until both pass their health "
        "gates again; fix: apply --yes (k2_accept_outage=true) to accept the outage, or make "
        "it a fleet (k2_prefill_instances/k2_decode_instances 2 or more, two [router] hosts "
        "and k2_front_address) whose changes keep serving"
    )


def mixing_warning(plan: Plan, changed: Sequence[str]) -> str:
    """What a PD change of both pools risks when :func:`generation_rollout` cannot keep the
    generations apart ("" when it can, or when nothing risks it)."""
    count = pd_generation_groups(plan, changed)
    if count == 0 or generation_rollout(plan, changed) is not None:
        return ""
    if count == 1:
        return (
            "one prefill and one decode instance change: no group serves while the other "
            "moves, so requests during the change fail or pair generations; fix: add instances, "
            "or stop taking traffic for the change"
        )
    return (
        "prefill and decode instances change behind one router, which pairs any prefill with "
        "any decode: during the rollout a request may be prefilled by one generation and "
        "decoded by the other; fix: two or more [router] hosts and k2_front_address (the "
        "front), which roll PD changes generation by generation"
    )


def generation_lines(rollout: GenerationRollout, first: int = 1) -> list[str]:
    """The generation-safe order as `apply --check` shows it, numbered from `first`."""
    new = rollout.new_router.host
    old = ", ".join(r.host for r in rollout.old_routers)
    fronts = ", ".join(rollout.front_hosts)
    lines = [
        f"{first}. the router on {new} (the new generation's): out of HAProxy on {fronts}, "
        f"drained, the {len(rollout.changed_urls)} changing instances taken out of it"
    ]
    last = len(rollout.groups)
    for n, group in enumerate(rollout.groups, start=1):
        step = f"{first + n}. {', '.join(group.instances)} on {', '.join(group.hosts)}: "
        if n == last:
            step += f"the router(s) on {old} out of HAProxy first; "
        down = f", down {group.down_s} s" if group.down_s else ""
        step += (
            f"out of the router(s) on {old}, drained{down}, replaced, into the router on {new} only"
        )
        if n < last:
            weights = ", ".join(f"{s} {w}" for s, w in rollout.weights[n - 1])
            step += f"; HAProxy weights {weights}" + (
                f" ({new} back into HAProxy)" if n == 1 else ""
            )
        lines.append(step)
    lines.append(
        f"{first + last + 1}. the router(s) on {old}: every worker of the new generation, "
        "listed healthy, back into HAProxy; every router's weight as before"
    )
    return lines
