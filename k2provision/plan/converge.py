"""Converge by difference: what a host should hold for its launch, and what differs. Pure.

A first step of every apply (action ``k2.cluster.look``) asks each host, in one module call,
about everything the plan places there: the sha256 and mode of each rendered file, each planned
container (running or not, the spec hash label it carries), whether each exec'd process lives,
what each health gate answers, and whether the model directory holds what the host's
processes load. :func:`differences` compares that answer with the plan and names, per phase,
what differs; a phase whose list is empty is converged on that host and its tasks are skipped
there. A phase the look does not cover is never called converged (it runs every task, as
without the look).

Each phase's play first ends the hosts whose look named the phase in ``skipped_phases``
(:func:`skipped_phases`): a host skips a phase its tags leave out, a looked-at phase it holds
converged, and the smoke test unless it runs it (the test runs once, from one host).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k2provision.core.records import HealthGate, HostPlan, Plan
from k2provision.plan.containers import LABEL_HASH, exec_pid_path, spec_hash

__all__ = [
    "LOOKED_PHASES",
    "PHASE_TAGS",
    "HostExpectation",
    "differences",
    "expected_state",
    "file_mode",
    "look_request",
    "repairs",
    "selected",
    "skipped_phases",
    "smoke_host",
]

LOOKED_PHASES = ("launch",)
"""The phases the look covers: only these may be found converged and skipped."""

PHASE_TAGS = {
    "preflight": "preflight",
    "prepare": "prepare",
    "ssh_mesh": "ssh_mesh",
    "weights": "weights",
    "validate": "nccl",
    "launch": "launch",
    "verify": "verify",
}
"""Each phase of site.yml (playbooks/<phase>.yml) and the tag its play carries."""


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
    gates: Mapping[str, HealthGate]
    """process name -> its health gate (a converged process passes it)."""
    gate_containers: Mapping[str, str]
    """process name -> the container a command gate runs in."""
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
        gates={p.name: p.health for p in entry.processes if p.health is not None},
        gate_containers={p.name: p.container for p in entry.processes if p.health is not None},
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
        "gates": [
            {
                "name": name,
                "url": gate.url or "",
                "command": list(gate.command),
                "container": expected.gate_containers[name],
            }
            for name, gate in sorted(expected.gates.items())
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


def _gate_text(gate: HealthGate) -> str:
    return f"GET {gate.url}" if gate.url is not None else f"`{' '.join(gate.command)}`"


def _gate_expects(gate: HealthGate) -> str:
    """What a passing gate answers: the HTTP status, or a command's exit status 0."""
    return str(gate.expect_status) if gate.url is not None else "0"


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
    answers = observed.get("gates") or {}
    launch += [
        f"process {name}: health gate {_gate_text(gate)} answered {answers.get(name, 'nothing')}"
        for name, gate in sorted(expected.gates.items())
        if str(answers.get(name)) != _gate_expects(gate)
    ]
    launch += [f"model dir {expected.model_dir}: {p}" for p in observed.get("checkpoint") or ()]
    return {"launch": launch}



def repairs(expected: HostExpectation, observed: Mapping[str, Any]) -> dict[str, list[str]]:
    """What the launch writes and recreates on the host: the files whose content or mode
    differs or that are missing, and the containers missing, stopped or of another spec."""
    differing = {line.split(":", 1)[0] for line in differences(expected, observed)["launch"]}
    return {
        "files": [p for p in sorted(expected.files) if f"file {p}" in differing],
        "containers": [c for c in sorted(expected.containers) if f"container {c}" in differing],
    }

def selected(tag: str, run_tags: Sequence[str], skip_tags: Sequence[str]) -> bool:
    """Whether ``--tags`` / ``--skip-tags`` let a play tagged `tag` run (any special tag
    other than ``all`` counts as selecting it, so nothing is left out by mistake)."""
    chosen = not run_tags or any(
        t in {tag, "all", "tagged", "untagged"} for t in run_tags
    )
    return chosen and tag not in skip_tags


def smoke_host(endpoint_host: str, play_hosts: Sequence[str]) -> str:
    """The one host whose verify play runs the smoke test: the endpoint's host, or the play's
    first host when --limit leaves the endpoint's host out (the test still asks the endpoint)."""
    return endpoint_host if endpoint_host in play_hosts or not play_hosts else play_hosts[0]


def skipped_phases(
    found: Mapping[str, list[str]],
    *,
    run_tags: Sequence[str],
    skip_tags: Sequence[str],
    endpoint: bool,
) -> list[str]:
    """The phases whose play leaves this host out: those the tags leave out, the looked-at
    ones `found` converged here, and the smoke test (verify) unless this host runs it
    (`endpoint`: it is the :func:`smoke_host`)."""
    skipped = []
    for phase, tag in PHASE_TAGS.items():
        if (
            not selected(tag, run_tags, skip_tags)
            or (phase in LOOKED_PHASES and not found.get(phase))
            or (phase == "verify" and not endpoint)
        ):
            skipped.append(phase)
    return skipped
