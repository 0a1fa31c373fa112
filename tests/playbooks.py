"""Run a playbook with this checkout's ansible.cfg through ansible-runner, and read what each
task did on each host from its events (never from scraped output)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


@dataclass
class PlaybookRun:
    """The outcome of one ansible-playbook run."""

    rc: int
    stats: dict[str, dict[str, int]]
    tasks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """task name -> host -> the task's result (the last one a host reported)."""
    stdout: str = ""

    def task(self, suffix: str) -> dict[str, dict[str, Any]]:
        """host -> result of the task whose name ends with ``suffix``."""
        for name, hosts in self.tasks.items():
            if name.endswith(suffix):
                return hosts
        raise AssertionError(f"no task {suffix!r} ran; tasks: {list(self.tasks)}\n{self.stdout}")

    def result(self, host: str, prefix: str) -> dict[str, Any]:
        """The result on ``host`` of the first task whose name starts with ``prefix``."""
        for name, hosts in self.tasks.items():
            if name.startswith(prefix) and host in hosts:
                return hosts[host]
        raise AssertionError(f"no task {prefix!r} ran on {host}; tasks: {list(self.tasks)}")


def run_playbook(
    playbook: list[dict[str, Any]], inventory: Path, workdir: Path, *extra: str
) -> PlaybookRun:
    """Write ``playbook`` (plays as data) into ``workdir`` and run it against ``inventory``."""
    path = workdir / "playbook.yml"
    path.write_text(json.dumps(playbook))
    (workdir / "runner").mkdir(exist_ok=True)
    done = ansible_runner.run(
        private_data_dir=str(workdir / "runner"),
        project_dir=str(ROOT),
        playbook=str(path),
        inventory=str(inventory),
        cmdline=" ".join(extra) or None,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        },
        quiet=True,
        suppress_env_files=True,
    )
    tasks: dict[str, dict[str, dict[str, Any]]] = {}
    for event in done.events:
        data = event.get("event_data", {})
        if event.get("event") in RESULTS and "task" in data:
            res = dict(data.get("res") or {})
            res["failed"] = event["event"] == "runner_on_failed" and not data.get("ignore_errors")
            tasks.setdefault(data["task"], {})[data["host"]] = res
    stats = {
        host: {
            key: int((done.stats or {}).get(key, {}).get(host, 0))
            for key in ("ok", "changed", "failures", "dark")
        }
        for host in {
            h for counts in (done.stats or {}).values() if isinstance(counts, dict) for h in counts
        }
    }
    return PlaybookRun(rc=int(done.rc), stats=stats, tasks=tasks, stdout=done.stdout.read())
