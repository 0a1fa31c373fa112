"""Command-line parameters several commands share, so each reads and helps the same way."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.core import Context, Parameter  # typer 0.26 vendors click (pinned)
from typer.core import TyperOption

from k2provision.core import vault
from k2provision.errors import ArgumentError


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


def checked_limit(value: str | None) -> str | None:
    """--limit as given; ArgumentError for one that names no host: ansible-playbook takes an
    empty --limit as none and runs on every host, the opposite of what was asked."""
    if value is not None and not value.strip(" \t,:&!"):
        raise ArgumentError(
            [
                f"--limit {value!r}: names no host; expected an Ansible host pattern (a host, "
                "a group such as decode, or several, comma-separated); leave --limit out to "
                "run on every host"
            ]
        )
    return value


LimitOpt = Annotated[
    str | None,
    typer.Option(
        "--limit", help="only these hosts (an Ansible host pattern)", callback=checked_limit
    ),
]
TagsOpt = Annotated[str | None, typer.Option("--tags", help="only these phases, comma-separated")]

KeepFailedOpt = Annotated[
    bool,
    typer.Option(
        "--keep-failed",
        help="leave a failed launch stage's containers running for debugging (default: stopped)",
    ),
]

FullOpt = Annotated[
    bool,
    typer.Option(
        "--full",
        help="run every task on every host (default: only what the first look finds off the plan)",
    ),
]

AcceptOutageOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="accept a change that takes the endpoint down (one prefill and one decode instance)",
    ),
]

CanaryOpt = Annotated[
    int | None,
    typer.Option(
        "--canary",
        min=0,
        max=50,
        metavar="PCT",
        help="behind the front, try a fleet's change on PCT % of requests first, then keep it "
        "or roll it back on its own (0: no canary; default: k2_canary_percent)",
    ),
]


SITE_TAGS = (
    "preflight",
    "prepare",
    "ssh_mesh",
    "weights",
    "nccl",
    "launch",
    "front",
    "verify",
    "monitoring",
)
"""The tags of playbooks/site.yml's phases, in their order (a test holds them to the plays)."""


def split_tags(tags: str | None) -> tuple[str, ...]:
    """'launch, verify' -> ('launch', 'verify'); ArgumentError for a tag no phase carries
    (ansible-playbook would run no task of it and call the run a success) and for a --tags
    that names no phase (it would run every phase)."""
    chosen = tuple(t.strip() for t in (tags or "").split(",") if t.strip())
    if tags is not None and not chosen:
        raise ArgumentError(
            [
                f"--tags {tags!r}: names no phase; expected one or more of "
                f"{', '.join(SITE_TAGS)}, comma-separated; leave --tags out to run every phase"
            ]
        )
    unknown = [t for t in chosen if t not in SITE_TAGS]
    if unknown:
        raise ArgumentError(
            [
                f"--tags {t}: no phase carries that tag; expected one or more of "
                f"{', '.join(SITE_TAGS)}, comma-separated"
                for t in unknown
            ]
        )
    return chosen


def _vault_setter(field: str) -> Callable[[Context, Parameter, Any], Any]:
    def store(ctx: Context, param: Parameter, value: Any) -> Any:
        del ctx, param
        vault.use(**{field: tuple(value) if isinstance(value, list | tuple) else bool(value)})
        return value

    return store


def vault_options() -> list[TyperOption]:
    """ansible-playbook's vault options, for every command that reads an inventory; they set
    the command's vault.VaultOptions as they are parsed (ANSIBLE_VAULT_PASSWORD_FILE and
    ANSIBLE_VAULT_IDENTITY_LIST apply too, through Ansible's config)."""
    return [
        TyperOption(
            param_decls=["--vault-password-file"],
            multiple=True,
            metavar="FILE",
            expose_value=False,
            callback=_vault_setter("password_files"),
            help="vault password file (or script), as ansible-playbook takes it; repeatable",
        ),
        TyperOption(
            param_decls=["--vault-id"],
            multiple=True,
            metavar="ID",
            expose_value=False,
            callback=_vault_setter("vault_ids"),
            help="vault identity (label@FILE or label@prompt); repeatable",
        ),
        TyperOption(
            param_decls=["--ask-vault-pass"],
            is_flag=True,
            expose_value=False,
            callback=_vault_setter("ask"),
            help="ask for the vault password (once, for the inventory and the run)",
        ),
    ]
