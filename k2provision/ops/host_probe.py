"""Asking a host about its planned processes: the shell commands and the answer's format. Pure.

The launch gate (launch_gate.py), `status` (status_probe.py) and `logs` (log_sources.py) all
ask a host the same things over one shell: what a health gate's URL answers (asked on the host,
where the engine's address is reachable), whether an exec'd process lives, a process's log, and
the marked sections an answer comes back in. This module builds those commands and reads their
answers; the callers judge what they mean.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from k2provision.core.records import Process
from k2provision.plan.containers import exec_log_path, exec_pid_path

MARK = "@@k2"
URL_TIMEOUT_S = 5
# Whether the server answers, not whether its certificate is trusted (verify checks that):
# an https URL is asked without checking the certificate.
_URL_PROBE = (
    "import ssl, sys, urllib.request as u\n"
    "try:\n"
    "    c = ssl._create_unverified_context()\n"
    "    print(u.urlopen(sys.argv[1], timeout=float(sys.argv[2]), context=c).status)\n"
    "except u.HTTPError as e:\n"
    "    print(e.code)\n"
    "except Exception as e:\n"
    "    print('no answer', getattr(e, 'reason', e))\n"
)


# ---------------------------------------------------------------- health and liveness


def url_probe(url: str, python: str = "python3", timeout_s: float = URL_TIMEOUT_S) -> str:
    """The shell command printing the HTTP status `url` answers on the host, or `no answer
    <reason>` when none comes within `timeout_s` (stdlib only: any python3 on the host)."""
    q = shlex.quote
    return f"{q(python)} -c {q(_URL_PROBE)} {q(url)} {timeout_s:g}"


def exec_liveness(process: Process) -> str:
    """The shell command printing one line on whether an exec'd process lives: `running
    <start>` (its pid answers; <start> is its pid file's mtime in Unix seconds), `starting` (no
    pid file yet) or `exited` (its pid is gone, or its container is)."""
    pid = exec_pid_path(process)
    check = (
        f"pid=$(cat {pid} 2>/dev/null) || {{ echo starting; exit 0; }}; "
        f'if kill -0 "$pid" 2>/dev/null; then echo running $(stat -c %Y {pid}); '
        "else echo exited; fi"
    )
    container = shlex.quote(process.container)
    return f"docker exec {container} sh -c {shlex.quote(check)} 2>/dev/null || echo exited"


def parse_liveness(text: str) -> tuple[str, int | None]:
    """An `exec_liveness` answer -> (running, starting or exited; start time when running)."""
    words = text.split()
    state = words[0] if words and words[0] in {"running", "starting"} else "exited"
    started = words[1] if state == "running" and len(words) > 1 else ""
    return state, int(started) if started.isdigit() else None


# ---------------------------------------------------------------- logs


def log_command(
    process: Process, tail: int | None = None, since: str | None = None, follow: bool = False
) -> str:
    """The shell command that prints a process's log (stdout and stderr interleaved).

    A container's main command logs to the container (`docker logs`); an exec'd process
    appends its output to a file inside the container (containers.exec_log_path), which has no
    timestamps: `since` does not apply to it. Following it ends the container-side `tail` when
    the caller goes away (its stdin closes)."""
    container = shlex.quote(process.container)
    if process.exec_in:
        count = f"-n {tail}" if tail is not None else "-n +1"
        path = shlex.quote(exec_log_path(process))
        if follow:
            inner = f"tail {count} -F {path} & t=$!; cat >/dev/null; kill $t"
            return f"docker exec -i {container} sh -c {shlex.quote(inner)}"
        return f"docker exec {container} tail {count} {path}"
    words = ["docker", "logs"]
    if follow:
        words.append("--follow")
    if tail is not None:
        words += ["--tail", str(tail)]
    if since:
        words += ["--since", shlex.quote(since)]
    return " ".join([*words, container])


def log_source(process: Process) -> str:
    """Where a process's log is read from, in words."""
    if process.exec_in:
        return f"{exec_log_path(process)} in container {process.container}"
    return f"docker logs {process.container}"


# ---------------------------------------------------------------- marked sections


def log_section(name: str, command: str) -> str:
    """Shell lines printing a marked section with `command`'s output, each output line behind
    `|` (so no log line reads as a marker), then its exit code."""
    return (
        f"echo '{MARK} log {name}'; {{ {command} 2>&1; echo \"{MARK} rc $?\"; }} "
        f"| sed '/^{MARK} rc /!s/^/|/'"
    )


@dataclass
class Section:
    """One part of a probe's answer: its text and the exit code the script noted."""

    text: list[str] = field(default_factory=list)
    rc: int | None = None


def parse_sections(output: str) -> dict[tuple[str, str], Section]:
    """A probe's output -> {(kind, process name): section}; ('now', '') etc. for host parts."""
    sections: dict[tuple[str, str], Section] = {}
    current: Section | None = None
    for line in output.splitlines():
        if line.startswith(f"{MARK} "):
            words = line.split(" ", 2)[1:]
            kind = words[0]
            arg = words[1] if len(words) > 1 else ""
            if kind == "rc" and current is not None:
                current.rc = int(arg) if arg.lstrip("-").isdigit() else None
                continue
            if kind == "now":
                sections[("now", "")] = current = Section([arg])
                continue
            sections[(kind, arg)] = current = Section()
            continue
        if current is not None:
            current.text.append(line[1:] if line.startswith("|") else line)
    return sections
