"""The k2provision command line: one function per command; parse, call, print, exit code.

Exit codes: 0 success, 1 a run failed on hosts, 2 bad input (inventory, plan, arguments).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k2provision.display import console, print_errors, print_plan
from k2provision.errors import K2Error
from k2provision.inventory import load_cluster
from k2provision.models import Plan
from k2provision.plan import build_plan

app = typer.Typer(
    help="Provision GPU hosts from an Ansible inventory and serve Kimi-K2.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

InventoryArg = Annotated[
    Path, typer.Argument(help="Ansible INI inventory, e.g. inventory/prod.ini")
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
def render(
    inventory: InventoryArg,
    out: Annotated[Path, typer.Option("--out", help="directory to write into")] = Path(
        "render-out"
    ),
) -> None:
    """Write every host's files and launch scripts under OUT/<host>/, plus plan.json."""
    result = load_plan(inventory)
    written = write_render(result, out)
    console.print(f"wrote {written} files for {len(result.hosts)} hosts under {out}/")


def write_render(result: Plan, out: Path) -> int:
    """Materialise a plan's files: OUT/<host>/<absolute path>, and OUT/plan.json."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    count = 1
    for host in result.hosts:
        for path, content in host.files.items():
            target = out / host.name / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            if path.endswith(".sh"):
                target.chmod(0o755)
            count += 1
    return count


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
