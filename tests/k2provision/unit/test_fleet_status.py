"""`status` on a fleet: each instance is up only while its hosts are fine and the router lists
its worker healthy; an instance down is a problem line (exit 1)."""

from __future__ import annotations

from pathlib import Path

from k2provision.commands.status import document, fleet_line, problem_lines
from k2provision.ops.status_probe import (
    EndpointStatus,
    HostStatus,
    RouterWorker,
    fleet_status,
    router_workers,
)
from tests.k2provision.unit.test_fleet import EXAMPLES, TP_FLEET, _plan


def _healthy(urls: list[str]) -> list[RouterWorker]:
    return [RouterWorker(url=u, kind="regular", healthy=True) for u in urls]


def test_every_instance_is_up_when_its_hosts_are_fine_and_the_router_routes_to_it() -> None:
    plan = _plan(TP_FLEET)
    urls = [i.url for i in plan.pools[0].instances]
    fleet = fleet_status(plan, [], _healthy(urls))
    assert [(i.instance, i.up) for i in fleet] == [(f"replica-{n}", True) for n in range(1, 5)]


def test_an_instance_out_of_the_router_unhealthy_or_on_a_troubled_host_is_down() -> None:
    plan = _plan(TP_FLEET)
    urls = [i.url for i in plan.pools[0].instances]
    workers = [*_healthy(urls[:2]), RouterWorker(url=urls[2], kind="regular", healthy=False)]
    troubled = HostStatus("node-02", "node", unreachable="no route to host")
    fleet = fleet_status(plan, [troubled], workers)
    assert [i.router for i in fleet] == ["healthy", "healthy", "unhealthy", "not in the router"]
    assert [i.up for i in fleet] == [False, True, False, False]
    assert fleet[0].problem == (
        f"instance replica-1 (node-01, node-02, {urls[0]}) down: host node-02 has a problem"
    )
    endpoint = EndpointStatus(url=plan.endpoint, models=("kimi-k2",), router_ready=True)
    lines = problem_lines([], endpoint, fleet)
    assert [line.split(" down:")[0] for line in lines] == [
        f"instance replica-1 (node-01, node-02, {urls[0]})",
        f"instance replica-3 (node-05, node-06, {urls[2]})",
        f"instance replica-4 (node-07, node-08, {urls[3]})",
    ]


def test_the_json_document_lists_the_instances_and_fails_while_one_is_down(
    tmp_path: Path,
) -> None:
    plan = _plan(TP_FLEET)
    urls = [i.url for i in plan.pools[0].instances]
    endpoint = EndpointStatus(
        url=plan.endpoint, models=("kimi-k2",), router_ready=True, workers=tuple(_healthy(urls))
    )
    doc = document(
        TP_FLEET, plan, [], endpoint, tmp_path, fleet_status(plan, [], endpoint.workers), []
    )
    assert doc["ok"]
    split = document(TP_FLEET, plan, [], endpoint, tmp_path, (), ["front: held by two hosts"])
    assert (split["ok"], split["problems"]) == (False, ["front: held by two hosts"])
    assert [i["instance"] for i in doc["instances"] if i["up"]] == [
        f"replica-{n}" for n in range(1, 5)
    ]
    down = EndpointStatus(
        url=plan.endpoint, models=("kimi-k2",), router_ready=True,
        workers=tuple(_healthy(urls[1:])),
    )  # fmt: skip
    fleet = fleet_status(plan, [], down.workers)
    assert not document(TP_FLEET, plan, [], down, tmp_path, fleet, [])["ok"]


def test_a_single_instance_plan_has_no_instances() -> None:
    assert fleet_status(_plan(EXAMPLES / "sglang-tp.ini"), [], []) == ()


def test_the_fleet_line_counts_each_pools_instances_up_and_the_routers_load() -> None:
    plan = _plan(EXAMPLES / "sglang-pd-fleet-32.ini")
    urls = [i.url for p in plan.pools for i in p.instances]
    workers = [RouterWorker(url=u, kind="x", healthy=n != 3, load=n) for n, u in enumerate(urls)]
    fleet = fleet_status(plan, [], workers)
    assert fleet_line(fleet, workers) == (
        "fleet: 3/4 instances up (prefill 2/2, decode 1/2), 6 requests in flight"
    )
    tp = _plan(TP_FLEET)
    replicas = _healthy([i.url for i in tp.pools[0].instances])
    assert fleet_line(fleet_status(tp, [], replicas), replicas) == "fleet: 4/4 instances up"


def test_the_routers_load_is_read_from_its_worker_list() -> None:
    body = {
        "workers": [
            {"url": "http://a:1", "worker_type": "regular", "is_healthy": True, "load": 2},
            {"url": "http://b:1", "is_healthy": False},
        ]
    }
    assert [(w.url, w.healthy, w.load) for w in router_workers(body)] == [
        ("http://a:1", True, 2),
        ("http://b:1", False, None),
    ]
