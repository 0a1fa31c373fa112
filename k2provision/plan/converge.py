"""Converge by difference: what a host should hold for its launch, and what differs. Pure.

A first step of every apply (action ``k2.cluster.look``) asks each host, in one module call,
about everything the plan places there, in the registry's questions (plan/host_questions.py,
the same the launch gate and status ask): the sha256 and mode of each rendered file, each
planned container (running or not, the spec hash label it carries), whether each exec'd
process lives, what each health gate answers (an https gate under the one certificate
policy), and whether the model directory holds what the host's processes load.
:func:`differences` compares the records with the plan and names, per phase, what differs as
typed :class:`Difference` records (subject, name, :class:`Drift`); the launch's repairs and a
fleet's rollout decide on those, never on the words (:attr:`Difference.text`, for people). A
phase whose list is empty is converged on that host and its tasks are skipped there. A phase
the look does not cover is never called converged (it runs every task, as without the look).

The same call reads what the other phases left: prepare, ssh_mesh and weights each write, at
their end, a stamp (``STAMP_DIR/<phase>.json``) with the digest of their inputs (what they
read of the plan, :func:`stamped_plan`, and the inventory's variables of their roles,
:func:`inputs_digest`: a changed spec is the launch's alone) and what they hold: prepare
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
guard), and not at all on a converged cluster unless the tags name them; validate, which
takes the GPUs (the NCCL test), never on a host that serves (:func:`serving`: a planned
container runs there), whatever the tags say. Verify runs as
always: the smoke test, once, from one host. The launch's containers are decided per host
(:func:`repairs`) and then per instance (:func:`instance_repairs`): the ranks of an instance
on several hosts are one group, so a rank whose container needs starting or recreating
brings every other rank of its instance with it.

Each phase's play first ends the hosts whose look named the phase in ``skipped_phases``
(:func:`skipped_phases`): a host skips a phase its tags leave out, a looked-at phase it holds
converged, and the smoke test unless it runs it (the test runs once, from one host).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from typing import Any, TypeVar

from k2provision.core.records import HealthGate, HostPlan, Plan
from k2provision.core.ssh_mesh import mesh_ssh_configs
from k2provision.plan.assemble import instance_ranks
from k2provision.plan.containers import exec_pid_path, spec_hash
from k2provision.plan.host_questions import gate_question, hq, state_question

RecordT = TypeVar("RecordT")

__all__ = [
    "CHECK_PHASES",
    "CLUSTER_PHASES",
    "GPU_CHECK_PHASES",
    "LOOKED_PHASES",
    "PHASE_ROLES",
    "PHASE_TAGS",
    "STAMP_DIR",
    "Difference",
    "Drift",
    "HostExpectation",
    "InstanceRepairs",
    "difference_lines",
    "differences",
    "everywhere",
    "expected_state",
    "file_mode",
    "inputs_digest",
    "instance_repairs",
    "look_questions",
    "look_request",
    "repairs",
    "selected",
    "serving",
    "skipped_phases",
    "smoke_host",
    "stamped_plan",
    "whole_instances",
]

LOOKED_PHASES = ("prepare", "ssh_mesh", "weights", "launch")
"""The phases the look covers: only these may be found converged and skipped."""

CLUSTER_PHASES = ("prepare", "ssh_mesh", "weights")
"""Looked-at phases whose roles compare hosts: they run on every host or on none."""

CHECK_PHASES = ("preflight", "validate")
"""Checks that guard a change: they run on every host when anything runs, else on none."""

GPU_CHECK_PHASES = ("validate",)
"""Checks that take the GPUs (the NCCL test): never on a host that serves. Drain it first."""

PHASE_ROLES = {
    "prepare": ("k2_nvidia_driver_", "k2_rdma_", "k2_container_runtime_", "k2_firewall_"),
    "ssh_mesh": ("k2_ssh_mesh_",),
    "weights": ("k2_weights_",),
}
"""The variable prefixes of each stamped phase's roles: their values are its inputs."""

RUN_ONLY_VARIABLES = frozenset(
    {"k2_weights_progress_file", "k2_weights_record_dir", "k2_container_runtime_progress_file"}
)
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
    "front": "front",
    "verify": "verify",
}
"""Each phase of site.yml (playbooks/<phase>.yml) and the tag its play carries."""


