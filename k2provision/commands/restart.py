"""`k2provision restart INVENTORY [--limit HOSTS]`: restart processes in stage order, gated.

The restart set comes from the plan (k2provision/ops/restart.py): the named hosts' processes,
widened to the instances they belong to. It is shown with the reason for each process before
anything happens, then confirmed (`--yes` in scripts; without a terminal and without `--yes`
the command refuses, exit 2, touching nothing). playbooks/restart.yml then recreates those
containers stage by stage behind the launch's health gates and runs the smoke test; the run
record keeps the set (`restart.json`) and the smoke test's answers (`verify.json`). In a fleet
the restarted instances roll instead, wave by wave behind the router (the order is
shown before asking), so the endpoint keeps answering.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from k2provision.commands.flow import EXIT_FAILED, HostRun, load_plan, run_on_hosts
from k2provision.commands.params import InventoryArg, KeepFailedOpt
from k2provision.commands.verify import VerifyHooks
from k2provision.core.records import Plan
from k2provision.errors import K2Error
from k2provision.ops.restart import NAMED, RestartSet, restart_set
from k2provision.plan.rollout import (
    restarted_instances,
    restarted_routers,
    rollout_lines,
    rollout_waves,
    router_lines,
)
from k2provision.run.display import console

RESULT_FILE = "restart.json"

RestartLimitOpt = Annotated[
    str | None,
    typer.Option(
        "--limit",
        help="hosts to restart, comma-separated (a pool name or `router` also works); "
        "default: every host",
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="restart without asking (for scripts)")]


def set_table(chosen: RestartSet) -> Table:
    """The restart set, one row per process in the order it restarts."""
    table = Table(title="restart, in stage order", title_justify="left")
    for column in ("stage", "host", "process", "container", "why"):
        table.add_column(column, overflow="fold")
    for step in chosen.steps:
        process = f"{step.process} (exec'd)" if step.exec_in else step.process
        why = Text("named") if step.reason == NAMED else Text(step.reason, "yellow")
        table.add_row(str(step.stage), step.host, process, step.container, why)
    return table


def set_document(chosen: RestartSet) -> dict[str, Any]:
    """The restart set as the run record keeps it."""
    return {
        "named": list(chosen.named),
        "hosts": list(chosen.hosts),
        "steps": [
            {
                "stage": s.stage,
                "host": s.host,
                "process": s.process,
                "container": s.container,
                "exec_in": s.exec_in,
                "reason": s.reason,
            }
            for s in chosen.steps
        ],
    }


def summary_line(chosen: RestartSet) -> Text:
    """'restart 3 processes on 2 hosts; 1 added: the ranks of one instance restart together'."""
    text = Text(
        f"restart {len(chosen.steps)} process(es) on {len(chosen.hosts)} host(s): "
        f"{', '.join(chosen.hosts)}"
    )
    added = sorted({s.host for s in chosen.widened} - set(chosen.named))
    if added:
        text.append(
            f"; {', '.join(added)} added: the ranks of one instance restart together",
            "yellow",
        )
    return text


def rolling_lines(plan: Plan, chosen: RestartSet) -> list[str]:
    """In a fleet, the order the restarted instances roll in behind the router, the plan's
    fleet.max_unavailable at a time, after the restarted routers behind a front, one at a
    time (as playbooks/restart.yml rolls them); empty otherwise."""
    containers = {host: chosen.containers(host) for host in chosen.hosts}
    instances = restarted_instances(plan, containers)
    routers = restarted_routers(plan, containers)
    waves = rollout_waves(plan, instances, plan.fleet.max_unavailable)
    return [*router_lines(routers), *rollout_lines(waves, first=len(routers) + 1)]


def confirmed(yes: bool, count: int) -> bool:
    """--yes, or the user's answer at a terminal; no terminal and no --yes is bad input."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise K2Error(
            [
                "restart: standard input is not a terminal, so nobody can confirm the restart "
                "shown above; nothing was restarted; fix: pass --yes to restart without asking"
            ]
        )
    return typer.confirm(f"Restart these {count} process(es)?", default=False)


class RestartHooks(VerifyHooks):
    """Restart's additions to the run flow: the set to the playbook and to the record."""

    def __init__(self, chosen: RestartSet, names: list[str] | None) -> None:
        super().__init__()
        self.chosen = chosen
        self.names = names

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        (record / RESULT_FILE).write_text(json.dumps(set_document(self.chosen), indent=2) + "\n")
        extra = super().extravars(plan, record)
        if self.names is not None:
            extra["k2_restart_hosts"] = self.names
        return extra


def restart(
    inventory: InventoryArg,
    limit: RestartLimitOpt = None,
    yes: YesOpt = False,
    keep_failed: KeepFailedOpt = False,
) -> None:
    """Restart the named hosts' processes (and the ranks of their instances) in stage order,
    behind the launch's health gates, then smoke-test the endpoint; exit 0 or 1."""
    names = None if limit is None else [n.strip() for n in limit.split(",")]
    loaded = load_plan(inventory)
    chosen = restart_set(loaded.plan, names)
    console.print(set_table(chosen))
    console.print(summary_line(chosen))
    for line in rolling_lines(loaded.plan, chosen):
        console.print(f"rolling, the endpoint serving: {line}")
    if not confirmed(yes, len(chosen.steps)):
        console.print("restart: nothing restarted")
        raise typer.Exit(EXIT_FAILED)
    run = HostRun(
        command="restart", inventory=inventory, playbook="restart.yml", keep_failed=keep_failed
    )
    raise typer.Exit(run_on_hosts(run, RestartHooks(chosen, names), loaded))


def register(app: typer.Typer) -> None:
    """Add `restart` to the app."""
    app.command("restart")(restart)
