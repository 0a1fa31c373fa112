"""The k2provision command line: the Typer app, assembled from a registry of command modules.

Each command lives in k2provision/commands/<name>.py and adds itself through `register(app)`.
Other installed packages add commands through the `k2provision.commands` entry-point group
(the lab registers `lab` so); the CLI works without any of them.

Exit codes: 0 success, 1 a run failed on hosts, 2 bad input (inventory, plan, arguments),
128 + the signal when stopped (130 SIGINT, 143 SIGTERM, 129 SIGHUP; run/cancel.py).
No traceback reaches the user: bad input is one line per problem; anything unexpected is one
line naming the file that holds the details.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated

import typer
from typer._click.core import Command, Context  # typer 0.26 vendors click (pinned in pyproject)
from typer.core import TyperGroup

from k2provision import __version__
from k2provision.commands import (
    apply,
    bench,
    drain,
    heal,
    logs,
    models,
    plan,
    render,
    restart,
    status,
    stop,
    verify,
    weights,
)
from k2provision.commands.params import vault_options
from k2provision.errors import ArgumentError, K2Error
from k2provision.run.cancel import Interrupted, exit_code
from k2provision.run.display import print_errors, print_unexpected, print_warnings

Register = Callable[[typer.Typer], None]

COMMANDS: tuple[Register, ...] = (
    plan.register,
    models.register,
    render.register,
    apply.register,
    stop.register,
    weights.register,
    status.register,
    logs.register,
    restart.register,
    drain.register,
    heal.register,
    verify.register,
    bench.register,
)
PLUGIN_GROUP = "k2provision.commands"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"k2provision {__version__}")
        raise typer.Exit(0)


def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Provision GPU hosts from an Ansible inventory and serve Kimi-K2."""
    del version


class CommandGroup(TyperGroup):
    """The app's command group: bad input (K2Error) from any command, the product's or a
    plugin's, is one line per problem and exit 2, however the app is invoked."""

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """A command; one that reads an inventory takes the vault options too."""
        command = super().get_command(ctx, cmd_name)
        names = {p.name for p in command.params} if command is not None else set()
        if command is not None and "inventory" in names and "vault_password_file" not in names:
            command.params.extend(vault_options())
        return command

    def invoke(self, ctx: Context) -> object:
        try:
            return super().invoke(ctx)
        except K2Error as error:
            print_errors(error)
            if isinstance(error, ArgumentError):
                _print_usage(self, ctx)
            raise typer.Exit(2) from None


def _print_usage(group: TyperGroup, ctx: Context) -> None:
    """The usage line of the command that refused an argument, and where its help is."""
    name = ctx.invoked_subcommand or ""
    command = group.get_command(ctx, name)
    if command is None:
        return
    with command.make_context(name, [], parent=ctx, resilient_parsing=True) as sub:
        typer.echo(sub.get_usage(), err=True)
        typer.echo(f"Try '{sub.command_path} --help' for help.", err=True)


def plugins() -> list[EntryPoint]:
    """The installed command plugins."""
    return sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name)


def build_app(extra: Iterable[EntryPoint] | None = None) -> typer.Typer:
    """The app: every registered command, then every plugin that loads."""
    app = typer.Typer(
        cls=CommandGroup,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    for register in COMMANDS:
        register(app)
    for entry in plugins() if extra is None else extra:
        try:
            register_plugin: Register = entry.load()
            register_plugin(app)
        except Exception as error:  # a broken plugin must not take the product's commands down
            print_warnings(
                [f"command plugin {entry.name} ({entry.value}) did not load: "
                 f"{type(error).__name__}: {error}"]
            )  # fmt: skip
    return app


def _details_file(error: BaseException) -> str:
    """Where an unexpected error's traceback is kept for a bug report."""
    with tempfile.NamedTemporaryFile(
        "w", prefix="k2provision-error-", suffix=".txt", delete=False
    ) as f:
        f.write("".join(traceback.format_exception(error)))
    return f.name


def main() -> None:
    """Console-script entry point."""
    try:
        build_app()(standalone_mode=True)
    except K2Error as error:
        print_errors(error)
        sys.exit(2)
    except Interrupted as stop:  # a stop signal where nothing had to be ended first
        sys.exit(exit_code(stop.signum))
    except Exception as error:  # the last guard: never a traceback on a user's terminal
        print_unexpected(error, _details_file(error))
        sys.exit(1)


if __name__ == "__main__":
    main()
