"""`k2provision lab ...`: the lab's commands, one function each; parse, call, print, exit code.

The lab registers this app as the `lab` subcommand of k2provision through the entry point
`k2provision.commands` (`register`). Exit codes: 0 done; 1 `status` found the lab down or
degraded; 2 an error for a person (not root, a missing tool, a bad argument, a step that
failed). Host names, addresses and paths are printed as plain text, never as markup.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from k2lab import core, demo
from k2lab.config import LabConfig
from k2lab.errors import LabError
from k2lab.inventory import parse_pairs, parse_var_value
from k2lab.proc import require_root, stderr_log
from k2lab.standin import CLIENT_IMAGE, build_standin, build_standin_client
from k2lab.state import LabState
from k2provision.commands.params import FormatOpt, OutputFormat
from k2provision.run.display import console as _out
from k2provision.run.display import print_errors

lab_app = typer.Typer(
    name="lab",
    help="A lab of real SSH hosts on this machine (namespaces + overlay roots). Needs root.",
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    """Add `lab` to k2provision's app (the `k2provision.commands` entry point)."""
    app.add_typer(lab_app, name="lab", help="Real SSH hosts on this machine, for trying and tests.")


def _fail(exc: LabError) -> typer.Exit:
    print_errors(exc, label="lab:")
    return typer.Exit(2)


def _parse_rate(text: str) -> float | None:
    if text.lower() in ("off", "none", "0"):
        return None
    try:
        return float(text)
    except ValueError as exc:
        raise LabError(f"rate {text!r}: expected Mbit/s (e.g. 100) or off") from exc


@lab_app.command("up")
def up_cmd(
    n: Annotated[int, typer.Argument(help="How many hosts (lab1..labN).")] = 4,
    shape_mbit: Annotated[
        float | None,
        typer.Option("--shape-mbit", help="Limit each host link to R Mbit/s each way."),
    ] = None,
    inventory: Annotated[
        Path | None,
        typer.Option(help="Where to write the inventory (default ./inventory/lab.ini)."),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=COUNT, repeatable, in order: --group prefill=1 --group decode=3 "
            "(default: the first layout that plans for N hosts)."
        ),
    ] = None,
    children: Annotated[
        list[str] | None, typer.Option(help="PARENT=G1,G2: a \\[PARENT:children] section.")
    ] = None,
    var: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE for \\[all:vars], repeatable (k2_engine=sglang)."),
    ] = None,
    instances: Annotated[
        int,
        typer.Option(
            "--instances",
            min=1,
            help="A fleet: K serving instances behind the real sglang-router, the router alone "
            "on lab1 and the instances on the other hosts (without --group/--var).",
        ),
    ] = 1,
    routers: Annotated[
        int,
        typer.Option(
            "--routers",
            min=1,
            help="With --instances: R routers on lab1..labR, HAProxy and keepalived beside "
            "each, the endpoint the lab's floating address (the front).",
        ),
    ] = 1,
    spares: Annotated[
        int,
        typer.Option(
            "--spares",
            min=0,
            help="With --instances: S spare hosts last, in \\[spare] (prepared, holding the "
            "weights, serving nothing until k2provision heal puts one in a failed host's "
            "place).",
        ),
    ] = 0,
    bastion: Annotated[
        bool,
        typer.Option(
            "--bastion",
            help="Add a host `bastion`; the others accept SSH only from it and the inventory "
            "reaches them through it (ProxyJump).",
        ),
    ] = False,
    bench_client: Annotated[
        bool,
        typer.Option(
            "--bench-client",
            help=f"Build {CLIENT_IMAGE}, the stand-in with sglang's real benchmark client "
            "(about 6 GB), and set k2_image to it, so `k2provision bench` runs its default "
            "in-cluster client.",
        ),
    ] = False,
) -> None:
    """Start N hosts (idempotent: running hosts are kept, dead ones restarted).

    Without --group/--var the inventory describes the first lab layout that plans for N hosts
    (see k2lab/demo.py for the order tried), and the stand-in engine image is built.
    """
    try:
        counts = {k: int(v) for k, v in parse_pairs(group or [], "--group").items()} or None
        kids = {
            k: [g for g in v.split(",") if g]
            for k, v in parse_pairs(children or [], "--children").items()
        }
        all_vars = {k: parse_var_value(v) for k, v in parse_pairs(var or [], "--var").items()}
        chosen = None
        if (instances > 1 or routers > 1 or spares) and (counts is not None or all_vars):
            raise LabError(
                "--instances, --routers and --spares choose the layout themselves: give them "
                "without --group/--var"
            )
        if counts is None and not all_vars:
            # refused here, before anything is made
            chosen = demo.choose(LabConfig.default(), n, instances, routers, spares)
            counts, all_vars = chosen.groups, chosen.all_vars
        if bench_client:
            all_vars = {**all_vars, "k2_image": CLIENT_IMAGE}
        state = core.up(
            n,
            shape_mbit=shape_mbit,
            inventory=inventory,
            groups=counts,
            children=kids or None,
            all_vars=all_vars or None,
            bastion=bastion,
        )
        if bench_client:
            build_standin_client(log=stderr_log)
        elif chosen is not None:
            build_standin(log=stderr_log)
    except ValueError as exc:
        raise _fail(LabError(f"--group: expected NAME=COUNT with a whole number ({exc})")) from exc
    except LabError as exc:
        raise _fail(exc) from exc
    _print_hosts(state)
    if chosen is not None:
        _out.print(f"layout: {chosen.describe()} (the first lab layout that plans)")


@lab_app.command("down")
def down_cmd() -> None:
    """Stop every host and remove what `up` created (by PID and by name)."""
    try:
        core.down()
    except LabError as exc:
        raise _fail(exc) from exc


@lab_app.command("status")
def status_cmd(output_format: FormatOpt = OutputFormat.table) -> None:
    """Show the hosts and whether each runs; exit 1 when the lab is down or degraded."""
    try:
        st = core.status()
    except LabError as exc:
        raise _fail(exc) from exc
    if output_format is OutputFormat.json:
        body = st.state.model_dump(mode="json") if st.state else None
        typer.echo(json.dumps({"up": st.up, "healthy": st.healthy, "state": body}, indent=2))
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
def stop_cmd(
    host: Annotated[str, typer.Argument(help="e.g. lab2")],
    cut_link: Annotated[
        bool,
        typer.Option(
            "--cut-link",
            help="Also take its link down and its addresses away: nothing answers for it "
            "(a floating address it held is then another host's alone).",
        ),
    ] = False,
) -> None:
    """Kill one host at once (its disk is kept), as a fault."""
    try:
        core.stop_host(host, cut_link=cut_link)
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
    from k2lab import build_image

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
        row: list[str | Text] = [host.name, host.address, str(state.ssh_port)]
        if alive is not None:
            row.append(Text("yes") if alive.get(host.name) else Text("no", "red"))
        table.add_row(*row)
    _out.print(table)
    if state.inventory:
        _out.print(f"inventory: {state.inventory}")


if __name__ == "__main__":
    lab_app()
