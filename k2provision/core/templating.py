"""Templates -> text. Jinja2 with StrictUndefined: a missing value is an error, never ''."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from functools import cache

import jinja2

from k2provision.core.records import Process

# Host facts a launch script finds before it starts its process (see models.LaunchValue):
# the program that finds them, shipped beside the launch scripts.
HOST_VALUES_SCRIPT = "host-values.py.in"
HOST_VALUES_FILE = "k2-host-values.py"
REGISTRAR_SCRIPT = "router-registrar.py.in"
REGISTRAR_FILE = "k2-router-registrar.py"


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


def shell_word(token: str, names: Iterable[str] = ()) -> str:
    """`token` quoted for sh; each `${NAME}` of `names` in it is left for the shell to expand."""
    known = tuple(names)
    if not known or "${" not in token:
        return shlex.quote(token)
    parts = _references(known).split(token)
    return "".join(
        f'"{part}"' if i % 2 else shlex.quote(part) for i, part in enumerate(parts) if part
    )


@cache
def _references(names: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern that splits a word around each `${NAME}` of `names`, keeping them."""
    return re.compile("(" + "|".join(re.escape("${" + n + "}") for n in names) + ")")


def argv_lines(argv: tuple[str, ...] | list[str], names: Iterable[str] = ()) -> list[str]:
    """Shell-quoted argv grouped one option (with its values) per line."""
    known = tuple(names)
    lines: list[list[str]] = []
    for token in argv:
        if not lines or token.startswith("-"):
            lines.append([])
        lines[-1].append(shell_word(token, known))
    return [" ".join(words) for words in lines]


def render_template(name: str, **context: object) -> str:
    """Render package template `name` with `context`."""
    return environment().get_template(name).render(**context)


def host_values_script() -> str:
    """The Python program a launch script runs to find its host values."""
    env = environment()
    assert env.loader is not None
    return env.loader.get_source(env, HOST_VALUES_SCRIPT)[0]


def host_values_path(config_dir: str) -> str:
    """Where the host-values program lives on every host (beside the launch scripts)."""
    return f"{config_dir}/launch/{HOST_VALUES_FILE}"


def registrar_script() -> str:
    """The Python program a router's launch script starts beside the router to register the
    workers it cannot name itself (Process.registrar)."""
    env = environment()
    assert env.loader is not None
    return env.loader.get_source(env, REGISTRAR_SCRIPT)[0]


def registrar_path(config_dir: str) -> str:
    """Where the registrar lives on a router's host (beside the launch scripts)."""
    return f"{config_dir}/launch/{REGISTRAR_FILE}"


def launch_script(process: Process, config_dir: str) -> str:
    """A POSIX shell script that finds the process's host values, exports its env, starts its
    registrar (a router's, where it has one) and execs its argv."""
    names = [v.name for v in process.resolve]
    env = {key: shell_word(value, names) for key, value in process.env.items()}
    registrar = process.registrar
    return render_template(
        "launch.sh.j2",
        process=process,
        env=env,
        argv=argv_lines(process.argv, names),
        host_values=host_values_path(config_dir),
        registrar=None
        if registrar is None
        else (
            registrar_path(config_dir),
            registrar.url,
            json.dumps([dict(w) for w in registrar.workers], separators=(",", ":")),
            registrar.key_file,
        ),
    )


def with_host_values(process: Process, values: Mapping[str, str]) -> Process:
    """`process` as its launch script runs it once its host values are `values` (for checks
    that need concrete arguments, such as the engines' own parsers)."""

    def fill(text: str) -> str:
        for v in process.resolve:
            text = text.replace(v.ref, values[v.name])
        return text

    return process.model_copy(
        update={
            "argv": tuple(fill(a) for a in process.argv),
            "env": {k: fill(v) for k, v in process.env.items()},
            "resolve": (),
        }
    )
