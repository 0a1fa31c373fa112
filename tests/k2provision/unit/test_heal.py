"""Spares and heal, and host work instance by instance: the [spare] group in the plan, a
spare in a failed host's place (the state file's substitution), the instances that start
before the routers roll, what heal chooses and what its circuit breaker refuses, the
commands' refusals (no host touched), and which serving hosts' host work waits for the
rolling pass and in what order."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    host_work_order,
    rollout_order,
)
from k2provision.cli import build_app
from k2provision.commands.apply import ApplyHooks
from k2provision.commands.heal import findings_of
from k2provision.core.host_state import (
    HostState,
    Replacement,
    TakenOut,
    read_state,
    state_path,
    write_drained,
    write_state,
)
from k2provision.core.records import Plan
from k2provision.errors import InventoryError
from k2provision.ops.bench import scale_of
from k2provision.ops.status_probe import HostStatus, RouterWorker
from k2provision.plan.assemble import build_plan
from k2provision.plan.converge import (
    Difference,
    Drift,
    differences,
    expected_state,
    host_work_changed,
)
from k2provision.plan.heal import (
    Failure,
    HealChoice,
    heal_choice,
    heal_lines,
    state_after,
    timestamp,
)
from k2provision.plan.host_work import defers, host_work_lines, host_work_waves
from k2provision.plan.inventory import load_cluster
from tests.k2provision.unit.test_converge import converged, state_key
from tests.k2provision.unit.test_fleet import TP_FLEET

NOW = datetime(2026, 11, 29, 4, 0, 0)
SPARE = "node-09 ansible_host=10.20.1.19"


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """The 4-replica TP fleet example behind a front of two routers, with one spare."""
    text = TP_FLEET.read_text().replace(
        "router-01 ansible_host=10.20.1.5",
        "router-01 ansible_host=10.20.1.5\nrouter-02 ansible_host=10.20.1.6",
    )
    path = tmp_path / "fleet.ini"
    path.write_text(f"{text}k2_front_address=10.20.1.100/24\n\n[spare]\n{SPARE}\n")
    return path


def _plan(inventory: Path) -> Plan:
    return build_plan(load_cluster(inventory))


def _replaced(inventory: Path, failed: str = "node-03", spare: str = "node-09") -> None:
    at = timestamp(NOW)
    write_state(
        inventory,
        HostState(
            replaced=(Replacement(failed, spare, at),), taken_out=(TakenOut(failed, at, "x"),)
        ),
    )


def test_the_state_file_keeps_drains_substitutions_and_the_breakers_log(fleet: Path) -> None:
    assert read_state(fleet) == HostState()
    state = HostState(
        drained=("node-05",),
        replaced=(Replacement("node-03", "node-09", "2026-11-29T04:00:00Z"),),
        taken_out=(TakenOut("node-03", "2026-11-29T04:00:00Z", "unreachable: timeout"),),
    )
    write_state(fleet, state)
    assert read_state(fleet) == state
    assert read_state(fleet).substitutes == {"node-03": "node-09"}
    # Draining keeps the rest of the state.
    write_drained(fleet, [])
    assert read_state(fleet).replaced == state.replaced
    write_state(fleet, HostState())
    assert not state_path(fleet).exists()
    state_path(fleet).write_text("replaced:\n- {host: node-03}\n")
    with pytest.raises(InventoryError) as error:
        read_state(fleet)
    assert "'replaced' a list of mappings with host, spare, at" in error.value.problems[0]


def test_a_spare_is_a_prepared_gpu_host_that_serves_nothing(fleet: Path) -> None:
    plan = _plan(fleet)
    spare = plan.host("node-09")
    assert (spare.role, spare.pool, spare.gpus, spare.processes) == ("spare", "spare", 8, ())
    assert plan.fleet.spares == ("node-09",)
    assert all("node-09" not in i.hosts for p in plan.pools for i in p.instances)
    # It gets the weights (every host but the routers') and counts for no throughput.
    synthetic = {"k2_weights_source": "synthetic"}
    assert expected_state(plan, "node-09", synthetic).weights
    assert not expected_state(plan, "router-01", synthetic).weights
    assert scale_of(plan).nodes == 8


def test_a_spare_in_a_pool_or_router_group_too_is_refused(fleet: Path) -> None:
    fleet.write_text(fleet.read_text() + "node-01\n")
    with pytest.raises(InventoryError) as error:
        load_cluster(fleet)
    assert any("node-01 is in [spare] and in a pool" in p for p in error.value.problems)


def test_the_spare_takes_the_failed_hosts_place_its_ranks_role_and_mastership(
    fleet: Path,
) -> None:
    before = _plan(fleet)
    _replaced(fleet)
    plan = _plan(fleet)
    replica = next(i for p in plan.pools for i in p.instances if i.instance == "replica-2")
    assert replica.hosts == ("node-09", "node-04")
    assert replica.master == "node-09"
    assert replica.url == "http://10.20.1.19:30000"
    assert (plan.host("node-09").role, plan.host("node-09").node_rank) == ("node", 0)
    assert "node-03" not in {h.name for h in plan.hosts}
    assert plan.fleet.replaced == {"node-03": "node-09"}
    assert plan.fleet.spares == ()
    # The other instances are as they were; the routers list the new master.
    others = [i for p in before.pools for i in p.instances if i.instance != "replica-2"]
    assert others == [i for p in plan.pools for i in p.instances if i.instance != "replica-2"]
    router = next(p for p in plan.host("router-01").processes if not p.gpus)
    assert "http://10.20.1.19:30000" in router.argv
    assert "http://10.20.1.13:30000" not in router.argv


def test_a_substitution_the_inventory_cannot_take_is_refused_naming_the_state_file(
    fleet: Path,
) -> None:
    _replaced(fleet, spare="node-07")
    with pytest.raises(InventoryError) as error:
        load_cluster(fleet)
    assert str(state_path(fleet)) in error.value.problems[0]
    assert "node-07 stands in for node-03, but it is not in [spare]" in error.value.problems[0]


def _looked(plan: Plan, missing: set[str], respecced: set[str]) -> dict[str, object]:
    """Every host's look: `missing` hosts' containers missing, `respecced` hosts' on an
    older spec, the rest converged."""
    looked: dict[str, object] = {}
    for host in plan.hosts:
        expected = expected_state(plan, host.name)
        answer = converged(expected)
        found = differences(expected, answer)["launch"]
        if host.name in missing:
            found = [Difference("container", c, Drift.MISSING) for c in expected.containers]
        elif host.name in respecced:
            for name in expected.containers:
                answer["answers"][state_key(expected, name)]["spec_hash"] = "old"
            found = differences(expected, answer)["launch"]
        looked[host.name] = {"full": False, "found": {"launch": [d.as_json() for d in found]}}
    return looked


def test_the_healed_instance_starts_and_joins_the_routers_before_they_roll(fleet: Path) -> None:
    _replaced(fleet)
    plan = _plan(fleet)
    looked = _looked(plan, {"node-09"}, {"node-04", "router-01", "router-02"})
    order = rollout_order(plan.model_dump(mode="json"), looked)
    assert [w["instances"] for w in order["first"]] == [["replica-2"]]
    assert order["first"][0]["hosts"] == ["node-09", "node-04"]
    assert order["first"][0]["workers"] == [{"url": "http://10.20.1.19:30000"}]
    assert [w["hosts"] for w in order["routers"]] == [["router-01"], ["router-02"]]
    assert order["waves"] == []
    assert order["lines"][0].startswith("1. replica-2 on node-09, node-04: not running; started")
    assert order["lines"][1].startswith("2. router on router-01")
    # Without a router to roll, a stopped instance is the launch's, as before.
    order = rollout_order(plan.model_dump(mode="json"), _looked(plan, {"node-09"}, set()))
    assert order["first"] == []
    assert order["waves"] == []


NOTHING = HostState()


def _choice(plan: Plan, failures: list[Failure], state: HostState = NOTHING, **kw: object):
    args: dict[str, object] = {"down": (), "max_hosts": 1, "window_s": 3600, **kw}
    return heal_choice(
        plan, failures, args["down"], state, NOW, args["max_hosts"], args["window_s"]
    )  # type: ignore[arg-type]


def test_heal_puts_a_free_spare_in_a_dead_hosts_place(fleet: Path) -> None:
    plan = _plan(fleet)
    dead = Failure("node-03", "unreachable: no answer within 20 s")
    choice = _choice(plan, [dead], down=("replica-2",))
    assert choice.replacements == (Replacement("node-03", "node-09", timestamp(NOW)),)
    assert choice.instances == ("replica-2",)
    assert not choice.refused
    assert heal_lines(plan, choice)[0].startswith(
        "node-03 (unreachable: no answer within 20 s): node-09 takes its place in replica-2 "
        "(its ranks and role, and the master)"
    )
    after = state_after(HostState(), choice, 3600, NOW)
    assert after.substitutes == {"node-03": "node-09"}
    assert after.taken_out == (TakenOut("node-03", timestamp(NOW), dead.why),)


def test_without_a_free_spare_the_instance_stays_down_and_heal_says_why(fleet: Path) -> None:
    plan = _plan(fleet)
    failures = [Failure("node-03", "unreachable"), Failure("node-05", "XID 79 on GPU 2")]
    choice = _choice(plan, failures, down=("replica-2", "replica-3"), max_hosts=2)
    assert [r.host for r in choice.replacements] == ["node-03"]
    assert choice.stays_down[0].startswith(
        "replica-3 stays down: node-05 (XID 79 on GPU 2) has no spare to take its place"
    )


def test_the_breaker_counts_the_hosts_taken_out_within_its_window(fleet: Path) -> None:
    plan = _plan(fleet)
    earlier = HostState(
        taken_out=(TakenOut("node-07", timestamp(NOW - timedelta(minutes=5)), "x"),)
    )
    choice = _choice(plan, [Failure("node-03", "unreachable")], earlier, down=("replica-2",))
    assert choice.replacements == ()
    assert choice.refused.startswith(
        "circuit breaker: taking out node-03 would make 2 host(s) within 3600 s (earlier: "
        "node-07 at 2026-11-29T03:55:00Z); at most 1 allowed"
    )
    assert "nothing was changed" in choice.refused
    # Outside the window it counts no more; a larger allowance lets it through.
    old = HostState(taken_out=(TakenOut("node-07", timestamp(NOW - timedelta(hours=2)), "x"),))
    assert _choice(plan, [Failure("node-03", "x")], old, down=("replica-2",)).replacements
    assert _choice(plan, [Failure("node-03", "x")], earlier, max_hosts=2).replacements
    assert state_after(old, HealChoice(), 3600, NOW).taken_out == ()  # pruned


def test_the_breaker_never_takes_out_the_last_serving_instance(fleet: Path) -> None:
    plan = _plan(fleet)
    # Three instances down already: replica-4's host failing its GPU gate is the last serving.
    down = ("replica-1", "replica-2", "replica-3")
    choice = _choice(plan, [Failure("node-07", "ECC")], down=down, max_hosts=4)
    assert "node-07 (ECC) serves in replica-4, the last instance of [nodes] still serving" in (
        choice.refused
    )
    # A host that is not an instance's, or whose instance is drained, is left alone.
    write_drained(fleet, ["node-05"])
    plan = _plan(fleet)
    failures = [Failure("router-01", "unreachable"), Failure("node-05", "unreachable")]
    choice = _choice(plan, failures)
    assert choice.replacements == ()
    assert not choice.refused
    assert [line.split(" (")[0] for line in choice.ignored] == [
        "router-01: unreachable",
        "node-05: unreachable",
    ]


def test_heal_check_shows_the_substitution_and_changes_nothing(fleet: Path) -> None:
    result = CliRunner().invoke(build_app(), ["heal", str(fleet), "node-03", "--check"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "heal: node-03 (named by the operator): node-09 takes its place in replica-2" in said
    assert "heal --check: nothing changed" in said
    assert not state_path(fleet).exists()


def test_heal_refused_by_the_breaker_exits_2_and_changes_nothing(fleet: Path) -> None:
    write_state(
        fleet, HostState(taken_out=(TakenOut("node-07", timestamp(datetime.utcnow()), "x"),))
    )
    before = state_path(fleet).read_text()
    result = CliRunner().invoke(build_app(), ["heal", str(fleet), "node-03"])
    assert result.exit_code == 2, result.output
    assert "circuit breaker: taking out node-03 would make 2 host(s)" in " ".join(
        result.output.split()
    )
    assert state_path(fleet).read_text() == before


def test_return_of_a_replaced_host_says_what_moves_back(fleet: Path) -> None:
    _replaced(fleet)
    result = CliRunner().invoke(build_app(), ["return", str(fleet), "node-03", "--check"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "return: node-03 back in its instance in place of node-09: replica-2 drained" in said
    assert yaml.safe_load(state_path(fleet).read_text())["replaced"][0]["spare"] == "node-09"
    mixed = CliRunner().invoke(build_app(), ["return", str(fleet), "node-03", "node-05"])
    assert mixed.exit_code == 2
    assert "expected one kind at a time" in " ".join(mixed.output.split())


def test_host_work_waits_on_a_serving_instances_host_and_rolls_instance_by_instance(
    fleet: Path,
) -> None:
    plan = _plan(fleet)
    # The driver's inputs changed, serving: deferred. Unchanged, idle, a router's or a
    # drained instance's host: not.
    assert defers(plan, "node-03", changed=True, serving=True)
    assert not defers(plan, "node-03", changed=False, serving=True)
    assert not defers(plan, "node-03", changed=True, serving=False)
    assert not defers(plan, "router-01", changed=True, serving=True)
    assert not defers(plan, "node-09", changed=True, serving=False)
    # A run whose tags leave prepare out (apply --tags launch) defers nothing.
    assert not defers(plan, "node-03", changed=True, serving=True, skipped=["prepare"])
    waves = host_work_waves(plan, ["node-01", "node-02", "node-05"])
    assert [w.instances for w in waves] == [("replica-1",), ("replica-3",)]
    assert waves[0].hosts == ("node-01", "node-02")
    assert host_work_lines(waves)[1] == (
        "2. replica-3 on node-05, node-06: out of every router, stopped, the host work "
        "(prepare, validate) done there, started behind its health gates, back in"
    )
    order = host_work_order(plan.model_dump(mode="json"), ["node-07"])
    assert order["waves"] == [{"instances": ["replica-4"], "hosts": ["node-07", "node-08"]}]
    write_drained(fleet, ["node-05"])
    assert not defers(_plan(fleet), "node-05", changed=True, serving=True)


def test_only_the_drivers_inputs_make_host_work_and_an_older_stamp_counts_as_unchanged(
    fleet: Path,
) -> None:
    plan = _plan(fleet)
    base = expected_state(plan, "node-03", {})
    newer = expected_state(plan, "node-03", {"k2_nvidia_driver_version": "580.95.05"})
    other = expected_state(plan, "node-03", {"k2_firewall_enabled": True})
    assert newer.host_work != base.host_work
    assert other.host_work == base.host_work
    assert other.stamps["prepare"] != base.stamps["prepare"]  # prepare runs, in place

    def stamp(**fields: object) -> dict[str, object]:
        return {"stamps": {"prepare": {"digest": "x", **fields}}}

    assert host_work_changed(newer, stamp(host_work=base.host_work))
    assert not host_work_changed(base, stamp(host_work=base.host_work))
    assert not host_work_changed(newer, stamp())
    assert not host_work_changed(newer, {"stamps": {}})


def test_apply_reads_the_rolling_pass_the_look_wrote(tmp_path: Path) -> None:
    hooks = ApplyHooks()
    assert hooks.order() == ([], [])
    extra = hooks.extravars(_plan(TP_FLEET), tmp_path)
    assert extra == {
        "k2_host_work_file": str(tmp_path / "host_work.json"),
        "k2_container_runtime_progress_file": str(tmp_path / "images-progress.jsonl"),
    }
    assert hooks.order() == ([], [])  # no look ran
    (tmp_path / "host_work.json").write_text(
        '{"waves": [{"instances": ["replica-1"], "hosts": ["node-01"]}], "lines": ["1. x"]}'
    )
    assert hooks.order() == ([{"instances": ["replica-1"], "hosts": ["node-01"]}], ["1. x"])


def test_detection_reads_status_a_lost_host_a_stopped_instance_and_a_stuck_rank(
    fleet: Path,
) -> None:
    plan = _plan(fleet)
    urls = {i.instance: i.url for p in plan.pools for i in p.instances}
    workers = [RouterWorker(urls[name], "regular", True) for name in ("replica-1", "replica-4")]
    hosts = [
        HostStatus(
            "node-01", "node", stuck_ranks=("dp rank 3 holds 2 requests, no snapshot for 75 s",)
        ),
        HostStatus("node-03", "node", unreachable="no answer within 20 s"),
        HostStatus("node-05", "node"),
        HostStatus("node-07", "node", gpu_health=("GPU 2: XID 79",)),
        HostStatus("node-09", "spare"),
    ]
    found = findings_of(plan, hosts, workers)
    assert found.failures == (
        Failure("node-03", "unreachable: no answer within 20 s"),
        Failure("node-07", "GPU 2: XID 79"),
    )
    # replica-1 holds a stuck rank, replica-2 and replica-3 are not in the router, replica-4's
    # host fails its GPU gate: only replica-3's hosts are fine (an apply starts it again).
    assert found.down == ("replica-1", "replica-2", "replica-3", "replica-4")
    assert found.restartable == ("replica-3",)
    assert found.stuck == ("node-01",)


def test_a_host_that_also_runs_the_router_is_left_alone(tmp_path: Path) -> None:
    # Without [router] the fleet's router runs on the first host of [nodes].
    text = TP_FLEET.read_text().replace("[router]\nrouter-01 ansible_host=10.20.1.5\n", "")
    path = tmp_path / "fleet.ini"
    path.write_text(f"{text}\n[spare]\n{SPARE}\n")
    plan = _plan(path)
    assert [r.host for r in plan.routers] == ["node-01"]
    choice = _choice(plan, [Failure("node-01", "unreachable")], down=("replica-1",))
    assert choice.replacements == ()
    assert "it runs a router too" in choice.ignored[0]
