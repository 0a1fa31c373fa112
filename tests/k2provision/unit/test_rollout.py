"""A fleet's rolling change: the instances a new spec replaces, grouped from the look's
differing containers, and the waves they are replaced in (k2_max_unavailable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    restart_rollout,
    restart_set,
    rollout_order,
)
from k2provision.commands.restart import rolling_lines
from k2provision.core.records import Plan
from k2provision.engines import sglang
from k2provision.errors import InventoryError
from k2provision.ops.restart import restart_set as plan_restart_set
from k2provision.ops.rollout import smoke_reason, start_reason
from k2provision.plan.converge import Difference, Drift, differences, expected_state
from k2provision.plan.inventory import load_cluster
from k2provision.plan.rollout import (
    changed_instances,
    restarted_instances,
    rollout_lines,
    rollout_waves,
    router_waves,
)
from k2provision.run.events import HostResult, parse_event
from tests.k2provision.unit.test_converge import converged, state_key
from tests.k2provision.unit.test_fleet import EXAMPLES, PD_FLEET, TP_FLEET, _edited, _plan


def _other_spec(plan: Plan, hosts: set[str]) -> dict[str, list[Difference]]:
    """The look's launch differences on every host of the plan, as if `hosts` ran an older
    spec (every other host converged)."""
    found: dict[str, list[Difference]] = {}
    for host in plan.hosts:
        expected = expected_state(plan, host.name)
        answer = converged(expected)
        if host.name in hosts:
            for name in expected.containers:
                answer["answers"][state_key(expected, name)]["spec_hash"] = "old"
        found[host.name] = differences(expected, answer)["launch"]
    return found


def test_an_instance_changes_when_a_container_of_one_of_its_hosts_differs() -> None:
    plan = _plan(TP_FLEET)
    looked = _other_spec(plan, {"node-04"})
    assert changed_instances(plan, looked) == ("replica-2",)
    assert changed_instances(plan, _other_spec(plan, set())) == ()


def _containers(plan: Plan, host: str) -> list[str]:
    return [p.container for p in plan.host(host).processes]


def test_missing_or_stopped_containers_are_left_to_the_launch() -> None:
    plan = _plan(TP_FLEET)
    looked = {host: [] for host in _other_spec(plan, set())}
    looked["node-03"] = [
        Difference("container", c, Drift.MISSING) for c in _containers(plan, "node-03")
    ]
    looked["node-05"] = [
        Difference("container", c, Drift.STOPPED) for c in _containers(plan, "node-05")
    ]
    assert changed_instances(plan, looked) == ()


def test_a_router_only_change_replaces_no_instance() -> None:
    plan = _plan(TP_FLEET)
    assert changed_instances(plan, _other_spec(plan, {"router-01"})) == ()
    assert _other_spec(plan, {"router-01"})["router-01"]  # the router itself differs


def test_changed_instances_roll_one_at_a_time_by_default() -> None:
    plan = _plan(TP_FLEET)
    changed = changed_instances(plan, _other_spec(plan, {h.name for h in plan.hosts}))
    assert changed == ("replica-1", "replica-2", "replica-3", "replica-4")
    waves = rollout_waves(plan, changed, plan.fleet.max_unavailable)
    assert [w.instances for w in waves] == [(i,) for i in changed]
    assert waves[1].hosts == ("node-03", "node-04")
    assert waves[1].urls == (plan.pools[0].instances[1].url,)
    # What the wave drains and replaces: the instance's engine containers, not the router's.
    node_3 = plan.host("node-03")
    assert waves[1].containers == {
        "node-03": tuple(p.container for p in node_3.processes),
        "node-04": tuple(p.container for p in plan.host("node-04").processes),
    }
    assert waves[1].stages == tuple(sorted({p.stage for p in node_3.processes}))
    assert rollout_lines(waves)[1].startswith("2. replica-2 on node-03, node-04: out of the")


def test_max_unavailable_widens_waves_but_a_pool_keeps_one_instance_serving() -> None:
    plan = _plan(TP_FLEET)
    changed = ("replica-1", "replica-2", "replica-3", "replica-4")
    assert [w.instances for w in rollout_waves(plan, changed, 2)] == [
        ("replica-1", "replica-2"),
        ("replica-3", "replica-4"),
    ]
    assert [len(w.instances) for w in rollout_waves(plan, changed, 64)] == [3, 1]
    with pytest.raises(ValueError, match="k2_max_unavailable=0"):
        rollout_waves(plan, changed, 0)


def test_pd_pools_roll_one_pool_after_the_other_in_plan_order() -> None:
    plan = _plan(PD_FLEET)
    changed = changed_instances(plan, _other_spec(plan, {"gpu-p05", "gpu-d01", "gpu-d20"}))
    assert changed == ("prefill-2", "decode-1", "decode-2")
    # Two instances per pool: a wave never takes both out, whatever max_unavailable says.
    assert [w.instances for w in rollout_waves(plan, changed, 4)] == [
        ("prefill-2",),
        ("decode-1",),
        ("decode-2",),
    ]


def test_the_playbooks_filter_reads_each_hosts_look() -> None:
    plan = _plan(TP_FLEET)
    looked = {
        host: {"full": False, "found": {"launch": [d.as_json() for d in found]}}
        for host, found in _other_spec(plan, {"node-01", "node-06"}).items()
    }
    looked["node-08"] = {}  # a host whose look answered nothing yet
    order = rollout_order(plan.model_dump(mode="json"), looked, "1")
    assert [w["instances"] for w in order["waves"]] == [["replica-1"], ["replica-3"]]
    assert order["waves"][1]["hosts"] == ["node-05", "node-06"]
    assert order["lines"][0].startswith("1. replica-1 on node-01, node-02")


def test_a_single_instance_plan_has_no_rollout() -> None:
    plan = _plan(EXAMPLES / "sglang-tp.ini")
    looked = _other_spec(plan, {h.name for h in plan.hosts})
    assert any(looked.values())
    assert changed_instances(plan, looked) == ()
    assert rollout_waves(plan, (), plan.fleet.max_unavailable) == ()


def test_a_fleet_restart_rolls_the_named_instances_and_recreates_the_router_in_place() -> None:
    plan = _plan(TP_FLEET)
    document = plan.model_dump(mode="json")
    # node-03 names replica-2 (widened to node-04); the router restarts in place.
    chosen = restart_set(document, "node-03,router")
    order = restart_rollout(document, chosen, 1)
    assert [w["instances"] for w in order["waves"]] == [["replica-2"]]
    assert order["waves"][0]["hosts"] == ["node-03", "node-04"]
    assert order["recreate"] == {"router-01": chosen["containers"]["router-01"]}
    # Every host: every instance rolls, one at a time, and only the router is recreated.
    everything = restart_rollout(document, restart_set(document), 1)
    assert [w["instances"] for w in everything["waves"]] == [
        ["replica-1"],
        ["replica-2"],
        ["replica-3"],
        ["replica-4"],
    ]
    assert list(everything["recreate"]) == ["router-01"]


def test_the_restart_command_shows_the_same_rolling_order() -> None:
    plan = _plan(TP_FLEET)
    chosen = plan_restart_set(plan, ["replica-3", "node-01"])
    assert rolling_lines(plan, chosen) == rollout_lines(
        rollout_waves(plan, ("replica-1", "replica-3"), 1)
    )
    assert rolling_lines(plan, chosen)[1].startswith("2. replica-3 on node-05, node-06")


def test_single_instances_restart_in_place() -> None:
    plan = _plan(EXAMPLES / "sglang-tp.ini")
    document = plan.model_dump(mode="json")
    chosen = restart_set(document)
    order = restart_rollout(document, chosen, 1)
    assert order["waves"] == []
    assert order["recreate"] == {h: c for h, c in chosen["containers"].items() if c}
    assert restarted_instances(plan, chosen["containers"]) == ()


def test_a_pd_fleet_restart_rolls_pool_by_pool_and_the_router_takes_each_half_back() -> None:
    plan = _plan(PD_FLEET)
    document = plan.model_dump(mode="json")
    order = restart_rollout(document, restart_set(document, "prefill-2,decode-1"), 1)
    assert [w["instances"] for w in order["waves"]] == [["prefill-2"], ["decode-1"]]
    prefill, decode = order["waves"]
    # sglang-router takes a prefill instance back with its type and KV bootstrap port, a
    # decode instance with its type: neither half answers a chat completion alone.
    assert prefill["workers"] == [
        {"url": "http://10.10.0.15:30000", "worker_type": "prefill", "bootstrap_port": 8998}
    ]
    assert decode["workers"] == [{"url": "http://10.10.0.31:30000", "worker_type": "decode"}]
    assert prefill["smoke_urls"] == decode["smoke_urls"] == []
    assert order["recreate"] == {}


def test_replicas_go_back_by_url_and_are_smoke_tested_on_it() -> None:
    plan = _plan(TP_FLEET)
    wave = rollout_waves(plan, ("replica-2",), 1)[0]
    url = plan.pools[0].instances[1].url
    assert wave.workers == ({"url": url},)
    assert wave.smoke_urls == (url,)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("k2_max_unavailable=0", "k2_max_unavailable"),
        ("k2_drain_timeout=0", "k2_drain_timeout"),
        ("k2_drain_timeout=true", "k2_drain_timeout"),
    ],
)
def test_rollout_variables_are_validated(tmp_path: Path, line: str, why: str) -> None:
    path = _edited(tmp_path, TP_FLEET, "k2_instances=4", f"k2_instances=4\n{line}")
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    assert any(why in problem for problem in caught.value.problems)


def test_rollout_variables_are_read() -> None:
    cluster = load_cluster(TP_FLEET)
    assert (cluster.max_unavailable, cluster.drain_timeout) == (1, 300)


def test_the_cli_shows_the_rollout_order_the_look_play_sets() -> None:
    raw = {
        "event": "runner_on_ok",
        "event_data": {
            "host": "lab1",
            "task": "The fleet's rolling change",
            "res": {"ansible_facts": {"k2_rollout": {"lines": ["1. replica-1 on lab2"]}}},
        },
    }
    event = parse_event(raw)
    assert isinstance(event, HostResult)
    assert event.differences == ("rollout order: 1. replica-1 on lab2",)


def test_a_failed_start_is_named_by_its_docker_run_then_by_its_gate() -> None:
    started = {"rc": 125, "stderr": "pulling\nno such image", "item": {"container": "k2-sglang"}}
    failed_run = {"results": [started]}
    gate = {"k2_failure": {"summary": "lab2: sglang: exited with status 1"}}
    assert start_reason("lab2", failed_run, gate) == (
        "lab2: docker run k2-sglang failed: no such image"
    )
    assert start_reason("lab2", {"results": [{"rc": 0}]}, gate) == (
        "lab2: sglang: exited with status 1"
    )
    assert start_reason("lab2", {"skipped": True}, {"skipped": True, "k2_failure": None}) == ""


def test_a_failed_smoke_test_names_the_instance_url_and_the_answer() -> None:
    assert smoke_reason({"item": "http://10.0.0.2:30000", "status": 503}) == (
        "smoke test http://10.0.0.2:30000/v1/chat/completions answered HTTP 503"
    )
    assert smoke_reason({"item": "http://10.0.0.2:30000", "status": -1, "msg": "refused"}) == (
        "smoke test http://10.0.0.2:30000/v1/chat/completions answered nothing (refused)"
    )


def test_a_model_swap_that_fits_the_instances_rolls_every_instance(tmp_path: Path) -> None:
    plan = _plan(TP_FLEET)
    swapped = _plan(
        _edited(
            tmp_path,
            TP_FLEET,
            "k2_model_dir=/models/Kimi-K2-Instruct",
            "k2_model=moonshotai/Kimi-K2-Thinking\nk2_model_dir=/models/Kimi-K2-Thinking",
        )
    )
    assert swapped.model != plan.model
    # Each instance's containers now run another spec than the old plan's: the look finds
    # them all, and they roll one at a time like any other change.
    looked = {
        host.name: [
            Difference("container", p.container, Drift.OTHER_SPEC)
            for p in host.processes
            if expected_state(plan, host.name).containers.get(p.container)
            != expected_state(swapped, host.name).containers.get(p.container)
        ]
        for host in swapped.hosts
    }
    changed = changed_instances(swapped, looked)
    assert changed == ("replica-1", "replica-2", "replica-3", "replica-4")
    assert len(rollout_waves(swapped, changed, 1)) == 4


def test_a_pools_only_instance_rolls_and_its_line_says_the_pool_pauses(tmp_path: Path) -> None:
    plan = _plan(_edited(tmp_path, PD_FLEET, "k2_decode_instances=2", "k2_decode_instances=1"))
    changed = changed_instances(plan, _other_spec(plan, {"gpu-p01", "gpu-d01"}))
    assert changed == ("prefill-1", "decode-1")
    waves = rollout_waves(plan, changed, plan.fleet.max_unavailable)
    assert [w.alone_in_pool for w in waves] == ["", "decode"]
    first, second = rollout_lines(waves)
    assert first.endswith(
        "drained, down 25 s (until its peers drop what they cached of it), replaced, "
        "health-checked, back in"
    )
    assert second.endswith(
        "back in (the only instance of [decode]: requests that need it wait or fail meanwhile)"
    )
    replicas = rollout_lines(rollout_waves(_plan(TP_FLEET), ("replica-1",), 1))
    assert replicas[0].endswith("replaced, smoke-tested, back in")


def test_no_rollout_or_repair_decision_depends_on_the_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decisions compare the typed differences: rewording every message (the drifts' words and
    each difference's detail) leaves the rolled instances and the launch's repairs as they
    were."""
    from k2provision.plan import converge

    plan = _plan(TP_FLEET)
    hosts = {"node-01", "node-06"}

    def decisions() -> tuple[tuple[str, ...], dict[str, dict[str, list[str]]]]:
        looked = _other_spec(plan, hosts)
        reworded = {
            host: [Difference(d.subject, d.name, d.drift, "reworded") for d in found]
            for host, found in looked.items()
        }
        assert changed_instances(plan, reworded) == changed_instances(plan, looked)
        return changed_instances(plan, looked), {
            host: converge.repairs(found) for host, found in reworded.items()
        }

    before = decisions()
    assert before[0] == ("replica-1", "replica-3")
    assert before[1]["node-01"]["containers"]
    monkeypatch.setattr(converge, "DRIFT_WORDS", dict.fromkeys(converge.DRIFT_WORDS, "?"))
    assert Difference("container", "k2-x", Drift.MISSING).text == "container k2-x: ?"
    assert decisions() == before


