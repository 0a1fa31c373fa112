"""`k2provision models [--format table|json|markdown]`: the model catalog, and per GPU type the
fewest nodes each engine layout needs; nothing is contacted."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

from k2provision.commands.models_table import markdown, rows, tables
from k2provision.core import catalog
from k2provision.errors import ArgumentError
from k2provision.run.display import console


class ModelsFormat(StrEnum):
    """What `models --format` accepts: docs/models.md's table is the markdown one."""

    table = "table"
    json = "json"
    markdown = "markdown"


# Beyond any model's context; a larger number is a typo, not a size to plan for.
MAX_CONTEXT_LENGTH = 2**31 - 1


def models(
    output_format: Annotated[
        ModelsFormat,
        typer.Option("--format", help="table for people, json for programs, markdown for docs"),
    ] = ModelsFormat.table,
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
    problems = [
        f"--gpu {g}: unknown GPU; expected one of {', '.join(catalog.GPUS)}"
        for g in gpu or []
        if g.lower() not in catalog.GPUS
    ]
    if context_length is not None and not 1 <= context_length <= MAX_CONTEXT_LENGTH:
        problems.append(
            f"--context-length {context_length}: expected an integer from 1 to "
            f"{MAX_CONTEXT_LENGTH}; fix: pass the context in tokens (e.g. 131072)"
        )
    if problems:
        raise ArgumentError(problems)
    data = rows(tuple(g.lower() for g in gpu) if gpu else None, context_length)
    if output_format is ModelsFormat.json:
        typer.echo(json.dumps(data, indent=2))
    elif output_format is ModelsFormat.markdown:
        typer.echo(markdown(data), nl=False)
    else:
        for table in tables(data):
            console.print(table)


def register(app: typer.Typer) -> None:
    """Add `models` to the app."""
    app.command("models")(models)
