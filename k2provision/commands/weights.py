"""`k2provision weights INVENTORY`: the weights phase alone, with a live bar and a hosts table.

It runs the `weights` phase of playbooks/site.yml (the k2_weights role) through the shared run
flow, exactly what `ansible-playbook -i INVENTORY playbooks/site.yml --tags weights` does, and
adds a live view of the broadcast (weights/progress.py), the final table of hosts x verified
files, and the role's record (the manifest and every host's outcome in `weights.json`).

A Hugging Face token in HF_TOKEN / HUGGING_FACE_HUB_TOKEN never reaches the run record: the
runner hands it to the role in a private file (runner.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from k2provision.commands.flow import HostRun, LiveView, LoadedPlan, RunHooks, run_on_hosts
from k2provision.commands.params import CheckOpt, InventoryArg, LimitOpt
from k2provision.core.records import Plan
from k2provision.run.display import console
from k2provision.run.runner import RunResult
from k2provision.weights.progress import WeightsView, results_table

PROGRESS_FILE = "weights-progress.jsonl"
RESULT_FILE = "weights.json"


class WeightsHooks(RunHooks):
    """The weights phase's additions to the run flow."""

    def __init__(self, *, verify: bool) -> None:
        self.verify = verify

    def preview(self, loaded: LoadedPlan, run: HostRun, record: Path) -> None:
        plan = loaded.plan
        hosts = [h for h in plan.hosts if h.pool != "router"]
        mode = " (check mode: nothing changes)" if run.check else ""
        rehash = " (re-hash everything)" if self.verify else ""
        console.print(
            Text.assemble(
                ("weights", "bold"),
                f" {plan.model} -> {plan.model_dir} on {len(hosts)} hosts{mode}{rehash}: "
                f"record in {record}",
            )
        )

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        progress = record / PROGRESS_FILE
        progress.touch(mode=0o600)
        extra: dict[str, Any] = {
            "k2_weights_progress_file": str(progress),
            "k2_weights_record_dir": str(record),
        }
        if self.verify:
            extra["k2_weights_verify"] = True
        return extra

    def view(self, plan: Plan, record: Path) -> LiveView:
        return WeightsView(record / PROGRESS_FILE)

    def report(self, plan: Plan, result: RunResult, view: LiveView) -> None:
        result_path = result.record_dir / RESULT_FILE
        if result_path.exists():
            console.print(results_table(json.loads(result_path.read_text())))
        elif result.ok:
            console.print("weights are not managed (k2_weights_source is not set); nothing ran")


def weights(
    inventory: InventoryArg,
    verify: Annotated[
        bool, typer.Option("--verify", help="re-hash every file on every host")
    ] = False,
    check: CheckOpt = False,
    limit: LimitOpt = None,
) -> None:
    """Put the model's weights on every host: fetched once, streamed host to host, verified."""
    # The whole weights phase runs, not only where the look finds a difference: this command
    # is asked for the weights' state on every host, and its record (weights.json) reports it.
    # The role's own no-op is quick (its manifest state; --verify re-hashes).
    run = HostRun(
        command="weights",
        inventory=inventory,
        tags=("weights",),
        limit=limit,
        check=check,
        full=True,
    )
    raise typer.Exit(run_on_hosts(run, WeightsHooks(verify=verify)))


def register(app: typer.Typer) -> None:
    """Add `weights` to the app."""
    app.command("weights")(weights)