def test_a_replaced_prefill_instance_stays_down_until_its_decode_peers_forget_it() -> None:
    """sglang 0.5.23's decode instances cache a prefill instance's endpoints by its bootstrap
    address and drop them only after SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE missed
    heartbeats: a successor behind the same URL and port that answers sooner would leave
    them on the old endpoints. The prefill wave waits that long between stop and start (and
    again before a rollback); decode and replica waves do not wait."""
    plan = _plan(PD_FLEET)
    document = plan.model_dump(mode="json")
    order = restart_rollout(document, restart_set(document, "prefill-2,decode-1"), 1)
    prefill, decode = order["waves"]
    heartbeats = sglang.PD_HEARTBEAT_MAX_FAILURE * (sglang.PD_HEARTBEAT_INTERVAL_S + 5)
    assert prefill["down_s"] == heartbeats + sglang.PD_HEARTBEAT_INTERVAL_S == 25
    assert decode["down_s"] == 0
    env = next(p.env for h in plan.hosts for p in h.processes if p.name == "sglang-decode")
    assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == str(sglang.PD_HEARTBEAT_INTERVAL_S)
    assert env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == str(
        sglang.PD_HEARTBEAT_MAX_FAILURE
    )
    lines = order["lines"]
    assert "drained, down 25 s (until its peers drop" in lines[0]
    assert "down" not in lines[1]
    replicas = _plan(TP_FLEET).model_dump(mode="json")
    tp = restart_rollout(replicas, restart_set(replicas, "replica-1"), 1)
    assert [w["down_s"] for w in tp["waves"]] == [0]
    # The role waits the wave's down_s after stopping and before a rollback's restart.
    role = Path(__file__).resolve().parents[3] / "roles" / "k2_rollout" / "tasks"
    # (the wave replaces its containers through replace.yml, which a router wave shares).
    assert "include_tasks: replace.yml" in (role / "wave.yml").read_text()
    for task_file in ("replace.yml", "rollback.yml"):
        assert "_k2_rollout_wave.down_s" in (role / task_file).read_text()


