"""The one place that runs Ansible: playbooks through ansible-runner, one record dir per run.

A run is described as data (`PlaybookRun`); its ansible-runner arguments and environment are
built from it by pure functions (`runner_kwargs`, `env_overrides`, `scrubbed`) that read the
caller's environment and never change `os.environ`. Events stream to a callback as typed events
(never scraped stdout). Environment and extra-vars files are suppressed, and the hub token is
taken out of the environment the run records, so secrets never land in the run record.

Each run keeps its SSH control masters in a directory of its own (`control_dir`) and ends
them when the playbook is done, so a run, finished or stopped, leaves no ssh process behind.
A stop signal (run/cancel.py) interrupts the playbook, kills its process group after a grace
time, and the result says the run was cancelled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2provision.core import safety_gates, vault
from k2provision.core.records import Plan
from k2provision.core.vault import VaultOptions
from k2provision.run.cancel import (
    CURRENT,
    Cancellation,
    cleaning,
    forget_playbook,
    note_playbook,
    running_playbook,
    signal_name,
)
from k2provision.run.events import Event, HostResult, Stats, Tally, parse_event

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = Path(__file__).resolve().parents[1] / "ansible" / "collections"
# ansible-runner writes its whole environment into the run record (artifacts/*/command), so
# the hub token never stays in the environment of a run: it goes to a private file instead,
# whose path the k2_weights role reads.
TOKEN_FILE_ENV = "K2_WEIGHTS_HF_TOKEN_FILE"
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# In a run record: the safety gates the run's inventory switches off, one line each.
SWITCHED_OFF_FILE = "SAFETY-GATES-OFF.txt"
CONTROL_BASE = Path("/tmp/k2-ansible-cp")  # ansible.cfg's control_path_dir; short for sockets


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run, as data."""

    playbook: str
    inventory: Path
    record_dir: Path
    extravars: Mapping[str, Any] = field(default_factory=dict)
    tags: Sequence[str] = ()
    limit: str | None = None
    check: bool = False
    diff: bool = False
    project_dir: Path = PROJECT_ROOT
    vault: VaultOptions = field(default_factory=vault.current)
    timeout_s: int | None = None
    """Ends the playbook after this many seconds (None: no limit)."""


@dataclass(frozen=True)
class RunResult:
    """What a playbook run did, and where its record is."""

    status: str
    rc: int
    record_dir: Path
    tally: Tally
    stats: dict[str, dict[str, int]]
    error_tail: str = ""
    cancelled: str = ""
    """The signal that stopped the run (SIGTERM, ...); "" when it ran to its end."""

    @property
    def ok(self) -> bool:
        """True when every host finished without failures or unreachability."""
        return self.rc == 0 and not self.tally.failures and not self.cancelled

    @property
    def changed(self) -> int:
        """Changed tasks over all hosts, from Ansible's recap."""
        return sum(int(s.get("changed", 0)) for s in self.stats.values())


def runs_dir() -> Path:
    """Where run records go: $K2_RUNS_DIR, else ./runs."""
    return Path(os.environ.get("K2_RUNS_DIR", "runs")).resolve()


def new_record_dir(command: str, plan: Plan | None = None) -> Path:
    """A fresh, predictably named directory for one run: runs/<UTC time>-<command>. With the
    run's plan, the safety gates its inventory switches off are written in it first
    (SWITCHED_OFF_FILE), so no record of such a run reads as an ordinary one."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = runs_dir() / f"{stamp}-{command}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    if plan is not None and (lines := switched_off(plan)):
        (path / SWITCHED_OFF_FILE).write_text("\n".join(lines) + "\n")
    return path


def switched_off(plan: Plan) -> list[str]:
    """The plan's warnings about safety gates its inventory switches off."""
    return [w for w in plan.warnings if w.startswith(safety_gates.SWITCHED_OFF)]


def hub_token(environ: Mapping[str, str]) -> str:
    """The Hugging Face token the caller's environment carries ("" when none)."""
    return next((environ[k].strip() for k in TOKEN_ENV_VARS if environ.get(k, "").strip()), "")


