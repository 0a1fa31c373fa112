"""Converge by difference: what a host should hold for its launch, and what differs. Pure.

A first step of every apply (action ``k2.cluster.look``) asks each host, in one module call,
about everything the plan places there: the sha256 and mode of each rendered file, each planned
container (running or not, the spec hash label it carries), whether each exec'd process lives,
and whether the model directory holds what the host's processes load. :func:`differences`
compares that answer with the plan and names, per phase, what differs; a phase whose list is
empty is converged on that host and its tasks are skipped there. A phase the look does not
cover is never called converged (it runs every task, as without the look).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k2provision.core.records import HostPlan, Plan
from k2provision.plan.containers import LABEL_HASH, exec_pid_path, spec_hash

__all__ = [
    "LOOKED_PHASES",
    "HostExpectation",
    "differences",
    "expected_state",
    "file_mode",
    "look_request",
]

LOOKED_PHASES = ("launch",)
"""The phases the look covers: only these may be found converged and skipped."""


def file_mode(path: str) -> str:
    """The mode a rendered file is written with (launch scripts are executable)."""
    return "0755" if path.endswith(".sh") else "0644"


def content_hash(content: str) -> str:
    """The sha256 of a rendered file as written (UTF-8)."""
    return hashlib.sha256(content.encode()).hexdigest()


@dataclass(frozen=True)
class HostExpectation:
    """What the plan places on one host, in the terms the look answers in."""

    host: str
    files: Mapping[str, tuple[str, str]]
    """path -> (sha256 of the content, mode)."""
    containers: Mapping[str, str]
    """container name -> the spec hash label it must carry (its process's main container)."""
    execs: Mapping[str, tuple[str, str]]
    """exec'd process name -> (its container, its pid file inside it)."""
    model_dir: str
    need: str | None
    """What the model directory must hold: checkpoint, directory, or None (no processes)."""


def _host(plan: Plan, host: str) -> HostPlan:
    for entry in plan.hosts:
        if entry.name == host:
            return entry
    raise ValueError(f"{host} is in no pool of the plan")


def expected_state(plan: Plan, host: str) -> HostExpectation:
    """What the plan places on `host` (files, containers, exec'd processes, the checkpoint)."""
    entry = _host(plan, host)
    files = dict(entry.files)
    need = None
    if entry.processes:
        need = "checkpoint" if any(p.gpus for p in entry.processes) else "directory"
    return HostExpectation(
        host=host,
        files={path: (content_hash(text), file_mode(path)) for path, text in files.items()},
        containers={
            p.container: spec_hash(plan.container, p, files)
            for p in entry.processes
            if not p.exec_in
        },
        execs={p.name: (p.container, exec_pid_path(p)) for p in entry.processes if p.exec_in},
        model_dir=plan.model_dir,
        need=need,
    )


def look_request(expected: HostExpectation) -> dict[str, Any]:
    """The arguments of module k2.cluster.host_look for this host."""
    return {
        "files": sorted(expected.files),
        "containers": sorted(expected.containers),
        "execs": [
            {"name": name, "container": container, "pid_file": pid}
            for name, (container, pid) in sorted(expected.execs.items())
        ],
        "label": LABEL_HASH,
        "model_dir": expected.model_dir,
        "need": expected.need or "none",
    }


def _file_differences(expected: HostExpectation, seen: Mapping[str, Any]) -> list[str]:
    lines = []
    for path, (digest, mode) in sorted(expected.files.items()):
        found = seen.get(path)
        if not isinstance(found, Mapping):
            lines.append(f"file {path}: missing")
        elif found.get("sha256") != digest:
            lines.append(f"file {path}: content differs from the plan")
        elif found.get("mode") != mode:
            lines.append(f"file {path}: mode {found.get('mode')}, planned {mode}")
    return lines


def _container_differences(expected: HostExpectation, seen: Mapping[str, Any]) -> list[str]:
    lines = []
    for name, digest in sorted(expected.containers.items()):
        found = seen.get(name)
        if not isinstance(found, Mapping):
            lines.append(f"container {name}: missing")
        elif not found.get("running"):
            lines.append(f"container {name}: not running")
        elif found.get("hash") != digest:
            lines.append(f"container {name}: made from another spec ({found.get('hash')})")
    return lines


def differences(expected: HostExpectation, observed: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per looked-at phase, what on the host differs from the plan, one line each (empty:
    converged). `observed` is what k2.cluster.host_look answered."""
    launch = _file_differences(expected, observed.get("files") or {})
    if (expected.containers or expected.execs) and not observed.get("docker"):
        launch.append("docker: not answering")
    launch += _container_differences(expected, observed.get("containers") or {})
    alive = observed.get("execs") or {}
    launch += [
        f"process {name}: not running in {container}"
        for name, (container, _) in sorted(expected.execs.items())
        if not alive.get(name)
    ]
    launch += [f"model dir {expected.model_dir}: {p}" for p in observed.get("checkpoint") or ()]
    return {"launch": launch}