def test_behind_a_front_each_changed_router_is_its_own_wave_before_the_instances() -> None:
    plan = _plan(PD_FLEET)
    assert plan.front is not None
    looked = _other_spec(plan, {"gpu-r02", "gpu-d01"})
    waves = router_waves(plan, looked)
    assert [(w.host, w.server, w.containers) for w in waves] == [
        ("gpu-r02", "gpu-r02", ("k2-router",))
    ]
    # It must list every instance of both pools healthy before HAProxy sends to it again.
    assert set(waves[0].worker_urls) == {i.url for p in plan.pools for i in p.members()}
    assert waves[0].front_hosts == ("gpu-r01", "gpu-r02")
    assert waves[0].registrations == ()  # SGLang's router names its workers itself
    order = rollout_order(
        plan.model_dump(mode="json"),
        {
            h: {"full": False, "found": {"launch": [d.as_json() for d in f]}}
            for h, f in looked.items()
        },
    )
    assert order["routers"][0]["instances"] == ["the router on gpu-r02"]
    assert order["routers"][0]["containers"] == {"gpu-r02": ["k2-router"]}
    assert order["lines"][0].startswith("1. router on gpu-r02: out of HAProxy on gpu-r01, gpu-r02")
    assert order["lines"][1].startswith("2. decode-1 on gpu-d01")
    # Both routers changed: one at a time, in the plan's order; a converged router is no wave.
    assert [w.host for w in router_waves(plan, _other_spec(plan, {"gpu-r01", "gpu-r02"}))] == [
        "gpu-r01",
        "gpu-r02",
    ]
    assert router_waves(plan, _other_spec(plan, {"gpu-d01"})) == ()


