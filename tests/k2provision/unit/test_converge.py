"""Converge by difference: a host that holds what the plan places there differs in nothing; each
kind of drift (a file's content or mode, a missing, stopped or re-specced container, a dead
exec'd process, a failing health gate, a broken checkpoint, docker gone) is named, on its host
only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.core.inventory import load_cluster
from k2provision.core.records import Plan
from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import LABEL_HASH
from k2provision.plan.converge import (
    LOOKED_PHASES,
    PHASE_TAGS,
    HostExpectation,
    differences,
    expected_state,
    file_mode,
    look_request,
    repairs,
    selected,
    skipped_phases,
    smoke_host,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))


def converged(expected: HostExpectation) -> dict[str, Any]:
    """What host_look answers on a host that holds exactly its part of the plan."""
    return {
        "files": {p: {"sha256": h, "mode": m} for p, (h, m) in expected.files.items()},
        "docker": True,
        "containers": {n: {"running": True, "hash": h} for n, h in expected.containers.items()},
        "execs": dict.fromkeys(expected.execs, True),
        "gates": {
            name: str(gate.expect_status) if gate.url else "0"
            for name, gate in expected.gates.items()
        },
        "checkpoint": [],
    }


def test_a_converged_host_differs_in_nothing_on_every_host(plan: Plan) -> None:
    for host in plan.hosts:
        expected = expected_state(plan, host.name)
        assert expected.files, host.name
        assert expected.containers, host.name
        assert differences(expected, converged(expected)) == {"launch": []}
    assert LOOKED_PHASES == ("launch",)


def test_the_request_asks_for_every_file_container_and_process_of_the_host(plan: Plan) -> None:
    host = plan.hosts[0]
    request = look_request(expected_state(plan, host.name))
    assert request["files"] == sorted(host.files)
    assert set(request["containers"]) == {p.container for p in host.processes if not p.exec_in}
    assert {e["name"] for e in request["execs"]} == {p.name for p in host.processes if p.exec_in}
    assert {g["name"] for g in request["gates"]} == {p.name for p in host.processes if p.health}
    assert request["label"] == LABEL_HASH
    assert request["model_dir"] == plan.model_dir
    assert request["need"] == "checkpoint"


def _drift(expected: HostExpectation, kind: str) -> tuple[dict[str, Any], str]:
    seen = converged(expected)
    path = sorted(expected.files)[0]
    name = sorted(expected.containers)[0]
    if kind == "file content":
        seen["files"][path] = {"sha256": "0" * 64, "mode": file_mode(path)}
        return seen, f"file {path}: content differs from the plan"
    if kind == "file mode":
        seen["files"][path] = {"sha256": expected.files[path][0], "mode": "0600"}
        return seen, f"file {path}: mode 0600, planned {file_mode(path)}"
    if kind == "file missing":
        seen["files"][path] = None
        return seen, f"file {path}: missing"
    if kind == "container missing":
        del seen["containers"][name]
        return seen, f"container {name}: missing"
    if kind == "container stopped":
        seen["containers"][name]["running"] = False
        return seen, f"container {name}: not running"
    if kind == "container spec":
        seen["containers"][name]["hash"] = "old"
        return seen, f"container {name}: made from another spec (old)"
    if kind == "health gate":
        name = sorted(expected.gates)[0]
        gate = expected.gates[name]
        seen["gates"][name] = "no answer (refused)"
        return seen, f"process {name}: health gate GET {gate.url} answered no answer (refused)"
    if kind == "checkpoint":
        seen["checkpoint"] = ["model-00001.safetensors: missing"]
        return seen, f"model dir {expected.model_dir}: model-00001.safetensors: missing"
    seen["docker"] = False
    seen["containers"] = {}
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
    found = differences(expected_state(plan, drifted), seen)["launch"]
    assert line in found
    if kind != "docker":
        assert found == [line]
    untouched = expected_state(plan, other)
    assert differences(untouched, converged(untouched)) == {"launch": []}


def test_a_dead_exec_process_is_named() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "vllm-tp-pp.ini"))
    host = next(h for h in plan.hosts if any(p.exec_in for p in h.processes))
    expected = expected_state(plan, host.name)
    seen = converged(expected)
    name = sorted(expected.execs)[0]
    seen["execs"][name] = False
    container = expected.execs[name][0]
    assert differences(expected, seen)["launch"] == [f"process {name}: not running in {container}"]


def test_a_host_outside_the_plan_is_refused(plan: Plan) -> None:
    with pytest.raises(ValueError, match="nohost is in no pool of the plan"):
        expected_state(plan, "nohost")


def test_repairs_are_the_drifted_files_and_containers_only(plan: Plan) -> None:
    expected = expected_state(plan, plan.hosts[0].name)
    assert repairs(expected, converged(expected)) == {"files": [], "containers": []}
    seen = converged(expected)
    path, name = sorted(expected.files)[0], sorted(expected.containers)[0]
    seen["files"][path] = None
    seen["containers"][name]["running"] = False
    assert repairs(expected, seen) == {"files": [path], "containers": [name]}


def test_a_host_skips_the_phases_the_tags_leave_out_and_a_converged_launch() -> None:
    converged_launch: dict[str, list[str]] = {"launch": []}
    drifted = {"launch": ["container k2-x: missing"]}
    every = skipped_phases(drifted, run_tags=["all"], skip_tags=[], endpoint=True)
    assert every == []
    assert skipped_phases(drifted, run_tags=["all"], skip_tags=[], endpoint=False) == ["verify"]
    assert skipped_phases(converged_launch, run_tags=["all"], skip_tags=[], endpoint=True) == [
        "launch"
    ]
    tagged = skipped_phases(drifted, run_tags=["launch", "verify"], skip_tags=[], endpoint=True)
    assert tagged == ["preflight", "prepare", "ssh_mesh", "weights", "validate"]
    assert "weights" in skipped_phases(drifted, run_tags=[], skip_tags=["weights"], endpoint=True)
    assert selected("nccl", ["nccl"], [])
    assert not selected(PHASE_TAGS["launch"], ["verify"], [])


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
