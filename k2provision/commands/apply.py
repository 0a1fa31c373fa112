"""`k2provision apply INVENTORY`: plan, then run playbooks/site.yml with progress and a summary;
then the host work the look deferred on a fleet's serving instances, instance by instance
(plan/host_work.py, playbooks/host_work.yml)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.text import Text

from k2provision.commands.flow import (
    EXIT_OK,
    HostRun,
    LoadedPlan,
    RunHooks,
    load_plan,
    run_on_hosts,
)
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
from k2provision.core.records import Plan
from k2provision.errors import PlanError
from k2provision.plan.canary import canary_problem
from k2provision.run.display import RunView, console
from k2provision.weights.progress import ProgressFeed, progress_view

HOST_WORK_FILE = "host_work.json"
IMAGES_PROGRESS_FILE = "images-progress.jsonl"
"""The images phase's relay progress (role k2_container_runtime), one JSON line per event."""


class ApplyView(RunView):
    """apply's live view: the phase, the task and the hosts' tallies, and while an image
    streams from host to host, each receiving host's progress."""

    def __init__(self, hosts: list[str], progress: Path) -> None:
        self.feed = ProgressFeed(progress)
        super().__init__(hosts)

    def _render(self) -> RenderableType:
        base: RenderableType = super()._render()
        streaming = [h for h in self.feed.snapshot() if h.status == "receiving"]
        if not streaming:
            return base
        return Group(progress_view(streaming, f"image stream > {self.task}"), base)

    def __enter__(self) -> ApplyView:
        self.feed.start()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.feed.stop()
        super().__exit__(*exc)


class ApplyHooks(RunHooks):
    """Where the look tells the deferred host work (k2_host_work_file, in the run's record)."""

    def __init__(self) -> None:
        self.record: Path | None = None

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        del plan
        self.record = record
        progress = record / IMAGES_PROGRESS_FILE
        progress.touch(mode=0o600)
        return {
            "k2_host_work_file": str(record / HOST_WORK_FILE),
            "k2_container_runtime_progress_file": str(progress),
        }

    def view(self, plan: Plan, record: Path) -> ApplyView:
        return ApplyView([h.name for h in plan.hosts], record / IMAGES_PROGRESS_FILE)

    def order(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The rolling pass the look ordered: its waves and their lines (none when there is
        no host work, or no look ran)."""
        if self.record is None:
            return [], []
        try:
            data = json.loads((self.record / HOST_WORK_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return [], []
        if not isinstance(data, dict):
            return [], []
        waves = [w for w in data.get("waves") or [] if isinstance(w, dict)]
        return waves, [str(line) for line in data.get("lines") or []]


class WaveHooks(RunHooks):
    """One wave of the rolling pass: its instances to playbooks/host_work.yml."""

    def __init__(self, instances: list[str]) -> None:
        self.instances = instances

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        del plan, record
        return {"k2_host_work_instances": self.instances}


def run_apply(run: HostRun, loaded: LoadedPlan | None = None) -> int:
    """The apply, then its rolling pass of deferred host work, wave by wave: each wave's
    instances out of every router, stopped, the work done on their hosts, started and back
    in (playbooks/host_work.yml, limited to the wave's hosts). Check mode shows the waves and
    runs none. The exit code of the first run that fails, else 0."""
    hooks = ApplyHooks()
    code = run_on_hosts(run, hooks, loaded)
    waves, lines = hooks.order()
    if code != EXIT_OK or not waves:
        return code
    console.print(
        "host work on serving instances, instance by instance"
        + (" (check mode: none runs)" if run.check else "")
        + ":",
        soft_wrap=True,
    )
    for line in lines:
        console.print(f"  {line}", soft_wrap=True)
    if run.check:
        return code
    for n, wave in enumerate(waves, start=1):
        instances = [str(i) for i in wave.get("instances", [])]
        hosts = [str(h) for h in wave.get("hosts", [])]
        console.print(
            f"host work {n}/{len(waves)}: {', '.join(instances)} on {', '.join(hosts)}",
            soft_wrap=True,
        )
        step = replace(
            run,
            command="host-work",
            playbook="host_work.yml",
            tags=(),
            limit=",".join(hosts),
            canary=None,
        )
        code = run_on_hosts(step, WaveHooks(instances))
        if code != EXIT_OK:
            console.print(
                Text(
                    f"host work stopped at {', '.join(instances)}: see its record; the waves "
                    "after it were not touched; fix: the cause, then k2provision apply again; "
                    "k2provision status names what serves meanwhile",
                    "red",
                ),
                soft_wrap=True,
            )
            return code
    return code


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
    raise typer.Exit(run_apply(run, loaded))


def register(app: typer.Typer) -> None:
    """Add `apply` to the app."""
    app.command("apply")(apply)
