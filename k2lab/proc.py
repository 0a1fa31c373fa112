"""Processes and commands: run a tool, start a detached daemon, and stop exactly that process.

A process is named by its PID *and* its start time (field 22 of /proc/PID/stat), so a PID
that the kernel has since reused for something else is never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from k2lab.errors import LabError, NotRootError

Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    """Default progress printer: one line on stderr."""
    print(f"lab: {message}", file=sys.stderr, flush=True)


def quiet_log(message: str) -> None:
    """A progress printer that prints nothing."""
    del message


def require_root() -> None:
    """Raise NotRootError unless running as root."""
    if os.geteuid() != 0:
        raise NotRootError()


REQUIRED_TOOLS: tuple[str, ...] = (
    "debootstrap",
    "ip",
    "tc",
    "unshare",
    "nsenter",
    "setsid",
    "mount",
    "umount",
    "ssh-keygen",
    "ssh-keyscan",
    "tinyproxy",
    "podman",
    "tar",
)


def require_tools(tools: Sequence[str] = REQUIRED_TOOLS) -> None:
    """Raise LabError naming every missing tool and the script that installs them."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise LabError(
            f"missing tools on this machine: {', '.join(missing)}; "
            "fix: run scripts/install-lab-deps (as root)"
        )


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    input_text: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; on failure raise LabError with its stderr."""
    full_env = None if env is None else {**os.environ, **env}
    try:
        result = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LabError(
            f"{argv[0]}: command not found; fix: run scripts/install-lab-deps (as root)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout} s") from exc
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        tail = detail[-1] if detail else "no output"
        raise LabError(f"`{' '.join(argv)}` failed (exit {result.returncode}): {tail}")
    return result


class ProcRef(BaseModel):
    """A process as the lab started it: PID plus kernel start time (clock ticks after boot)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    start_time: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    return raw[raw.rindex(")") + 2 :].split()


def proc_start_time(pid: int) -> int | None:
    """The process's start time, or None when there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def proc_ref(pid: int) -> ProcRef | None:
    """A ProcRef for a live PID, or None."""
    start = proc_start_time(pid)
    return None if start is None else ProcRef(pid=pid, start_time=start)


def is_alive(ref: ProcRef | None) -> bool:
    """True when this very process (not a reused PID) exists and is not a zombie."""
    if ref is None:
        return False
    fields = _stat_fields(ref.pid)
    if fields is None or int(fields[19]) != ref.start_time:
        return False
    return fields[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (scans /proc; the kernel's children file may be absent)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def kill(ref: ProcRef | None, sig: int = signal.SIGKILL) -> bool:
    """Signal exactly this process; False when it was already gone."""
    if not is_alive(ref):
        return False
    assert ref is not None
    try:
        os.kill(ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(refs: Sequence[ProcRef | None], timeout: float = 10.0) -> bool:
    """Wait until none of these processes is alive; True on success."""
    deadline = time.monotonic() + timeout
    while any(is_alive(r) for r in refs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def spawn_detached(
    shell_script: str, *, pid_file: Path, log_file: Path, timeout: float = 10.0
) -> ProcRef:
    """Start `sh -c shell_script` in its own session, detached from this process.

    The script must write its own PID (`echo $$ > "$K2_PIDFILE"`) before it `exec`s the
    long-running program, so the PID recorded is the daemon's. `setsid --fork` makes the
    daemon a child of init, so no zombie is left in the caller when it is stopped later.
    """
    pid_file.unlink(missing_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        starter = subprocess.run(
            ["setsid", "--fork", "sh", "-c", shell_script],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, "K2_PIDFILE": str(pid_file)},
            check=False,
        )
    if starter.returncode != 0:
        raise LabError(f"could not start a detached process (see {log_file})")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text.isdigit():
            ref = proc_ref(int(text))
            if ref is None:
                break
            return ref
        time.sleep(0.01)
    tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
    raise LabError(f"a lab process exited at start: {' | '.join(tail) or 'no output'}")