def test_one_router_without_a_front_has_no_router_wave() -> None:
    plan = _plan(TP_FLEET)
    assert plan.front is None
    assert router_waves(plan, _other_spec(plan, {"router-01"})) == ()


def test_a_vllm_fleets_new_router_is_given_its_workers_by_model_id(tmp_path: Path) -> None:
    text = TP_FLEET.read_text().replace("k2_engine=sglang", "k2_engine=vllm")
    text = text.replace(
        "router-01 ansible_host=10.20.1.5",
        "router-01 ansible_host=10.20.1.5\nrouter-02 ansible_host=10.20.1.6",
    )
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(text + "k2_front_address=10.20.1.100/24\n")
    plan = _plan(inventory)
    waves = router_waves(plan, _other_spec(plan, {"router-01"}))
    assert [w.host for w in waves] == ["router-01"]
    assert [b["url"] for b in waves[0].registrations] == list(waves[0].worker_urls)
    assert all(b["model_id"] == plan.served_model_name for b in waves[0].registrations)


def test_restarting_the_routers_behind_a_front_rolls_them_and_recreates_nothing_in_place() -> None:
    plan = _plan(PD_FLEET)
    chosen = restart_set(plan.model_dump(mode="json"), "router")
    order = restart_rollout(plan.model_dump(mode="json"), chosen)
    assert [r["hosts"] for r in order["routers"]] == [["gpu-r01"], ["gpu-r02"]]
    assert order["waves"] == []
    assert order["recreate"] == {}
    assert rolling_lines(plan, plan_restart_set(plan, ["router"]))[1].startswith(
        "2. router on gpu-r02: out of HAProxy on gpu-r01, gpu-r02"
    )
    # One router, no front: recreated in place as before.
    tp = _plan(TP_FLEET)
    alone = restart_rollout(
        tp.model_dump(mode="json"), restart_set(tp.model_dump(mode="json"), "router")
    )
    assert alone["routers"] == []
    assert alone["recreate"] == {"router-01": ["k2-router"]}