def file_mode(path: str) -> str:
    """The mode a rendered file is written with (launch scripts are executable)."""
    return "0755" if path.endswith(".sh") else "0644"


def content_hash(content: str) -> str:
    """The sha256 of a rendered file as written (UTF-8)."""
    return hashlib.sha256(content.encode()).hexdigest()


class Drift(StrEnum):
    """How a thing on a host differs from the plan: what decisions compare (never a message)."""

    MISSING = "missing"
    CONTENT = "content"
    MODE = "mode"
    STOPPED = "stopped"
    OTHER_SPEC = "other_spec"
    NOT_ANSWERING = "not_answering"
    GATE = "gate"
    PROBLEM = "problem"
    STAMP_MISSING = "stamp_missing"
    STAMP_CHANGED = "stamp_changed"
    OTHER_ID = "other_id"
    NOT_INSTALLED = "not_installed"
    NOT_LOADED = "not_loaded"


DRIFT_WORDS = {
    Drift.MISSING: "missing",
    Drift.CONTENT: "content differs from the plan",
    Drift.MODE: "mode differs from the plan",
    Drift.STOPPED: "not running",
    Drift.OTHER_SPEC: "made from another spec",
    Drift.NOT_ANSWERING: "not answering",
    Drift.GATE: "health gate failing",
    Drift.PROBLEM: "differs from the plan",
    Drift.STAMP_MISSING: "missing (the phase has not run to its end here)",
    Drift.STAMP_CHANGED: "the plan or the phase's variables changed since",
    Drift.OTHER_ID: "another image ID",
    Drift.NOT_INSTALLED: "not installed",
    Drift.NOT_LOADED: "not loaded",
}
"""Each drift in words, where a difference brings no words of its own."""


