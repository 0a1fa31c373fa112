"""Host work on a fleet, instance by instance: which hosts' work waits for the rolling pass,
and the order it runs in. Pure.

Host work is a change of the NVIDIA driver or fabric manager (it takes the GPUs and may
reboot the host: converge.host_work_changed, from the prepare stamp) with the rest of the
prepare phase and the checks that take the GPUs (validate: the NCCL test). On a host of a
fleet's instance that serves, none of it runs during an apply: the look defers it
(:func:`defers`), the apply's other phases go on, and
`k2provision apply` then runs the deferred work instance by instance
(playbooks/host_work.yml): out of every router, stopped within the drain timeout, the work
done and checked on its hosts, started behind its health gates and back into every router,
at most ``k2_max_unavailable`` instances of a pool at a time and never the last one serving
(:func:`host_work_waves`, the rolling change's rule). A router's host or a single instance's
is not deferred: the driver role refuses a driver change on a serving host there, naming
the outage.
"""

from __future__ import annotations

from collections.abc import Sequence

from k2provision.core.records import Plan
from k2provision.plan.rollout import RolloutWave, fleet_instances, rollout_waves

__all__ = ["DEFERRED_PHASES", "defers", "host_work_lines", "host_work_waves"]

DEFERRED_PHASES = ("prepare", "validate")
"""The phases a serving instance's host skips until its instance's turn."""


def defers(
    plan: Plan, host: str, changed: bool, serving: bool, skipped: Sequence[str] = ()
) -> bool:
    """Whether `host`'s host work waits for the rolling pass: it serves in an instance of a
    fleet (not drained), the driver's inputs changed since its prepare stamp (`changed`:
    converge.host_work_changed), and the run does prepare there (`skipped`: the phases the
    host's own look skips; the tags may leave prepare out)."""
    instance = next((i for i in fleet_instances(plan) if host in i.hosts), None)
    return (
        serving
        and changed
        and "prepare" not in skipped
        and instance is not None
        and instance.instance not in plan.fleet.drained
    )


def host_work_waves(plan: Plan, deferred: Sequence[str]) -> tuple[RolloutWave, ...]:
    """The instances holding the `deferred` hosts, in waves of the plan's
    fleet.max_unavailable, pool by pool, each pool keeping one instance serving."""
    instances = [i.instance for i in fleet_instances(plan) if set(i.hosts) & set(deferred)]
    return rollout_waves(plan, instances, plan.fleet.max_unavailable)


def host_work_lines(waves: Sequence[RolloutWave]) -> list[str]:
    """The rolling pass as `apply --check` shows it, one line per wave."""
    return [
        f"{n}. {', '.join(w.instances)} on {', '.join(w.hosts)}: out of every router, "
        "stopped, the host work (prepare, validate) done there, started behind its health "
        "gates, back in"
        for n, w in enumerate(waves, start=1)
    ]
