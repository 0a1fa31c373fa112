"""Converge by difference: what a host should hold for its launch, and what differs. Pure.

A first step of every apply (action ``k2.cluster.look``) asks each host, in one module call,
about everything the plan places there: the sha256 and mode of each rendered file, each planned
container (running or not, the spec hash label it carries), whether each exec'd process lives,
what each health gate answers, and whether the model directory holds what the host's
processes load. :func:`differences` compares that answer with the plan and names, per phase,
what differs; a phase whose list is empty is converged on that host and its tasks are skipped
there. A phase the look does not cover is never called converged (it runs every task, as
without the look).

The same call reads what the other phases left: prepare, ssh_mesh and weights each write, at
their end, a stamp (``STAMP_DIR/<phase>.json``) with the digest of their inputs (the plan and
the inventory's variables of their roles, :func:`inputs_digest`) and what they hold: prepare
the packages its roles installed, the images (by ID) and the kernel modules they loaded,
weights the manifest it distributed, ssh_mesh where the controller keeps the cluster's key
pair. The look answers each stamp; whether each of those packages is installed, each image
held and each module loaded; the mesh's keys and configurations in ``<config_dir>/ssh`` (the
private key's public half, the controller's public key, authorized_keys, this host's host key
in known_hosts, the sshd/ssh config hashes); and what the model directory holds of the
weights manifest (sizes and the relay's verified stamps, no hashing). A changed input,
package, image, module, key or shard names its phase. No role sets a sysctl, so the look
reads none.

Prepare, ssh_mesh and weights compare hosts with each other (one image ID everywhere, the
all-pairs known_hosts, the chain from the seed): a difference on any host runs the phase on
every host (:func:`everywhere`), whose idempotent tasks change only the drifted host. The
launch runs per host. Preflight and validate are checks, not state: they run on every host
when any looked-at phase runs on any host (nothing changes otherwise, so there is nothing to
guard), and not at all on a converged cluster unless the tags name them. Verify runs as
always: the smoke test, once, from one host.

Each phase's play first ends the hosts whose look named the phase in ``skipped_phases``
(:func:`skipped_phases`): a host skips a phase its tags leave out, a looked-at phase it holds
converged, and the smoke test unless it runs it (the test runs once, from one host).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from k2provision.core.records import HealthGate, HostPlan, Plan
from k2provision.core.ssh_mesh import mesh_ssh_configs
from k2provision.plan.assemble import plan_digest
from k2provision.plan.containers import LABEL_HASH, exec_pid_path, spec_hash

__all__ = [
    "CHECK_PHASES",
    "CLUSTER_PHASES",
    "LOOKED_PHASES",
    "PHASE_ROLES",
    "PHASE_TAGS",
    "STAMP_DIR",
    "HostExpectation",
    "differences",
    "everywhere",
    "expected_state",
    "file_mode",
    "inputs_digest",
    "look_request",
    "repairs",
    "selected",
    "skipped_phases",
    "smoke_host",
]

LOOKED_PHASES = ("prepare", "ssh_mesh", "weights", "launch")
"""The phases the look covers: only these may be found converged and skipped."""

CLUSTER_PHASES = ("prepare", "ssh_mesh", "weights")
"""Looked-at phases whose roles compare hosts: they run on every host or on none."""

CHECK_PHASES = ("preflight", "validate")
"""Checks that guard a change: they run on every host when anything runs, else on none."""

PHASE_ROLES = {
    "prepare": ("k2_nvidia_driver_", "k2_rdma_", "k2_container_runtime_", "k2_firewall_"),
    "ssh_mesh": ("k2_ssh_mesh_",),
    "weights": ("k2_weights_",),
}
"""The variable prefixes of each stamped phase's roles: their values are its inputs."""

RUN_ONLY_VARIABLES = frozenset({"k2_weights_progress_file", "k2_weights_record_dir"})
"""Variables a run sets for itself (where it reports): not inputs of what a phase holds."""

STAMP_DIR = "/var/lib/k2provision/converged"
"""Where each stamped phase records its inputs' digest and what it holds (``<phase>.json``)."""

MESH_MODES = {
    "id_ed25519": "0600",
    "id_ed25519.pub": "0644",
    "authorized_keys": "0600",
    "known_hosts": "0644",
    "ssh_host_ed25519_key": "0600",
}
"""The mesh's key files (in ``<config_dir>/ssh``) and the modes the role writes them with."""

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
    stamps: Mapping[str, str]
    """stamped phase -> the digest of its inputs its stamp must carry."""
    weights: bool
    """Whether this host holds the weights the weights phase distributes (managed, no router)."""
    mesh_dir: str
    mesh_configs: Mapping[str, str]
    """The mesh's sshd_config and ssh_config: path -> sha256."""
    mesh_hosts: int
    """How many hosts known_hosts pins."""


