"""Filters that turn a registered plan into per-host facts and docker argv (k2.cluster.*)."""

from __future__ import annotations

import json
from typing import Any

from k2provision.ansible.plan_parts import NotInPlanError, host_part
from k2provision.core.inventory import plain_value
from k2provision.core.records import (
    ContainerOptions,
    Plan,
    Process,
    RouterRef,
    registered_at_launch,
)
from k2provision.errors import K2Error
from k2provision.ops.restart import restart_set as plan_restart_set
from k2provision.ops.rollout import smoke_reason, start_reason
from k2provision.plan.canary import CanaryRollout, canary_lines, canary_rollout, canary_verdict
from k2provision.plan.containers import LABEL_HASH, exec_argv, run_argv, spec_hash
from k2provision.plan.converge import (
    Difference,
    InstanceRepairs,
    everywhere,
    file_mode,
    instance_repairs,
    whole_instances,
)
from k2provision.plan.host_questions import container_key, container_states, hq, state_question
from k2provision.plan.host_work import defers, host_work_lines, host_work_waves
from k2provision.plan.rollout import (
    GenerationRollout,
    RolloutWave,
    RouterWave,
    changed_instances,
    down_instances,
    generation_lines,
    generation_rollout,
    instances_wave,
    mixing_warning,
    pd_outage,
    restarted_instances,
    restarted_routers,
    rollout_lines,
    rollout_waves,
    router_lines,
    router_waves,
    start_first_lines,
)


def host_plan(plan: dict[str, Any], host: str) -> dict[str, Any]:
    """The part of `plan` (as registered by k2.cluster.plan) that belongs to `host`."""
    try:
        return host_part(plan, host)
    except NotInPlanError as error:
        raise ValueError(error.problems[0]) from None


def _owner_files(
    process: dict[str, Any], plan: dict[str, Any], host: str | None = None
) -> dict[str, str]:
    """The rendered files of the host that runs `process`: `host`'s when named (identical
    processes on several hosts, such as every rank's sshd in an mpirun world, differ only by
    their host's files), else the one host whose processes include it."""
    owners = [
        entry
        for entry in plan["hosts"]
        if (host is None or entry["name"] == host) and any(p == process for p in entry["processes"])
    ]
    if len(owners) == 1:
        return dict(owners[0]["files"])
    if not owners:
        raise ValueError(f"process {process.get('name')} is in no host of the plan named {host}")
    names = ", ".join(entry["name"] for entry in owners)
    raise ValueError(f"process {process.get('name')} runs on {names}: name the host")


def docker_run_argv(
    process: dict[str, Any], plan: dict[str, Any], host: str | None = None
) -> list[str]:
    """The `docker run` argv for a planned process (of `host`, where several run it)."""
    proc = Process.model_validate(process)
    options = ContainerOptions.model_validate(plan["container"])
    return run_argv(options, proc, plan["config_dir"], _owner_files(process, plan, host))


def docker_spec_hash(process: dict[str, Any], plan: dict[str, Any], host: str | None = None) -> str:
    """The label value a correctly configured container of this process carries."""
    proc = Process.model_validate(process)
    options = ContainerOptions.model_validate(plan["container"])
    return spec_hash(options, proc, _owner_files(process, plan, host))


