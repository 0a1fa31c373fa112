"""Addresses across hosts: a host's k2_local_ip that is another host's address or k2_local_ip
(the router's included, however an IPv6 address is spelt) is refused naming both hosts, and
every assignment of addresses is accepted exactly when no two hosts share one."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k2provision.errors import InventoryError
from k2provision.plan.inventory import cluster_from_groups

VLLM = {"k2_engine": "vllm", "k2_layout": "tp"}
PD = {"k2_engine": "sglang", "k2_layout": "pd"}


def problems(groups: dict[str, list[str]], host_vars: dict[str, dict[str, Any]]) -> list[str]:
    """The refusal lines of an inventory given as Ansible resolved it ([] when accepted)."""
    try:
        cluster_from_groups("inv.ini", groups, host_vars)
    except InventoryError as refused:
        return list(refused.problems)
    return []


CASES: list[tuple[str, dict[str, list[str]], dict[str, dict[str, Any]], tuple[str, ...]]] = [
    (
        "local-ip-is-another-hosts-address",
        {"nodes": ["a", "b"]},
        {
            "a": {**VLLM, "ansible_host": "10.0.0.1", "k2_local_ip": "10.1.0.1"},
            "b": {**VLLM, "ansible_host": "10.0.0.2", "k2_local_ip": "10.0.0.1"},
        },
        ("b: k2_local_ip=10.0.0.1 is a's address (ansible_host=10.0.0.1)", "correct a's"),
    ),
    (
        "local-ip-is-a-later-hosts-address",
        {"nodes": ["a", "b"]},
        {
            "a": {**VLLM, "ansible_host": "10.0.0.1", "k2_local_ip": "10.0.0.2"},
            "b": {**VLLM, "ansible_host": "10.0.0.2"},
        },
        ("a: k2_local_ip=10.0.0.2 is b's address", "set a's k2_local_ip"),
    ),
    (
        "local-ip-is-the-routers-address",
        {"prefill": ["p"], "decode": ["d"], "router": ["r"]},
        {
            "p": {**PD, "ansible_host": "10.0.0.1"},
            "d": {**PD, "ansible_host": "10.0.0.2"},
            "r": {**PD, "ansible_host": "10.0.0.9", "k2_local_ip": "10.0.0.1"},
        },
        ("r: k2_local_ip=10.0.0.1 is also p's",),  # inventory.py's line for an exact repeat
    ),
    (
        "local-ip-is-the-default-routers-address",
        {"prefill": ["p"], "decode": ["d"]},
        {
            "p": {**PD, "ansible_host": "10.0.0.1"},
            "d": {**PD, "ansible_host": "10.0.0.2", "k2_local_ip": "10.0.0.1"},
        },
        ("d: k2_local_ip=10.0.0.1 is also p's",),
    ),
    (
        "local-ip-is-the-routers-address-spelt-another-way",
        {"prefill": ["p"], "decode": ["d"]},
        {
            "p": {**PD, "ansible_host": "fd00::1"},
            "d": {**PD, "ansible_host": "fd00::2", "k2_local_ip": "fd00:0::1"},
        },
        ("d: k2_local_ip=fd00:0::1 is the router p's address",),
    ),
    (
        "ipv6-spelt-another-way",
        {"nodes": ["a", "b"]},
        {
            "a": {**VLLM, "ansible_host": "fd00::1"},
            "b": {**VLLM, "ansible_host": "fd00::2", "k2_local_ip": "FD00:0::1"},
        },
        ("b: k2_local_ip=FD00:0::1 is a's address (ansible_host=fd00::1)",),
    ),
    (
        "two-local-ips-spelt-two-ways",
        {"nodes": ["a", "b"]},
        {
            "a": {**VLLM, "ansible_host": "fd00::1", "k2_local_ip": "fd01::1"},
            "b": {**VLLM, "ansible_host": "fd00::2", "k2_local_ip": "fd01:0:0::1"},
        },
        ("k2_local_ip (k2_local_ip=",),
    ),
    (
        "two-equal-local-ips",
        {"nodes": ["a", "b"]},
        {
            "a": {**VLLM, "ansible_host": "10.0.0.1", "k2_local_ip": "10.1.0.1"},
            "b": {**VLLM, "ansible_host": "10.0.0.2", "k2_local_ip": "10.1.0.1"},
        },
        ("b: k2_local_ip=10.1.0.1 is also a's",),
    ),
]


@pytest.mark.parametrize(
    ("groups", "host_vars", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_shared_address_is_refused_naming_both_hosts(
    groups: dict[str, list[str]], host_vars: dict[str, dict[str, Any]], fragments: tuple[str, ...]
) -> None:
    found = problems(groups, host_vars)
    lines = [line for line in found if all(f in line for f in fragments)]
    assert len(lines) == 1, found
    assert "fix:" in lines[0]


def test_own_addresses_are_accepted() -> None:
    assert not problems(
        {"prefill": ["p"], "decode": ["d"], "router": ["r"]},
        {
            "p": {**PD, "ansible_host": "10.0.0.1", "k2_local_ip": "10.1.0.1"},
            "d": {**PD, "ansible_host": "10.0.0.2", "k2_local_ip": "10.1.0.2"},
            "r": {**PD, "ansible_host": "10.0.0.3"},
        },
    )


POOL = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(POOL), st.none() | st.sampled_from(POOL)),
        min_size=2,
        max_size=4,
    )
)
def test_accepted_exactly_when_no_two_hosts_share_an_address(
    hosts: list[tuple[str, str | None]],
) -> None:
    names = [f"h{i}" for i in range(len(hosts))]
    host_vars: dict[str, dict[str, Any]] = {}
    owned: list[set[str]] = []
    for name, (address, local_ip) in zip(names, hosts, strict=True):
        host_vars[name] = {**VLLM, "ansible_host": address}
        if local_ip is not None:
            host_vars[name]["k2_local_ip"] = local_ip
        owned.append({str(ipaddress.ip_address(a)) for a in (address, local_ip) if a})
    shared = any(owned[i] & owned[j] for i in range(len(owned)) for j in range(i))
    found = problems({"nodes": names}, host_vars)
    assert bool(found) == shared, (hosts, found)
    for line in found:
        assert "fix:" in line
        assert sum(name in line for name in names) >= 2, line