def inputs_digest(plan: Plan, phase: str, variables: Mapping[str, Any]) -> str:
    """The digest of a stamped phase's inputs: the plan, and the variables of its roles the
    inventory or the command line set (`variables`: the host's variables, unrendered); for the
    mesh also the inventory file's name, which names the cluster's key pair."""
    own = {
        name: value
        for name, value in variables.items()
        if name.startswith(PHASE_ROLES[phase]) and name not in RUN_ONLY_VARIABLES
    }
    if phase == "ssh_mesh":
        # The cluster's key pair on the controller is named after the inventory file.
        sources = variables.get("ansible_inventory_sources") or ()
        own["inventory"] = [PurePath(str(source)).stem for source in sources]
    inputs = {"phase": phase, "plan": plan_digest(plan), "variables": own}
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _host(plan: Plan, host: str) -> HostPlan:
    for entry in plan.hosts:
        if entry.name == host:
            return entry
    raise ValueError(f"{host} is in no pool of the plan")


def expected_state(
    plan: Plan, host: str, variables: Mapping[str, Any] | None = None
) -> HostExpectation:
    """What the plan places on `host` (files, containers, exec'd processes, the checkpoint,
    the phases' stamps, the mesh); `variables`: the host's inventory variables."""
    variables = variables or {}
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
        stamps={phase: inputs_digest(plan, phase, variables) for phase in PHASE_ROLES},
        weights=bool(variables.get("k2_weights_source")) and entry.pool != "router",
        mesh_dir=f"{plan.config_dir}/ssh",
        mesh_configs={
            path: content_hash(entry.files.get(path, text))
            for path, text in mesh_ssh_configs(f"{plan.config_dir}/ssh", plan.ssh_port).items()
        },
        mesh_hosts=len(plan.hosts),
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
        "stamp_dir": STAMP_DIR,
        "stamps": sorted(expected.stamps),
        "mesh_dir": expected.mesh_dir,
        "mesh_files": sorted([*MESH_MODES, *(p.rsplit("/", 1)[1] for p in expected.mesh_configs)]),
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
    stamps = observed.get("stamps") or {}
    return {
        "prepare": _stamp_differences(expected, "prepare", stamps)
        + _prepare_differences(stamps.get("prepare"), observed),
        "ssh_mesh": _stamp_differences(expected, "ssh_mesh", stamps)
        + _mesh_differences(expected, observed.get("mesh") or {}),
        "weights": (
            _stamp_differences(expected, "weights", stamps)
            + _weights_differences(expected, observed.get("weights"))
            if expected.weights
            else []
        ),
        "launch": launch,
    }


def _stamp_differences(
    expected: HostExpectation, phase: str, stamps: Mapping[str, Any]
) -> list[str]:
    stamp = stamps.get(phase)
    if not isinstance(stamp, Mapping):
        return [f"stamp {STAMP_DIR}/{phase}.json: missing (the phase has not run to its end here)"]
    if stamp.get("digest") != expected.stamps[phase]:
        return [f"stamp {STAMP_DIR}/{phase}.json: the plan or the phase's variables changed since"]
    return []


def _prepare_differences(stamp: Any, observed: Mapping[str, Any]) -> list[str]:
    """The packages, images and kernel modules the prepare stamp says the phase holds, as
    found. A package counts by name: the roles install any version (``state: present``), so
    a version the host moved to is not theirs to put back."""
    if not isinstance(stamp, Mapping):
        return []
    packages = observed.get("packages") or {}
    modules = observed.get("modules") or {}
    lines = []
    for name in stamp.get("packages") or ():
        found = packages.get(name)
        if not isinstance(found, Mapping) or not str(found.get("status", "")).startswith("ii"):
            lines.append(f"package {name}: not installed")
    images = observed.get("images") or {}
    for ref, image_id in sorted((stamp.get("images") or {}).items()):
        if ref not in images:
            lines.append(f"image {ref}: missing")
        elif images[ref] != image_id:
            lines.append(f"image {ref}: ID {images[ref]}, held {image_id}")
    lines += [
        f"kernel module {name}: not loaded"
        for name in stamp.get("modules") or ()
        if not modules.get(name)
    ]
    return lines


def _key(text: str) -> str:
    """An OpenSSH public key's type and key, without its comment."""
    return " ".join(text.split()[:2])


