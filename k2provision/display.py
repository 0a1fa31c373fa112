"""Rich tables for plans and errors. Output only; no decisions here."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k2provision.errors import K2Error
from k2provision.models import Plan

# Pipes and CI logs get wide lines instead of rich's 80-column default.
# emoji=False: data such as the IPv6 address fd00:100::1 must not turn ":100:" into an emoji.
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160, emoji=False)


def print_errors(error: K2Error) -> None:
    """One line per problem on stderr."""
    for problem in error.problems:
        err_console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)


def print_warnings(plan: Plan) -> None:
    """The plan's warnings, one line each, on stderr."""
    for warning in plan.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)


def _sizes(plan: Plan, pool_name: str) -> str:
    pool = next(p for p in plan.pools if p.name == pool_name)
    p = pool.parallel
    parts = [f"tp {p.tp}"]
    if p.pp > 1:
        parts.append(f"pp {p.pp}")
    if p.dp > 1:
        parts.append(f"dp {p.dp}" + (" (attn)" if p.dp_attention else ""))
    if p.ep > 1:
        parts.append(f"ep {p.ep}")
    if p.redundant_experts:
        parts.append(f"+{p.redundant_experts} spare experts")
    return ", ".join(parts)


def plan_table(plan: Plan) -> Table:
    """Hosts, roles, ranks, GPUs and what each runs."""
    table = Table(
        title=f"{plan.model} on {plan.engine} {plan.engine_version} ({plan.layout})",
        title_justify="left",
    )
    for column in ("host", "address", "role", "rank", "GPUs", "runs (stage)"):
        table.add_column(column)
    for host in plan.hosts:
        runs = ", ".join(f"{p.name} ({p.stage})" for p in host.processes) or "-"
        table.add_row(
            escape(host.name),
            escape(host.address),
            host.role,
            str(host.node_rank),
            str(host.gpus),
            escape(runs),
        )
    return table


def fit_table(plan: Plan) -> Table:
    """Memory fit per pool, per GPU: the derived fraction, weights, reserve and KV cache."""
    table = Table(title="memory fit per GPU", title_justify="left")
    for column in (
        "pool",
        "parallel",
        "fraction",
        "weights GiB",
        "reserve GiB",
        "KV GiB",
        "KV tokens/replica",
        "context",
        "fits",
    ):
        table.add_column(column)
    for r in plan.fit:
        table.add_row(
            r.pool,
            _sizes(plan, r.pool),
            f"{r.mem_fraction:g}",
            f"{r.weights_gib}",
            f"{r.reserve_gib}",
            f"{r.kv_gib} ({r.kv_dtype})",
            f"{r.kv_tokens_per_replica:,}",
            f"{r.context_length:,}",
            "[green]yes[/]" if r.fits else "[red]no[/]",
        )
    return table


def reserve_table(plan: Plan) -> Table:
    """What the reserve holds, per GPU: CUDA graphs and buffers for the chosen sizes."""
    table = Table(title="reserve per GPU (GiB): graphs and buffers", title_justify="left")
    for column in (
        "pool",
        "CUDA graphs",
        "comm buffers",
        "activations",
        "runtime",
        "encoder",
        "margin",
        "total",
    ):
        table.add_column(column)
    for r in plan.fit:
        m = r.reserve
        table.add_row(
            r.pool,
            f"{m.cuda_graphs}",
            f"{m.comm_buffers}",
            f"{m.activations}",
            f"{m.runtime}",
            f"{m.encoder}",
            f"{m.margin}",
            f"{r.reserve_gib}",
        )
    return table


def print_plan(plan: Plan) -> None:
    """The human view of a plan."""
    if plan.lab:
        console.print(
            "[bold yellow]LAB PROFILE: hardware steps skipped, stand-in engine image "
            f"{plan.hosts[0].processes[0].image if plan.hosts[0].processes else ''}[/]"
        )
    console.print(plan_table(plan))
    console.print(fit_table(plan))
    console.print(reserve_table(plan))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    console.print(f"endpoint: [bold]{escape(plan.endpoint)}[/]", highlight=False)
    sys.stdout.flush()


class RunView:
    """Live view of a playbook run: the current phase and task, and per-host tallies."""

    def __init__(self, hosts: list[str]) -> None:
        from rich.live import Live
        from rich.spinner import Spinner

        from k2provision.events import Tally

        self.hosts = hosts
        self.phase = ""
        self.task = ""
        self.tally = Tally()
        self.spinner = Spinner("dots", text="starting")
        self.live = Live(self._render(), console=console, refresh_per_second=8, transient=True)

    def _render(self) -> Any:
        from rich.console import Group

        self.spinner.text = escape(f"{self.phase} > {self.task}" if self.phase else self.task)
        return Group(self.spinner, self.host_table(live=True))

    def host_table(self, live: bool = False) -> Table:
        """Per-host ok/changed/failed/unreachable counts (and the first failure)."""
        table = Table(title=None if live else "run summary", title_justify="left")
        for column in ("host", "ok", "changed", "failed", "unreachable", "first failure"):
            table.add_column(column)
        for host in self.hosts:
            c = self.tally.counts.get(host, {})
            table.add_row(
                escape(host),
                str(c.get("ok", 0)),
                str(c.get("changed", 0)),
                f"[red]{c['failed']}[/]" if c.get("failed") else "0",
                f"[red]{c['unreachable']}[/]" if c.get("unreachable") else "0",
                escape(self.tally.failures.get(host, ""))[:120],
            )
        return table

    def __enter__(self) -> RunView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def on_event(self, event: Any) -> None:
        """Fold one typed runner event into the view."""
        from k2provision.events import HostResult, PlayStarted, TaskStarted

        if isinstance(event, PlayStarted):
            self.phase = event.name
        elif isinstance(event, TaskStarted):
            self.task = event.name
        elif isinstance(event, HostResult):
            if event.host not in self.hosts:
                self.hosts.append(event.host)
            self.tally.add(event)
            if event.status in {"failed", "unreachable"} and not event.ignored:
                console.print(
                    f"[red]{event.status}[/] {escape(event.host)}: "
                    f"{escape(event.task)}: {escape(event.message)}",
                    soft_wrap=True,
                )
        self.live.update(self._render())
