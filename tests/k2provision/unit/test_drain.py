"""Drain and return: the state file beside the inventory, what the plan makes of it (the
drained instances kept stopped, out of the look, the launch, restarts, rollouts and the
routers' worker lists), and what the commands choose and refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    host_work_wave,
)
from k2provision.cli import build_app
from k2provision.commands.status import problem_lines
from k2provision.core.host_state import read_drained, state_path, write_drained
from k2provision.core.records import Plan
from k2provision.errors import InventoryError, K2Error, PlanError
from k2provision.ops.restart import restart_set
from k2provision.ops.status_probe import EndpointStatus, HostStatus, InstanceStatus
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.converge import (
    everywhere,
    expected_state,
    inputs_digest,
    serving,
    skipped_phases,
)
from k2provision.plan.drain import drain_choice, drain_lines, return_choice
from k2provision.plan.inventory import load_cluster
from k2provision.plan.monitoring import scrape_targets
from k2provision.plan.rollout import rollout_waves, serving_members
from k2provision.run.events import HostResult, Tally
from tests.k2provision.unit.test_converge import converged, state_key
from tests.k2provision.unit.test_fleet import PD_FLEET, TP_FLEET

NODE_HOSTS = 2  # each replica of the TP fleet example spans two hosts


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A copy of the 4-replica TP fleet example, so its state file is the test's own."""
    path = tmp_path / "fleet.ini"
    shutil.copy(TP_FLEET, path)
    return path


def _plan(inventory: Path) -> Plan:
    return build_plan(load_cluster(inventory))


def test_the_state_file_sits_hidden_beside_the_inventory_and_round_trips(fleet: Path) -> None:
    assert state_path(fleet) == fleet.parent / ".fleet.ini.k2state.yml"
    assert read_drained(fleet) == ()
    write_drained(fleet, ["node-03", "node-03", "node-05"])
    assert read_drained(fleet) == ("node-03", "node-05")
    assert yaml.safe_load(state_path(fleet).read_text()) == {"drained": ["node-03", "node-05"]}
    write_drained(fleet, [])
    assert not state_path(fleet).exists()


@pytest.mark.parametrize("text", ["drained: node-03\n", "[1, 2]\n", "drained: [1]\n", "{x"])
def test_a_broken_state_file_is_named_with_its_fix(fleet: Path, text: str) -> None:
    state_path(fleet).write_text(text)
    with pytest.raises(InventoryError) as error:
        load_cluster(fleet)
    assert str(state_path(fleet)) in error.value.problems[0]
    assert "fix:" in error.value.problems[0]


def test_a_drained_host_the_inventory_lacks_is_refused(fleet: Path) -> None:
    write_drained(fleet, ["node-99"])
    with pytest.raises(InventoryError) as error:
        load_cluster(fleet)
    assert "node-99 is drained but not in the inventory" in error.value.problems[0]
    assert "fix: take node-99 off the file's drained list" in error.value.problems[0]


def test_a_drained_router_host_is_refused_by_the_plan(fleet: Path) -> None:
    write_drained(fleet, ["router-01"])
    with pytest.raises(PlanError) as error:
        _plan(fleet)
    assert "router-01: drained, but it serves in no instance" in error.value.problems[0]


def test_nothing_drained_plans_and_digests_as_before(fleet: Path) -> None:
    plan = _plan(fleet)
    assert plan.fleet.drained == ()
    assert "drained" not in plan.model_dump(mode="json")["fleet"]
    assert plan_digest(plan) == plan_digest(build_plan(load_cluster(TP_FLEET)))


def test_a_drained_host_takes_its_whole_instance_out_of_the_plans_serving(fleet: Path) -> None:
    before = _plan(fleet)
    write_drained(fleet, ["node-04"])
    plan = _plan(fleet)
    assert plan.fleet.drained == ("replica-2",)
    assert plan.fleet.drained_hosts == ("node-03", "node-04")
    assert plan.fleet.drained_named == ("node-04",)
    assert plan_digest(plan) != plan_digest(before)
    # The look expects nothing running on its hosts; the other hosts are as before.
    for host in ("node-03", "node-04"):
        expected = expected_state(plan, host)
        assert not expected.containers
        assert not expected.gates
        assert expected.need is None
        assert expected.files == expected_state(before, host).files
    assert expected_state(plan, "node-05") == expected_state(before, "node-05")
    # The stamped phases (prepare, mesh, weights) read nothing of it: no re-run of them.
    for phase in ("prepare", "ssh_mesh", "weights"):
        assert inputs_digest(plan, phase, {}) == inputs_digest(before, phase, {})
    # Routers list and take back the serving instances only.
    assert [i.instance for i in serving_members(plan)] == ["replica-1", "replica-3", "replica-4"]