@dataclass(frozen=True)
class Difference:
    """One thing on a host that differs from the plan: what (`subject`: file, container,
    process, docker, model dir, stamp, package, image, kernel module, mesh, weights), which
    one (`name`), how (`drift`). Decisions (the launch's repairs, a fleet's rollout) compare
    those; `detail` (the facts in words, rendered from the typed values) and :attr:`text`
    are for people only."""

    subject: str
    name: str
    drift: Drift
    detail: str = ""

    @property
    def text(self) -> str:
        """The difference as the look shows it: ``<subject> <name>: <words>``."""
        where = f"{self.subject} {self.name}" if self.name else self.subject
        return f"{where}: {self.detail or DRIFT_WORDS[self.drift]}"

    def as_json(self) -> dict[str, str]:
        return {
            "subject": self.subject,
            "name": self.name,
            "drift": self.drift.value,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Difference:
        return cls(
            str(data["subject"]),
            str(data["name"]),
            Drift(str(data["drift"])),
            str(data.get("detail") or ""),
        )


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
    questions: Mapping[str, hq.Question[Any]]
    """What the look asks about the launch's processes, by key (``state NAME``, ``gate
    NAME``): the registry's questions, as the launch gate and status ask them."""
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
    host_work: str = ""
    """The digest of what the host work reads (:func:`host_work_digest`), which the prepare
    stamp carries: where it changed on a serving host, the work waits (plan/host_work.py)."""


LAUNCH_ONLY_PLAN_FIELDS = frozenset({"pools", "fit", "warnings", "fleet"})
"""Plan fields no stamped phase reads (the engines' tunables, the memory fit, the rolling
settings): a changed spec or rolling setting runs the launch, not prepare, ssh_mesh or weights."""

STAMPED_PROCESS_FIELDS = ("name", "container", "image", "gpus", "exec_in")
"""What the stamped phases read of a planned process: the images prepare pulls, the container
the mesh's sshd may live in. Its argv, environment and health gate are the launch's."""


def stamped_plan(plan: Plan) -> dict[str, Any]:
    """The part of the plan the stamped phases' roles and filters read: the plan less
    :data:`LAUNCH_ONLY_PLAN_FIELDS`, each process cut to :data:`STAMPED_PROCESS_FIELDS` and
    each host's files to the mesh's configurations (the launch renders the rest)."""
    data = plan.model_dump(mode="json", exclude=set(LAUNCH_ONLY_PLAN_FIELDS))
    mesh_dir = f"{plan.config_dir}/ssh/"
    for host in data["hosts"]:
        host["processes"] = [
            {name: process[name] for name in STAMPED_PROCESS_FIELDS}
            for process in host["processes"]
        ]
        host["files"] = {
            path: text for path, text in host["files"].items() if path.startswith(mesh_dir)
        }
    return data


def inputs_digest(plan: Plan, phase: str, variables: Mapping[str, Any]) -> str:
    """The digest of a stamped phase's inputs: what it reads of the plan (:func:`stamped_plan`),
    and the variables of its roles the inventory or the command line set (`variables`: the
    host's variables, unrendered); for the mesh also the inventory file's name, which names the
    cluster's key pair."""
    own = {
        name: value
        for name, value in variables.items()
        if name.startswith(PHASE_ROLES[phase]) and name not in RUN_ONLY_VARIABLES
    }
    if phase == "ssh_mesh":
        # The cluster's key pair on the controller is named after the inventory file.
        sources = variables.get("ansible_inventory_sources") or ()
        own["inventory"] = [PurePath(str(source)).stem for source in sources]
    inputs = {"phase": phase, "plan": stamped_plan(plan), "variables": own}
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


HOST_WORK_PREFIXES = ("k2_nvidia_driver_",)
"""The variables of the host work that takes the GPUs or reboots the host: the driver and
fabric manager. A change of the rest of prepare (the firewall's peers, RDMA packages, Docker)
runs in place, serving or not."""


def host_work_digest(plan: Plan, variables: Mapping[str, Any]) -> str:
    """The digest of the driver's inputs: its role's variables the inventory or the command
    line set, and the driver the engine's release needs."""
    own = {
        name: value
        for name, value in variables.items()
        if name.startswith(HOST_WORK_PREFIXES) and name not in RUN_ONLY_VARIABLES
    }
    inputs = {"min_driver": plan.engine_min_driver, "variables": own}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def host_work_changed(expected: HostExpectation, observed: Mapping[str, Any]) -> bool:
    """Whether the host's prepare stamp records other driver inputs than the plan's (a stamp
    without them, written before they were recorded, counts as unchanged)."""
    stamp = (observed.get("stamps") or {}).get("prepare")
    if not isinstance(stamp, Mapping) or "host_work" not in stamp:
        return False
    return bool(stamp["host_work"] != expected.host_work)


def _host(plan: Plan, host: str) -> HostPlan:
    for entry in plan.hosts:
        if entry.name == host:
            return entry
    raise ValueError(f"{host} is in no pool of the plan")


def expected_state(
    plan: Plan, host: str, variables: Mapping[str, Any] | None = None
) -> HostExpectation:
    """What the plan places on `host` (files, containers, exec'd processes, the checkpoint,
    the phases' stamps, the mesh); `variables`: the host's inventory variables. A drained
    host (FleetSettings.drained_hosts) is expected to run none of its processes: the look
    asks nothing of them and the launch has nothing to start there."""
    variables = variables or {}
    entry = _host(plan, host)
    if host in plan.fleet.drained_hosts:
        entry = entry.model_copy(update={"processes": ()})
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
        questions={
            **{f"state {p.name}": state_question(p) for p in entry.processes},
            **{
                f"gate {p.name}": gate_question(p, p.health, plan.config_dir)
                for p in entry.processes
                if p.health is not None
            },
        },
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
        host_work=host_work_digest(plan, variables),
    )


def look_questions(expected: HostExpectation) -> dict[str, hq.Question[Any]]:
    """Every registry question the look asks the host, by key: the launch's processes and
    gates, each rendered file (``file PATH``) and each mesh file (``mesh NAME``)."""
    mesh_files = sorted([*MESH_MODES, *(p.rsplit("/", 1)[1] for p in expected.mesh_configs)])
    return {
        **{f"file {path}": hq.FileQuestion(path) for path in sorted(expected.files)},
        **{f"mesh {name}": hq.FileQuestion(f"{expected.mesh_dir}/{name}") for name in mesh_files},
        **dict(sorted(expected.questions.items())),
    }


