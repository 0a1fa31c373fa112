"""One inventory line that switches something off, or sets what nothing reads, is never silent:
safety gates switched off outside the lab (refused, or a warning in the plan and in every run
record), integers in spellings that readers disagree on, role variables that bypass the
checked cluster variables, a router on an instance's host, settings with nothing to act on."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2provision.core import role_specs, safety_gates
from k2provision.core.inventory import read_inventory
from k2provision.core.records import Cluster, Tunables
from k2provision.core.variables import CLUSTER_VARS, TUNABLE_VARS
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import cluster_from_groups
from k2provision.run import runner
from tests.golden_cases import GOLDEN

Groups = dict[str, list[str]]
HostVars = dict[str, dict[str, Any]]


@cache
def golden(case: str) -> tuple[Groups, HostVars]:
    return read_inventory(GOLDEN / case / "inventory.ini")


def with_vars(
    case: str, changes: dict[str, Any], groups: Groups | None = None
) -> tuple[Groups, HostVars]:
    """The golden case's inventory with `changes` set on every host (None removes one)."""
    base_groups, host_vars = golden(case)
    changed = {
        host: {k: v for k, v in {**variables, **changes}.items() if v is not None}
        for host, variables in host_vars.items()
    }
    return (groups if groups is not None else base_groups), changed


def outcome(case: str, changes: dict[str, Any], groups: Groups | None = None) -> Any:
    """The plan, or the refusal's problem lines."""
    found_groups, host_vars = with_vars(case, changes, groups)
    try:
        return build_plan(cluster_from_groups(case, found_groups, host_vars))
    except K2Error as refused:
        return list(refused.problems)


def refused(case: str, changes: dict[str, Any], groups: Groups | None = None) -> list[str]:
    result = outcome(case, changes, groups)
    assert isinstance(result, list), f"{changes} planned"
    return result


def warnings(case: str, changes: dict[str, Any], groups: Groups | None = None) -> list[str]:
    result = outcome(case, changes, groups)
    assert not isinstance(result, list), result
    return list(result.warnings)


# ---------------------------------------------------------------- safety gates

# Per gate: a value that switches it off and one that keeps it.
GATE_VALUES: dict[str, tuple[Any, Any]] = {
    "k2_preflight_require_dcgm": (False, True),
    "k2_preflight_hardware": ("no", "yes"),
    "k2_preflight_require_clock_sync": ("false", True),
    "k2_preflight_require_persistence_mode": (0, 1),
    "k2_preflight_disk_gib": (0, 800),
    "k2_preflight_min_active_ib_ports": (0, 2),
    "k2_preflight_ib_rate_gbps": (0.0, 400),
    "k2_ssh_mesh_verify": ("off", "on"),
    "k2_nvidia_driver_hardware": (False, True),
    "k2_rdma_hardware": (False, True),
    "k2_container_runtime_hardware": (False, True),
    "k2_nccl_check_hardware": (False, True),
}


def test_every_gate_is_a_role_variable_and_is_drawn() -> None:
    for name in safety_gates.GATES:
        assert role_specs.option(name) is not None, name
    assert set(GATE_VALUES) | set(safety_gates.REFUSED_OFF_LAB) == set(safety_gates.GATES)


@pytest.mark.parametrize("name", sorted(GATE_VALUES))
def test_a_gate_switched_off_outside_the_lab_is_a_loud_warning_first(name: str) -> None:
    off, on = GATE_VALUES[name]
    found = warnings("sglang-tp", {name: off})
    line = found[0]
    assert line.startswith(f"SAFETY GATE OFF: node-01, node-02: {name}=")
    assert "(k2_lab is false)" in line
    assert f"remove {name} to keep the gate" in line
    assert not [w for w in warnings("sglang-tp", {name: on}) if name in w]


@pytest.mark.parametrize("name", sorted(GATE_VALUES))
def test_a_gate_switched_off_in_the_lab_is_the_labs_business(name: str) -> None:
    cluster = cluster_from_groups(
        "lab", *with_vars("sglang-tp", {name: GATE_VALUES[name][0], "k2_lab": True})
    )
    assert cluster.switched_off == ()


def test_a_templated_gate_is_warned_as_possibly_off() -> None:
    (line,) = warnings("sglang-tp", {"k2_preflight_require_dcgm": "{{ x }}"})
    assert "(a template: it may turn the gate off at run time)" in line