def state_questions(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """The registry's questions of whether each process runs (its container's state, or an
    exec'd process's liveness), by key ``state NAME``: what k2.cluster.host_ask takes."""
    return {
        f"state {p['name']}": hq.question_json(state_question(Process.model_validate(p)))
        for p in processes
    }


def container_questions(names: list[str]) -> dict[str, Any]:
    """The registry's question of each named container's state, by key ``container NAME``."""
    return {
        container_key(str(name)): hq.question_json(hq.ContainerQuestion(str(name), LABEL_HASH))
        for name in names
    }


def found_containers(answers: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers k2.cluster.host_ask found of `container_questions`' keys, each as
    ``{name, image, running}``."""
    return [
        {"name": name, "image": state.image, "running": state.running}
        for name, state in sorted(container_states(answers).items())
        if state.found
    ]


def _state(answers: dict[str, Any], process: dict[str, Any]) -> Any:
    data = answers.get(f"state {process['name']}")
    if process.get("exec_in"):
        return hq.record_from_json(hq.ExecState, data)
    return hq.record_from_json(hq.ContainerState, data)


def stale_containers(
    processes: list[dict[str, Any]],
    answers: dict[str, Any],
    plan: dict[str, Any],
    host: str | None = None,
    recreate: list[str] | None = None,
) -> list[Any]:
    """Processes whose container is missing, stopped, was made from another spec, or is named
    in `recreate` (a restart). `answers`: k2.cluster.host_ask's to `state_questions`, on
    `host` (the inventory host the tasks run for)."""
    stale = []
    for process in processes:
        state = _state(answers, process)
        if (
            not isinstance(state, hq.ContainerState)
            or not state.running
            or state.spec_hash != docker_spec_hash(process, plan, host)
            or process["container"] in (recreate or ())
        ):
            stale.append(process)
    return stale


def stopped_processes(
    processes: list[dict[str, Any]], answers: dict[str, Any]
) -> list[dict[str, Any]]:
    """The exec'd processes of `processes` that do not run (not started yet, or exited), from
    k2.cluster.host_ask's answers to `state_questions`."""
    return [
        p
        for p in processes
        if not isinstance(state := _state(answers, p), hq.ExecState) or state.state != "running"
    ]


def file_entries(files: dict[str, str], paths: list[str]) -> list[dict[str, str]]:
    """The entries k2.cluster.write_files takes for `paths` of a host's rendered `files`."""
    return [{"path": p, "content": files[p], "mode": file_mode(p)} for p in paths]


def docker_exec_argv(process: dict[str, Any], config_dir: str) -> list[str]:
    """The `docker exec` argv for a process started inside a running container."""
    return exec_argv(Process.model_validate(process), config_dir)


def plan_stages(plan: dict[str, Any]) -> list[int]:
    """Distinct process stages of the whole plan, in start order."""
    return sorted({p.stage for h in Plan.model_validate(plan).hosts for p in h.processes})


def stage_containers_on(plan: dict[str, Any], stage: Any, hosts: list[str]) -> list[dict[str, str]]:
    """The containers of `stage` on `hosts`, as {host, container} pairs in plan order: what a
    failed stage stops on the hosts its run left alone (their part was already converged)."""
    wanted = set(hosts)
    return [
        {"host": h.name, "container": p.container}
        for h in Plan.model_validate(plan).hosts
        if h.name in wanted
        for p in h.processes
        if p.stage == int(stage) and not p.exec_in
    ]


def restart_set(plan: dict[str, Any], names: Any = None) -> dict[str, Any]:
    """What restarting `names` restarts (k2provision/ops/restart.py): {hosts: [...], containers:
    {host: [container, ...]}}. `names` is a comma-separated string or a list of hosts, pools or
    `router`; None or empty: every host."""
    if isinstance(names, str):
        names = names.split(",")
    wanted = [str(n) for n in names or ()] or None
    try:
        chosen = plan_restart_set(Plan.model_validate(plan), wanted)
    except K2Error as error:
        raise ValueError("; ".join(error.problems)) from None
    return {
        "hosts": list(chosen.hosts),
        "containers": {host: list(chosen.containers(host)) for host in chosen.hosts},
    }


def _wave_json(w: RolloutWave) -> dict[str, Any]:
    return {
        "instances": list(w.instances),
        "urls": list(w.urls),
        "hosts": list(w.hosts),
        "containers": {host: list(names) for host, names in w.containers.items()},
        "stages": list(w.stages),
        "workers": [dict(body) for body in w.workers],
        "smoke_urls": list(w.smoke_urls),
        "down_s": w.down_s,
    }


def _router_json(r: RouterRef) -> dict[str, Any]:
    return {"host": r.host, "url": r.url, "server": r.server}


def _generation_json(g: GenerationRollout | None) -> dict[str, Any] | None:
    """A generation-safe PD change as the k2_rollout role reads it (None: none)."""
    if g is None:
        return None
    return {
        "new_router": _router_json(g.new_router),
        "old_routers": [_router_json(r) for r in g.old_routers],
        "front_hosts": list(g.front_hosts),
        "changed_urls": list(g.changed_urls),
        "groups": [_wave_json(w) for w in g.groups],
        "weights": [[{"server": s, "weight": w} for s, w in step] for step in g.weights],
        "workers": [dict(body) for body in g.workers],
        "worker_urls": list(g.worker_urls),
    }


def _canary_json(c: CanaryRollout | None) -> dict[str, Any] | None:
    """A canary as the k2_rollout role reads it (None: none)."""
    if c is None:
        return None
    return {
        "router": _router_json(c.router),
        "others": [_router_json(r) for r in c.others],
        "front_hosts": list(c.front_hosts),
        "wave": _wave_json(c.wave),
        "weights": [{"server": s, "weight": w} for s, w in c.weights],
        "worker_urls": list(c.worker_urls),
        "workers": [dict(body) for body in c.workers],
        "settings": c.settings.model_dump(mode="json"),
    }


def _rollout_document(
    waves: tuple[RolloutWave, ...],
    routers: tuple[RouterWave, ...] = (),
    generation: GenerationRollout | None = None,
    warning: str = "",
    canary: CanaryRollout | None = None,
    first: tuple[RolloutWave, ...] = (),
) -> dict[str, Any]:
    """Rollout waves as the k2_rollout role reads them: {first: [...], routers: [...],
    generation: {...} or None, canary: {...} or None, waves: [...], lines: [...], warning},
    the lines of the instances started first, then the routers', the generation's, the
    canary's, then the other waves'."""
    lines = start_first_lines(first)
    lines += router_lines(routers, first=len(lines) + 1)
    if generation is not None:
        lines += generation_lines(generation, first=len(lines) + 1)
    if canary is not None:
        lines += canary_lines(canary, first=len(lines) + 1)
    lines += rollout_lines(waves, first=len(lines) + 1)
    return {
        # Each router wave carries a wave's keys too (instances names it, hosts, containers,
        # stages), so the role starts and rolls it back with the same tasks.
        "routers": [
            {
                "instances": [f"the router on {r.host}"],
                "hosts": [r.host],
                "containers": {r.host: list(r.containers)},
                "stages": list(r.stages),
                "down_s": 0,
                "url": r.url,
                "server": r.server,
                "front_hosts": list(r.front_hosts),
                "worker_urls": list(r.worker_urls),
                "registrations": [dict(body) for body in r.registrations],
            }
            for r in routers
        ],
        "first": [_wave_json(w) for w in first],
        "generation": _generation_json(generation),
        "canary": _canary_json(canary),
        "waves": [_wave_json(w) for w in waves],
        "lines": lines,
        "warning": warning,
    }


def _wave_width(plan: Plan, max_unavailable: Any) -> int:
    """The instances a wave replaces at once: the plan's, unless the caller names a number."""
    return plan.fleet.max_unavailable if max_unavailable is None else int(max_unavailable)


def rollout_order(
    plan: dict[str, Any], looked: dict[str, Any], max_unavailable: Any = None, canary: Any = None
) -> dict[str, Any]:
    """A fleet's rolling change (k2provision/plan/rollout.py): {waves: [{instances, urls,
    hosts}, ...], lines: [...], routers, generation, canary, warning, outage}. `looked` is
    each host's k2_converge (the look's answer); no waves for a single instance or when no
    instance differs. Waves are as wide as the plan's fleet.max_unavailable unless
    `max_unavailable` says otherwise; the first is a canary (plan/canary.py) at the plan's
    fleet.canary.percent, or at `canary` per cent where the run names one (apply --canary)."""
    parsed = Plan.model_validate(plan)
    launch = _launch_found(looked)
    routers = router_waves(parsed, launch)
    # Behind a front whose routers roll, an instance that does not run (healed onto a spare,
    # back from a reboot) starts first: a new router must list every worker healthy.
    down = down_instances(parsed, launch) if routers else ()
    started = rollout_waves(parsed, down, _wave_width(parsed, max_unavailable))
    changed = tuple(i for i in changed_instances(parsed, launch) if i not in down)
    generation = generation_rollout(parsed, changed)
    moved = {i for g in generation.groups for i in g.instances} if generation else set()
    waves = rollout_waves(
        parsed, [i for i in changed if i not in moved], _wave_width(parsed, max_unavailable)
    )
    settings = parsed.fleet.canary
    if canary is not None and str(canary).strip() != "":
        settings = settings.model_copy(update={"percent": int(canary)})
    first = canary_rollout(parsed, waves, settings)
    document = _rollout_document(
        waves[1:] if first else waves,
        routers,
        generation,
        mixing_warning(parsed, changed),
        first,
        started,
    )
    return {**document, "outage": pd_outage(parsed, launch)}


def host_work_wave(plan: dict[str, Any], instances: list[Any]) -> dict[str, Any]:
    """The wave a drain takes out or a return brings back (plan/rollout.py instances_wave):
    {instances, urls, hosts, containers, stages, workers, ...}, as rollout_order's waves."""
    parsed = Plan.model_validate(plan)
    return _wave_json(instances_wave(parsed, [str(i) for i in instances]))


def host_work_defers(
    plan: dict[str, Any], host: str, changed: Any, serving: Any, skipped: Any = None
) -> bool:
    """Whether `host`'s host work waits for the rolling pass (plan/host_work.py defers);
    `skipped`: the phases the host's own look skips."""
    return defers(
        Plan.model_validate(plan),
        str(host),
        str(changed).lower() in {"true", "yes", "1"},
        str(serving).lower() in {"true", "yes", "1"},
        [str(p) for p in skipped or ()],
    )


def host_work_order(plan: dict[str, Any], deferred: list[Any]) -> dict[str, Any]:
    """The rolling pass of the `deferred` hosts' host work (plan/host_work.py):
    {waves: [{instances, hosts}], lines: [...]}."""
    waves = host_work_waves(Plan.model_validate(plan), [str(h) for h in deferred])
    return {
        "waves": [{"instances": list(w.instances), "hosts": list(w.hosts)} for w in waves],
        "lines": host_work_lines(waves),
    }


def rollout_canary_verdict(
    canary: dict[str, Any], before: list[Any], after: list[Any], probes: dict[str, Any]
) -> dict[str, Any]:
    """Keep a canary or roll it back (plan/canary.py canary_verdict): {kept, figures}."""
    verdict = canary_verdict(canary, before, after, probes)
    return {"kept": verdict.kept, "figures": verdict.figures}


def restart_rollout(
    plan: dict[str, Any], restarting: dict[str, Any], max_unavailable: Any = None
) -> dict[str, Any]:
    """A fleet's restart as a rolling change: the instances `restarting` (restart_set's
    answer) recreates roll wave by wave behind the router ({waves, lines}, as rollout_order),
    and `recreate` ({host: [container, ...]}) is what the launch recreates in place: the rest
    (a router without a front; every container when the plan does not roll). Behind a front
    the restarted routers roll one at a time out of HAProxy first (`routers`). Waves as in
    rollout_order."""
    parsed = Plan.model_validate(plan)
    containers = {h: list(c) for h, c in (restarting.get("containers") or {}).items()}
    waves = rollout_waves(
        parsed, restarted_instances(parsed, containers), _wave_width(parsed, max_unavailable)
    )
    routers = restarted_routers(parsed, containers)
    rolled = {(h, c) for w in waves for h, names in w.containers.items() for c in names}
    rolled |= {(r.host, c) for r in routers for c in r.containers}
    recreate = {
        host: [c for c in names if (host, c) not in rolled] for host, names in containers.items()
    }
    return {
        **_rollout_document(waves, routers),
        "recreate": {host: names for host, names in recreate.items() if names},
    }


def rollout_start_reason(host: str, run: Any = None, gate: Any = None, execs: Any = None) -> str:
    """Why `host`'s new containers (or the processes exec'd into them) of a rollout wave failed
    ("" when they did not)."""
    return start_reason(host, run or {}, gate or {}, execs or {})


def rollout_smoke_reason(result: dict[str, Any]) -> str:
    """Why a rollout wave's smoke test of one instance failed."""
    return smoke_reason(result)


def _plain_args(func: Any) -> Any:
    """Wrap a filter so it sees plain dicts and lists, not Ansible's lazily templated ones."""

    def wrapper(*args: Any) -> Any:
        return func(*(plain_value(a) for a in args))

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def json_body(result: dict[str, Any]) -> Any:
    """The JSON a `uri` result carries, whatever the reply's content type said (sglang-router
    0.3.2 types its /v1/models JSON text/plain, so `uri` leaves `.json` unset); {} when the
    body is not JSON."""
    if "json" in result:
        return result["json"]
    try:
        return json.loads(result.get("content") or "")
    except ValueError:
        return {}


def launch_registrations(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The `POST /workers` bodies of the fleet's workers the launch registers with the router
    (WorkerRegistration.at_launch), in the plan's order; empty when the router takes all of
    its workers from its command line."""
    return list(registered_at_launch(Plan.model_validate(plan).pools))


def converge_skips(own: list[str], every_host: list[Any], serving: Any = False) -> list[str]:
    """This host's skipped phases once every host's look is in (`every_host`: each one's
    skipped_phases; a host the look could not judge counts as running everything); `serving`:
    the look found this host's planned containers running (no GPU check runs here)."""
    return everywhere(
        own,
        [list(skips or ()) for skips in every_host],
        str(serving).lower() in {"true", "yes", "1"},
    )


def _launch_found(looked: dict[str, Any]) -> dict[str, list[Difference]]:
    """Each host's launch differences, typed, from its k2_converge (none where its look
    answered nothing yet)."""
    return {
        host: [
            Difference.from_json(d) for d in ((found or {}).get("found") or {}).get("launch") or ()
        ]
        for host, found in looked.items()
    }


def _instances_document(decided: InstanceRepairs) -> dict[str, Any]:
    return {
        "containers": {host: list(names) for host, names in decided.containers.items()},
        "refusal": decided.refusal(),
    }


def whole_instance_repairs(plan: dict[str, Any], looked: dict[str, Any]) -> dict[str, Any]:
    """What the launch recreates once every host's look is in (plan/converge.py
    instance_repairs): {containers: {host: [container, ...]}, refusal: "" or why the run
    stops (a recreated instance has ranks outside the run)}. `looked` is each play host's
    k2_converge."""
    return _instances_document(instance_repairs(Plan.model_validate(plan), _launch_found(looked)))


def whole_instance_containers(plan: dict[str, Any], stale: dict[str, Any]) -> dict[str, Any]:
    """As whole_instance_repairs, without a look: `stale` is, per play host, the containers it
    found missing, stopped or of another spec itself (stale_containers' names)."""
    recreate = {host: [str(name) for name in names or ()] for host, names in stale.items()}
    return _instances_document(whole_instances(Plan.model_validate(plan), recreate))


def with_instance_repairs(
    look: dict[str, Any], decided: dict[str, Any], host: str
) -> dict[str, Any]:
    """`host`'s look (k2_converge) with the containers its launch recreates once every host's
    look is in (`decided`: whole_instance_repairs' answer): its own, and the ranks of an instance
    another host of which recreates them. A host with such ranks and no difference of its
    own no longer skips the launch, where the tags run it."""
    containers = list((decided.get("containers") or {}).get(host) or look.get("containers") or ())
    skipped = list(look.get("skipped_phases") or ())
    if set(containers) - set(look.get("containers") or ()) and look.get("launch_selected"):
        skipped = [phase for phase in skipped if phase != "launch"]
    return {**look, "containers": containers, "skipped_phases": skipped}


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        funcs = (
            converge_skips,
            whole_instance_repairs,
            whole_instance_containers,
            with_instance_repairs,
            host_plan,
            docker_run_argv,
            docker_spec_hash,
            docker_exec_argv,
            file_entries,
            stale_containers,
            state_questions,
            container_questions,
            found_containers,
            stopped_processes,
            plan_stages,
            stage_containers_on,
            restart_set,
            rollout_order,
            host_work_wave,
            host_work_defers,
            host_work_order,
            restart_rollout,
            rollout_start_reason,
            rollout_smoke_reason,
            rollout_canary_verdict,
            json_body,
            launch_registrations,
        )
        return {f.__name__: _plain_args(f) for f in funcs}
