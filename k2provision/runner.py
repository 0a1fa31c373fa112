"""The one place that runs Ansible: playbooks through ansible-runner, one record dir per run.

Events stream to a callback as typed events (never scraped stdout). Environment and extra-vars
files are suppressed so secrets passed through the environment never land in the run record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2provision.events import Event, HostResult, Stats, Tally, parse_event

PROJECT_ROOT = Path(__file__).resolve().parents[1]
COLLECTIONS = Path(__file__).resolve().parent / "ansible" / "collections"
# ansible-runner writes its whole environment into the run record (artifacts/*/command), so
# the hub token never stays in the environment of a run: it goes to a private file instead,
# whose path the k2_weights role reads.
TOKEN_FILE_ENV = "K2_WEIGHTS_HF_TOKEN_FILE"
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass(frozen=True)
class RunResult:
    """What a playbook run did, and where its record is."""

    status: str
    rc: int
    record_dir: Path
    tally: Tally
    stats: dict[str, dict[str, int]]
    error_tail: str = ""

    @property
    def ok(self) -> bool:
        """True when every host finished without failures or unreachability."""
        return self.rc == 0 and not self.tally.failures


def runs_dir() -> Path:
    """Where run records go: $K2_RUNS_DIR, else ./runs."""
    return Path(os.environ.get("K2_RUNS_DIR", "runs")).resolve()


def new_record_dir(command: str) -> Path:
    """A fresh, predictably named directory for one run: runs/<UTC time>-<command>."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = runs_dir() / f"{stamp}-{command}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


@contextlib.contextmanager
def token_moved_to_file() -> Iterator[None]:
    """For one run: the hub token out of the environment, into a private 0600 file."""
    saved = {k: os.environ.pop(k) for k in TOKEN_ENV_VARS if k in os.environ}
    token = next((v.strip() for v in saved.values() if v.strip()), "")
    previous = os.environ.pop(TOKEN_FILE_ENV, None)
    private = Path(tempfile.mkdtemp(prefix="k2-token-")) if token else None
    try:
        if private is not None:
            path = private / "token"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(token)
            os.environ[TOKEN_FILE_ENV] = str(path)
        yield
    finally:
        os.environ.pop(TOKEN_FILE_ENV, None)
        if previous is not None:
            os.environ[TOKEN_FILE_ENV] = previous
        os.environ.update(saved)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _env() -> dict[str, str]:
    """Environment for ansible-playbook: our config and plugins, our Python's bin on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return {
        "ANSIBLE_CONFIG": str(PROJECT_ROOT / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS),
        "ANSIBLE_ROLES_PATH": str(PROJECT_ROOT / "roles"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": path if bin_dir in path.split(":") else f"{bin_dir}:{path}",
    }


def run_playbook(
    playbook: str,
    inventory: Path,
    *,
    record_dir: Path,
    extravars: dict[str, Any] | None = None,
    tags: Sequence[str] = (),
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    on_event: Callable[[Event], None] | None = None,
) -> RunResult:
    """Run playbooks/<playbook> against `inventory`, streaming typed events to `on_event`."""
    import ansible_runner

    if not (PROJECT_ROOT / "playbooks" / playbook).exists():
        raise FileNotFoundError(
            f"{PROJECT_ROOT / 'playbooks' / playbook} not found; run k2provision from a "
            "checkout installed with pip install -e ."
        )
    tally = Tally()
    stats: dict[str, dict[str, int]] = {}
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    os.environ.update(_env())

    def handle(raw: dict[str, Any]) -> bool:
        event = parse_event(raw)
        if isinstance(event, HostResult):
            tally.add(event)
        elif isinstance(event, Stats):
            stats.update(event.hosts)
        if event is not None and on_event is not None:
            on_event(event)
        return True

    with token_moved_to_file():
        result = ansible_runner.run(
            private_data_dir=str(record_dir),
            project_dir=str(PROJECT_ROOT),
            playbook=f"playbooks/{playbook}",
            inventory=str(inventory.resolve()),
            extravars=extravars or {},
            tags=",".join(tags) or None,
            limit=limit,
            cmdline=" ".join(cmdline) or None,
            envvars=_env(),
            event_handler=handle,
            quiet=True,
            suppress_env_files=True,
            json_mode=False,
        )
    rc = int(result.rc or 0)
    run = RunResult(
        status=str(result.status),
        rc=rc,
        record_dir=record_dir,
        tally=tally,
        stats=stats,
        error_tail=_output_tail(record_dir) if rc and not tally.failures else "",
    )
    _write_summary(run)
    return run


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
    (run.record_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