def look_request(expected: HostExpectation) -> dict[str, Any]:
    """The arguments of module k2.cluster.host_look for this host."""
    return {
        "questions": {
            key: hq.question_json(question) for key, question in look_questions(expected).items()
        },
        "model_dir": expected.model_dir,
        "need": expected.need or "none",
        "stamp_dir": STAMP_DIR,
        "stamps": sorted(expected.stamps),
        "mesh_dir": expected.mesh_dir,
    }


def _record(cls: type[RecordT], answers: Mapping[str, Any], key: str) -> RecordT | None:
    """The look's answer to one question, as its record (None: not answered)."""
    return hq.record_from_json(cls, answers.get(key))


def _file_differences(expected: HostExpectation, answers: Mapping[str, Any]) -> list[Difference]:
    found: list[Difference] = []
    for path, (digest, mode) in sorted(expected.files.items()):
        held = _record(hq.FileDigest, answers, f"file {path}")
        if held is None:
            found.append(Difference("file", path, Drift.MISSING))
        elif held.sha256 != digest:
            found.append(Difference("file", path, Drift.CONTENT))
        elif held.mode != mode:
            found.append(Difference("file", path, Drift.MODE, f"mode {held.mode}, planned {mode}"))
    return found


def _container_differences(
    expected: HostExpectation, answers: Mapping[str, Any]
) -> list[Difference]:
    found: list[Difference] = []
    names = {q.container: key for key, q in expected.questions.items()
             if isinstance(q, hq.ContainerQuestion)}  # fmt: skip
    for name, digest in sorted(expected.containers.items()):
        state = _record(hq.ContainerState, answers, names.get(name, ""))
        if state is None or not state.found:
            found.append(Difference("container", name, Drift.MISSING))
        elif not state.running:
            found.append(Difference("container", name, Drift.STOPPED))
        elif state.spec_hash != digest:
            found.append(
                Difference(
                    "container",
                    name,
                    Drift.OTHER_SPEC,
                    f"made from another spec ({state.spec_hash or None})",
                )
            )
    return found


def serving(expected: HostExpectation, observed: Mapping[str, Any]) -> bool:
    """Whether the host runs one of its planned containers now, on any spec: it serves (or
    holds its router), so no work that takes its GPUs or reboots it may run there. A drained
    host plans none (expected_state), so it never serves."""
    answers = observed.get("answers") or {}
    for key, question in expected.questions.items():
        if isinstance(question, hq.ContainerQuestion) and question.container in expected.containers:
            state = _record(hq.ContainerState, answers, key)
            if state is not None and state.found and state.running:
                return True
    return False


def _gate_text(gate: HealthGate) -> str:
    return f"GET {gate.url}" if gate.url is not None else f"`{' '.join(gate.command)}`"


def _gate_expects(gate: HealthGate) -> int:
    """What a passing gate answers: the HTTP status, or a command's exit status 0."""
    return gate.expect_status if gate.url is not None else 0


def _process_differences(expected: HostExpectation, answers: Mapping[str, Any]) -> list[Difference]:
    found: list[Difference] = []
    for name, (container, _) in sorted(expected.execs.items()):
        alive = _record(hq.ExecState, answers, f"state {name}")
        if alive is None or alive.state != "running":
            found.append(Difference("process", name, Drift.STOPPED, f"not running in {container}"))
    for name, gate in sorted(expected.gates.items()):
        answer = _record(hq.GateAnswer, answers, f"gate {name}")
        if answer is None or not answer.passes(_gate_expects(gate)):
            said = answer.text if answer is not None else "nothing"
            found.append(
                Difference(
                    "process", name, Drift.GATE, f"health gate {_gate_text(gate)} answered {said}"
                )
            )
    return found


