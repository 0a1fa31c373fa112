"""`k2provision plan INVENTORY [--format table|json]`: the plan; nothing is contacted."""

from __future__ import annotations

import json

import typer

from k2provision.commands.flow import load_plan
from k2provision.commands.params import FormatOpt, InventoryArg, OutputFormat
from k2provision.run.display import print_plan, print_warnings


def plan(inventory: InventoryArg, output_format: FormatOpt = OutputFormat.table) -> None:
    """Show what would run where: pools, ranks, GPUs, memory fit, endpoint."""
    loaded = load_plan(inventory)
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(loaded.plan.model_dump(mode="json"), indent=2))
        return
    print_plan(loaded.plan)
    print_warnings(loaded.notices)


def register(app: typer.Typer) -> None:
    """Add `plan` to the app."""
    app.command("plan")(plan)
