"""`k2provision drain INVENTORY HOST...` and `k2provision return INVENTORY HOST...`.

Drain takes every fleet instance holding one of the hosts out of every router, lets it
answer what it holds (the plan's drain timeout), stops it and records the hosts as drained
in the inventory's state file (core/host_state.py), which every later plan reads: no apply,
restart or rollout starts the instance again, and `status` shows it drained with the
capacity left. Return starts the instances again behind their health gates (on the plan's
spec, whatever changed meanwhile), puts them back into every router, and takes the hosts off
the state file. What each does is shown first (plan/drain.py); `--check` stops there.
Draining the last serving instance of a pool is refused, touching nothing, unless `--yes`.
Both change the state file before they run, so the run's plan is the one they leave: a drain
that fails midway leaves its hosts drained (re-run it to finish), a return that fails leaves
them undrained and its instances down, which status names (apply, or drain again).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from k2provision.commands.apply import run_apply
from k2provision.commands.flow import EXIT_OK, HostRun, RunHooks, load_plan, run_on_hosts
from k2provision.commands.params import InventoryArg
from k2provision.core.host_state import read_state, write_drained, write_state
from k2provision.core.records import Plan
from k2provision.errors import K2Error
from k2provision.plan.drain import HostWork, drain_choice, drain_lines, return_choice
from k2provision.plan.rollout import fleet_instances
from k2provision.run.display import console

HostsArg = Annotated[list[str], typer.Argument(help="the hosts, as the inventory names them")]
DrainYesOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="drain even the last serving instance of a pool (an outage of that pool)",
    ),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="show what would happen; change nothing")]


class HostWorkHooks(RunHooks):
    """The instances to the playbook (k2_drain_instances or k2_return_instances)."""

    def __init__(self, variable: str, work: HostWork) -> None:
        self.variable = variable
        self.work = work

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        del plan, record
        return {self.variable: list(self.work.instances)}


def _show(command: str, plan: Plan, work: HostWork, returning: bool) -> None:
    for line in drain_lines(plan, work, returning):
        console.print(f"{command}: {line}", soft_wrap=True)


def drain(
    inventory: InventoryArg, hosts: HostsArg, yes: DrainYesOpt = False, check: CheckOpt = False
) -> None:
    """Take the instances holding HOSTS out of every router, let them finish what they hold,
    stop them, and keep them stopped (recorded as drained) until `return`; exit 0 or 1."""
    loaded = load_plan(inventory)
    work = drain_choice(loaded.plan, hosts)
    _show("drain", loaded.plan, work, returning=False)
    if work.outage and not yes:
        pools = ", ".join(f"[{p}]" for p in work.outage)
        raise K2Error(
            [
                f"drain: {', '.join(work.instances)} is the last serving instance of {pools}; "
                f"draining it is an outage of {pools}; nothing was changed; fix: return a "
                "drained instance first, or pass --yes to take the outage"
            ]
        )
    if check:
        console.print("drain --check: nothing changed")
        return
    path = write_drained(inventory, work.drained_after)
    if not work.instances:
        console.print(f"drain: {', '.join(hosts)} already drained; recorded in {path}")
        return
    console.print(f"drain: {', '.join(hosts)} recorded as drained in {path}")
    code = _run("drain", inventory, HostWorkHooks("k2_drain_instances", work))
    if code != EXIT_OK:
        console.print(
            Text(
                f"drain: did not finish; {', '.join(hosts)} stay recorded as drained, and no "
                "run starts their instances; fix: see the record, then drain again",
                "red",
            ),
            soft_wrap=True,
        )
    raise typer.Exit(code)


def return_replaced(inventory: Path, plan: Plan, hosts: list[str], check: bool) -> None:
    """Undo heal's substitutions for `hosts`: each spare's instance is drained (out of every
    router, stopped), the state file forgets the substitution, and an apply starts the
    instance on its own hosts again and rolls the routers onto it; the spare is a spare
    again. Exit 0 or 1."""
    by_host = {i.host: i for i in read_state(inventory).replaced}
    spares = [by_host[h].spare for h in hosts]
    instances = tuple(
        dict.fromkeys(i.instance for i in fleet_instances(plan) if set(i.hosts) & set(spares))
    )
    for host, spare in zip(hosts, spares, strict=True):
        console.print(
            f"return: {host} back in its instance in place of {spare}: "
            f"{', '.join(instances)} drained from {spare}, then started on its own hosts "
            f"behind its health gates and into every router; {spare} a spare again",
            soft_wrap=True,
        )
    if check:
        console.print("return --check: nothing changed")
        return
    work = HostWork(instances=instances, drained_after=plan.fleet.drained_named)
    code = _run("return", inventory, HostWorkHooks("k2_drain_instances", work))
    if code == EXIT_OK:
        state = read_state(inventory)
        kept = tuple(r for r in state.replaced if r.host not in hosts)
        path = write_state(inventory, replace(state, replaced=kept))
        console.print(f"return: {', '.join(hosts)} no longer replaced ({path})", soft_wrap=True)
        code = run_apply(HostRun(command="return", inventory=inventory))
    if code != EXIT_OK:
        console.print(
            Text(
                f"return: did not finish; {', '.join(instances)} may be down; fix: see the "
                "record, then k2provision apply (or heal again)",
                "red",
            ),
            soft_wrap=True,
        )
    raise typer.Exit(code)


def return_hosts(inventory: InventoryArg, hosts: HostsArg, check: CheckOpt = False) -> None:
    """Bring drained HOSTS back: their instances start behind their health gates and go back
    into every router, and the hosts leave the drained list; a host a spare stands in for
    (heal) takes its place back, the spare a spare again; exit 0 or 1."""
    loaded = load_plan(inventory)
    replaced = [h for h in hosts if h in loaded.plan.fleet.replaced]
    if replaced and len(replaced) < len(hosts):
        raise K2Error(
            [
                f"return: {', '.join(replaced)} replaced by a spare and "
                f"{', '.join(h for h in hosts if h not in replaced)} not; expected one kind "
                "at a time; fix: return them in two commands"
            ]
        )
    if replaced:
        return_replaced(inventory, loaded.plan, replaced, check)
        return
    work = return_choice(loaded.plan, hosts)
    _show("return", loaded.plan, work, returning=True)
    if check:
        console.print("return --check: nothing changed")
        return
    # Off the list first: the run's plan then serves them (Prometheus scrapes them again).
    path = write_drained(inventory, work.drained_after)
    left = ", ".join(work.drained_after) or "none"
    code = EXIT_OK
    if work.instances:
        code = _run("return", inventory, HostWorkHooks("k2_return_instances", work))
    if code != EXIT_OK:
        console.print(
            Text(
                f"return: {', '.join(work.instances)} did not start and stay out of the "
                f"routers; {', '.join(hosts)} are no longer drained (drained now: {left}), so "
                "status names them down; fix: see the record, then k2provision apply (or "
                "drain them again)",
                "red",
            ),
            soft_wrap=True,
        )
        raise typer.Exit(code)
    console.print(f"return: {', '.join(hosts)} back; drained now: {left} ({path})")


def _run(command: str, inventory: Path, hooks: HostWorkHooks) -> int:
    """The playbook, on the plan read now (after the state file changed)."""
    run = HostRun(command=command, inventory=inventory, playbook="drain.yml")
    return run_on_hosts(run, hooks)


def register(app: typer.Typer) -> None:
    """Add `drain` and `return` to the app."""
    app.command("drain")(drain)
    app.command("return")(return_hosts)