def differences(
    expected: HostExpectation, observed: Mapping[str, Any]
) -> dict[str, list[Difference]]:
    """Per looked-at phase, what on the host differs from the plan (empty: converged).
    `observed` is what k2.cluster.host_look answered."""
    answers = observed.get("answers") or {}
    launch = _file_differences(expected, answers)
    if (expected.containers or expected.execs) and not observed.get("docker"):
        launch.append(Difference("docker", "", Drift.NOT_ANSWERING))
    launch += _container_differences(expected, answers)
    launch += _process_differences(expected, answers)
    launch += [
        Difference("model dir", expected.model_dir, Drift.PROBLEM, str(p))
        for p in observed.get("checkpoint") or ()
    ]
    stamps = observed.get("stamps") or {}
    return {
        "prepare": _stamp_differences("prepare", expected, stamps)
        + _prepare_differences(stamps.get("prepare"), observed),
        "ssh_mesh": _stamp_differences("ssh_mesh", expected, stamps)
        + _mesh_differences(expected, observed.get("mesh") or {}, answers),
        "weights": (
            _stamp_differences("weights", expected, stamps)
            + _weights_differences(expected, observed.get("weights"))
            if expected.weights
            else []
        ),
        "launch": launch,
    }


def difference_lines(found: Mapping[str, Sequence[Difference]]) -> dict[str, list[str]]:
    """Per phase, its differences in words (for people: the look's output, --check)."""
    return {phase: [d.text for d in diffs] for phase, diffs in found.items()}


def _stamp_differences(
    phase: str, expected: HostExpectation, stamps: Mapping[str, Any]
) -> list[Difference]:
    stamp = stamps.get(phase)
    where = f"{STAMP_DIR}/{phase}.json"
    if not isinstance(stamp, Mapping):
        return [Difference("stamp", where, Drift.STAMP_MISSING)]
    if stamp.get("digest") != expected.stamps[phase]:
        return [Difference("stamp", where, Drift.STAMP_CHANGED)]
    return []


def _prepare_differences(stamp: Any, observed: Mapping[str, Any]) -> list[Difference]:
    """The packages, images and kernel modules the prepare stamp says the phase holds, as
    found. A package counts by name: the roles install any version (``state: present``), so
    a version the host moved to is not theirs to put back."""
    if not isinstance(stamp, Mapping):
        return []
    packages = observed.get("packages") or {}
    modules = observed.get("modules") or {}
    found: list[Difference] = []
    for name in stamp.get("packages") or ():
        held = packages.get(name)
        if not isinstance(held, Mapping) or not str(held.get("status", "")).startswith("ii"):
            found.append(Difference("package", str(name), Drift.NOT_INSTALLED))
    images = observed.get("images") or {}
    for ref, image_id in sorted((stamp.get("images") or {}).items()):
        if ref not in images:
            found.append(Difference("image", ref, Drift.MISSING))
        elif images[ref] != image_id:
            found.append(
                Difference("image", ref, Drift.OTHER_ID, f"ID {images[ref]}, held {image_id}")
            )
    found += [
        Difference("kernel module", str(name), Drift.NOT_LOADED)
        for name in stamp.get("modules") or ()
        if not modules.get(name)
    ]
    return found


def _key(text: str) -> str:
    """An OpenSSH public key's type and key, without its comment."""
    return " ".join(text.split()[:2])


def _mesh_differences(
    expected: HostExpectation, mesh: Mapping[str, Any], answers: Mapping[str, Any]
) -> list[Difference]:
    """The mesh's keys and configurations on this host, as the role leaves them."""
    found: list[Difference] = []
    for name, mode in sorted(MESH_MODES.items()):
        held = _record(hq.FileDigest, answers, f"mesh {name}")
        path = f"{expected.mesh_dir}/{name}"
        if held is None:
            found.append(Difference("mesh", path, Drift.MISSING))
        elif held.mode != mode:
            found.append(Difference("mesh", path, Drift.MODE, f"mode {held.mode}, planned {mode}"))
    for path, digest in sorted(expected.mesh_configs.items()):
        held = _record(hq.FileDigest, answers, f"mesh {path.rsplit('/', 1)[1]}")
        if held is None:
            found.append(Difference("mesh", path, Drift.MISSING))
        elif held.sha256 != digest:
            found.append(Difference("mesh", path, Drift.CONTENT))
    if found:
        return found
    key = _key(str(mesh.get("public") or ""))
    mesh_dir = expected.mesh_dir
    if not key or key != _key(str(mesh.get("private_public") or "")):
        found.append(
            Difference(
                "mesh",
                f"{mesh_dir}/id_ed25519",
                Drift.PROBLEM,
                "its public half is not id_ed25519.pub",
            )
        )
    if "controller_public" in mesh and _key(str(mesh["controller_public"] or "")) != key:
        found.append(
            Difference(
                "mesh",
                f"{mesh_dir}/id_ed25519.pub",
                Drift.PROBLEM,
                "not the cluster's key on the controller",
            )
        )
    authorized = [_key(line.removeprefix("restrict ")) for line in _lines(mesh, "authorized_keys")]
    if authorized != [key]:
        found.append(
            Difference(
                "mesh",
                f"{mesh_dir}/authorized_keys",
                Drift.PROBLEM,
                "does not hold the mesh key only",
            )
        )
    pinned = [_key(line.split(None, 1)[-1]) for line in _lines(mesh, "known_hosts")]
    if len(pinned) != expected.mesh_hosts or _key(str(mesh.get("host_public") or "")) not in pinned:
        found.append(
            Difference(
                "mesh",
                f"{mesh_dir}/known_hosts",
                Drift.PROBLEM,
                f"pins {len(pinned)} host keys, planned {expected.mesh_hosts} with this host's own",
            )
        )
    return found


