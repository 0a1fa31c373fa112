"""`status` on a fleet: each instance is up only while its hosts are fine and the router lists
its worker healthy; an instance down is a problem line (exit 1)."""

from __future__ import annotations

from pathlib import Path

from k2provision.commands.status import document, problem_lines
from k2provision.ops.status_probe import (
    EndpointStatus,
    HostStatus,
    RouterWorker,
    fleet_status,
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
    doc = document(TP_FLEET, plan, [], endpoint, tmp_path)
    assert doc["ok"]
    assert [i["instance"] for i in doc["instances"] if i["up"]] == [
        f"replica-{n}" for n in range(1, 5)
    ]
    down = EndpointStatus(
        url=plan.endpoint, models=("kimi-k2",), router_ready=True,
        workers=tuple(_healthy(urls[1:])),
    )  # fmt: skip
    assert not document(TP_FLEET, plan, [], down, tmp_path)["ok"]


def test_a_single_instance_plan_has_no_instances() -> None:
    assert fleet_status(_plan(EXAMPLES / "sglang-tp.ini"), [], []) == ()