def test_facts_that_replace_the_hosts_are_refused_outside_the_lab() -> None:
    facts = {"nvidia_smi_xml": "<nvidia_smi_log>" + "x" * 500, "ibstat": ""}
    (line,) = refused("sglang-tp", {"k2_preflight_facts_override": facts})
    assert line.startswith("node-01, node-02: k2_preflight_facts_override=")
    assert "outside the lab (k2_lab is false)" in line
    assert "fix: remove it from the inventory" in line
    assert len(line) < 500  # the value is cut short, not pages of command output
    lab = cluster_from_groups(
        "lab", *with_vars("sglang-tp", {"k2_preflight_facts_override": facts, "k2_lab": True})
    )
    assert lab.switched_off == ()
    assert not refused_or_none("sglang-tp", {"k2_preflight_facts_override": {}})


def refused_or_none(case: str, changes: dict[str, Any]) -> list[str]:
    result = outcome(case, changes)
    return result if isinstance(result, list) else []


def test_every_run_record_of_such_a_plan_says_so_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K2_RUNS_DIR", str(tmp_path))
    plan = outcome("sglang-tp", {"k2_preflight_require_dcgm": False, "k2_ssh_mesh_verify": 0})
    record = runner.new_record_dir("apply", plan)
    lines = (record / runner.SWITCHED_OFF_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("SAFETY GATE OFF") for line in lines)
    plain = runner.new_record_dir("apply", outcome("sglang-tp", {}))
    assert not (plain / runner.SWITCHED_OFF_FILE).exists()


# ---------------------------------------------------------------- integers, one spelling


def _integer_vars() -> list[str]:
    fields = {**Cluster.model_fields, **Tunables.model_fields}
    names = [*CLUSTER_VARS, *TUNABLE_VARS]
    return [n for n in names if fields[n.removeprefix("k2_")].annotation in (int, int | None)]


INTEGER_VARS = _integer_vars()
# Spellings one reader takes as 1 and another as text, each with the reason given.
SPELLINGS = {
    "01": "leading zero",
    "1.0": "fraction part",
    1.0: "fraction part",
    "+1": "leading zero, a sign",
    " 1": "a space",
    "0x1": None,
}


def test_the_integer_variables_are_drawn() -> None:
    assert {"k2_instances", "k2_drain_timeout", "k2_api_port", "k2_gpus_per_node"} <= set(
        INTEGER_VARS
    )


@settings(max_examples=80, deadline=None)
@given(variable=st.sampled_from(INTEGER_VARS), spelling=st.sampled_from(list(SPELLINGS)))
def test_an_integer_in_another_spelling_is_refused_naming_it(variable: str, spelling: Any) -> None:
    problems = refused("sglang-tp-fleet", {variable: spelling})
    (line,) = [p for p in problems if f"{variable}=" in p]
    assert "is refused" in line
    assert f"fix: correct {variable}" in line
    if (why := SPELLINGS[spelling]) is not None:
        assert why in line


def test_instances_01_keeps_no_router_host_without_a_router() -> None:
    for spelling in ("01", "1.0", 1.0):
        problems = refused("sglang-tp-fleet", {"k2_instances": spelling})
        assert any(p.startswith(f"sglang-tp-fleet: k2_instances={spelling}") for p in problems)


@pytest.mark.parametrize("value", ["022", 22.0, "+22"])
def test_the_ssh_port_follows_the_same_rule(value: Any) -> None:
    (line,) = refused("sglang-tp", {"ansible_port": value})
    assert line.startswith(f"node-01, node-02: ansible_port={value}")
    assert "expected an integer from 1 to 65535" in line


# ---------------------------------------------------------------- role variables the plan sets


def internal_variables() -> list[str]:
    return sorted({*role_specs.MIRRORED, *role_specs.playbook_set()})


def test_the_role_internal_variables_include_every_plan_and_the_drain_timeout() -> None:
    names = internal_variables()
    assert "k2_rollout_drain_timeout" in names
    assert "k2_rollout_waves" in names
    for role in role_specs.specs():
        if f"{role}_plan" in role_specs.options(role):
            assert f"{role}_plan" in names