def test_restarts_leave_drained_hosts_alone_and_refuse_to_name_one(fleet: Path) -> None:
    write_drained(fleet, ["node-03"])
    plan = _plan(fleet)
    everything = restart_set(plan)
    assert {"node-03", "node-04"}.isdisjoint(everything.hosts)
    assert "node-05" in everything.hosts
    with pytest.raises(K2Error) as error:
        restart_set(plan, ["node-03"])
    assert "k2provision return node-03" in error.value.problems[0]


def test_a_wave_keeps_a_serving_instance_when_the_others_are_drained(fleet: Path) -> None:
    write_drained(fleet, ["node-01", "node-03", "node-05"])
    plan = _plan(fleet)
    (wave,) = rollout_waves(plan, ["replica-4"], max_unavailable=3)
    assert wave.alone_in_pool == "nodes"  # the pool's only serving instance: it says so
    write_drained(fleet, ["node-01"])
    waves = rollout_waves(_plan(fleet), ["replica-2", "replica-3", "replica-4"], 3)
    assert [w.instances for w in waves] == [("replica-2", "replica-3"), ("replica-4",)]


def test_drain_takes_the_instances_of_the_hosts_and_refuses_the_last_one(fleet: Path) -> None:
    plan = _plan(fleet)
    work = drain_choice(plan, ["node-04"])
    assert work.instances == ("replica-2",)
    assert work.drained_after == ("node-04",)
    assert work.outage == ()
    (line,) = drain_lines(plan, work)
    assert line == (
        "replica-2 (node-03, node-04): out of every router (router-01), up to 300 s to "
        "answer what it holds, stopped"
    )
    every = drain_choice(plan, [f"node-0{n}" for n in range(1, 9)])
    assert every.outage == ("nodes",)
    write_drained(fleet, ["node-01", "node-03", "node-05"])
    assert drain_choice(_plan(fleet), ["node-07"]).outage == ("nodes",)
    assert drain_choice(_plan(fleet), ["node-02"]).instances == ()  # drained already


@pytest.mark.parametrize(
    ("hosts", "said"),
    [
        (["nope"], "drain: nope is not a host of the inventory"),
        (["router-01"], "drain: router-01 serves in no instance of a fleet"),
        ([], "drain: no host named"),
    ],
)
def test_drain_refuses_what_is_not_an_instances_host(
    fleet: Path, hosts: list[str], said: str
) -> None:
    with pytest.raises(K2Error) as error:
        drain_choice(_plan(fleet), hosts)
    assert error.value.problems[0].startswith(said)


def test_an_instance_returns_when_none_of_its_hosts_stays_drained(fleet: Path) -> None:
    write_drained(fleet, ["node-03", "node-04", "node-05"])
    plan = _plan(fleet)
    assert plan.fleet.drained == ("replica-2", "replica-3")
    half = return_choice(plan, ["node-03"])
    assert half.instances == ()
    assert half.drained_after == ("node-04", "node-05")
    both = return_choice(plan, ["node-03", "node-04"])
    assert both.instances == ("replica-2",)
    assert both.drained_after == ("node-05",)
    with pytest.raises(K2Error) as error:
        return_choice(plan, ["node-07"])
    assert "return: node-07 is not drained (drained: node-03, node-04, node-05)" in str(
        error.value.problems
    )


def test_the_roles_wave_holds_the_instances_urls_containers_and_bodies(fleet: Path) -> None:
    plan = _plan(fleet)
    wave = host_work_wave(plan.model_dump(mode="json"), ["replica-3"])
    assert wave["instances"] == ["replica-3"]
    assert wave["hosts"] == ["node-05", "node-06"]
    assert set(wave["containers"]) == {"node-05", "node-06"}
    assert wave["urls"] == [plan.pools[0].instances[2].url]
    assert wave["workers"] == [{"url": plan.pools[0].instances[2].url}]


def test_a_pd_fleets_drain_names_the_pool_it_empties(tmp_path: Path) -> None:
    path = tmp_path / "pd.ini"
    shutil.copy(PD_FLEET, path)
    plan = _plan(path)
    prefill = [i for p in plan.pools if p.name == "prefill" for i in p.members()]
    hosts = [h for i in prefill for h in i.hosts]
    work = drain_choice(plan, hosts)
    assert work.outage == ("prefill",)


