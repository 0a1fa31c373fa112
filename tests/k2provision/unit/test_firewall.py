"""The k2_firewall role's ruleset (core/firewall.py): the endpoint's port from anywhere, SSH,
the cluster's own addresses and the trusted subnets accepted, the rest dropped; and nft
itself accepts the file (`nft -c`, Debian's nftables: scripts/install-lab-deps). Where the
firewall is on, the plan refuses what it would shut out: a host written by DNS name (in either
of Ansible's spellings), a trusted entry that is no address, and an SSH port list without the
port Ansible connects to (ansible_ssh_port, else ansible_port, else 22)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.firewall import (
    ssh_port,
)
from k2provision.core.firewall import ruleset
from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import cluster_from_groups, load_cluster
from tests.golden_cases import expected_path

ROOT = Path(__file__).resolve().parents[3]


def _plan(case: str) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(expected_path(case).read_text())["plan"]
    return plan


def _endpoint_host(plan: dict[str, Any]) -> str:
    return str(plan["endpoint_host"])


def test_the_endpoint_host_opens_the_endpoint_and_ssh_and_trusts_the_cluster() -> None:
    plan = _plan("sglang-pd-1p1d")
    text = ruleset(plan, _endpoint_host(plan), [22, 2200], ["10.9.0.0/16", "not-an-address"])
    assert 'tcp dport { 22, 2200 } accept comment "SSH"' in text
    assert 'tcp dport { 8000 } accept comment "the endpoint"' in text
    assert "policy drop;" in text
    addresses = {a for h in plan["hosts"] for a in (h["address"], h["local_ip"])}
    for address in addresses:
        assert f"{address}/32" in text
    assert "10.9.0.0/16" in text
    assert "not-an-address" not in text
    assert "peers_v6" not in text
    # Replaced whole on every load: the table is created, deleted, then defined.
    assert text.index("delete table inet k2provision") < text.index("table inet k2provision {")


def test_other_hosts_open_only_ssh_to_the_world() -> None:
    plan = _plan("sglang-pd-1p1d")
    other = next(h["name"] for h in plan["hosts"] if h["name"] != _endpoint_host(plan))
    text = ruleset(plan, other, [22])
    assert "the endpoint" not in text
    assert 'tcp dport { 22 } accept comment "SSH"' in text


def test_ipv6_peers_go_in_their_own_set() -> None:
    plan = _plan("sglang-pd-ipv6")
    text = ruleset(plan, _endpoint_host(plan), [22])
    assert "ip6 saddr @peers_v6 accept" in text
    assert "ip saddr @peers_v4" not in text


def test_a_host_outside_the_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="nowhere is in no pool of the plan"):
        ruleset(_plan("sglang-tp"), "nowhere", [22])


@pytest.mark.parametrize("case", ["sglang-pd-1p1d", "sglang-pd-ipv6", "vllm-tp16"])
def test_nft_accepts_the_ruleset(case: str, tmp_path: Path) -> None:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    assert Path(nft).exists(), "nft is missing: scripts/install-lab-deps installs nftables"
    plan = _plan(case)
    path = tmp_path / "k2provision.nft"
    path.write_text(ruleset(plan, _endpoint_host(plan), [22], ["10.0.0.0/8", "fd00::/8"]))
    result = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_trtllm_fleet_instance_s_mesh_port_takes_its_own_hosts_only(tmp_path: Path) -> None:
    """Each instance of a TensorRT-LLM fleet is its own MPI world: on its hosts the mesh's
    k2_ssh_port drops every address but the instance's own (before the cluster's peers are
    accepted), and nft accepts the file; a single instance keeps the port open to its cluster."""
    plan = build_plan(load_cluster(ROOT / "inventory/examples/trtllm-tp-ep-fleet.ini")).model_dump(
        mode="json"
    )
    text = ruleset(plan, "node-05", [22])
    mesh = text[text.index("set mesh_v4") : text.index("chain input")]
    own = [f"10.20.1.{n}/32" for n in range(15, 19)]
    assert all(address in mesh for address in own), mesh
    assert "10.20.1.11/32" not in mesh  # replica-1's head: another world
    drop = 'tcp dport { 2233 } ip saddr != @mesh_v4 drop comment "the mpirun mesh: replica-2'
    assert drop in text
    assert text.index(drop) < text.index("ip saddr @peers_v4 accept")
    assert "mesh_v4" not in ruleset(plan, "router-01", [22])  # no mesh there
    nft = shutil.which("nft") or "/usr/sbin/nft"
    path = tmp_path / "k2provision.nft"
    path.write_text(text)
    result = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    single = _plan("trtllm-tp16-ep8")
    assert "mesh_v4" not in ruleset(single, _endpoint_host(single), [22])


def test_the_role_loads_the_file_it_checks_with_the_filter_of_this_module() -> None:
    tasks = (ROOT / "roles/k2_firewall/tasks/main.yml").read_text()
    assert "k2.cluster.firewall_ruleset(" in tasks
    assert "validate: nft -c -f %s" in tasks
    prepare = (ROOT / "playbooks/prepare.yml").read_text()
    assert 'k2_firewall_plan: "{{ k2_planned.plan }}"' in prepare


# ------------------------------------------------ what the plan refuses for the firewall

VLLM = {"k2_engine": "vllm", "k2_layout": "tp"}
ON = {**VLLM, "k2_firewall_enabled": True}


def firewall_refusals(host_vars: dict[str, dict[str, Any]]) -> list[str]:
    """The refusal lines of a two-host inventory as Ansible resolved it ([] when accepted)."""
    try:
        cluster_from_groups("inv.ini", {"nodes": ["n1", "n2"]}, host_vars)
    except InventoryError as refused:
        return list(refused.problems)
    return []


def two(base: dict[str, Any], n1: dict[str, Any], n2: dict[str, Any]) -> dict[str, Any]:
    return {"n1": {**base, **n1}, "n2": {**base, **n2}}


IP1, IP2 = {"ansible_host": "10.0.0.1"}, {"ansible_host": "10.0.0.2"}

# (case, host vars, the one line's start, fragments)
DNS_CASES: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    (
        "ansible_host-name",
        two(ON, IP1, {"ansible_host": "gpu2.example"}),
        "n2: ansible_host=gpu2.example is a DNS name",
        ("k2_firewall_enabled on n1, n2", "fix: set n2's k2_local_ip", "write ansible_host as"),
    ),
    (
        "alias-name",
        two(ON, IP1, {"ansible_ssh_host": "gpu2.example"}),
        "n2: ansible_ssh_host=gpu2.example is a DNS name",
        ("write ansible_ssh_host as an IP address",),
    ),
    (
        "alias-name-over-an-ip",
        two(ON, IP1, {"ansible_host": "10.0.0.2", "ansible_ssh_host": "gpu2.example"}),
        "n2: ansible_ssh_host=gpu2.example is a DNS name",
        ("expected an IP address for every host where the firewall is on",),
    ),
    (
        "inventory-name",
        two(ON, IP1, {}),
        "n2: the inventory name n2 (no ansible_host) is a DNS name",
        ("fix: set n2's k2_local_ip",),
    ),
    (
        "on-one-host-only",
        two(VLLM, {**IP1, "k2_firewall_enabled": "yes"}, {"ansible_host": "gpu2.example"}),
        "n2: ansible_host=gpu2.example is a DNS name",
        ("(k2_firewall_enabled on n1)",),
    ),
]


@pytest.mark.parametrize(
    ("host_vars", "start", "fragments"), [c[1:] for c in DNS_CASES], ids=[c[0] for c in DNS_CASES]
)
def test_a_host_written_by_name_is_refused_where_the_firewall_is_on(
    host_vars: dict[str, Any], start: str, fragments: tuple[str, ...]
) -> None:
    found = firewall_refusals(host_vars)
    lines = [line for line in found if line.startswith(start)]
    assert len(lines) == 1, found
    assert all(f in lines[0] for f in fragments), lines[0]


@pytest.mark.parametrize(
    "host_vars",
    [
        two(ON, IP1, {"ansible_host": "gpu2.example", "k2_local_ip": "10.0.0.2"}),
        two(ON, IP1, {"ansible_host": "gpu2.example", "ansible_ssh_host": "10.0.0.2"}),
        two(VLLM, IP1, {"ansible_host": "gpu2.example"}),
        two({**VLLM, "k2_firewall_enabled": "false"}, IP1, {"ansible_host": "gpu2.example"}),
        two({**VLLM, "k2_firewall_enabled": "{{ lookup('env', 'FW') }}"}, IP1, IP2),
    ],
    ids=["local-ip", "alias-ip", "firewall-off", "off-as-text", "templated"],
)
def test_names_are_accepted_where_an_address_is_known_or_no_firewall_runs(
    host_vars: dict[str, Any],
) -> None:
    assert firewall_refusals(host_vars) == []


# (case, n1's connection variables, k2_firewall_ssh_ports, the one line's fragments or None)
SSH_CASES: list[tuple[str, dict[str, Any], Any, tuple[str, ...] | None]] = [
    ("default-port-listed", {}, [22], None),
    ("unset-list", {"ansible_port": 2200}, None, None),
    (
        "default-port-missing",
        {},
        [2200],
        ("k2_firewall_ssh_ports=[2200] leaves out the host's SSH port, 22 (Ansible's default",),
    ),
    ("empty", {}, [], ("k2_firewall_ssh_ports=[] leaves out", "holds 22")),
    ("custom-port", {"ansible_port": 2200}, [22], ("ansible_port=2200", "fix: add 2200")),
    (
        "alias",
        {"ansible_ssh_port": 2222},
        "22,2200",
        ("k2_firewall_ssh_ports=22,2200 leaves out", "ansible_ssh_port=2222"),
    ),
    ("alias-listed", {"ansible_ssh_port": 2222}, "22,2222", None),
    (
        "alias-wins",
        {"ansible_port": 2200, "ansible_ssh_port": 2222},
        [2200],
        ("ansible_ssh_port=2222", "fix: add 2222 to k2_firewall_ssh_ports"),
    ),
    ("both-listed", {"ansible_port": 2200, "ansible_ssh_port": 2222}, [2222], None),
    ("templated", {"ansible_port": 2200}, "{{ [22] }}", None),
]


@pytest.mark.parametrize(
    ("connect", "ports", "fragments"), [c[1:] for c in SSH_CASES], ids=[c[0] for c in SSH_CASES]
)
def test_an_ssh_port_list_without_the_ssh_port_is_refused(
    connect: dict[str, Any], ports: Any, fragments: tuple[str, ...] | None
) -> None:
    listed = {} if ports is None else {"k2_firewall_ssh_ports": ports}
    found = firewall_refusals(two(ON, {**IP1, **connect, **listed}, IP2))
    lines = [line for line in found if "k2_firewall_ssh_ports" in line]
    if fragments is None:
        assert found == []
        return
    assert len(lines) == 1, found
    assert lines[0].startswith("n1: "), lines[0]
    assert all(f in lines[0] for f in fragments), lines[0]
    assert "locked out; fix: add" in lines[0]


def test_an_ssh_port_list_is_left_alone_where_the_firewall_is_off() -> None:
    assert firewall_refusals(two(VLLM, {**IP1, "k2_firewall_ssh_ports": [2200]}, IP2)) == []


def test_a_trusted_entry_that_is_no_address_is_refused() -> None:
    trusted = {"k2_firewall_trusted": ["10.9.0.0/16", "monitor.example"]}
    found = firewall_refusals(two(ON, {**IP1, **trusted}, {**IP2, **trusted}))
    assert found == [
        'n1, n2: k2_firewall_trusted=["10.9.0.0/16", "monitor.example"] holds \'monitor.example\', '
        "which is not an IP address or CIDR; nft sets hold addresses only, so the firewall would "
        "trust nothing for it; expected addresses or CIDRs (10.0.0.0/16); fix: write each as its "
        "IP address or subnet"
    ]
    assert firewall_refusals(two(ON, {**IP1, "k2_firewall_trusted": ["fd00::/8"]}, IP2)) == []


@settings(max_examples=80, deadline=None)
@given(
    address=st.sampled_from(["10.0.0.2", "gpu2.example", "fd00::2", "GPU-2"]),
    alias=st.none() | st.sampled_from(["10.0.0.2", "gpu2.example"]),
    local_ip=st.none() | st.just("10.1.0.2"),
    enabled=st.sampled_from([True, False, "yes", "no", "true", "off", 1, 0]),
)
def test_the_ruleset_trusts_every_host_or_the_plan_is_refused(
    address: str, alias: str | None, local_ip: str | None, enabled: Any
) -> None:
    """However a host is written, a firewall the plan accepts holds an address of every host:
    the trusted set is never silently short of a host of the cluster."""
    n2: dict[str, Any] = {"ansible_host": address}
    if alias is not None:
        n2["ansible_ssh_host"] = alias
    if local_ip is not None:
        n2["k2_local_ip"] = local_ip
    host_vars = two({**VLLM, "k2_firewall_enabled": enabled}, IP1, n2)
    try:
        cluster = cluster_from_groups("inv.ini", {"nodes": ["n1", "n2"]}, host_vars)
    except InventoryError as refused:
        for line in refused.problems:
            # n2's address, or the cluster's mix of address families
            assert line.startswith(("n2: ", "inv.ini: IPv4 addresses (n1")), line
            assert "fix:" in line, line
        return
    if enabled in (True, "yes", "true", 1):
        plan = build_plan(cluster)
        text = ruleset(plan.model_dump(mode="json"), "n1", [22])
        resolved = alias if alias is not None else address
        trusted = local_ip or resolved
        assert trusted in text, (trusted, text)


def test_the_role_default_reads_the_ssh_port_as_the_plan_does() -> None:
    for path in (
        "roles/k2_firewall/defaults/main.yml",
        "roles/k2_firewall/meta/argument_specs.yml",
    ):
        assert "[hostvars[inventory_hostname] | k2.cluster.ssh_port]" in (ROOT / path).read_text()
    assert ssh_port({}) == 22
    assert ssh_port({"ansible_port": "2200"}) == 2200
    assert ssh_port({"ansible_port": 2200, "ansible_ssh_port": 2222}) == 2222
