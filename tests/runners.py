"""The one way the tests run the k2provision CLI (``k2``) and a command on a lab host
(``on_host``). Test modules import these; tests/k2provision/unit/test_structure.py fails on a
module that defines its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import k2lab as lab_api

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def k2(
    *args: str,
    cwd: Path = ROOT,
    runs: Path | None = None,
    timeout: float = 300,
    installed: bool = False,
    unset_prefix: str | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process, its output captured, no terminal on its standard input (as
    in a script). ``installed`` runs the console script pip installed, as a user types it,
    instead of ``python -m k2provision.cli``; ``runs`` is its K2_RUNS_DIR; ``env`` is added to
    this process's environment, after removing its variables that start with ``unset_prefix``."""
    argv = [str(BIN / "k2provision")] if installed else [sys.executable, "-m", "k2provision.cli"]
    extra = {"K2_RUNS_DIR": str(runs)} if runs is not None else {}
    proc = subprocess.Popen(
        [*argv, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={
            **{
                k: v
                for k, v in os.environ.items()
                if not (unset_prefix and k.startswith(unset_prefix))
            },
            "PYTHONPATH": str(ROOT),
            **extra,
            **env,
        },
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Past its time the command is stopped as a user would stop it (SIGTERM: it ends the
        # playbooks it started), then everything it started is killed: nothing it left running
        # may act on the lab hosts during the tests that follow.
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise subprocess.TimeoutExpired(proc.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def start(*args: str, runs: Path, **env: str) -> subprocess.Popen[str]:
    """The installed CLI started in a child process, its output merged and piped, for tests
    that signal it while it runs; ``runs`` is its K2_RUNS_DIR."""
    return subprocess.Popen(
        [str(BIN / "k2provision"), *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "K2_RUNS_DIR": str(runs), **env},
    )


def newest_record(runs: Path) -> Path:
    """The run record written last under ``runs``."""
    return max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)


def controller_leftovers(run: Path) -> list[str]:
    """Processes on this machine that belong to the run recorded in ``run``: its
    ansible-playbook (named by its record directory) and SSH masters (by their control path)."""
    from k2provision.run.runner import control_dir

    found: list[str] = []
    for marker in (str(run), str(control_dir(run))):
        out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True)
        found += [line for line in out.stdout.splitlines() if "pgrep" not in line]
    return found


def on_host(
    state: Any, host: str, command: str, *, timeout: float = 120, check: bool = True
) -> str:
    """``command`` on lab host ``host`` over SSH; its stdout. Unless ``check`` is false, a
    non-zero exit fails the test with the host, the command and the ends of its output."""
    out = subprocess.run(
        lab_api.ssh_command(state, host, command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert out.returncode == 0, (host, command, out.stdout[-2000:], out.stderr[-2000:])
    return out.stdout