def _lines(mesh: Mapping[str, Any], name: str) -> list[str]:
    """The lines of a mesh file that are not comments."""
    text = str(mesh.get(name) or "")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _weights_differences(expected: HostExpectation, weights: Any) -> list[Difference]:
    """What the model directory holds of the manifest the weights phase distributed."""
    if not isinstance(weights, Mapping):
        return [
            Difference(
                "weights",
                "",
                Drift.MISSING,
                f"no manifest of an earlier distribution on {expected.host}",
            )
        ]
    drifts = {"missing": Drift.MISSING, "wrong": Drift.CONTENT, "unverified": Drift.PROBLEM}
    return [
        Difference("weights", f"{expected.model_dir}/{name}", drift, why)
        for why, drift in drifts.items()
        for name in sorted(weights.get(why) or ())
    ]


REPAIRED = {Drift.MISSING, Drift.CONTENT, Drift.MODE, Drift.STOPPED, Drift.OTHER_SPEC}
"""The drifts the launch repairs by writing a file or recreating a container."""


def repairs(launch: Sequence[Difference]) -> dict[str, list[str]]:
    """What the launch writes and recreates on the host, from its launch differences: the
    files missing or whose content or mode differs, and the containers missing, stopped or
    of another spec."""
    return {
        "files": sorted({d.name for d in launch if d.subject == "file" and d.drift in REPAIRED}),
        "containers": sorted(
            {d.name for d in launch if d.subject == "container" and d.drift in REPAIRED}
        ),
    }