@contextlib.contextmanager
def token_file(token: str) -> Iterator[Path | None]:
    """For one run: `token` in a private 0600 file, removed afterwards (None for no token)."""
    if not token:
        yield None
        return
    private = Path(tempfile.mkdtemp(prefix="k2-token-"))
    try:
        path = private / "token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token)
        yield path
    finally:
        shutil.rmtree(private, ignore_errors=True)


def control_dir(record_dir: Path) -> Path:
    """The directory of one run's SSH control masters: named after its record, short enough
    for socket paths, and different for two records of the same name."""
    digest = hashlib.sha256(str(record_dir.resolve()).encode()).hexdigest()[:8]
    return CONTROL_BASE / f"{record_dir.name[:40]}-{digest}"


def env_overrides(
    environ: Mapping[str, str],
    *,
    token_path: Path | None,
    project_dir: Path = PROJECT_ROOT,
    masters: Path | None = None,
) -> dict[str, str]:
    """What ansible-playbook's environment adds to the caller's: our config, roles and plugins,
    our Python's bin on PATH, where the run's SSH control masters live, and where the hub
    token is (when there is one)."""
    bin_dir = str(Path(sys.executable).parent)
    path = environ.get("PATH", "/usr/bin:/bin")
    env = {
        "ANSIBLE_CONFIG": str(project_dir / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_ROLES_PATH": str(project_dir / "roles"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": path if bin_dir in path.split(":") else f"{bin_dir}:{path}",
    }
    if masters is not None:
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(masters)
    if token_path is not None:
        env[TOKEN_FILE_ENV] = str(token_path)
    return env


def scrubbed(env: Mapping[str, str], *, token_path: Path | None) -> dict[str, str]:
    """A run's full environment without the hub token variables (and without a token-file
    path inherited from the caller when this run has none)."""
    dropped = set(TOKEN_ENV_VARS) | ({TOKEN_FILE_ENV} if token_path is None else set())
    return {k: v for k, v in env.items() if k not in dropped}


def runner_kwargs(
    run: PlaybookRun, environ: Mapping[str, str], token_path: Path | None
) -> dict[str, Any]:
    """ansible_runner's arguments for `run` (the event handler apart)."""
    cmdline = [flag for flag, on in (("--check", run.check), ("--diff", run.diff)) if on]
    cmdline += vault.playbook_args(run.vault)
    return {
        "private_data_dir": str(run.record_dir),
        "project_dir": str(run.project_dir),
        "playbook": f"playbooks/{run.playbook}",
        "inventory": str(run.inventory.resolve()),
        "extravars": dict(run.extravars),
        "tags": ",".join(run.tags) or None,
        "limit": run.limit,
        "cmdline": " ".join(cmdline) or None,
        "timeout": run.timeout_s,
        "envvars": env_overrides(
            environ,
            token_path=token_path,
            project_dir=run.project_dir,
            masters=control_dir(run.record_dir),
        ),
        # How often (s) the runner asks the cancel callback while the playbook is silent.
        "settings": {"pexpect_timeout": 1},
        "quiet": True,
        "suppress_env_files": True,
        "json_mode": False,
        # --ask-vault-pass and --vault-id LABEL@prompt: ansible-playbook's prompts answered with
        # the passwords asked once (suppress_env_files keeps them out of the record).
        **({"passwords": answers} if (answers := vault.prompt_answers(run.vault)) else {}),
    }


def end_masters(directory: Path, settle_s: float = 0.0) -> list[str]:
    """End the SSH control masters whose sockets are in `directory`, then remove it; the
    sockets whose master did not answer (an empty list when all ended). After an interrupted
    playbook, `settle_s` also waits out masters its killed clients forked a moment before."""
    left: list[str] = []
    if not directory.is_dir():
        return left
    for socket in sorted(directory.iterdir()):
        try:
            subprocess.run(
                ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "k2-control-master"],
                capture_output=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            left.append(str(socket))
    left = [s for s in left if Path(s).exists()]
    _kill_late_masters(directory, settle_s)
    with contextlib.suppress(OSError):
        directory.rmdir()
    return left


def _kill_late_masters(directory: Path, settle_s: float) -> None:
    """End the masters no socket led to yet, and the SSH clients that would start one.
    Ansible starts each SSH client in a session of its own, so killing an interrupted
    playbook's process group leaves a client that was still connecting; it becomes a master
    (listing its socket) seconds later on a loaded machine and would persist. Clients and
    masters alike carry the run's control directory in their command line (`ControlPath=DIR/..`
    or `ssh: DIR/.. [mux]`); they are ended until none shows up for `settle_s`."""
    quiet_since = deadline = time.monotonic()
    deadline += settle_s + 10  # a master that outlives SIGTERM is left after that
    while time.monotonic() < deadline:
        found = subprocess.run(
            ["pgrep", "-f", f"ssh.*{directory}/"], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in found:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGTERM)
        if found:
            quiet_since = time.monotonic()
        if time.monotonic() - quiet_since >= settle_s:
            return
        time.sleep(0.25)


def run_playbook(
    run: PlaybookRun,
    on_event: Callable[[Event], None] | None = None,
    cancel: Cancellation = CURRENT,
) -> RunResult:
    """Run `run.playbook`, streaming typed events to `on_event`; write summary.json. A stop
    signal (`cancel`) interrupts the playbook and the result is marked cancelled."""
    from ansible_runner.interface import init_runner

    if not (run.project_dir / "playbooks" / run.playbook).exists():
        raise FileNotFoundError(
            f"{run.project_dir / 'playbooks' / run.playbook} not found; run k2provision from a "
            "checkout installed with pip install -e ."
        )
    tally = Tally()
    stats: dict[str, dict[str, int]] = {}
    groups: set[int] = set()
    masters = control_dir(run.record_dir)

    def handle(raw: dict[str, Any]) -> bool:
        pid = raw.get("pid")
        if isinstance(pid, int) and not groups:  # the playbook's own process leads its group
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(pid))
                note_playbook(cancel, os.getpgid(pid), f"{run.playbook}, record {run.record_dir}")
        event = parse_event(raw)
        if isinstance(event, HostResult):
            tally.add(event)
        elif isinstance(event, Stats):
            stats.update(event.hosts)
        if event is not None and on_event is not None:
            on_event(event)
        return True

    cleanup = cancel.cleaning  # a cleanup playbook of a cancelled run is not itself cancelled
    cancel.running[f"SSH control masters of {run.playbook}"] = str(masters)
    try:
        with token_file(hub_token(os.environ)) as token_path:
            runner = init_runner(
                **runner_kwargs(run, os.environ, token_path),
                event_handler=handle,
                cancel_callback=lambda: cancel.give_up(time.monotonic()),
            )
            # ansible-runner seeds the run's environment from this process's; the token stays
            # out.
            runner.config.env = scrubbed(runner.config.env, token_path=token_path)
            with running_playbook(cancel):
                runner.run()
    finally:
        with cleaning(cancel):
            for group in groups:
                forget_playbook(cancel, group)
            if not end_masters(masters, 2.0 if cancel.signum is not None else 0.0):
                cancel.running.pop(f"SSH control masters of {run.playbook}", None)
    tally.settle(stats)
    rc = int(runner.rc or 0)
    stopped = signal_name(cancel.signum) if cancel.signum is not None and not cleanup else ""
    result = RunResult(
        status="cancelled" if stopped else str(runner.status),
        rc=rc,
        record_dir=run.record_dir,
        tally=tally,
        stats=stats,
        error_tail="" if stopped or not rc or tally.failures else _output_tail(run.record_dir),
        cancelled=stopped,
    )
    _write_summary(result)
    return result


def _output_tail(record_dir: Path, lines: int = 15) -> str:
    """The end of ansible-playbook's own output: the reason when it failed before any task."""
    outputs = sorted(record_dir.glob("artifacts/*/stdout"))
    if not outputs:
        return ""
    return "\n".join(outputs[-1].read_text(errors="replace").strip().splitlines()[-lines:])


def _write_summary(run: RunResult) -> None:
    summary = {
        "status": run.status,
        "rc": run.rc,
        "hosts": run.stats,
        "failures": run.tally.failures,
        "error": run.error_tail,
    }
    if run.cancelled:
        summary["cancelled"] = run.cancelled
        summary["done"] = {h: dict(c) for h, c in run.tally.counts.items()}
    (run.record_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