def _looked(found: dict[str, list[Difference]]) -> dict[str, Any]:
    return {
        h: {"full": False, "found": {"launch": [d.as_json() for d in f]}} for h, f in found.items()
    }


def _simulate(order: dict[str, Any], plan: Plan) -> list[set[str]]:
    """Each router's workers, by generation, after every step the role takes: what a
    request could be paired across. Returns the generations each router held at each step."""
    gen = order["generation"]
    changed = set(gen["changed_urls"])
    holds = {r.host: {(u, "old") for u in gen["worker_urls"]} for r in plan.routers}
    seen: list[set[str]] = []

    def look() -> None:
        for workers in holds.values():
            seen.append({g for u, g in workers if u in changed})

    new = gen["new_router"]["host"]
    holds[new] = {(u, g) for u, g in holds[new] if u not in changed}
    look()
    for group in gen["groups"]:
        for old in gen["old_routers"]:
            holds[old["host"]] -= {(u, "old") for u in group["urls"]}
        look()
        holds[new] |= {(u, "new") for u in group["urls"]}
        look()
    for old in gen["old_routers"]:
        holds[old["host"]] = {(u, "new" if u in changed else "old") for u in gen["worker_urls"]}
        look()
    return seen


def test_a_pd_change_of_both_pools_behind_a_front_moves_generation_by_generation() -> None:
    plan = _plan(PD_FLEET)
    looked = _other_spec(
        plan, {h.name for h in plan.hosts if h.name.startswith(("gpu-p", "gpu-d"))}
    )
    order = rollout_order(plan.model_dump(mode="json"), _looked(looked))
    gen = order["generation"]
    assert gen is not None
    assert order["waves"] == []  # every changed instance moves with its generation
    assert [g["instances"] for g in gen["groups"]] == [
        ["prefill-1", "decode-1"],
        ["prefill-2", "decode-2"],
    ]
    assert gen["new_router"]["host"] == "gpu-r02"
    assert [r["host"] for r in gen["old_routers"]] == ["gpu-r01"]
    # After the first group, each router serves one group's worth: equal weights.
    assert gen["weights"] == [
        [{"server": "gpu-r01", "weight": 10}, {"server": "gpu-r02", "weight": 10}]
    ]
    # No router ever holds instances of both generations.
    assert all(len(gens) <= 1 for gens in _simulate(order, plan))
    lines = order["lines"]
    assert lines[0].startswith("1. the router on gpu-r02 (the new generation's): out of HAProxy")
    assert lines[1].startswith("2. prefill-1, decode-1 on gpu-p01")
    assert (
        "into the router on gpu-r02 only; HAProxy weights gpu-r01 10, gpu-r02 10 (gpu-r02 back"
        in lines[1]
    )
    assert "the router(s) on gpu-r01 out of HAProxy first" in lines[2]
    assert lines[3].startswith("4. the router(s) on gpu-r01: every worker of the new generation")
    assert order["warning"] == ""


