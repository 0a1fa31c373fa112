"""The front tier: two or more [router] hosts behind one floating address (k2_front_address).
The plan's front, each router behind it, HAProxy's and keepalived's configurations, and every
value the inventory may get wrong, refused before any host is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.front import (
    front_interface,
    front_writes,
)
from k2provision.core.records import Plan
from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from k2provision.plan.front import (
    HAPROXY_CONFIG,
    KEEPALIVED_CONFIG,
    haproxy_config,
    keepalived_config,
)
from k2provision.plan.inventory import load_cluster

EXAMPLES = Path(__file__).resolve().parents[3] / "inventory" / "examples"
PD_FLEET = EXAMPLES / "sglang-pd-fleet-32.ini"
TP_FLEET = EXAMPLES / "sglang-tp-fleet.ini"
ROUTER = ("python3", "-m", "sglang_router.launch_router")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_cluster(PD_FLEET))


def _edited(tmp_path: Path, source: Path, *changes: tuple[str, str]) -> Path:
    text = source.read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / source.name
    path.write_text(text)
    return path


def _refused(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        build_plan(load_cluster(path))
    return caught.value.problems


def test_the_32_node_example_has_two_routers_behind_one_floating_address(plan: Plan) -> None:
    front = plan.front
    assert front is not None
    assert (front.address, front.prefix, front.vrid, front.port) == ("10.10.0.100", 24, 51, 8000)
    assert [(h.name, h.address, h.priority) for h in front.hosts] == [
        ("gpu-r01", "10.10.0.5", 150),
        ("gpu-r02", "10.10.0.6", 140),
    ]
    assert plan.endpoint == "http://10.10.0.100:8000"
    assert plan.endpoint_host == "gpu-r01"
    assert [(r.host, r.url) for r in plan.routers] == [
        ("gpu-r01", "http://10.10.0.5:8080"),
        ("gpu-r02", "http://10.10.0.6:8080"),
    ]
    assert plan.routers == front.routers
    for router in plan.routers:
        host = plan.host(router.host)
        (process,) = host.processes
        argv = process.argv
        assert argv[:3] == ROUTER
        # Each router serves on its own private address, where HAProxy reaches it; every
        # router knows every instance from its command line.
        assert argv[argv.index("--host") + 1] == host.local_ip
        assert argv[argv.index("--port") + 1] == "8080"
        assert argv.count("--prefill") == 2
        assert argv.count("--decode") == 2
        assert process.health is not None
        assert process.health.url == f"http://{host.local_ip}:8080/readiness"
        ports = {(p.setting, p.port, p.public, p.process) for p in host.ports}
        assert ports == {
            ("k2_router_port", 8080, False, "sglang-router"),
            ("k2_router_metrics_port", 29000, False, "sglang-router"),
            ("k2_api_port", 8000, True, "haproxy"),
        }


def test_one_router_plans_as_before_without_a_front() -> None:
    plan = build_plan(load_cluster(TP_FLEET))
    assert plan.front is None
    (router,) = plan.routers
    assert router.url == plan.endpoint
    assert router.host == plan.endpoint_host
    process = next(p for p in plan.host(router.host).processes if p.argv[:3] == ROUTER)
    assert process.argv[process.argv.index("--port") + 1] == "8000"


def test_keepalived_holds_the_address_with_adverts_to_the_other_front_host(plan: Plan) -> None:
    assert plan.front is not None
    text = keepalived_config(plan.front, "gpu-r02", "bond0")
    for line in (
        "    vrrp_version 3\n",
        "    state BACKUP\n",
        "    nopreempt\n",
        "    interface bond0\n",
        "    virtual_router_id 51\n",
        "    priority 140\n",
        "    advert_int 0.5\n",
        "    unicast_src_ip 10.10.0.6\n",
        "    unicast_peer {\n        10.10.0.5\n    }\n",
        "        10.10.0.100/24 dev bond0\n",
        '    script "/usr/bin/pgrep -x haproxy"\n',
        "        k2_front_haproxy\n",
    ):
        assert line in text, line
    # No weight on the tracked script: HAProxy down puts the instance in FAULT, which gives
    # the address up even under nopreempt.
    assert "weight" not in text
    assert "priority 150" in keepalived_config(plan.front, "gpu-r01", "bond0")


def test_haproxy_spreads_over_every_router_and_checks_each(plan: Plan) -> None:
    assert plan.front is not None
    text = haproxy_config(plan.front, "gpu-r01")
    for line in (
        "    bind :8000\n",
        "    balance roundrobin\n",
        "    http-check send meth GET uri /health\n",
        "    http-check expect status 200\n",
        "    server gpu-r01 10.10.0.5:8080 check\n",
        "    server gpu-r02 10.10.0.6:8080 check\n",
        "    timeout server 7200s\n",
        "    retry-on conn-failure empty-response\n",
        "    timeout connect 500ms\n",
        "    default-server inter 500ms fastinter 250ms fall 2 rise 2 observe layer4 error-limit 1"
        " on-error mark-down\n",
        "    stats socket /var/lib/haproxy/k2-admin.sock mode 600 level admin\n",
    ):
        assert line in text, line


def test_the_role_writes_both_files_on_the_interface_that_holds_the_host(plan: Plan) -> None:
    data = plan.model_dump(mode="json")
    ip_output = "2: eth0    inet 10.10.0.6/24 brd 10.10.0.255 scope global eth0\\ ...\n"
    assert front_interface(data, "gpu-r02", ip_output) == "eth0"
    assert front_interface(data, "gpu-r02", "") == ""
    writes = front_writes(data, "gpu-r02", "eth0")
    assert [w["path"] for w in writes] == [HAPROXY_CONFIG, KEEPALIVED_CONFIG]
    assert all(w["mode"] == "0644" for w in writes)
    with pytest.raises(ValueError, match="gpu-p01 is no front host"):
        front_writes(data, "gpu-p01", "eth0")


def test_a_named_interface_is_used_as_given(tmp_path: Path) -> None:
    path = _edited(
        tmp_path, PD_FLEET, ("k2_front_address=", "k2_front_interface=bond1\nk2_front_address=")
    )
    data = build_plan(load_cluster(path)).model_dump(mode="json")
    assert front_interface(data, "gpu-r01", "") == "bond1"


ADDRESS = "k2_front_address=10.10.0.100/24"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            [("gpu-r02 ansible_host=10.10.0.6\n", "")],
            "k2_front_address=10.10.0.100/24: one router host (gpu-r01) would hold it alone, "
            "which is no failover",
        ),
        (
            [(ADDRESS + "\n", "")],
            "[router] has 2 hosts (gpu-r01, gpu-r02): several routers share the endpoint behind "
            "one floating address, and k2_front_address is unset",
        ),
        (
            [(ADDRESS, "k2_front_address=10.10.0.100")],
            "k2_front_address=10.10.0.100 has no prefix",
        ),
        (
            [(ADDRESS, "k2_front_address=fd00::100/64")],
            "k2_front_address=fd00::100/64 is IPv6",
        ),
        (
            [(ADDRESS, "k2_front_address=10.10.0.100/32")],
            "a /32 network holds no other host",
        ),
        (
            [(ADDRESS, "k2_front_address=10.10.0.255/24")],
            "k2_front_address=10.10.0.255/24 is the broadcast address of 10.10.0.0/24",
        ),
        (
            [(ADDRESS, "k2_front_address=10.10.0.11/24")],
            "gpu-p01: ansible_host=10.10.0.11 is the front's floating address",
        ),
        (
            [("gpu-r02 ansible_host=10.10.0.6", "gpu-r02 ansible_host=10.10.9.6")],
            "gpu-r02: ansible_host=10.10.9.6 is outside 10.10.0.0/24, the network of "
            "k2_front_address=10.10.0.100/24",
        ),
        (
            [("gpu-r02 ansible_host=10.10.0.6", "gpu-r02 ansible_host=r02.example")],
            "gpu-r02: ansible_host=r02.example is a name, not an address; expected every "
            "[router] host of a front",
        ),
        (
            [(ADDRESS, ADDRESS + "\nk2_front_vrid=256")],
            "k2_front_vrid",
        ),
    ],
)
def test_a_front_that_cannot_work_is_refused_before_any_host(
    tmp_path: Path, changes: list[tuple[str, str]], expected: str
) -> None:
    problems = _refused(_edited(tmp_path, PD_FLEET, *changes))
    assert any(expected in p for p in problems), problems


def test_front_settings_without_a_front_are_warned_as_idle(tmp_path: Path) -> None:
    path = _edited(
        tmp_path,
        PD_FLEET,
        ("gpu-r02 ansible_host=10.10.0.6\n", ""),
        (ADDRESS + "\n", "k2_router_port=8090\n"),
    )
    plan = build_plan(load_cluster(path))
    assert plan.front is None
    assert any("k2_router_port=8090 has nothing to act on" in w for w in plan.warnings)


def test_the_vrrp_listener_reads_an_adverts_version_id_and_priority() -> None:
    from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.modules import (
        vrrp_adverts,
    )

    ip = bytes([0x45]) + bytes(19)  # an IPv4 header of 20 bytes
    v2 = bytes([0x21, 51, 150, 1, 0, 1, 0, 0]) + bytes(12)
    assert vrrp_adverts.parse_advert(ip + v2) == {"version": 2, "vrid": 51, "priority": 150}
    v3 = bytes([0x31, 7, 100, 1, 0, 100, 0, 0])
    assert vrrp_adverts.parse_advert(ip + v3) == {"version": 3, "vrid": 7, "priority": 100}
    # Options in the IP header (IHL 6) are skipped.
    assert vrrp_adverts.parse_advert(bytes([0x46]) + bytes(23) + v2)["vrid"] == 51  # type: ignore[index]
    assert vrrp_adverts.parse_advert(ip + bytes([0x22, 51, 0, 0])) is None  # not an advert
    assert vrrp_adverts.parse_advert(ip + bytes([0x11, 51, 0, 0])) is None  # VRRP version 1
    assert vrrp_adverts.parse_advert(ip[:10]) is None
    assert vrrp_adverts.parse_advert(bytes([0x60]) + bytes(40)) is None  # IPv6
