"""The k2provision command line: one function per command; parse, call, print, exit code.

Exit codes: 0 success, 1 a run failed on hosts, 2 bad input (inventory, plan, arguments).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k2provision.display import console, print_errors, print_plan, print_warnings
from k2provision.errors import K2Error
from k2provision.inventory import load_cluster
from k2provision.models import Plan
from k2provision.plan import build_plan
from k2provision.render_output import write_render

app = typer.Typer(
    help="Provision GPU hosts from an Ansible inventory and serve Kimi-K2.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _mount_lab() -> None:
    from k2provision.lab.cli import lab_app

    app.add_typer(lab_app, name="lab", help="Real SSH hosts on this machine, for trying and tests.")


_mount_lab()


def _mount_weights() -> None:
    from k2provision.weights.cli import weights_cmd

    app.command("weights")(weights_cmd)


_mount_weights()

InventoryArg = Annotated[
    Path, typer.Argument(help="Ansible inventory (INI, YAML or a directory), e.g. prod.ini")
]


def load_plan(inventory: Path) -> Plan:
    """Inventory -> Plan, or print the problems and exit 2."""
    try:
        return build_plan(load_cluster(inventory))
    except K2Error as error:
        print_errors(error)
        raise typer.Exit(2) from None


@app.command()
def plan(
    inventory: InventoryArg,
    output_format: Annotated[
        str, typer.Option("--format", help="table (default) or json")
    ] = "table",
) -> None:
    """Show what would run where: pools, ranks, GPUs, memory fit, endpoint."""
    if output_format not in {"table", "json"}:
        print_errors(K2Error([f"--format {output_format}: expected table or json"]))
        raise typer.Exit(2)
    result = load_plan(inventory)
    if output_format == "json":
        typer.echo(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        print_plan(result)


@app.command()
def models(
    output_format: Annotated[
        str, typer.Option("--format", help="table (default), json or markdown")
    ] = "table",
    gpu: Annotated[
        list[str] | None, typer.Option("--gpu", help="only these GPU types (repeatable)")
    ] = None,
    context_length: Annotated[
        int | None,
        typer.Option("--context-length", help="size layouts for this context, not the model's"),
    ] = None,
) -> None:
    """The model catalog: sizes, formats, context, pinned engines' support, and per GPU type
    the fewest nodes each engine layout needs."""
    from k2provision import catalog
    from k2provision.models_table import markdown, rows, tables

    problems = [f"--format {output_format}: expected table, json or markdown"] * (
        output_format not in {"table", "json", "markdown"}
    )
    problems += [
        f"--gpu {g}: unknown GPU; expected one of {', '.join(catalog.GPUS)}"
        for g in gpu or []
        if g.lower() not in catalog.GPUS
    ]
    if context_length is not None and context_length < 1:
        problems.append(f"--context-length {context_length}: expected a positive integer")
    if problems:
        print_errors(K2Error(problems))
        raise typer.Exit(2)
    data = rows(tuple(g.lower() for g in gpu) if gpu else None, context_length)
    if output_format == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    if output_format == "markdown":
        typer.echo(markdown(data), nl=False)
        return
    for table in tables(data):
        console.print(table)


@app.command()
def render(
    inventory: InventoryArg,
    out: Annotated[Path, typer.Option("--out", help="directory to write into")] = Path(
        "render-out"
    ),
    force: Annotated[
        bool, typer.Option("--force", help="write into a non-empty directory that is no render")
    ] = False,
) -> None:
    """Write every host's files and launch scripts under OUT/<host>/, plus plan.json."""
    result = load_plan(inventory)
    try:
        written = write_render(result, out, force=force)
    except K2Error as error:
        print_errors(error)
        raise typer.Exit(2) from None
    print_warnings(result)
    console.print(f"wrote {written} files for {len(result.hosts)} hosts under {out}/")


@app.command()
def apply(
    inventory: InventoryArg,
    check: Annotated[bool, typer.Option("--check", help="predict changes, change nothing")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="show file differences")] = False,
    limit: Annotated[str | None, typer.Option("--limit", help="only these hosts (pattern)")] = None,
    tags: Annotated[
        str | None, typer.Option("--tags", help="only these phases, comma-separated")
    ] = None,
) -> None:
    """Plan, then run playbooks/site.yml on the hosts with live progress and a summary."""
    raise typer.Exit(
        run_phases("site.yml", "apply", inventory, check=check, diff=diff, limit=limit, tags=tags)
    )


@app.command()
def stop(
    inventory: InventoryArg,
    limit: Annotated[str | None, typer.Option("--limit", help="only these hosts (pattern)")] = None,
) -> None:
    """Stop and remove the plan's engine containers (weights and files stay)."""
    raise typer.Exit(run_phases("stop.yml", "stop", inventory, limit=limit))


def run_phases(
    playbook: str,
    command: str,
    inventory: Path,
    *,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    tags: str | None = None,
) -> int:
    """Show the plan, run `playbook`, print the summary; the exit code of the outcome."""
    from k2provision.display import RunView
    from k2provision.plan import plan_digest
    from k2provision.runner import new_record_dir, run_playbook

    result = load_plan(inventory)
    print_plan(result)
    record = new_record_dir(command)
    (record / "plan.json").write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    hosts = [h.name for h in result.hosts]
    mode = " (check mode: nothing changes)" if check else ""
    console.print(f"[bold]{command}[/] {inventory}{mode}: record in {record}")
    with RunView(hosts) as view:
        run = run_playbook(
            playbook,
            inventory,
            record_dir=record,
            extravars={"k2_expected_plan_digest": plan_digest(result)},
            tags=[t.strip() for t in tags.split(",") if t.strip()] if tags else (),
            limit=limit,
            check=check,
            diff=diff,
            on_event=view.on_event,
        )
    console.print(view.host_table())
    if run.error_tail:
        console.print(
            f"[red]ansible-playbook stopped before any host result:[/]\n{run.error_tail}",
            markup=True,
            highlight=False,
        )
    if result.lab:
        console.print(
            "[bold yellow]LAB PROFILE was on: hardware steps skipped, stand-in engines.[/]"
        )
    verdict = "[green]succeeded[/]" if run.ok else "[red]failed[/]"
    console.print(
        f"{command} {verdict}: {view.tally.total('changed')} changed, "
        f"{len(run.tally.failures)} host(s) failed or unreachable; record: {record}"
    )
    return 0 if run.ok else 1


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