def test_a_change_of_one_pd_pool_rolls_as_before() -> None:
    plan = _plan(PD_FLEET)
    looked = _other_spec(plan, {h.name for h in plan.hosts if h.name.startswith("gpu-p")})
    order = rollout_order(plan.model_dump(mode="json"), _looked(looked))
    assert order["generation"] is None
    assert [w["instances"] for w in order["waves"]] == [["prefill-1"], ["prefill-2"]]
    assert order["warning"] == ""


def test_a_pd_change_of_both_pools_behind_one_router_is_said_to_risk_mixing(tmp_path: Path) -> None:
    text = PD_FLEET.read_text().replace("gpu-r02 ansible_host=10.10.0.6\n", "")
    text = "\n".join(x for x in text.splitlines() if not x.startswith("k2_front_address"))
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(text + "\n")
    plan = _plan(inventory)
    looked = _other_spec(plan, {h.name for h in plan.hosts if h.name != "gpu-r01"})
    order = rollout_order(plan.model_dump(mode="json"), _looked(looked))
    assert order["generation"] is None
    assert len(order["waves"]) == 4
    assert order["warning"].startswith("prefill and decode instances change behind one router")
    assert "k2_front_address" in order["warning"]


def test_a_single_instance_pd_change_is_an_outage_the_run_needs_accepted() -> None:
    plan = _plan(
        Path(__file__).resolve().parents[2] / "golden" / "sglang-pd-1p1d" / "inventory.ini"
    )
    engine_hosts = {h for pool in plan.pools for h in pool.hosts}
    changed = sorted(engine_hosts)[:1]
    order = rollout_order(plan.model_dump(mode="json"), _looked(_other_spec(plan, set(changed))))
    assert order["waves"] == []
    assert order["outage"].startswith(
        f"this change replaces the only prefill and decode instance ({changed[0]} run another spec)"
    )
    assert "fix: apply --yes (k2_accept_outage=true)" in order["outage"]
    converged_order = rollout_order(plan.model_dump(mode="json"), _looked(_other_spec(plan, set())))
    assert converged_order["outage"] == ""
    # A fleet's change is no outage: it rolls.
    fleet = _plan(PD_FLEET)
    rolled = rollout_order(fleet.model_dump(mode="json"), _looked(_other_spec(fleet, {"gpu-p01"})))
    assert rolled["outage"] == ""


def test_the_look_fails_an_unaccepted_outage_and_the_cli_accepts_it_with_yes() -> None:
    look = (Path(__file__).resolve().parents[3] / "playbooks" / "look.yml").read_text()
    assert "not (k2_accept_outage | default(false) | bool)" in look
    from k2provision.commands.flow import HostRun

    assert HostRun(command="apply", inventory=Path("x"), accept_outage=True).accept_outage
    event = parse_event(
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": "lab1",
                "task": "The fleet's rolling change",
                "res": {"ansible_facts": {"k2_rollout": {"lines": [], "outage": "this change"}}},
            },
        }
    )
    assert isinstance(event, HostResult)
    assert event.differences == ("rollout outage: this change",)