@pytest.mark.parametrize("name", internal_variables())
def test_a_role_internal_variable_in_the_inventory_is_refused_naming_what_to_set(
    name: str,
) -> None:
    (line,) = refused("sglang-tp", {name: 5})
    assert line.startswith(f"node-01, node-02: {name}=5 ")
    assert "expected it unset in the inventory" in line
    assert "fix: remove it" in line
    if name in role_specs.MIRRORED:
        assert f"set {role_specs.MIRRORED[name]}" in line


def test_an_unchecked_drain_timeout_never_reaches_docker_stop() -> None:
    (line,) = refused("sglang-tp-fleet", {"k2_rollout_drain_timeout": -1})
    assert "k2_rollout_drain_timeout=-1" in line
    assert "set k2_drain_timeout" in line


# ---------------------------------------------------------------- the router's host


def test_the_default_router_placement_is_warned_about() -> None:
    (line,) = [w for w in warnings("sglang-pd-4p12d", {}) if "router runs on" in w]
    assert line.startswith("gpu-p01: the router runs on an instance's host (the first host of ")
    assert "[prefill], the default without a [router] group" in line
    assert "fix: add a [router] group with one host of its own" in line


def test_a_router_group_naming_a_pool_host_is_warned_about() -> None:
    groups, _ = golden("sglang-tp-fleet")
    moved = {**groups, "router": ["node-01"]}
    moved["all"] = [h for h in moved["all"] if h != "router-01"]
    found_groups, host_vars = with_vars("sglang-tp-fleet", {}, moved)
    del host_vars["router-01"]
    plan = build_plan(cluster_from_groups("fleet", found_groups, host_vars))
    (line,) = [w for w in plan.warnings if "router runs on" in w]
    assert line.startswith("node-01: the router runs on an instance's host ([router] names")


def test_a_fleet_without_a_router_group_is_warned_about() -> None:
    groups, _ = golden("sglang-tp-fleet")
    without = {g: [h for h in hosts if h != "router-01"] for g, hosts in groups.items()}
    del without["router"]
    found_groups, host_vars = with_vars("sglang-tp-fleet", {}, without)
    del host_vars["router-01"]
    plan = build_plan(cluster_from_groups("fleet", found_groups, host_vars))
    (line,) = [w for w in plan.warnings if "router runs on" in w]
    assert line.startswith("node-01: the router runs on an instance's host (the first host of ")
    assert "[nodes], the default without a [router] group" in line


def test_a_router_of_its_own_is_not_warned_about() -> None:
    for case in ("sglang-tp-fleet", "sglang-pd-1p1d"):
        assert not [w for w in warnings(case, {}) if "router runs on" in w]


# ---------------------------------------------------------------- settings that act on nothing

IDLE = [
    ("sglang-tp", "k2_max_unavailable", 2, "only a fleet"),
    ("sglang-tp", "k2_drain_timeout", 30, "only a fleet"),
    ("sglang-pd-1p1d", "k2_drain_timeout", 30, "only a fleet"),
    ("sglang-tp", "k2_router_image", "lmsysorg/sglang-router:v1", "only a router"),
    ("sglang-tp", "k2_router_queue_size", 5, "only a router"),
    ("sglang-tp", "k2_router_max_concurrent_requests", 5, "only a router"),
    ("sglang-tp", "k2_router_queue_timeout_s", 5, "only a router"),
    ("vllm-tp16", "k2_router_metrics_port", 29100, "only a router"),
]


@pytest.mark.parametrize(("case", "name", "value", "reader"), IDLE)
def test_a_setting_with_nothing_to_act_on_is_warned_naming_it(
    case: str, name: str, value: Any, reader: str
) -> None:
    (line,) = [w for w in warnings(case, {name: value}) if name in w]
    assert line.startswith(f"{case}: {name}={value} has nothing to act on: {reader}")
    assert f"remove {name}" in line


@pytest.mark.parametrize(
    ("case", "name", "value"),
    [
        ("sglang-tp-fleet", "k2_drain_timeout", 30),
        ("sglang-tp-fleet", "k2_router_queue_timeout_s", 5),
        ("sglang-pd-1p1d", "k2_router_queue_size", 5),
    ],
)
def test_a_setting_that_acts_is_not_warned_about(case: str, name: str, value: Any) -> None:
    assert not [w for w in warnings(case, {name: value}) if "nothing to act on" in w]