def _mesh_differences(expected: HostExpectation, mesh: Mapping[str, Any]) -> list[str]:
    """The mesh's keys and configurations on this host, as the role leaves them."""
    files = mesh.get("files") or {}
    lines = []
    for name, mode in sorted(MESH_MODES.items()):
        found = files.get(name)
        path = f"{expected.mesh_dir}/{name}"
        if not isinstance(found, Mapping):
            lines.append(f"mesh {path}: missing")
        elif found.get("mode") != mode:
            lines.append(f"mesh {path}: mode {found.get('mode')}, planned {mode}")
    for path, digest in sorted(expected.mesh_configs.items()):
        found = files.get(path.rsplit("/", 1)[1])
        if isinstance(found, Mapping) and found.get("sha256") != digest:
            lines.append(f"mesh {path}: content differs from the plan")
        elif not isinstance(found, Mapping):
            lines.append(f"mesh {path}: missing")
    if lines:
        return lines
    key = _key(str(mesh.get("public") or ""))
    if not key or key != _key(str(mesh.get("private_public") or "")):
        lines.append(f"mesh {expected.mesh_dir}/id_ed25519: its public half is not id_ed25519.pub")
    if "controller_public" in mesh and _key(str(mesh["controller_public"] or "")) != key:
        lines.append(
            f"mesh {expected.mesh_dir}/id_ed25519.pub: not the cluster's key on the controller"
        )
    authorized = [_key(line.removeprefix("restrict ")) for line in _lines(mesh, "authorized_keys")]
    if authorized != [key]:
        lines.append(f"mesh {expected.mesh_dir}/authorized_keys: does not hold the mesh key only")
    pinned = [_key(line.split(None, 1)[-1]) for line in _lines(mesh, "known_hosts")]
    if len(pinned) != expected.mesh_hosts or _key(str(mesh.get("host_public") or "")) not in pinned:
        lines.append(
            f"mesh {expected.mesh_dir}/known_hosts: pins {len(pinned)} host keys, planned "
            f"{expected.mesh_hosts} with this host's own"
        )
    return lines


def _lines(mesh: Mapping[str, Any], name: str) -> list[str]:
    """The lines of a mesh file that are not comments."""
    text = str(mesh.get(name) or "")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _weights_differences(expected: HostExpectation, weights: Any) -> list[str]:
    """What the model directory holds of the manifest the weights phase distributed."""
    if not isinstance(weights, Mapping):
        return [f"weights: no manifest of an earlier distribution on {expected.host}"]
    return [
        f"weights {expected.model_dir}/{name}: {why}"
        for why in ("missing", "wrong", "unverified")
        for name in sorted(weights.get(why) or ())
    ]


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
    chosen = not run_tags or any(t in {tag, "all", "tagged", "untagged"} for t in run_tags)
    return chosen and tag not in skip_tags


def smoke_host(endpoint_host: str, play_hosts: Sequence[str]) -> str:
    """The one host whose verify play runs the smoke test: the endpoint's host, or the play's
    first host when --limit leaves the endpoint's host out (the test still asks the endpoint)."""
    return endpoint_host if endpoint_host in play_hosts or not play_hosts else play_hosts[0]


def everywhere(own: Sequence[str], every_host: Sequence[Sequence[str]]) -> list[str]:
    """The phases a host skips once every host's look is in: its own per-host skips, and the
    cluster phases and checks only where every host (`every_host`: each one's own skips)
    skips them."""
    shared = (*CLUSTER_PHASES, *CHECK_PHASES)
    return [
        phase for phase in own if phase not in shared or all(phase in skips for skips in every_host)
    ]


def skipped_phases(
    found: Mapping[str, list[str]],
    *,
    run_tags: Sequence[str],
    skip_tags: Sequence[str],
    endpoint: bool,
) -> list[str]:
    """The phases whose play leaves this host out: those the tags leave out, the looked-at
    ones `found` converged here, the checks when no looked-at phase runs here (unless the tags
    name them), and the smoke
    test (verify) unless this host runs it (`endpoint`: it is the :func:`smoke_host`). The
    cluster phases and checks are then skipped only where every host skips them
    (:func:`everywhere`)."""
    runs = {
        phase
        for phase in LOOKED_PHASES
        if found.get(phase) and selected(PHASE_TAGS[phase], run_tags, skip_tags)
    }
    skipped = []
    for phase, tag in PHASE_TAGS.items():
        if (
            not selected(tag, run_tags, skip_tags)
            or (phase in LOOKED_PHASES and not found.get(phase))
            or (phase in CHECK_PHASES and not runs and tag not in run_tags)
            or (phase == "verify" and not endpoint)
        ):
            skipped.append(phase)
    return skipped
