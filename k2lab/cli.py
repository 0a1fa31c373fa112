"""`k2provision lab ...`: the lab's commands, one function each; parse, call, print, exit code.

Exit codes: 0 done; 1 `status` found the lab down or degraded; 2 an error for a person
(not root, a missing tool, a bad argument, a step that failed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k2provision.lab import core
from k2provision.lab.errors import LabError
from k2provision.lab.inventory import VarValue, parse_pairs, parse_var_value
from k2provision.lab.state import LabState

lab_app = typer.Typer(
    name="lab",
    help="A lab of real SSH hosts on this machine (namespaces + overlay roots). Needs root.",
    no_args_is_help=True,
    add_completion=False,
)
_err = Console(stderr=True)
_out = Console()


def _fail(exc: LabError) -> typer.Exit:
    for problem in exc.problems:
        _err.print(f"[bold red]lab:[/] {escape(problem)}", highlight=False)
    return typer.Exit(2)


def _parse_rate(text: str) -> float | None:
    if text.lower() in ("off", "none", "0"):
        return None
    try:
        return float(text)
    except ValueError as exc:
        raise LabError(f"rate {text!r}: expected Mbit/s (e.g. 100) or off") from exc


def demo_layout(n: int) -> tuple[dict[str, int] | None, dict[str, VarValue]]:
    """What `lab up N` deploys when no --group/--var is given: the whole flow, small.

    Two hosts or more: SGLang PD (first half prefill, second half decode, router on the first
    prefill host); one host: KTransformers. Weights come from the synthetic test source.
    """
    common: dict[str, VarValue] = {
        "k2_model_dir": "/models/Kimi-K2-Instruct",
        "k2_context_length": 32768,
        "k2_weights_source": "synthetic",
    }
    if n == 1:
        return None, {**common, "k2_engine": "ktransformers", "k2_layout": "single"}
    return {"prefill": n // 2, "decode": n - n // 2}, {
        **common,
        "k2_engine": "sglang",
        "k2_layout": "pd",
    }


@lab_app.command("up")
def up_cmd(
    n: Annotated[int, typer.Argument(help="How many hosts (lab1..labN).")] = 4,
    shape_mbit: Annotated[
        float | None,
        typer.Option("--shape-mbit", help="Limit each host link to R Mbit/s each way."),
    ] = None,
    inventory: Annotated[
        Path | None, typer.Option(help="Where to write the inventory (default inventory/lab.ini).")
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=COUNT, repeatable, in order: --group prefill=1 --group decode=3 "
            "(default: every host in \\[nodes])."
        ),
    ] = None,
    children: Annotated[
        list[str] | None, typer.Option(help="PARENT=G1,G2: a \\[PARENT:children] section.")
    ] = None,
    var: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for \\[all:vars], repeatable (k2_engine=sglang)."),
    ] = None,
) -> None:
    """Start N hosts (idempotent: running hosts are kept, dead ones restarted)."""
    try:
        counts = {k: int(v) for k, v in parse_pairs(group or [], "--group").items()} or None
        kids = {
            k: [g for g in v.split(",") if g]
            for k, v in parse_pairs(children or [], "--children").items()
        }
        all_vars = {k: parse_var_value(v) for k, v in parse_pairs(var or [], "--var").items()}
        if counts is None and not all_vars:
            counts, all_vars = demo_layout(n)
        state = core.up(
            n,
            shape_mbit=shape_mbit,
            inventory=inventory,
            groups=counts,
            children=kids or None,
            all_vars=all_vars or None,
        )
    except ValueError as exc:
        raise _fail(LabError(f"--group: expected NAME=COUNT with a whole number ({exc})")) from exc
    except LabError as exc:
        raise _fail(exc) from exc
    _print_hosts(state)


@lab_app.command("down")
def down_cmd() -> None:
    """Stop every host and remove what `up` created (by PID and by name)."""
    try:
        core.down()
    except LabError as exc:
        raise _fail(exc) from exc


@lab_app.command("status")
def status_cmd(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the state file's content.")
    ] = False,
) -> None:
    """Show the hosts and whether each runs; exit 1 when the lab is down or degraded."""
    try:
        st = core.status()
    except LabError as exc:
        raise _fail(exc) from exc
    if as_json:
        body = st.state.model_dump(mode="json") if st.state else None
        _out.print_json(json.dumps({"up": st.up, "healthy": st.healthy, "state": body}))
    elif st.state is None:
        _out.print(f"lab {st.name} is not up")
    else:
        _print_hosts(st.state, {h.name: h.alive for h in st.hosts})
        _out.print(
            f"bridge {st.state.bridge}: {'up' if st.bridge else 'MISSING'}; "
            f"proxy {st.state.controller_ip}:3142: {'up' if st.proxy else 'DOWN'}; "
            f"shaping: {st.state.shape_mbit or 'off'}"
        )
    if not st.healthy:
        raise typer.Exit(1)


@lab_app.command("shape")
def shape_cmd(rate: Annotated[str, typer.Argument(help="Mbit/s per host link, or off.")]) -> None:
    """Limit (or unlimit) every host link of the running lab."""
    try:
        core.shape(_parse_rate(rate))
    except LabError as exc:
        raise _fail(exc) from exc


@lab_app.command("stop")
def stop_cmd(host: Annotated[str, typer.Argument(help="e.g. lab2")]) -> None:
    """Kill one host at once (its disk is kept), as a fault."""
    try:
        core.stop_host(host)
    except LabError as exc:
        raise _fail(exc) from exc


@lab_app.command("start")
def start_cmd(host: Annotated[str, typer.Argument(help="e.g. lab2")]) -> None:
    """Start a stopped host again."""
    try:
        core.start_host(host)
    except LabError as exc:
        raise _fail(exc) from exc


@lab_app.command("build-image")
def build_image_cmd(
    tag: Annotated[str, typer.Argument(help="e.g. localhost/k2stub:test")],
    directory: Annotated[
        Path, typer.Argument(help="Build context with a Containerfile/Dockerfile.")
    ],
) -> None:
    """Build an image FROM localhost/k2host:test that every lab host can run."""
    from k2provision.lab import build_image
    from k2provision.lab.proc import require_root

    try:
        require_root()
        build_image(tag, directory)
    except LabError as exc:
        raise _fail(exc) from exc


def _print_hosts(state: LabState, alive: dict[str, bool] | None = None) -> None:
    table = Table(title=f"lab {state.name}", show_edge=False)
    for column in ("host", "address", "ssh", *(("running",) if alive is not None else ())):
        table.add_column(column)
    for host in state.hosts:
        row = [host.name, host.address, str(state.ssh_port)]
        if alive is not None:
            row.append("yes" if alive.get(host.name) else "[red]no[/]")
        table.add_row(*row)
    _out.print(table)
    if state.inventory:
        _out.print(f"inventory: {state.inventory}", highlight=False)


if __name__ == "__main__":
    lab_app()
