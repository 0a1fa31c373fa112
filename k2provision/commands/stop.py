"""`k2provision stop INVENTORY`: stop and remove the plan's engine containers."""

from __future__ import annotations

import typer

from k2provision.commands.flow import HostRun, run_on_hosts
from k2provision.commands.params import InventoryArg, LimitOpt


def stop(inventory: InventoryArg, limit: LimitOpt = None) -> None:
    """Stop and remove the plan's engine containers (weights and files stay)."""
    raise typer.Exit(
        run_on_hosts(HostRun(command="stop", inventory=inventory, playbook="stop.yml", limit=limit))
    )


def register(app: typer.Typer) -> None:
    """Add `stop` to the app."""
    app.command("stop")(stop)