def test_status_counts_a_drained_instance_as_no_problem() -> None:
    drained = InstanceStatus("replica-2", ("node-03",), "http://x", "not in the router", (), True)
    down = InstanceStatus("replica-3", ("node-05",), "http://y", "not in the router")
    assert not drained.up
    assert drained.problem == ""
    assert down.problem.startswith("instance replica-3")
    assert HostStatus("node-03", "node", unreachable="timed out", drained=True).problems == []
    assert HostStatus("node-05", "node", unreachable="timed out").problems
    endpoint = EndpointStatus("http://e", models=("kimi-k2",))
    assert problem_lines([], endpoint, [drained]) == []
    assert problem_lines([], endpoint, [drained, down]) == [down.problem]


def test_drain_check_and_the_outage_refusal_change_nothing(fleet: Path) -> None:
    runner = CliRunner()
    app = build_app(extra=[])
    shown = runner.invoke(app, ["drain", str(fleet), "node-04", "--check"])
    assert shown.exit_code == 0, shown.output
    assert "drain: replica-2 (node-03, node-04): out of every router" in shown.output
    assert not state_path(fleet).exists()
    hosts = [f"node-0{n}" for n in range(1, 9)]
    refused = runner.invoke(app, ["drain", str(fleet), *hosts])
    assert refused.exit_code == 2, refused.output
    assert "is the last serving instance of [nodes]" in refused.output
    assert "--yes" in refused.output
    assert not state_path(fleet).exists()
    back = runner.invoke(app, ["return", str(fleet), "node-04"])
    assert back.exit_code == 2
    assert "node-04 is not drained" in back.output


def test_a_drained_engine_is_no_scrape_target_but_its_host_still_is(fleet: Path) -> None:
    before = {(t.job, t.host) for t in scrape_targets(_plan(fleet))}
    write_drained(fleet, ["node-03"])
    after = {(t.job, t.host) for t in scrape_targets(_plan(fleet))}
    assert ("engine", "node-03") in before
    assert before - after == {("engine", "node-03")}


def test_host_work_never_touches_a_host_whose_planned_containers_run(fleet: Path) -> None:
    """The look's `serving`: a planned container running on any spec. A serving host skips
    the GPU-taking check (validate) whatever the other hosts do; stopped, or drained, it
    serves nothing and takes part again."""
    plan = _plan(fleet)
    expected = expected_state(plan, "node-03")
    seen = converged(expected)
    assert serving(expected, seen)
    (name,) = expected.containers
    seen["answers"][state_key(expected, name)]["spec_hash"] = "old"
    assert serving(expected, seen)  # running another spec still serves
    seen["answers"][state_key(expected, name)].update(running=False, status="exited")
    assert not serving(expected, seen)
    write_drained(fleet, ["node-03"])
    drained = expected_state(_plan(fleet), "node-03")
    assert not serving(drained, converged(expected))
    found = {"launch": ["container k2-sglang: made from another spec"]}
    own = skipped_phases(found, run_tags=[], skip_tags=[], endpoint=False, serving=True)
    assert "validate" in own
    assert "preflight" not in own
    # Another host runs validate (it serves nothing): a serving host still skips it.
    assert "validate" in everywhere(own, [own, []], serving=True)
    assert "validate" not in everywhere(own, [own, []], serving=False)
    assert "validate" not in skipped_phases(found, run_tags=[], skip_tags=[], endpoint=False)


def test_an_unreachable_result_ansible_ignored_counts_as_ok_once_the_recap_says_so() -> None:
    """A drain passes over a drained host that is down (ignore_unreachable): Ansible's recap
    counts it neither unreachable nor failed, and so does the run's tally then."""
    tally = Tally()
    for host, status in (("lab4", "unreachable"), ("lab5", "unreachable"), ("lab3", "ok")):
        tally.add(HostResult(host=host, task="Drain | Stop", status=status, message="refused"))
    assert set(tally.failures) == {"lab4", "lab5"}
    tally.settle({"lab4": {"ok": 6}, "lab5": {"ok": 2, "unreachable": 1}, "lab3": {"ok": 5}})
    assert set(tally.failures) == {"lab5"}  # lab5's was not ignored
    assert tally.counts["lab4"] == {"ok": 1}
    assert tally.counts["lab5"] == {"unreachable": 1}


def test_the_plan_says_what_is_drained_and_how_it_comes_back(fleet: Path) -> None:
    runner = CliRunner()
    app = build_app(extra=[])
    before = runner.invoke(app, ["plan", str(fleet)])
    assert before.exit_code == 0, before.output
    assert "drained:" not in before.output
    write_drained(fleet, ["node-04"])
    shown = runner.invoke(app, ["plan", str(fleet)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert (
        "drained: replica-2 on node-03, node-04: stopped and out of every router until "
        "`k2provision return INVENTORY node-04`"
    ) in shown.output
    as_json = runner.invoke(app, ["plan", str(fleet), "--format", "json"])
    assert json.loads(as_json.stdout)["fleet"]["drained"] == ["replica-2"]
