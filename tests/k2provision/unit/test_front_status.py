"""`status` on a front: each front host's answer (does it hold the address, do HAProxy and
keepalived run, which workers its router lists) read from the probe's own output format, and
the front judged as a whole: one holder, every front host reached, every router complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2provision.core.records import Plan
from k2provision.ops.front_status import FrontHostStatus, front_problems, front_view
from k2provision.ops.status_probe import HostStatus, host_status, status_probe
from k2provision.plan.assemble import build_plan
from k2provision.plan.host_questions import hq
from k2provision.plan.inventory import load_cluster

PD_FLEET = Path(__file__).resolve().parents[3] / "inventory" / "examples" / "sglang-pd-fleet-32.ini"
INSTANCES = (
    "http://10.10.0.11:30000",
    "http://10.10.0.15:30000",
    "http://10.10.0.31:30000",
    "http://10.10.0.43:30000",
)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_cluster(PD_FLEET))


def answer(
    plan: Plan,
    host: str,
    holds: bool = False,
    daemons: tuple[str, ...] = ("haproxy", "keepalived"),
    workers: tuple[str, ...] = INSTANCES,
    servers: tuple[str, str] = ("UP", "UP"),
) -> str:
    """What the front host's probe prints: its other questions unanswered (rc 1). `servers`:
    how its HAProxy counts gpu-r01's and gpu-r02's routers (`show stat`, the columns cut to a
    few of HAProxy's, in its order)."""
    asked = status_probe(plan, plan.host(host))
    front = asked.front
    assert front is not None
    assert front.workers is not None
    replies = {
        front.address.key: hq.Answer(
            (f"2: eth0    inet {plan.front.address}/24 scope global eth0",) if holds else (), (), 0
        )
        if plan.front
        else hq.Answer(),
        front.daemons.key: hq.Answer(tuple(f"{n} {d}" for n, d in enumerate(daemons, 100)), (), 0),
        front.workers.key: hq.Answer(
            (json.dumps({"workers": [{"url": u, "is_healthy": True} for u in workers]}),), (), 0
        ),
        front.servers.key: hq.Answer(
            (
                "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status",
                "k2_endpoint,FRONTEND,,,3,9,4096,120,OPEN",
                f"k2_routers,gpu-r01,0,0,2,5,,60,{servers[0]}",
                f"k2_routers,gpu-r02,0,0,1,4,,60,{servers[1]}",
                "k2_routers,BACKEND,0,0,3,9,410,120,UP",
                "",
            ),
            (),
            0,
        ),
    }
    text = "".join(
        hq.render_answer(t.key, replies.get(t.key, hq.Answer((), (), 1)))
        for t in asked.batch.tickets
    )
    return text + hq.END


def test_a_front_host_is_asked_for_the_address_its_daemons_and_its_routers_workers(
    plan: Plan,
) -> None:
    asked = status_probe(plan, plan.host("gpu-r02"))
    assert asked.front is not None
    script = asked.batch.script()
    assert "ip -o -4 addr show to 10.10.0.100/32" in script
    assert "pgrep -l -x 'haproxy|keepalived'" in script
    assert "/var/lib/haproxy/k2-admin.sock 'show stat'" in script
    assert "http://10.10.0.6:8080/workers" in script
    assert "/etc/k2provision/secrets/api_key" in script  # the key is read there, on the host
    assert status_probe(plan, plan.host("gpu-p01")).front is None


def test_a_whole_front_host_has_no_problem(plan: Plan) -> None:
    status = host_status(plan, plan.host("gpu-r01"), answer(plan, "gpu-r01", holds=True))
    assert status.front == FrontHostStatus(
        holds=True,
        haproxy=True,
        keepalived=True,
        router="http://10.10.0.5:8080",
        workers=tuple((u, True) for u in INSTANCES),
        instances=INSTANCES,
        servers=(("gpu-r01", "UP"), ("gpu-r02", "UP")),
    )
    assert status.front.problems == []


def test_a_router_its_haproxy_does_not_count_up_is_named(plan: Plan) -> None:
    text = answer(plan, "gpu-r01", servers=("UP", "DRAIN"))
    status = host_status(plan, plan.host("gpu-r01"), text)
    assert status.front is not None
    assert status.front.problems == [
        "HAProxy here counts the router on gpu-r02 DRAIN: it sends it no request; fix: "
        "`k2provision restart INVENTORY --limit gpu-r02` replaces that router and puts it back "
        "once it lists every worker (a router change that stopped left it out)"
    ]
    down = host_status(plan, plan.host("gpu-r01"), answer(plan, "gpu-r01", servers=("UP", "DOWN")))
    assert down.front is not None
    assert down.front.problems == [
        "HAProxy here counts the router on gpu-r02 DOWN: it sends it no request"
    ]


def test_a_stopped_daemon_and_a_router_missing_an_instance_are_named(plan: Plan) -> None:
    text = answer(plan, "gpu-r02", daemons=("keepalived",), workers=INSTANCES[:3])
    problems = host_status(plan, plan.host("gpu-r02"), text).problems
    assert "haproxy is not running (the front's HTTP spreader here is gone)" in problems
    assert (
        "router http://10.10.0.6:8080 lists 3 of 4 instances healthy; "
        "not: http://10.10.0.43:30000" in problems
    )


def _hosts(plan: Plan, holders: set[str], down: set[str] = frozenset()) -> list[HostStatus]:
    found = []
    for name in ("gpu-r01", "gpu-r02"):
        if name in down:
            found.append(HostStatus(name, "router", unreachable="Connection refused"))
        else:
            found.append(
                host_status(plan, plan.host(name), answer(plan, name, holds=name in holders))
            )
    return found


def test_the_front_has_one_holder_or_says_what_is_wrong(plan: Plan) -> None:
    lines, problems = front_view(plan, _hosts(plan, {"gpu-r01"}))
    assert problems == []
    assert lines[0] == "front 10.10.0.100: held by gpu-r01"
    assert "front host gpu-r02: haproxy up, keepalived up, router" in lines[2]
    assert lines[2].endswith(
        "4/4 instances healthy; its HAProxy counts the routers gpu-r01 UP, gpu-r02 UP"
    )
    (split,) = front_view(plan, _hosts(plan, {"gpu-r01", "gpu-r02"}))[1]
    assert split.startswith("split brain: gpu-r01, gpu-r02 each hold the front's address")
    (nobody,) = front_view(plan, _hosts(plan, set()))[1]
    assert nobody.startswith("no front host holds the address 10.10.0.100")
    down = front_view(plan, _hosts(plan, {"gpu-r01"}, down={"gpu-r02"}))[1]
    assert down == [
        "front host gpu-r02 is down (unreachable): the address has one holder fewer to move to"
    ]
    assert (
        front_problems(
            build_plan(load_cluster(PD_FLEET.with_name("sglang-tp-fleet.ini"))), {}, set()
        )
        == []
    )
