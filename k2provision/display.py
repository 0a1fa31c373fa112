"""Rich tables for plans and errors. Output only; no decisions here."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k2provision.errors import K2Error
from k2provision.models import Plan

console = Console()
err_console = Console(stderr=True)


def print_errors(error: K2Error) -> None:
    """One line per problem on stderr."""
    for problem in error.problems:
        err_console.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)


def _sizes(plan: Plan, pool_name: str) -> str:
    pool = next(p for p in plan.pools if p.name == pool_name)
    p = pool.parallel
    parts = [f"tp {p.tp}"]
    if p.pp > 1:
        parts.append(f"pp {p.pp}")
    if p.dp > 1:
        parts.append(f"dp {p.dp}" + (" (attention)" if p.dp_attention else ""))
    if p.ep > 1:
        parts.append(f"ep {p.ep}")
    if p.redundant_experts:
        parts.append(f"+{p.redundant_experts} redundant experts")
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
        table.add_row(host.name, host.address, host.role, str(host.node_rank), str(host.gpus), runs)
    return table


def fit_table(plan: Plan) -> Table:
    """Memory fit per pool, per GPU."""
    table = Table(title="memory fit per GPU", title_justify="left")
    for column in (
        "pool",
        "parallel",
        "weights GiB",
        "budget GiB",
        "KV GiB",
        "KV tokens/GPU",
        "context",
        "fits",
    ):
        table.add_column(column)
    for r in plan.fit:
        table.add_row(
            r.pool,
            _sizes(plan, r.pool),
            f"{r.weights_gib}",
            f"{r.budget_gib}",
            f"{r.kv_gib}",
            f"{r.kv_tokens_per_gpu:,}",
            f"{r.context_length:,}",
            "[green]yes[/]" if r.fits else "[red]no[/]",
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
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    console.print(f"endpoint: [bold]{plan.endpoint}[/]")
    sys.stdout.flush()
