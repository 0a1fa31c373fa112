"""Converge by difference: a host that holds what the plan places there differs in nothing; each
kind of drift (a file's content or mode, a missing, stopped or re-specced container, a dead
exec'd process, a failing health gate, a broken checkpoint, docker gone, a package removed, a
kernel module unloaded, a phase's inputs changed, a mesh key or configuration changed, a weight
shard missing) is named, on its host only; the cluster phases and checks run everywhere or
nowhere."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    whole_instance_containers,
    whole_instance_repairs,
    with_instance_repairs,
)
from k2provision.core.records import Plan
from k2provision.plan.assemble import build_plan
from k2provision.plan.converge import (
    CLUSTER_PHASES,
    LOOKED_PHASES,
    MESH_MODES,
    PHASE_ROLES,
    PHASE_TAGS,
    Difference,
    Drift,
    HostExpectation,
    InstanceRepairs,
    difference_lines,
    differences,
    everywhere,
    expected_state,
    file_mode,
    inputs_digest,
    instance_repairs,
    look_questions,
    look_request,
    repairs,
    selected,
    skipped_phases,
    smoke_host,
    stamped_plan,
)
from k2provision.plan.host_questions import hq
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]
MESH_KEY = "ssh-ed25519 AAAAmeshkey k2provision-mesh-prod"
HOST_KEY = "ssh-ed25519 AAAAhostkey root@h k2provision mesh"
WEIGHTS = {"k2_weights_source": "synthetic"}
NO_PHASE = {phase: [] for phase in LOOKED_PHASES}


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))


def lines(expected: HostExpectation, seen: dict[str, Any]) -> dict[str, list[str]]:
    """The differences in words, per phase."""
    return difference_lines(differences(expected, seen))


def running(spec: str) -> dict[str, Any]:
    state = hq.ContainerState(True, True, "running", 0, "2026-01-01T00:00:00Z", 0, spec)
    return dict(hq.record_json(state))


def converged(expected: HostExpectation) -> dict[str, Any]:
    """What host_look answers on a host that holds exactly its part of the plan."""
    answers: dict[str, Any] = {}
    for key, question in look_questions(expected).items():
        if isinstance(question, hq.FileQuestion):
            name = question.path.rsplit("/", 1)[1]
            if key.startswith("file "):
                digest, mode = expected.files[question.path]
            elif name in MESH_MODES:
                digest, mode = "x", MESH_MODES[name]
            else:
                digest, mode = expected.mesh_configs[question.path], "0644"
            answers[key] = hq.record_json(hq.FileDigest(digest, mode))
        elif isinstance(question, hq.ContainerQuestion):
            answers[key] = running(expected.containers[question.container])
        elif isinstance(question, hq.ExecQuestion):
            answers[key] = hq.record_json(hq.ExecState("running", 1769860740))
        elif isinstance(question, hq.HttpQuestion):
            answers[key] = hq.record_json(hq.GateAnswer(200))
        else:
            answers[key] = hq.record_json(hq.GateAnswer(0))
    return {
        "answers": answers,
        "docker": True,
        "checkpoint": [],
        "stamps": {
            "prepare": {
                "digest": expected.stamps["prepare"],
                "packages": ["rdma-core"],
                "modules": ["ib_umad"],
                "images": {"k2/standin:1": "sha256:aa"},
            },
            "ssh_mesh": {"digest": expected.stamps["ssh_mesh"]},
            "weights": {"digest": expected.stamps["weights"], "manifest": "/m/manifest.json"},
        },
        "packages": {"rdma-core": {"status": "ii", "version": "44.0-2"}},
        "modules": {"ib_umad": True},
        "images": {"k2/standin:1": "sha256:aa"},
        "weights": {"missing": [], "wrong": [], "unverified": []},
        "mesh": {
            "private_public": MESH_KEY.rsplit(" ", 1)[0],
            "controller_public": MESH_KEY + "\n",
            "public": MESH_KEY + "\n",
            "authorized_keys": f"# managed\nrestrict {MESH_KEY}\n",
            "host_public": HOST_KEY,
            "known_hosts": "# managed\n"
            + "".join(
                f"[10.0.0.{i}]:2233 {HOST_KEY if i == 0 else f'ssh-ed25519 AAAAother{i}'}\n"
                for i in range(expected.mesh_hosts)
            ),
        },
    }


def test_a_converged_host_differs_in_nothing_on_every_host(plan: Plan) -> None:
    for host in plan.hosts:
        expected = expected_state(plan, host.name, WEIGHTS)
        assert expected.files, host.name
        assert expected.containers, host.name
        assert expected.weights == (host.pool != "router"), host.name
        assert lines(expected, converged(expected)) == NO_PHASE
    assert LOOKED_PHASES == ("prepare", "ssh_mesh", "weights", "launch")


@pytest.mark.parametrize(
    ("phase", "kind", "line"),
    [
        ("prepare", "package", "package rdma-core: not installed"),
        ("prepare", "module", "kernel module ib_umad: not loaded"),
        ("prepare", "image gone", "image k2/standin:1: missing"),
        ("prepare", "image moved", "image k2/standin:1: ID sha256:bb, held sha256:aa"),
        ("prepare", "stamp", "stamp /var/lib/k2provision/converged/prepare.json: missing"),
        ("ssh_mesh", "authorized key", "authorized_keys: does not hold the mesh key only"),
        ("ssh_mesh", "private key", "id_ed25519: its public half is not id_ed25519.pub"),
        ("ssh_mesh", "host key", "known_hosts: pins 15 host keys, planned 16 with this host's own"),
        ("ssh_mesh", "key mode", "authorized_keys: mode 0644, planned 0600"),
        ("ssh_mesh", "sshd config", "sshd_config: content differs from the plan"),
        ("ssh_mesh", "controller key", "id_ed25519.pub: not the cluster's key on the controller"),
        ("weights", "shard", "model-00001-of-00004.safetensors: missing"),
        ("weights", "manifest", "weights: no manifest of an earlier distribution"),
        ("weights", "inputs", "weights.json: the plan or the phase's variables changed since"),
    ],
)
def test_each_kind_of_state_drifted_names_its_phase_on_its_host_only(
    plan: Plan, phase: str, kind: str, line: str
) -> None:
    drifted, other = plan.hosts[0].name, plan.hosts[1].name
    expected = expected_state(plan, drifted, WEIGHTS)
    seen = converged(expected)
    mesh = seen["mesh"]
    if kind == "package":
        seen["packages"] = {"rdma-core": {"status": "rc", "version": "44.0-2"}}
    elif kind == "module":
        seen["modules"] = {}
    elif kind == "image gone":
        seen["images"] = {}
    elif kind == "image moved":
        seen["images"] = {"k2/standin:1": "sha256:bb"}
    elif kind == "stamp":
        seen["stamps"]["prepare"] = None
    elif kind == "authorized key":
        mesh["authorized_keys"] = "restrict ssh-ed25519 AAAAintruder someone\n"
    elif kind == "private key":
        mesh["private_public"] = "ssh-ed25519 AAAAanother"
    elif kind == "host key":
        mesh["known_hosts"] = "\n".join(mesh["known_hosts"].splitlines()[:-1])
    elif kind == "key mode":
        seen["answers"]["mesh authorized_keys"]["mode"] = "0644"
    elif kind == "controller key":
        mesh["controller_public"] = "ssh-ed25519 AAAAnewkey k2provision-mesh-prod\n"
    elif kind == "sshd config":
        seen["answers"]["mesh sshd_config"]["sha256"] = "0" * 64
    elif kind == "shard":
        seen["weights"]["missing"] = ["model-00001-of-00004.safetensors"]
    elif kind == "manifest":
        seen["weights"] = None
    elif kind == "inputs":
        changed = expected_state(plan, drifted, {**WEIGHTS, "k2_weights_revision": "abc"})
        seen["stamps"]["weights"]["digest"] = changed.stamps["weights"]
    found = lines(expected, seen)
    assert [line in text for text in found[phase]] == [True], found
    assert {p: v for p, v in found.items() if p != phase} == {p: [] for p in NO_PHASE if p != phase}
    untouched = expected_state(plan, other, WEIGHTS)
    assert lines(untouched, converged(untouched)) == NO_PHASE


def test_a_phase_s_inputs_are_the_plan_and_its_roles_variables_only(plan: Plan) -> None:
    digest = inputs_digest(plan, "prepare", {})
    assert inputs_digest(plan, "prepare", {"k2_rdma_packages": ["rdma-core"]}) != digest
    assert inputs_digest(plan, "prepare", {"k2_weights_revision": "abc"}) == digest
    assert inputs_digest(plan, "weights", {"k2_weights_record_dir": "/runs/1"}) == (
        inputs_digest(plan, "weights", {})
    )
    mesh = inputs_digest(plan, "ssh_mesh", {"ansible_inventory_sources": ["/inv/prod.ini"]})
    assert inputs_digest(plan, "ssh_mesh", {"ansible_inventory_sources": ["/x/prod.yml"]}) == mesh
    assert inputs_digest(plan, "ssh_mesh", {"ansible_inventory_sources": ["/inv/lab.ini"]}) != mesh
    other = build_plan(load_cluster(ROOT / "inventory" / "examples" / "vllm-tp-pp.ini"))
    assert inputs_digest(other, "prepare", {}) != digest
    assert set(PHASE_ROLES) == set(CLUSTER_PHASES)


def _plan_with(tmp_path: Path, old: str, new: str) -> Plan:
    text = (ROOT / "inventory" / "prod.ini").read_text()
    assert old in text
    changed = tmp_path / "prod.ini"
    changed.write_text(text.replace(old, new))
    return build_plan(load_cluster(changed))


@pytest.mark.parametrize(
    ("old", "new", "moved"),
    [
        # A spec change (the engine's flags, the fit) is the launch's alone.
        ("k2_context_length=131072", "k2_context_length=65536", set()),
        ("k2_context_length=131072", "k2_context_length=131072\nk2_drain_timeout=60", set()),
        # What the stamped phases read: the image prepare pulls, the mesh's port, the weights.
        ("k2_gpu=h200", "k2_gpu=h200\nk2_image=reg/sglang:other", {"prepare"}),
        ("k2_context_length=131072", "k2_context_length=131072\nk2_ssh_port=2244", {"ssh_mesh"}),
        ("k2_model_dir=/models/Kimi-K2-Instruct", "k2_model_dir=/data/k2", {"prepare", "weights"}),
    ],
)
def test_a_spec_change_leaves_the_stamped_phases_alone_and_their_inputs_move_them(
    plan: Plan, tmp_path: Path, old: str, new: str, moved: set[str]
) -> None:
    changed = _plan_with(tmp_path, old, new)
    assert changed != plan
    differ = {
        phase
        for phase in PHASE_ROLES
        if inputs_digest(changed, phase, {}) != inputs_digest(plan, phase, {})
    }
    assert moved <= differ, differ
    if not moved:
        assert differ == set()
    assert "pools" not in stamped_plan(plan)


def test_no_weights_are_looked_at_where_the_phase_places_none(plan: Plan) -> None:
    first, *rest = plan.hosts
    routed = plan.model_copy(update={"hosts": (first.model_copy(update={"pool": "router"}), *rest)})
    for host, variables in ((first.name, WEIGHTS), (plan.hosts[1].name, {})):
        expected = expected_state(routed, host, variables)
        assert not expected.weights, host
        seen = {**converged(expected), "weights": None}
        seen["stamps"].pop("weights")
        assert differences(expected, seen)["weights"] == [], host


def test_the_request_asks_for_every_file_container_and_process_of_the_host(plan: Plan) -> None:
    host = plan.hosts[0]
    request = look_request(expected_state(plan, host.name))
    asked = {key: hq.question_from_json(q) for key, q in request["questions"].items()}
    files = [q.path for k, q in asked.items() if k.startswith("file ")]  # type: ignore[attr-defined]
    assert files == sorted(host.files)
    containers = {q.container for q in asked.values() if isinstance(q, hq.ContainerQuestion)}
    assert containers == {p.container for p in host.processes if not p.exec_in}
    execs = {q.pid_file for q in asked.values() if isinstance(q, hq.ExecQuestion)}
    assert execs == {f"/run/k2-{p.name}.pid" for p in host.processes if p.exec_in}
    gates = {k.removeprefix("gate ") for k in asked if k.startswith("gate ")}
    assert gates == {p.name for p in host.processes if p.health}
    assert request["model_dir"] == plan.model_dir
    assert request["need"] == "checkpoint"
    assert request["stamps"] == sorted(CLUSTER_PHASES)
    assert request["mesh_dir"] == f"{plan.config_dir}/ssh"
    mesh = {k.removeprefix("mesh ") for k in asked if k.startswith("mesh ")}
    assert mesh == {*MESH_MODES, "sshd_config", "ssh_config"}


def state_key(expected: HostExpectation, container: str) -> str:
    """The look's key of the question about `container`'s state."""
    return next(
        k
        for k, q in look_questions(expected).items()
        if isinstance(q, hq.ContainerQuestion) and q.container == container
    )


def _drift(expected: HostExpectation, kind: str) -> tuple[dict[str, Any], str]:
    seen = converged(expected)
    answers = seen["answers"]
    path = sorted(expected.files)[0]
    name = sorted(expected.containers)[0]
    state = state_key(expected, name)
    if kind == "file content":
        answers[f"file {path}"] = {"sha256": "0" * 64, "mode": file_mode(path)}
        return seen, f"file {path}: content differs from the plan"
    if kind == "file mode":
        answers[f"file {path}"] = {"sha256": expected.files[path][0], "mode": "0600"}
        return seen, f"file {path}: mode 0600, planned {file_mode(path)}"
    if kind == "file missing":
        answers[f"file {path}"] = None
        return seen, f"file {path}: missing"
    if kind == "container missing":
        answers[state] = hq.record_json(hq.ContainerState(False))
        return seen, f"container {name}: missing"
    if kind == "container stopped":
        answers[state]["running"] = False
        return seen, f"container {name}: not running"
    if kind == "container spec":
        answers[state]["spec_hash"] = "old"
        return seen, f"container {name}: made from another spec (old)"
    if kind == "health gate":
        name = sorted(expected.gates)[0]
        gate = expected.gates[name]
        answers[f"gate {name}"] = hq.record_json(hq.GateAnswer(None, "refused"))
        return seen, f"process {name}: health gate GET {gate.url} answered no answer (refused)"
    if kind == "checkpoint":
        seen["checkpoint"] = ["model-00001.safetensors: missing"]
        return seen, f"model dir {expected.model_dir}: model-00001.safetensors: missing"
    seen["docker"] = False
    answers[state] = hq.record_json(hq.ContainerState(False))
    return seen, "docker: not answering"


@pytest.mark.parametrize(
    "kind",
    [
        "file content",
        "file mode",
        "file missing",
        "container missing",
        "container stopped",
        "container spec",
        "health gate",
        "checkpoint",
        "docker",
    ],
)
def test_each_kind_of_drift_is_named_on_its_host_only(plan: Plan, kind: str) -> None:
    drifted, other = plan.hosts[0].name, plan.hosts[1].name
    seen, line = _drift(expected_state(plan, drifted), kind)
    found = lines(expected_state(plan, drifted), seen)["launch"]
    assert line in found
    if kind != "docker":
        assert found == [line]
    untouched = expected_state(plan, other)
    assert lines(untouched, converged(untouched))["launch"] == []


def test_a_dead_exec_process_is_named() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "vllm-tp-pp.ini"))
    host = next(h for h in plan.hosts if any(p.exec_in for p in h.processes))
    expected = expected_state(plan, host.name)
    seen = converged(expected)
    name = sorted(expected.execs)[0]
    seen["answers"][f"state {name}"] = hq.record_json(hq.ExecState("exited"))
    container = expected.execs[name][0]
    assert lines(expected, seen)["launch"] == [f"process {name}: not running in {container}"]


def test_a_host_outside_the_plan_is_refused(plan: Plan) -> None:
    with pytest.raises(ValueError, match="nohost is in no pool of the plan"):
        expected_state(plan, "nohost")


def test_repairs_are_the_drifted_files_and_containers_only(plan: Plan) -> None:
    expected = expected_state(plan, plan.hosts[0].name)
    assert repairs(differences(expected, converged(expected))["launch"]) == {
        "files": [],
        "containers": [],
    }
    seen, _ = _drift(expected, "file missing")
    path, name = sorted(expected.files)[0], sorted(expected.containers)[0]
    seen["answers"][state_key(expected, name)]["running"] = False
    assert repairs(differences(expected, seen)["launch"]) == {"files": [path], "containers": [name]}


def test_a_host_skips_the_phases_the_tags_leave_out_and_the_converged_ones() -> None:
    drifted = {**NO_PHASE, "launch": ["container k2-x: missing"]}
    every = skipped_phases(drifted, run_tags=["all"], skip_tags=[], endpoint=True)
    assert every == ["prepare", "ssh_mesh", "weights"]
    assert skipped_phases(drifted, run_tags=["all"], skip_tags=[], endpoint=False) == [
        "prepare", "ssh_mesh", "weights", "verify",
    ]  # fmt: skip
    # Nothing to change here: the checks that guard a change have nothing to guard.
    assert skipped_phases(NO_PHASE, run_tags=["all"], skip_tags=[], endpoint=True) == [
        "preflight", "prepare", "ssh_mesh", "weights", "validate", "launch",
    ]  # fmt: skip
    tagged = skipped_phases(drifted, run_tags=["launch", "verify"], skip_tags=[], endpoint=True)
    assert tagged == ["preflight", "prepare", "ssh_mesh", "weights", "validate", "front"]
    # The launch left out by the tags: a drifted launch is no change to guard, but a check the
    # tags name runs.
    mesh_only = skipped_phases(drifted, run_tags=["ssh_mesh", "nccl"], skip_tags=[], endpoint=True)
    assert {"preflight", "launch"} <= set(mesh_only)
    assert "validate" not in mesh_only
    asked = skipped_phases(NO_PHASE, run_tags=["preflight"], skip_tags=[], endpoint=True)
    assert "preflight" not in asked
    assert "weights" in skipped_phases(drifted, run_tags=[], skip_tags=["weights"], endpoint=True)
    assert selected("nccl", ["nccl"], [])
    assert not selected(PHASE_TAGS["launch"], ["verify"], [])


def test_cluster_phases_and_checks_run_on_every_host_or_on_none() -> None:
    converged_here = ["preflight", "prepare", "ssh_mesh", "weights", "validate", "launch"]
    mesh_drifted = ["prepare", "weights", "verify"]
    assert everywhere(converged_here, [converged_here, mesh_drifted]) == [
        "prepare", "weights", "launch",
    ]  # fmt: skip
    assert everywhere(mesh_drifted, [converged_here, mesh_drifted]) == mesh_drifted
    assert everywhere(converged_here, [converged_here, converged_here]) == converged_here
    # A host the look could not judge (full): nothing shared is skipped.
    assert everywhere(converged_here, [converged_here, []]) == ["launch"]


def test_each_phase_play_ends_the_hosts_the_look_names_and_carries_its_tag() -> None:
    import yaml

    site = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    imported = [step["ansible.builtin.import_playbook"] for step in site]
    assert imported[:2] == ["plan.yml", "look.yml"]
    # Monitoring comes last and is not judged by the look: its role converges on its own. A
    # fleet's rollout comes just before the launch, and acts on the look's rollout order.
    phases = [f"{phase}.yml" for phase in PHASE_TAGS]
    phases.insert(phases.index("launch.yml"), "rollout.yml")
    assert imported[2:] == [*phases, "monitoring.yml"]
    for phase, tag in PHASE_TAGS.items():
        (play,) = yaml.safe_load((ROOT / "playbooks" / f"{phase}.yml").read_text())
        assert play["tags"] == [tag], phase
        (first,) = play["pre_tasks"]
        assert first["ansible.builtin.meta"] == "end_host", phase
        assert first["tags"] == ["always"], phase
        assert f"'{phase}' in k2_converge.skipped_phases" in first["when"], phase
        stamps = [t for t in play.get("post_tasks", ()) if "k2.cluster.write_files" in t]
        assert len(stamps) == (phase in CLUSTER_PHASES), phase
        if stamps:
            (stamp,) = stamps[0]["k2.cluster.write_files"]["files"]
            assert stamp["path"] == f"{{{{ k2_converge.stamp_dir }}}}/{phase}.json"
            assert f"k2_converge.stamps.{phase}" in json.dumps(stamps[0]), phase


def test_the_smoke_test_runs_from_the_endpoint_host_or_the_first_host_of_a_limited_play() -> None:
    assert smoke_host("h1", ["h3", "h1"]) == "h1"
    assert smoke_host("h1", ["h3", "h4"]) == "h3"


def test_the_cli_shows_each_difference_the_look_found_with_its_host() -> None:
    from k2provision.run import display
    from k2provision.run.events import HostResult, parse_event

    line = "launch: file /etc/k2provision/launch/[x].sh: content differs from the plan"
    raw = {
        "event": "runner_on_ok",
        "event_data": {"host": "h2", "task": "What differs from the plan",
                       "res": {"changed": True, "differences": [line]}},
    }  # fmt: skip
    event = parse_event(raw)
    assert isinstance(event, HostResult)
    assert event.differences == (line,)
    view = display.RunView(["h2"])
    with display.console.capture() as capture:
        view.on_event(event)
    assert f"h2: {line}" in capture.get()
    quiet = parse_event({**raw, "event_data": {**raw["event_data"], "res": {"changed": False}}})
    assert isinstance(quiet, HostResult)
    assert quiet.differences == ()


def test_a_change_to_one_rank_replaces_every_rank_of_its_instance(
    plan: Plan, tmp_path: Path
) -> None:
    """gpu-d02's RDMA devices change: only its own command line differs, but every decode rank
    runs another spec (a lone new rank would wait for a group the others left), and the
    prefill instance, untouched, keeps its containers."""
    text = (ROOT / "inventory" / "prod.ini").read_text()
    line = "gpu-d02 ansible_host=10.10.0.22 k2_ib_devices=mlx5_0,mlx5_1,mlx5_2,mlx5_3,"
    assert line in text
    changed = tmp_path / "prod.ini"
    changed.write_text(text.replace(line, "gpu-d02 ansible_host=10.10.0.22 k2_ib_devices="))
    new = build_plan(load_cluster(changed))
    argv_changed = [
        h.name
        for h in new.hosts
        if [p.argv for p in h.processes] != [p.argv for p in plan.host(h.name).processes]
    ]
    assert argv_changed == ["gpu-d02"]
    respecced = {}
    for host in new.hosts:
        seen = converged(expected_state(plan, host.name))
        found = differences(expected_state(new, host.name), seen)["launch"]
        respecced[host.name] = [
            d.name for d in found if d.subject == "container" and d.drift is Drift.OTHER_SPEC
        ]
    decode = next(p for p in new.pools if p.name == "decode").hosts
    assert {h: c for h, c in respecced.items() if c} == {host: ["k2-sglang"] for host in decode}


def _looked(
    plan: Plan, spoil: dict[str, tuple[str, str]], hosts: Sequence[str] | None = None
) -> dict[str, list[Difference]]:
    """Each host's launch differences (of `hosts`, else every host): converged, except the
    containers `spoil` names (host -> (container, "missing" | "stopped" | "exited"))."""
    found = {}
    for host in hosts or [h.name for h in plan.hosts]:
        expected = expected_state(plan, host)
        seen = converged(expected)
        if host in spoil:
            container, how = spoil[host]
            key = state_key(expected, container)
            if how == "missing":
                seen["answers"][key] = None
            else:
                seen["answers"][key].update(running=False, status=how)
        found[host] = differences(expected, seen)["launch"]
    return found


def _recreated(decided: InstanceRepairs) -> dict[str, tuple[str, ...]]:
    return {host: names for host, names in decided.containers.items() if names}


@pytest.mark.parametrize("how", ["missing", "stopped", "exited"])
def test_one_rank_needing_its_container_recreates_its_whole_instance(plan: Plan, how: str) -> None:
    """One decode rank missing, stopped or exited: every decode rank is recreated (a rank
    started alone would wait for a group the others left); the prefill instance and the
    router on its first host are left as they are."""
    looked = _looked(plan, {"gpu-d05": ("k2-sglang", how)})
    decided = instance_repairs(plan, looked)
    decode = next(p for p in plan.pools if p.name == "decode").hosts
    assert _recreated(decided) == dict.fromkeys(decode, ("k2-sglang",))
    # Decided on the typed drifts: other words decide the same.
    reworded = {
        host: [Difference(d.subject, d.name, d.drift, "reworded") for d in found]
        for host, found in looked.items()
    }
    assert instance_repairs(plan, reworded) == decided
    assert decided.outside == {}
    assert decided.refusal() == ""


def test_only_the_fleet_instance_of_the_missing_rank_is_recreated() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "sglang-pd-fleet-32.ini"))
    decided = instance_repairs(plan, _looked(plan, {"gpu-d07": ("k2-sglang", "missing")}))
    decode_1 = next(i for p in plan.pools for i in p.members() if i.instance == "decode-1")
    assert _recreated(decided) == dict.fromkeys(decode_1.hosts, ("k2-sglang",))


def test_a_lone_router_or_single_host_instance_is_repaired_alone(
    plan: Plan, tmp_path: Path
) -> None:
    decided = instance_repairs(plan, _looked(plan, {"gpu-p01": ("k2-router", "missing")}))
    assert _recreated(decided) == {"gpu-p01": ("k2-router",)}
    fleet = tmp_path / "fleet.ini"
    source = (ROOT / "inventory" / "examples" / "sglang-tp-fleet.ini").read_text()
    assert "k2_instances=4" in source
    fleet.write_text(source.replace("k2_instances=4", "k2_instances=8\nk2_context_length=32768"))
    single = build_plan(load_cluster(fleet))
    assert all(len(i.hosts) == 1 for p in single.pools if p.name == "nodes" for i in p.members())
    decided = instance_repairs(single, _looked(single, {"node-03": ("k2-sglang", "missing")}))
    assert _recreated(decided) == {"node-03": ("k2-sglang",)}


def test_a_converged_cluster_recreates_nothing(plan: Plan) -> None:
    assert _recreated(instance_repairs(plan, _looked(plan, {}))) == {}


def test_mpirun_and_ray_worlds_recreate_every_container_rank_not_the_execd_process() -> None:
    for example, host in (("trtllm-tp-ep.ini", "node-02"), ("vllm-tp-pp.ini", "node-01")):
        plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / example))
        container = sorted(expected_state(plan, host).containers)[0]
        decided = instance_repairs(plan, _looked(plan, {host: (container, "stopped")}))
        assert _recreated(decided) == {
            h.name: tuple(sorted({p.container for p in h.processes if not p.exec_in}))
            for h in plan.hosts
        }


def test_a_recreated_instance_with_ranks_outside_the_run_is_refused(plan: Plan) -> None:
    """Under --limit the look sees only some hosts: recreating the rank it sees alone would
    leave it waiting, so the run stops naming the instance, the hosts left out and the fix."""
    looked = _looked(plan, {"gpu-d02": ("k2-sglang", "missing")}, ["gpu-d02", "gpu-p01"])
    decided = instance_repairs(plan, looked)
    decode = next(p for p in plan.pools if p.name == "decode").hosts
    assert decided.outside == {"[decode]": tuple(h for h in decode if h != "gpu-d02")}
    refusal = decided.refusal()
    assert refusal.startswith("[decode]: a rank of this instance needs its container started")
    assert "gpu-d01, gpu-d03" in refusal
    assert "--limit" in refusal
    assert instance_repairs(plan, _looked(plan, {}, ["gpu-d02"])).refusal() == ""


def test_the_look_play_hands_each_host_its_share_of_the_instance(plan: Plan) -> None:
    """The filters look.yml applies: every play host's look in, the decode ranks whose own
    look found nothing run the launch (no longer skip it) and recreate their container."""
    looked = {
        host: {
            "full": False,
            "found": {"launch": [d.as_json() for d in found]},
            "containers": repairs(found)["containers"],
            "skipped_phases": ["prepare", "launch"] if not found else ["prepare"],
            "launch_selected": True,
        }
        for host, found in _looked(plan, {"gpu-d05": ("k2-sglang", "exited")}).items()
    }
    decided = whole_instance_repairs(plan.model_dump(mode="json"), looked)
    assert decided["refusal"] == ""
    peer = with_instance_repairs(looked["gpu-d01"], decided, "gpu-d01")
    assert peer["containers"] == ["k2-sglang"]
    assert peer["skipped_phases"] == ["prepare"]
    prefill = with_instance_repairs(looked["gpu-p02"], decided, "gpu-p02")
    assert prefill["containers"] == []
    assert prefill["skipped_phases"] == ["prepare", "launch"]
    untagged = with_instance_repairs(
        {**looked["gpu-d01"], "launch_selected": False}, decided, "gpu-d01"
    )
    assert "launch" in untagged["skipped_phases"]


def test_without_a_look_the_launch_grows_each_hosts_stale_containers_to_whole_instances(
    plan: Plan,
) -> None:
    """Under --full the launch asks each host itself (stale_containers) and then hands every
    host the ranks its instance's other hosts need: the same decision as after a look."""
    stale: dict[str, list[str]] = {h.name: [] for h in plan.hosts}
    stale["gpu-d09"] = ["k2-sglang"]
    decided = whole_instance_containers(plan.model_dump(mode="json"), stale)
    decode = next(p for p in plan.pools if p.name == "decode").hosts
    recreated = {h: tuple(c) for h, c in decided["containers"].items() if c}
    assert recreated == dict.fromkeys(decode, ("k2-sglang",))
    stale["gpu-p01"] = ["k2-router"]
    del stale["gpu-d03"]
    decided = whole_instance_containers(plan.model_dump(mode="json"), stale)
    assert decided["containers"]["gpu-p01"] == ["k2-router"]
    assert decided["containers"]["gpu-p02"] == []
    assert decided["refusal"].startswith("[decode]: ")
    assert "on gpu-d03 are outside this run" in decided["refusal"]
