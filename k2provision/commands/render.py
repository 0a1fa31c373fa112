"""`k2provision render INVENTORY [--out DIR] [--force]`: every host's files, to inspect or copy
by hand. Where it may write is render_output.py's to decide (a new, empty or earlier-render
directory; host names that are safe path components)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from k2provision.commands.flow import load_plan
from k2provision.commands.params import InventoryArg
from k2provision.errors import ArgumentError
from k2provision.run.display import console, print_warnings
from k2provision.run.render_files import write_render


def render(
    inventory: InventoryArg,
    out: Annotated[str, typer.Option("--out", help="directory to write into")] = "render-out",
    force: Annotated[
        bool, typer.Option("--force", help="write into a non-empty directory that is no render")
    ] = False,
) -> None:
    """Write every host's files and launch scripts under OUT/<host>/, plus plan.json."""
    if not out.strip():
        raise ArgumentError(
            ["--out '' names no directory; expected the directory to write into; fix: pass "
             "--out DIR (default render-out)"]
        )  # fmt: skip
    loaded = load_plan(inventory)
    written = write_render(loaded.plan, Path(out), force=force)
    print_warnings([*loaded.notices, *loaded.plan.warnings])
    console.print(f"wrote {written} files for {len(loaded.plan.hosts)} hosts under {out}/")


def register(app: typer.Typer) -> None:
    """Add `render` to the app."""
    app.command("render")(render)
