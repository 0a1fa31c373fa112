"""`k2provision apply INVENTORY`: plan, then run playbooks/site.yml with progress and a summary."""

from __future__ import annotations

import typer

from k2provision.commands.flow import HostRun, load_plan, run_on_hosts
from k2provision.commands.params import (
    AcceptOutageOpt,
    CanaryOpt,
    CheckOpt,
    DiffOpt,
    FullOpt,
    InventoryArg,
    KeepFailedOpt,
    LimitOpt,
    TagsOpt,
    split_tags,
)
from k2provision.errors import PlanError
from k2provision.plan.canary import canary_problem


def apply(
    inventory: InventoryArg,
    check: CheckOpt = False,
    diff: DiffOpt = False,
    limit: LimitOpt = None,
    tags: TagsOpt = None,
    keep_failed: KeepFailedOpt = False,
    full: FullOpt = False,
    yes: AcceptOutageOpt = False,
    canary: CanaryOpt = None,
) -> None:
    """Plan, then run playbooks/site.yml on the hosts with live progress and a summary."""
    loaded = load_plan(inventory)
    if canary and (problem := canary_problem(loaded.plan, canary)):
        raise PlanError([problem])
    run = HostRun(
        command="apply",
        inventory=inventory,
        tags=split_tags(tags),
        limit=limit,
        check=check,
        diff=diff,
        keep_failed=keep_failed,
        full=full,
        accept_outage=yes,
        canary=canary,
    )
    raise typer.Exit(run_on_hosts(run, loaded=loaded))


def register(app: typer.Typer) -> None:
    """Add `apply` to the app."""
    app.command("apply")(apply)
