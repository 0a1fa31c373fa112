"""Every listener in one port plan (plan/ports.py): the engine's, the router's, the weights
relay's and the monitoring phase's (node and DCGM exporters, Prometheus, Grafana) share no port
on a host, and none takes the port Ansible reaches the host's sshd on, however the inventory
spells it (ansible_port or ansible_ssh_port; core/connection.py). Each refusal names the host,
both listeners with their variables (or that the port is fixed), the expectation and the fix."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2provision.core import connection
from k2provision.errors import InventoryError
from k2provision.ops.connect import ssh_command, ssh_target
from k2provision.ops.remote import run_one
from k2provision.plan import monitoring
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import cluster_from_groups

VLLM = {"k2_engine": "vllm", "k2_layout": "tp"}
SGLANG = {"k2_engine": "sglang", "k2_layout": "tp", "k2_gpu": "b200"}
PD = {"k2_engine": "sglang", "k2_layout": "pd", "k2_gpu": "b200"}
TRTLLM = {"k2_engine": "trtllm", "k2_layout": "tp_ep"}
FIXED = {
    monitoring.NODE_EXPORTER_PORT: "the node exporter",
    monitoring.DCGM_EXPORTER_PORT: "the DCGM exporter",
    monitoring.PROMETHEUS_PORT: "Prometheus",
    monitoring.GRAFANA_PORT: "Grafana",
}


def nodes(base: dict[str, Any], count: int = 1, **extra: Any) -> dict[str, dict[str, Any]]:
    return {f"n{i}": {**base, "ansible_host": f"10.0.0.{i}", **extra} for i in range(1, count + 1)}


def refusals(groups: dict[str, list[str]], host_vars: dict[str, dict[str, Any]]) -> list[str]:
    """The refusal lines of an inventory as Ansible resolved it, through the plan ([] when it
    plans)."""
    try:
        build_plan(cluster_from_groups("inv.ini", groups, host_vars))
    except InventoryError as refused:
        return list(refused.problems)
    return []


def one_host(base: dict[str, Any], **extra: Any) -> list[str]:
    return refusals({"nodes": ["n1"]}, nodes(base, **extra))


# ------------------------------------------------------------ the monitoring phase's listeners

MONITORING_CASES = [
    ("api-on-node-exporter", VLLM, {"k2_api_port": 9100}, "k2_api_port=9100", "node exporter"),
    ("api-on-dcgm", VLLM, {"k2_api_port": 9400}, "k2_api_port=9400", "DCGM exporter"),
    ("api-on-prometheus", VLLM, {"k2_api_port": 9090}, "k2_api_port=9090", "Prometheus"),
    ("api-on-grafana", VLLM, {"k2_api_port": 3000}, "k2_api_port=3000", "Grafana"),
    ("sglang-on-node", SGLANG, {"k2_sglang_port": 9100}, "k2_sglang_port=9100", "node exporter"),
    ("dist-run-on-dcgm", SGLANG, {"k2_dist_port": 9400}, "k2_dist_port=9400", "DCGM exporter"),
    ("sglang-on-grafana", SGLANG, {"k2_sglang_port": 3000}, "k2_sglang_port=3000", "Grafana"),
    ("relay-on-node", VLLM, {"k2_weights_port": 9100}, "k2_weights_port=9100", "node exporter"),
    ("relay-on-prom", VLLM, {"k2_weights_port": 9090}, "k2_weights_port=9090", "Prometheus"),
]


@pytest.mark.parametrize(
    ("base", "extra", "variable", "what"),
    [c[1:] for c in MONITORING_CASES],
    ids=[c[0] for c in MONITORING_CASES],
)
def test_a_port_of_the_monitoring_phase_is_refused_naming_both(
    base: dict[str, Any], extra: dict[str, Any], variable: str, what: str
) -> None:
    found = one_host(base, **extra)
    name = variable.split("=", maxsplit=1)[0]
    lines = [line for line in found if variable in line and what in line]
    assert len(lines) == 1, found
    line = lines[0]
    assert line.startswith("n1: ")
    assert "fixed in roles/k2_monitoring" in line
    assert "expected distinct ports on one host" in line
    assert f"fix: set {name} to a port free on this host" in line


def test_two_variables_on_one_port_name_both_in_the_fix() -> None:
    found = one_host(VLLM, k2_api_port=8100, k2_weights_port=8100)
    assert found == [
        "n1: k2_api_port=8100 (the vLLM API server) and k2_weights_port=8100 (the weights relay) "
        "both listen on this host; expected distinct ports on one host; fix: move one of them "
        "(k2_api_port or k2_weights_port) to a port free on this host"
    ]


def test_the_server_listeners_follow_the_monitoring_host_and_its_switch() -> None:
    two = nodes(VLLM, 2, k2_api_port=9090)
    assert any("Prometheus" in line for line in refusals({"nodes": ["n1", "n2"]}, two))
    # [monitoring] elsewhere: Prometheus and Grafana are not on the endpoint's host.
    assert not refusals({"nodes": ["n1", "n2"], "monitoring": ["n2"]}, two)
    # A [monitoring] host outside the plan (which the role refuses) moves them off it too.
    assert not refusals({"nodes": ["n1", "n2"], "monitoring": ["mon"]}, two)
    # Named there, they are.
    found = refusals({"nodes": ["n1", "n2"], "monitoring": ["n1"]}, two)
    assert any(line.startswith("n1: k2_api_port=9090") for line in found)
    # k2_monitoring_server=false (any spelling Ansible's bool accepts) runs neither.
    for off in (False, "false", "no", "0"):
        assert not one_host(VLLM, k2_api_port=9090, k2_monitoring_server=off), off
    # The lab runs no Prometheus or Grafana, but its stand-in exporters hold their ports.
    assert not one_host({**VLLM, "k2_lab": True}, k2_api_port=9090)
    assert any(
        "node exporter" in line for line in one_host({**VLLM, "k2_lab": True}, k2_api_port=9100)
    )


def test_a_router_only_host_runs_no_dcgm_exporter() -> None:
    host_vars = {
        "p": {**PD, "ansible_host": "10.0.0.1"},
        "d1": {**PD, "ansible_host": "10.0.0.2"},
        "d2": {**PD, "ansible_host": "10.0.0.3"},
        "r": {**PD, "ansible_host": "10.0.0.4"},
    }
    groups = {"prefill": ["p"], "decode": ["d1", "d2"], "router": ["r"]}
    for h in host_vars.values():
        h["k2_router_metrics_port"] = 9400
    assert not [line for line in refusals(groups, host_vars) if line.startswith("r:")]
    for h in host_vars.values():
        h["k2_router_metrics_port"] = 9100
    found = refusals(groups, host_vars)
    assert any(line.startswith("r: k2_router_metrics_port=9100") for line in found), found


def test_the_mesh_sshd_is_in_the_plan_too() -> None:
    found = refusals({"nodes": ["n1", "n2"]}, nodes({**TRTLLM, "k2_ssh_port": 9100}, 2))
    assert any(
        line.startswith("n1, n2: k2_ssh_port=9100 (the containers' sshd) and port 9100")
        for line in found
    ), found


# --------------------------------------------------------------------- the host's SSH port

DP_EP = {**VLLM, "k2_layout": "dp_ep"}
# (case, engine, connection variables, listener settings, fragments of the one line)
SSH_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], tuple[str, ...]]] = [
    ("default-22", VLLM, {}, {"k2_api_port": 22}, ("k2_api_port=22", "22 (Ansible's default")),
    ("port", VLLM, {"ansible_port": 2200}, {"k2_api_port": 2200}, ("ansible_port=2200",)),
    ("alias", VLLM, {"ansible_ssh_port": 2222}, {"k2_api_port": 2222}, ("ansible_ssh_port=2222",)),
    (
        "alias-wins",
        VLLM,
        {"ansible_port": 2200, "ansible_ssh_port": 2222},
        {"k2_api_port": 2222},
        ("ansible_ssh_port=2222",),
    ),
    (
        "alias-as-text",
        VLLM,
        {"ansible_ssh_port": "2222"},
        {"k2_api_port": 2222},
        ("k2_api_port=2222", "ansible_ssh_port=2222"),
    ),
    ("relay", VLLM, {"ansible_port": 2200}, {"k2_weights_port": 2200}, ("k2_weights_port=2200",)),
    ("sglang", SGLANG, {}, {"k2_sglang_port": 22}, ("k2_sglang_port=22", "the SGLang server")),
    (
        "exporter",
        VLLM,
        {"ansible_port": 9100},
        {},
        (
            "port 9100 (the node exporter",
            "fix: run the host's sshd on another port and set ansible_port to it",
        ),
    ),
    (
        "grafana-alias",
        VLLM,
        {"ansible_ssh_port": 3000},
        {},
        ("port 3000 (Grafana", "set ansible_ssh_port to it"),
    ),
]


@pytest.mark.parametrize(
    ("base", "connect", "ports", "fragments"),
    [c[1:] for c in SSH_CASES],
    ids=[c[0] for c in SSH_CASES],
)
def test_no_listener_takes_the_ssh_port_however_it_is_spelt(
    base: dict[str, Any], connect: dict[str, Any], ports: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    found = one_host(base, **connect, **ports)
    lines = [line for line in found if "is the host's SSH port" in line]
    assert len(lines) == 1, found
    assert lines[0].startswith("n1: ")
    assert all(f in lines[0] for f in fragments), lines[0]
    assert "expected every listener on a port sshd does not hold; fix: " in lines[0]


def test_the_shadowed_spelling_is_not_the_ssh_port() -> None:
    """ansible_ssh_port wins over ansible_port: the port ansible_port names is free."""
    assert not one_host(VLLM, ansible_port=8000, ansible_ssh_port=2222)
    assert one_host(VLLM, ansible_port=2222, ansible_ssh_port=8000)


def test_the_engine_port_of_every_host_is_checked() -> None:
    found = refusals({"nodes": ["n1", "n2"]}, nodes(SGLANG, 2, k2_sglang_port=22))
    assert any(line.startswith("n1: k2_sglang_port=22") for line in found), found
    found = refusals({"nodes": ["n1", "n2"]}, nodes(DP_EP, 2, ansible_ssh_port=13345))
    assert any(
        line.startswith("n1: k2_dp_rpc_port=13345") and "ansible_ssh_port=13345" in line
        for line in found
    ), found
    # The weights relay runs on every host.
    found = refusals({"nodes": ["n1", "n2"]}, nodes(SGLANG, 2, k2_weights_port=22))
    assert any(line.startswith("n1, n2: k2_weights_port=22") for line in found), found


def test_the_mesh_port_is_not_the_ssh_port() -> None:
    found = refusals({"nodes": ["n1", "n2"]}, nodes(TRTLLM, 2, ansible_port=2233))
    assert any(
        line.startswith("n1, n2: k2_ssh_port=2233 (the containers' sshd) is the host's SSH port")
        for line in found
    ), found


PORTS = (22, 2200, 2233, 3000, 5757, 6379, 8000, 8100, 9090, 9100, 9400, 13345, 30000)
SETTINGS = ("k2_api_port", "k2_ray_port", "k2_dp_rpc_port", "k2_weights_port", "k2_sglang_port")


@settings(max_examples=60, deadline=None)
@given(
    engine=st.sampled_from(
        [VLLM, {**VLLM, "k2_layout": "dp_ep"}, SGLANG, {**VLLM, "k2_lab": True}]
    ),
    chosen=st.dictionaries(st.sampled_from(SETTINGS), st.sampled_from(PORTS)),
    connect=st.dictionaries(st.sampled_from(connection.PORT_VARS), st.sampled_from(PORTS)),
)
def test_a_plan_has_one_listener_per_port_and_none_on_ssh_or_it_is_refused(
    engine: dict[str, Any], chosen: dict[str, int], connect: dict[str, int]
) -> None:
    """Over port assignments and both spellings of the SSH port: either every line of the
    refusal names a listener, the expectation and a fix, or every host's recorded ports and the
    monitoring ports it runs are distinct and clear of its SSH port."""
    if engine is not SGLANG:
        chosen.pop("k2_sglang_port", None)  # an SGLang port on vLLM is refused for that
    host_vars = nodes(engine, 2, **connect, **chosen)
    ssh = int(str(connection.ssh_port(host_vars["n1"]).value))
    try:
        plan = build_plan(cluster_from_groups("inv.ini", {"nodes": ["n1", "n2"]}, host_vars))
    except InventoryError as refused:
        for line in refused.problems:
            if "listen" in line or "SSH port" in line:
                assert line.split(": ")[0] in ("n1", "n2", "n1, n2"), line
                assert "expected" in line, line
                assert "fix: " in line, line
                assert "k2_" in line or "fixed in" in line, line
        return
    for host in plan.hosts:
        ports = [p.port for p in host.ports] + [
            monitoring.NODE_EXPORTER_PORT,
            monitoring.DCGM_EXPORTER_PORT,
        ]
        if host.name == plan.endpoint_host and not plan.lab:
            ports += [monitoring.PROMETHEUS_PORT, monitoring.GRAFANA_PORT]
        ports += [int(chosen.get("k2_weights_port", 8765))]
        assert len(ports) == len(set(ports)), (host.name, ports)
        assert ssh not in ports, (host.name, ssh, ports)


# -------------------------------------------------- one resolver, as Ansible's ssh plugin reads


SPELLINGS: list[dict[str, Any]] = [
    {},
    {"ansible_host": "10.0.0.5"},
    {"ansible_ssh_host": "10.0.0.6"},
    {"ansible_host": "10.0.0.5", "ansible_ssh_host": "10.0.0.6"},
    {"ansible_port": 2200},
    {"ansible_ssh_port": 2222},
    {"ansible_port": 2200, "ansible_ssh_port": 2222},
    {"ansible_host": "a.example", "ansible_ssh_host": "b.example", "ansible_port": 2200},
]


def _port_of(argv: list[str]) -> int:
    ports = [int(o.split("=", 1)[1]) for o in argv if o.startswith("Port=")]
    return ports[-1] if ports else connection.DEFAULT_SSH_PORT


@pytest.mark.parametrize("variables", SPELLINGS, ids=[str(v) for v in SPELLINGS])
def test_the_resolver_agrees_with_ansibles_ssh_plugin(variables: dict[str, Any]) -> None:
    """The address and port the plan reads are those Ansible's own ssh connection plugin
    connects to (its argv), for every spelling and both together."""
    argv = ssh_command(ssh_target("inv-name", variables), "true")
    assert argv[-2] == connection.host_address("inv-name", variables).value
    assert _port_of(argv) == int(str(connection.ssh_port(variables).value))
    assert ssh_target("inv-name", variables).host == argv[-2]


@pytest.mark.parametrize("variables", SPELLINGS, ids=[str(v) for v in SPELLINGS])
def test_the_cluster_reads_the_resolved_address_and_port(variables: dict[str, Any]) -> None:
    others = {"n2": {**VLLM, "ansible_host": "10.0.0.2"}}
    cluster = cluster_from_groups(
        "inv.ini", {"nodes": ["n1", "n2"]}, {"n1": {**VLLM, **variables}, **others}
    )
    host = cluster.host("n1")
    address = connection.host_address("n1", variables)
    port = connection.ssh_port(variables)
    assert (host.address, host.address_from) == (address.value, address.variable or "")
    assert (host.ssh_port, host.ssh_port_from) == (port.value, port.variable or "")


@pytest.mark.parametrize(
    ("variables", "fragment"),
    [
        ({"ansible_ssh_host": "10.0.0.1:2222"}, "n1: ansible_ssh_host=10.0.0.1:2222 holds a port"),
        ({"ansible_ssh_port": 70000}, "n1: ansible_ssh_port=70000 is out of range"),
        ({"ansible_ssh_port": "ssh"}, "n1: ansible_ssh_port=ssh is not a port number"),
        ({"ansible_port": 22, "ansible_ssh_port": 0}, "n1: ansible_ssh_port=0 is out of range"),
    ],
)
def test_a_bad_alias_is_refused_by_its_own_name(variables: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InventoryError) as refused:
        cluster_from_groups("inv.ini", {"nodes": ["n1"]}, {"n1": {**VLLM, **variables}})
    lines = [line for line in refused.value.problems if line.startswith(fragment)]
    assert len(lines) == 1, refused.value.problems
    assert "fix: set ansible_ssh_" in lines[0]


def test_an_unreachable_host_is_named_by_the_spelling_ansible_used() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    variables = {"ansible_host": "10.255.0.9", "ansible_ssh_host": "127.0.0.1"}
    reply = run_one(ssh_target("down", {**variables, "ansible_ssh_port": port}), "true", 15)
    assert not reply.reached
    expected = f"ansible_ssh_host=127.0.0.1 ansible_ssh_port={port}: Connection refused"
    assert expected in reply.unreachable, reply.unreachable