def _rank_groups(plan: Plan) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each instance on several hosts, named (its pool, and its name in a fleet), with the
    (host, container) of each of its engine ranks in rank order: the containers that form
    one group (an exec'd process lives in one of them, the router in none)."""
    groups = []
    for pool in plan.pools:
        for instance in pool.members():
            if len(instance.hosts) < 2:
                continue
            ranks = instance_ranks(plan.hosts, instance)
            order = {host: n for n, host in enumerate(instance.hosts)}
            members = sorted(
                {(h.name, p.container) for h, _, p in ranks if not p.exec_in},
                key=lambda rank: (order[rank[0]], rank[1]),
            )
            name = f"[{pool.name}] {instance.instance}".rstrip()
            groups.append((name, members))
    return groups


@dataclass(frozen=True)
class InstanceRepairs:
    """The containers the launch recreates once every host's look is in."""

    containers: Mapping[str, tuple[str, ...]]
    """host -> the containers its launch recreates (every looked-at host, and any host
    outside the look an instance's repair reaches)."""
    outside: Mapping[str, tuple[str, ...]]
    """instance -> the hosts of its ranks the run does not reach (not looked at: outside
    --limit) although another of its ranks is recreated: a lone new rank cannot join them."""

    def refusal(self) -> str:
        """Why the run stops before the launch when a recreated instance reaches past the
        hosts it runs on, and the fix ("" when it does not)."""
        return "; ".join(
            f"{instance}: a rank of this instance needs its container started or recreated, "
            f"and a rank started alone cannot join the group of the others; its ranks on "
            f"{', '.join(hosts)} are outside this run (--limit): include them, or run "
            "without --limit, so that the whole instance is recreated"
            for instance, hosts in self.outside.items()
        )


def instance_repairs(plan: Plan, found: Mapping[str, Sequence[Difference]]) -> InstanceRepairs:
    """What the launch recreates on each host, the whole instance at once: each host's own
    :func:`repairs`, and when any rank of an instance on several hosts needs its container
    started or recreated (missing, stopped, exited, another spec), every rank of that
    instance, on every one of its hosts (:func:`whole_instances`). `found` is, per looked-at
    host, its launch differences (the look's typed records)."""
    return whole_instances(
        plan, {host: repairs(diffs)["containers"] for host, diffs in found.items()}
    )


def whole_instances(plan: Plan, recreate: Mapping[str, Sequence[str]]) -> InstanceRepairs:
    """`recreate` (host -> the containers a host needs started or recreated, for each host
    the run reaches), grown to whole instances: a rank of an instance on several hosts takes
    every other rank of its instance with it. NCCL and torch.distributed take no new rank
    into a running group, so a rank started alone would wait for peers that never rejoin;
    the launch starts them all again stage by stage, in rank order, behind its gates. A
    single-host instance, the router and the other instances are left as they are."""
    grown = {host: set(names) for host, names in recreate.items()}
    outside: dict[str, tuple[str, ...]] = {}
    for name, ranks in _rank_groups(plan):
        if not any(container in grown.get(host, ()) for host, container in ranks):
            continue
        for host, container in ranks:
            grown.setdefault(host, set()).add(container)
        missed = tuple(dict.fromkeys(host for host, _ in ranks if host not in recreate))
        if missed:
            outside[name] = missed
    return InstanceRepairs(
        containers={host: tuple(sorted(names)) for host, names in grown.items()},
        outside=outside,
    )


def selected(tag: str, run_tags: Sequence[str], skip_tags: Sequence[str]) -> bool:
    """Whether ``--tags`` / ``--skip-tags`` let a play tagged `tag` run (any special tag
    other than ``all`` counts as selecting it, so nothing is left out by mistake)."""
    chosen = not run_tags or any(t in {tag, "all", "tagged", "untagged"} for t in run_tags)
    return chosen and tag not in skip_tags


def smoke_host(endpoint_host: str, play_hosts: Sequence[str]) -> str:
    """The one host whose verify play runs the smoke test: the endpoint's host, or the play's
    first host when --limit leaves the endpoint's host out (the test still asks the endpoint)."""
    return endpoint_host if endpoint_host in play_hosts or not play_hosts else play_hosts[0]


def everywhere(
    own: Sequence[str], every_host: Sequence[Sequence[str]], serving: bool = False
) -> list[str]:
    """The phases a host skips once every host's look is in: its own per-host skips, and the
    cluster phases and checks only where every host (`every_host`: each one's own skips)
    skips them, but the GPU checks wherever the host is `serving`."""
    shared = (*CLUSTER_PHASES, *CHECK_PHASES)
    return [
        phase
        for phase in own
        if phase not in shared
        or all(phase in skips for skips in every_host)
        or (phase in GPU_CHECK_PHASES and serving)
    ]


def skipped_phases(
    found: Mapping[str, list[str]],
    *,
    run_tags: Sequence[str],
    skip_tags: Sequence[str],
    endpoint: bool,
    serving: bool = False,
) -> list[str]:
    """The phases whose play leaves this host out: those the tags leave out, the looked-at
    ones `found` converged here, the checks when no looked-at phase runs here (unless the tags
    name them), the smoke
    test (verify) unless this host runs it (`endpoint`: it is the :func:`smoke_host`), and
    the checks that take the GPUs (:data:`GPU_CHECK_PHASES`) on a host `serving` (its planned
    containers run: :func:`serving`), whatever the tags say. The cluster phases and checks
    are then skipped only where every host skips them (:func:`everywhere`), those GPU checks
    on a serving host always."""
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
            or (phase in GPU_CHECK_PHASES and serving)
        ):
            skipped.append(phase)
    return skipped
