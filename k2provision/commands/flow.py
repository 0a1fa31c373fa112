"""The one flow of every command that touches hosts, and the plan loading every command shares.

load plan -> print it -> run record -> runner -> summary -> exit code. A command describes its
run as data (`HostRun`) and may add to the flow through `RunHooks` (what it previews, extra
variables for the playbook, its live view, its results); everything else is the same for
every command: the record's content, how failures and Ansible's own errors are shown, the lab
banner, the verdict line and the exit code (0 ok, 1 failed on hosts, 2 bad input).

A stop signal (SIGTERM, SIGINT, SIGHUP; run/cancel.py) interrupts the playbook; the flow then
ends what the run had started on the hosts (`end_started`: weights relays, a launch stage not
through its gates), marks the record cancelled and exits 128 + the signal.
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

from k2provision.core.records import Plan
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.inventory import load_cluster
from k2provision.run.cancel import CURRENT, Interrupted, Started, cleaning, exit_code, stopping
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
from k2provision.run.runner import (
    PlaybookRun,
    RunResult,
    new_record_dir,
    run_playbook,
    switched_off,
)

EXIT_OK = 0
EXIT_FAILED = 1

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
    full: bool = False
    """Every task runs, not only those of what the look found off the plan (k2_full_converge)."""
    accept_outage: bool = False
    """A change the look finds takes the endpoint down goes ahead (k2_accept_outage)."""
    canary: int | None = None
    """This run's canary share in per cent, instead of the plan's (k2_apply_canary)."""


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


CLEANUP_TIMEOUT_S = 60
RELAYS_LEFT = "stopped; what they received stays, and the next run resumes from its checkpoints"


def end_started(run: HostRun, started: Started, record: Path, digest: str) -> dict[str, Any]:
    """After a cancelled run: stop the weights relays it started and the launch stage it had
    not got through (as a failed stage is stopped, unless --keep-failed); what was done."""
    done: dict[str, Any] = {}
    if not started.anything:
        return done
    cleanup = record / "cleanup"
    cleanup.mkdir()
    stage = started.stage if started.stage is not None and not run.keep_failed else ""
    where = f"on the hosts, see {cleanup}"
    if started.relays:
        CURRENT.running["weights relays (pidfiles serve.pid, send.pid)"] = where
    if stage:
        CURRENT.running[f"launch stage {stage}'s containers"] = where
    result = run_playbook(
        PlaybookRun(
            playbook="cancelled.yml",
            inventory=run.inventory,
            record_dir=cleanup,
            extravars={
                "k2_expected_plan_digest": digest,
                "k2_cancel_relays": started.relays,
                "k2_cancel_stage": stage,
            },
            limit=run.limit,
            timeout_s=CLEANUP_TIMEOUT_S,
        )
    )
    outcome = "" if result.ok else f" (not everywhere: see {cleanup}/summary.json)"
    if started.relays:
        done["relays"] = RELAYS_LEFT + outcome
    if started.stage is not None:
        done["launch_stage"] = started.stage
        done["launch_stage_containers"] = (
            "left running (--keep-failed)" if run.keep_failed else "stopped" + outcome
        )
    if result.ok:
        CURRENT.running.clear()
    return done


def record_cancelled(record: Path, signal: str, ended: dict[str, Any]) -> None:
    """The record's summary.json, marked cancelled, with what the cleanup ended."""
    path = record / "summary.json"
    summary: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    summary.update(status="cancelled", cancelled=signal, ended=ended)
    summary.setdefault("done", {})
    path.write_text(json.dumps(summary, indent=2) + "\n")


def verdict(run: HostRun, result: RunResult, seconds: float) -> Text:
    """`apply succeeded in 12.3 s: 4 changed, 0 host(s) failed or unreachable; record: DIR`."""
    word = Text("succeeded", "green") if result.ok else Text("failed", "red")
    if result.cancelled:
        word = Text(f"cancelled ({result.cancelled})", "yellow")
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
    playbook, show the outcome; the exit code. A stop signal ends it as the module says."""
    record: list[Path] = []

    def abandoned(left: list[str]) -> None:
        if record:
            record_cancelled(record[0], "second signal", {"may_still_run": left})

    with stopping(CURRENT, on_abandon=abandoned):
        try:
            return _flow(run, hooks or RunHooks(), loaded, record)
        except Interrupted as stop:
            if record:
                record_cancelled(record[0], stop.args[0], {})
            console.print(Text(f"{run.command} cancelled ({stop.args[0]}) before it ran", "yellow"))
            return exit_code(stop.signum)


def _flow(run: HostRun, hooks: RunHooks, loaded: LoadedPlan | None, record_: list[Path]) -> int:
    loaded = loaded or load_plan(run.inventory)
    plan = loaded.plan
    record = new_record_dir(run.command, plan)
    record_.append(record)
    record_plan(plan, record)
    hooks.preview(loaded, run, record)
    print_warnings(loaded.notices)
    started = time.monotonic()
    on_hosts = Started()
    try:
        extravars = {"k2_expected_plan_digest": plan_digest(plan), **hooks.extravars(plan, record)}
        if run.keep_failed:
            extravars["k2_launch_keep_failed"] = True
        if run.full:
            extravars["k2_full_converge"] = True
        if run.accept_outage:
            extravars["k2_accept_outage"] = True
        if run.canary is not None:
            extravars["k2_apply_canary"] = run.canary
        with hooks.view(plan, record) as view:

            def on_event(event: Event) -> None:
                on_hosts.observe(event)
                view.on_event(event)

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
                on_event=on_event,
            )
        if result.cancelled:
            with cleaning(CURRENT):
                console.print(f"{run.command}: {result.cancelled}; ending what the run started")
                ended = end_started(run, on_hosts, record, plan_digest(plan))
                record_cancelled(record, result.cancelled, ended)
        hooks.report(plan, result, view)
    except Exception as error:  # a bug or a broken environment: one line, details in the record
        print_unexpected(error, str(record_error(record, error)))
        return EXIT_FAILED
    if result.error_tail:
        console.print(Text("ansible-playbook stopped before any host result:", "red"))
        console.print(result.error_tail, soft_wrap=True)
    if plan.lab:
        console.print(lab_banner(plan, ran=True))
    for line in switched_off(plan):
        console.print(Text(line, "bold red"), soft_wrap=True)
    console.print(verdict(run, result, time.monotonic() - started))
    if result.cancelled:
        return CURRENT.exit_code()
    return EXIT_OK if result.ok else EXIT_FAILED
