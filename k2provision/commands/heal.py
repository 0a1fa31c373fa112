"""`k2provision heal INVENTORY [HOST...]` and `k2provision watch INVENTORY`.

Heal finds the hosts of the fleet's instances that cannot serve (unreachable, or failing the
GPU gate: XIDs, ECC, NVLink, fabric manager, an IB port down), or takes the HOSTs named,
puts a spare in each one's place (plan/heal.py) in the inventory's state file, and applies:
the instance starts on its new hosts behind its health gates, joins every router, and the
routers roll onto the new worker list (plan/rollout.py `down_instances`); the failed host
is then in no play until `k2provision return HOST` undoes the substitution. An instance whose
hosts are fine but whose containers stopped is started again by the same apply; a host with
a stuck DP rank (ops/rank_liveness.py: /health still answers) is restarted with its
instance, rolling through the routers. Without a free spare the instance stays down and heal
says why. The circuit breaker (plan/heal.py) refuses, changing nothing, a heal that takes out
more than --max-hosts within --window seconds or the last serving instance of a pool.

Watch runs heal's detection every --interval seconds (or --once) and heals what it finds
within the breaker's limits, never forcing past it; each round is a line in the watch's run
record (watch.jsonl) and each heal has its own record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from k2provision.commands.apply import run_apply
from k2provision.commands.flow import EXIT_FAILED, EXIT_OK, HostRun, load_plan, run_on_hosts
from k2provision.commands.params import InventoryArg
from k2provision.commands.restart import RestartHooks
from k2provision.commands.status import gather
from k2provision.core.host_state import read_state, write_state
from k2provision.core.records import Plan
from k2provision.errors import ArgumentError, K2Error
from k2provision.ops.endpoint_access import endpoint_access
from k2provision.ops.remote import ssh_inventory
from k2provision.ops.restart import restart_set
from k2provision.ops.status_probe import HostStatus, RouterWorker, fleet_status
from k2provision.plan.heal import Failure, HealChoice, heal_choice, heal_lines, state_after
from k2provision.run.cancel import stopping
from k2provision.run.display import console
from k2provision.run.runner import new_record_dir

EXIT_REFUSED = 2

HostsArg = Annotated[
    list[str] | None,
    typer.Argument(help="the hosts to replace, as the inventory names them (default: detect)"),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="show what would happen; change nothing")]
MaxHostsOpt = Annotated[
    int,
    typer.Option(
        "--max-hosts",
        min=1,
        help="the circuit breaker: at most this many hosts taken out within --window",
    ),
]
WindowOpt = Annotated[
    int,
    typer.Option("--window", min=1, help="the circuit breaker's window, in seconds"),
]


@dataclass(frozen=True)
class Finding:
    """What detection found: the failed hosts, the instances down, those down on hosts that
    are fine (their containers stopped or failing their gates: an apply starts them again),
    and the hosts with a stuck rank (its /health still answers, so no look sees it: they are
    restarted, instance by instance through the routers)."""

    failures: tuple[Failure, ...]
    down: tuple[str, ...]
    restartable: tuple[str, ...]
    stuck: tuple[str, ...] = ()


def findings_of(
    plan: Plan, hosts: Sequence[HostStatus], workers: Sequence[RouterWorker]
) -> Finding:
    """What the hosts' status and the routers' workers say needs healing."""
    failures = []
    for h in hosts:
        if h.drained:
            continue
        if h.unreachable:
            failures.append(Failure(h.host, f"unreachable: {h.unreachable}"))
        elif h.gpu_health or h.ib_ports:
            failures.append(Failure(h.host, "; ".join((*h.gpu_health, *h.ib_ports))))
    failed = {f.host for f in failures}
    fleet = fleet_status(plan, hosts, workers)
    down = tuple(i.instance for i in fleet if not i.up and not i.drained)
    stuck = tuple(h.host for h in hosts if h.stuck_ranks and not h.drained and h.host not in failed)
    restartable = tuple(
        i.instance for i in fleet if i.instance in down and not set(i.hosts) & {*failed, *stuck}
    )
    return Finding(tuple(failures), down, restartable, stuck)


def detect(plan: Plan, inventory: Path) -> Finding:
    """Every host's status probe and the routers' view of the instances (status's)."""
    _, targets = ssh_inventory(inventory)
    hosts, endpoint = gather(plan, targets, endpoint_access(plan.access))
    return findings_of(plan, hosts, endpoint.workers)


def _named(plan: Plan, hosts: list[str]) -> Finding:
    known = {h.name for h in plan.hosts}
    if unknown := [h for h in hosts if h not in known]:
        raise ArgumentError(
            [
                f"heal: {h} is not a host of the plan; expected one of "
                f"{', '.join(sorted(known))}; fix: name an instance's host"
                for h in unknown
            ]
        )
    failures = tuple(Failure(h, "named by the operator") for h in hosts)
    return Finding(failures, (), ())


def _show(plan: Plan, choice: HealChoice, finding: Finding) -> None:
    for line in heal_lines(plan, choice):
        console.print(f"heal: {line}", soft_wrap=True)
    if finding.restartable:
        console.print(
            f"heal: {', '.join(finding.restartable)} down on hosts that are fine: the apply "
            "starts it again",
            soft_wrap=True,
        )
    if finding.stuck:
        console.print(
            f"heal: a rank stuck on {', '.join(finding.stuck)} (its /health still answers): "
            "restarted, instance by instance through the routers",
            soft_wrap=True,
        )


def heal_once(
    inventory: Path,
    hosts: list[str],
    check: bool,
    max_hosts: int,
    window_s: int,
) -> tuple[int, dict[str, Any]]:
    """One heal: detect (or take `hosts`), decide, record, apply; the exit code and what
    happened (the watch's log entry)."""
    loaded = load_plan(inventory)
    plan = loaded.plan
    finding = _named(plan, hosts) if hosts else detect(plan, inventory)
    state = read_state(inventory)
    now = datetime.now(UTC).replace(tzinfo=None)
    choice = heal_choice(plan, finding.failures, finding.down, state, now, max_hosts, window_s)
    entry: dict[str, Any] = {
        "failures": [asdict(f) for f in finding.failures],
        "down": list(finding.down),
        "stuck": list(finding.stuck),
        "replacements": [asdict(r) for r in choice.replacements],
        "stays_down": list(choice.stays_down),
        "refused": choice.refused,
    }
    _show(plan, choice, finding)
    if choice.refused:
        console.print(Text(f"heal: {choice.refused}", "red"), soft_wrap=True)
        return EXIT_REFUSED, {**entry, "action": "refused"}
    if not choice.replacements and not finding.restartable and not finding.stuck:
        verdict = EXIT_FAILED if choice.stays_down else EXIT_OK
        console.print("heal: nothing to heal" if verdict == EXIT_OK else "heal: nothing healed")
        return verdict, {**entry, "action": "none"}
    if check:
        console.print("heal --check: nothing changed")
        return EXIT_OK, {**entry, "action": "check"}
    if choice.replacements:
        path = write_state(inventory, state_after(state, choice, window_s, now))
        console.print(
            "heal: recorded in "
            f"{path}: " + ", ".join(f"{r.spare} in place of {r.host}" for r in choice.replacements),
            soft_wrap=True,
        )
    code = EXIT_OK
    if choice.replacements or finding.restartable:
        code = run_apply(HostRun(command="heal", inventory=inventory))
    if code == EXIT_OK and finding.stuck:
        code = _restart(inventory, list(finding.stuck))
    if code != EXIT_OK:
        console.print(
            Text(
                "heal: the apply did not finish; the substitutions stay recorded (status "
                "shows what serves); fix: see the record, then k2provision apply",
                "red",
            ),
            soft_wrap=True,
        )
    elif choice.stays_down:
        code = EXIT_FAILED
    return code, {**entry, "action": "healed", "rc": code}


def _restart(inventory: Path, hosts: list[str]) -> int:
    """Restart `hosts` and the ranks of their instances (a fleet's roll through the routers,
    as `k2provision restart --limit HOSTS --yes`)."""
    loaded = load_plan(inventory)
    chosen = restart_set(loaded.plan, hosts)
    run = HostRun(command="heal-restart", inventory=inventory, playbook="restart.yml")
    return run_on_hosts(run, RestartHooks(chosen, hosts), loaded)


def heal(
    inventory: InventoryArg,
    hosts: HostsArg = None,
    check: CheckOpt = False,
    max_hosts: MaxHostsOpt = 1,
    window: WindowOpt = 3600,
) -> None:
    """Replace the fleet's failed hosts (unreachable, failing the GPU gate; or the HOSTs
    named) by spares and start their instances there; exit 0 when healed (or nothing to
    heal), 1 when an instance stays down or the apply failed, 2 when the breaker refuses."""
    code, _ = heal_once(inventory, list(hosts or []), check, max_hosts, window)
    raise typer.Exit(code)


def watch(
    inventory: InventoryArg,
    interval: Annotated[
        float, typer.Option("--interval", min=1.0, help="seconds between detections")
    ] = 60.0,
    once: Annotated[
        bool, typer.Option("--once", help="one round, then exit with its code")
    ] = False,
    max_hosts: MaxHostsOpt = 1,
    window: WindowOpt = 3600,
) -> None:
    """Detect and heal unattended, within the circuit breaker (never forced past it); each
    round is logged to the watch's record (watch.jsonl)."""
    record = new_record_dir("watch")
    log = record / "watch.jsonl"
    console.print(f"watch {inventory}: every {interval:g} s; log in {log}", soft_wrap=True)
    code = EXIT_OK
    with stopping():
        while True:
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            try:
                code, entry = heal_once(inventory, [], False, max_hosts, window)
            except K2Error as error:  # an inventory or state file gone bad: logged, kept on
                code, entry = EXIT_FAILED, {"action": "error", "problems": error.problems}
                for line in error.problems:
                    console.print(Text(f"watch: {line}", "red"), soft_wrap=True)
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"at": started, "rc": code, **entry}) + "\n")
            if once:
                raise typer.Exit(code)
            time.sleep(interval)


def register(app: typer.Typer) -> None:
    """Add `heal` and `watch` to the app."""
    app.command("heal")(heal)
    app.command("watch")(watch)
