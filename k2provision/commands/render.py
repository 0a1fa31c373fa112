"""`k2provision render INVENTORY [--out DIR]`: every host's files, to inspect or copy by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k2provision.commands.flow import load_plan
from k2provision.commands.params import InventoryArg
from k2provision.display import console, print_warnings
from k2provision.models import Plan


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


def render(
    inventory: InventoryArg,
    out: Annotated[Path, typer.Option("--out", help="directory to write into")] = Path(
        "render-out"
    ),
) -> None:
    """Write every host's files and launch scripts under OUT/<host>/, plus plan.json."""
    loaded = load_plan(inventory)
    written = write_render(loaded.plan, out)
    print_warnings(loaded.notices)
    console.print(f"wrote {written} files for {len(loaded.plan.hosts)} hosts under {out}/")


def register(app: typer.Typer) -> None:
    """Add `render` to the app."""
    app.command("render")(render)
