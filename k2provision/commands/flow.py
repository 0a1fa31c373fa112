"""The one flow of every command that touches hosts, and the plan loading every command shares.

load plan -> print it -> run record -> runner -> summary -> exit code. A command describes its
run as data (`HostRun`) and may add to the flow through `RunHooks` (what it previews, extra
variables for the playbook, its live view, its results); everything else is the same for
every command: the record's content, how failures and Ansible's own errors are shown, the lab
banner, the verdict line and the exit code (0 ok, 1 failed on hosts, 2 bad input).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.text import Text

from k2provision.core.inventory import load_cluster
from k2provision.core.records import Plan
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.run.display import (
    RunView,
    console,
    host_table,
    lab_banner,
    print_plan,
    print_unexpected,
    print_warnings,
)
from k2provision.run.events import Event
from k2provision.run.runner import PlaybookRun, RunResult, new_record_dir, run_playbook

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

_NOTICE_START = re.compile(r"^\[(?:[A-Z]+ ?)+\]:\s*")


@dataclass(frozen=True)
class LoadedPlan:
    """A plan, and what Ansible's inventory loader said while reading the inventory."""

    plan: Plan
    notices: tuple[str, ...] = ()


def notices_from(output: str) -> tuple[str, ...]:
    """Ansible's `[WARNING]: ...` output as one line per notice, without its prefix."""
    found: list[str] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        if _NOTICE_START.match(line) or not found:
            found.append(_NOTICE_START.sub("", line).strip())
        else:
            found[-1] = f"{found[-1]} {line.strip()}"
    return tuple(f"ansible: {n}" for n in found)


@contextlib.contextmanager
def ansible_output_captured() -> Iterator[io.StringIO]:
    """Ansible's display writes notices to sys.stderr; collect them instead of letting them
    interleave with the command's output."""
    from ansible.utils.display import Display

    Display()  # made once, on the real streams (it adapts them); it writes to sys.stderr later
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield buffer


def load_plan(inventory: Path) -> LoadedPlan:
    """Inventory -> Plan (K2Error, exit 2, on bad input), with Ansible's loader notices."""
    with ansible_output_captured() as said:
        cluster = load_cluster(inventory)
    return LoadedPlan(build_plan(cluster), notices_from(said.getvalue()))


class LiveView(Protocol):
    """A live view of a run: a context manager fed every typed runner event."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...

    def on_event(self, event: Event) -> None:
        """Fold one event into the view."""
        ...


@dataclass(frozen=True)
class HostRun:
    """What a host-touching command asks of the flow."""

    command: str
    """Names the run record (runs/<UTC time>-<command>) and the verdict line."""
    inventory: Path
    playbook: str = "site.yml"
    tags: tuple[str, ...] = ()
    limit: str | None = None
    check: bool = False
    diff: bool = False
    keep_failed: bool = False
    """A failed launch stage's containers are left running (k2_launch_keep_failed)."""


class RunHooks:
    """What a command adds to the flow; these defaults are apply's and stop's."""

    def preview(self, loaded: LoadedPlan, run: HostRun, record: Path) -> None:
        """Shown before anything runs: the plan, then what runs where and the record."""
        print_plan(loaded.plan)
        mode = " (check mode: nothing changes)" if run.check else ""
        console.print(
            Text.assemble((run.command, "bold"), f" {run.inventory}{mode}: record in {record}")
        )

    def extravars(self, plan: Plan, record: Path) -> dict[str, Any]:
        """Variables the command passes to the playbook beyond the plan's digest."""
        del plan, record
        return {}

    def view(self, plan: Plan, record: Path) -> LiveView:
        """The live view while the playbook runs."""
        del record
        return RunView([h.name for h in plan.hosts])

    def report(self, plan: Plan, result: RunResult, view: LiveView) -> None:
        """What the command shows once the playbook is done, before the verdict."""
        del plan
        if isinstance(view, RunView):
            console.print(host_table(view.hosts, result.tally))


def record_plan(plan: Plan, record: Path) -> None:
    """The plan a run showed, as the record keeps it."""
    (record / "plan.json").write_text(json.dumps(plan.model_dump(mode="json"), indent=2) + "\n")


def record_error(record: Path, error: BaseException) -> Path:
    """The traceback of an unexpected failure, kept in the run record."""
    path = record / "error.txt"
    path.write_text("".join(traceback.format_exception(error)))
    return path


def verdict(run: HostRun, result: RunResult, seconds: float) -> Text:
    """`apply succeeded in 12.3 s: 4 changed, 0 host(s) failed or unreachable; record: DIR`."""
    word = Text("succeeded", "green") if result.ok else Text("failed", "red")
    return Text.assemble(
        f"{run.command} ",
        word,
        f" in {seconds:.1f} s: {result.changed} changed, "
        f"{len(result.tally.failures)} host(s) failed or unreachable; record: {result.record_dir}",
    )


def run_on_hosts(
    run: HostRun, hooks: RunHooks | None = None, loaded: LoadedPlan | None = None
) -> int:
    """The flow: plan (`loaded` when the command read it already), preview, record, run the
    playbook, show the outcome; the exit code."""
    hooks = hooks or RunHooks()
    loaded = loaded or load_plan(run.inventory)
    plan = loaded.plan
    record = new_record_dir(run.command)
    record_plan(plan, record)
    hooks.preview(loaded, run, record)
    print_warnings(loaded.notices)
    started = time.monotonic()
    try:
        extravars = {"k2_expected_plan_digest": plan_digest(plan), **hooks.extravars(plan, record)}
        if run.keep_failed:
            extravars["k2_launch_keep_failed"] = True
        with hooks.view(plan, record) as view:
            result = run_playbook(
                PlaybookRun(
                    playbook=run.playbook,
                    inventory=run.inventory,
                    record_dir=record,
                    extravars=extravars,
                    tags=run.tags,
                    limit=run.limit,
                    check=run.check,
                    diff=run.diff,
                ),
                on_event=view.on_event,
            )
        hooks.report(plan, result, view)
    except Exception as error:  # a bug or a broken environment: one line, details in the record
        print_unexpected(error, str(record_error(record, error)))
        return EXIT_FAILED
    if result.error_tail:
        console.print(Text("ansible-playbook stopped before any host result:", "red"))
        console.print(result.error_tail, soft_wrap=True)
    if plan.lab:
        console.print(lab_banner(plan, ran=True))
    console.print(verdict(run, result, time.monotonic() - started))
    return EXIT_OK if result.ok else EXIT_FAILED

