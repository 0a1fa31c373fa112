"""`k2provision logs INVENTORY [TARGET] [--follow] [--tail N] [--since T] [--grep RE]`.

TARGET is a host, a pool (prefill, decode, nodes), `router`, a planned process name or any
inventory group; without it, every planned process. Lines come out as `host/process | line`.
Without --follow each host is asked once (one SSH session, every host at once) and its
processes' logs come out one after another in plan order; with --follow every process streams
at once (one SSH channel each) until Ctrl-C, which ends the remote readers and exits 0.
--grep keeps the lines a Python regular expression matches (after --tail picks the last N).
"""

from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass
from typing import Annotated

import typer

from k2provision.commands.flow import EXIT_FAILED, EXIT_OK, load_plan
from k2provision.commands.params import InventoryArg
from k2provision.errors import ArgumentError
from k2provision.ops.connect import SshTarget
from k2provision.ops.log_sources import LogSource, select_sources, since_problem
from k2provision.ops.remote import (
    Stream,
    follow_all,
    run_all,
    ssh_inventory,
)
from k2provision.ops.status_probe import plain_line
from k2provision.plan.host_questions import hq, log_question
from k2provision.run.cancel import Interrupted, exit_code, stopping
from k2provision.run.display import print_warnings

SNAPSHOT_TIMEOUT_S = 60.0
# The most lines --tail asks each process for.
MAX_TAIL = 1_000_000
_write_lock = threading.Lock()


@dataclass(frozen=True)
class LogRequest:
    """What `logs` reads: which processes, reached how, and which of their lines."""

    sources: list[LogSource]
    targets: dict[str, SshTarget]
    tail: int | None
    since: str | None
    pattern: re.Pattern[str] | None


def emit(label: str, line: str, pattern: re.Pattern[str] | None) -> None:
    """One prefixed line on stdout, as the log has it less terminal control codes (colours
    included), unless --grep drops it."""
    line = plain_line(line)
    if pattern is not None and not pattern.search(line):
        return
    with _write_lock:
        sys.stdout.write(f"{label} | {line}\n")
        sys.stdout.flush()


def snapshot_probe(
    sources: list[LogSource], tail: int | None, since: str | None
) -> tuple[hq.Batch, dict[str, hq.Ticket[hq.LogTail]]]:
    """What a host is asked for `logs` without --follow: each process's log, in one batch."""
    batch = hq.Batch()
    asked = {
        s.label: batch.add(f"log {s.process.name}", log_question(s.process, tail, since))
        for s in sources
    }
    return batch, asked


def snapshot(ask: LogRequest) -> int:
    """Every chosen host asked at once; each process's lines in plan order."""
    sources, targets, pattern = ask.sources, ask.targets, ask.pattern
    by_host: dict[str, list[LogSource]] = {}
    for source in sources:
        by_host.setdefault(source.host, []).append(source)
    probes = {h: snapshot_probe(s, ask.tail, ask.since) for h, s in by_host.items()}
    replies = run_all(
        {h: (targets[h], batch.script()) for h, (batch, _) in probes.items()},
        timeout=SNAPSHOT_TIMEOUT_S,
    )
    problems: list[str] = []
    for host, host_sources in by_host.items():
        reply = replies[host]
        if not reply.reached:
            problems.append(f"{host}: unreachable: {reply.unreachable}")
            continue
        batch, asked = probes[host]
        answers = batch.read(reply.stdout)
        for source in host_sources:
            ticket = asked[source.label]
            if ticket.key not in answers.raw:
                problems.append(f"{source.label}: no answer")
                continue
            log = answers[ticket]
            if log.rc not in (0, None):
                last = log.lines[-1] if log.lines else ""
                problems.append(f"{source.label}: reading the log failed ({log.rc}): {last}")
                continue
            for line in log.lines:
                emit(source.label, line, pattern)
    print_warnings(problems)
    return EXIT_FAILED if problems else EXIT_OK


def follow(ask: LogRequest) -> int:
    """Every process streamed at once until Ctrl-C (exit 0) or every stream ends."""
    pattern = ask.pattern
    streams = {
        s.label: Stream(
            ask.targets[s.host],
            log_question(s.process, ask.tail, ask.since).stream_command(follow=True),
        )
        for s in ask.sources
    }
    # Ctrl-C, SIGTERM or SIGHUP end a follow cleanly: follow_all closes every SSH session on
    # the way out, also where the shell started us with SIGINT ignored (a background job).
    try:
        with stopping():
            errors = follow_all(streams, lambda label, line: emit(label, line, pattern))
    except Interrupted as stop:
        return exit_code(stop.signum)
    failed = [f"{label}: {reason}" for label, reason in errors.items() if reason]
    print_warnings(failed)
    return EXIT_FAILED if failed else EXIT_OK


def logs(
    inventory: InventoryArg,
    target: Annotated[
        str | None,
        typer.Argument(
            help="a host, a pool (prefill, decode, nodes), router, a process, or an "
            "inventory group; all when left out"
        ),
    ] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="stream new lines from every target until Ctrl-C")
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option("--tail", help="only the last N lines of each process (default 100)"),
    ] = 100,
    since: Annotated[
        str | None,
        typer.Option("--since", help="only lines since a time: 10m, 1h30m, 2026-01-31T12:00:00Z"),
    ] = None,
    grep: Annotated[
        str | None, typer.Option("--grep", help="only lines this regular expression matches")
    ] = None,
) -> None:
    """Read the planned processes' logs, every line behind `host/process | `."""
    problems = []
    if tail is not None and not 0 <= tail <= MAX_TAIL:
        problems.append(f"--tail {tail}: expected 0 to {MAX_TAIL} lines")
    if since is not None and (line := since_problem(since)):
        problems.append(line)
    pattern = None
    if grep is not None:
        try:
            pattern = re.compile(grep)
        except re.error as error:
            problems.append(f"--grep {grep}: not a regular expression ({error})")
    if problems:
        raise ArgumentError(problems)
    loaded = load_plan(inventory)
    groups, targets = ssh_inventory(inventory)
    sources = select_sources(loaded.plan, groups, target)
    print_warnings(loaded.notices)
    if since and any(s.process.exec_in for s in sources):
        print_warnings(["--since does not apply to exec'd processes' log files (no timestamps)"])
    read = follow if follow_ else snapshot
    try:
        code = read(LogRequest(sources, targets, tail, since, pattern))
    except KeyboardInterrupt:
        code = EXIT_OK
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add `logs` to the app."""
    app.command("logs")(logs)
