"""Command-line parameters several commands share, so each reads and helps the same way."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class OutputFormat(StrEnum):
    """What --format accepts, wherever a command has it."""

    table = "table"
    json = "json"


InventoryArg = Annotated[
    Path,
    typer.Argument(
        help="Ansible inventory: an INI or YAML file, or a directory (e.g. inventory/prod.ini)"
    ),
]
FormatOpt = Annotated[
    OutputFormat,
    typer.Option("--format", help="table for people (warnings on stderr), json for programs"),
]
CheckOpt = Annotated[bool, typer.Option("--check", help="predict changes, change nothing")]
DiffOpt = Annotated[bool, typer.Option("--diff", help="show file differences")]
LimitOpt = Annotated[
    str | None, typer.Option("--limit", help="only these hosts (an Ansible host pattern)")
]
TagsOpt = Annotated[
    str | None, typer.Option("--tags", help="only these phases, comma-separated")
]

KeepFailedOpt = Annotated[
    bool,
    typer.Option(
        "--keep-failed",
        help="leave a failed launch stage's containers running for debugging (default: stopped)",
    ),
]


def split_tags(tags: str | None) -> tuple[str, ...]:
    """'launch, verify' -> ('launch', 'verify')."""
    return tuple(t.strip() for t in (tags or "").split(",") if t.strip())
