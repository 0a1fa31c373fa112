"""Templates -> text. Jinja2 with StrictUndefined: a missing value is an error, never ''."""

from __future__ import annotations

import shlex
from functools import cache

import jinja2

from k2provision.models import Process


@cache
def environment() -> jinja2.Environment:
    """The one Jinja2 environment of the package's templates."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("k2provision", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    env.filters["argv_lines"] = argv_lines
    return env


def argv_lines(argv: tuple[str, ...] | list[str]) -> list[str]:
    """Shell-quoted argv grouped one option (with its values) per line."""
    lines: list[list[str]] = []
    for token in argv:
        if not lines or token.startswith("-"):
            lines.append([])
        lines[-1].append(shlex.quote(token))
    return [" ".join(words) for words in lines]


def render_template(name: str, **context: object) -> str:
    """Render package template `name` with `context`."""
    return environment().get_template(name).render(**context)


def launch_script(process: Process) -> str:
    """A POSIX shell script that exports the process's env and execs its argv."""
    return render_template("launch.sh.j2", process=process)
