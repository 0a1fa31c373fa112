"""Where every rendered listener binds: the endpoint on every interface, everything else on the
host's private address (k2_local_ip), except where the pinned engine fixes a wildcard, which
the plan then says. Every golden case, each host given a private address of its own."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from k2provision.core.records import Cluster, Plan
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.golden_cases import CASES, GOLDEN

WILDCARDS = ("0.0.0.0", "::")
# What the pinned engines bind on every interface with no option to do otherwise (sources:
# docs/engines.md "Listen addresses"); no golden case sets the weights relay's port.
ENGINE_FIXED = {"k2_dist_port", "k2_ray_port"}


def _private(cluster: Cluster) -> Cluster:
    """`cluster` with a k2_local_ip of its own on every host, unlike any inventory address."""
    v6 = any(":" in h.address for h in cluster.hosts)
    hosts = tuple(
        h.model_copy(update={"local_ip": f"fd00:85::{i + 1}" if v6 else f"10.250.0.{i + 1}"})
        for i, h in enumerate(cluster.hosts)
    )
    return cluster.model_copy(update={"hosts": hosts})


def _plan(case: str) -> Plan:
    return build_plan(_private(load_cluster(GOLDEN / case / "inventory.ini")))


@pytest.mark.parametrize("case", CASES)
def test_every_listener_but_the_endpoint_binds_the_private_address(case: str) -> None:
    plan = _plan(case)
    for host in plan.hosts:
        assert host.local_ip not in (h.address for h in plan.hosts)
        for port in host.ports:
            where = f"{case} {host.name} {port.setting}"
            if port.public or port.wildcard_why:
                assert port.bind in WILDCARDS, where
            else:
                assert port.bind == host.local_ip, where
            if port.wildcard_why:
                assert not port.public, where
                assert port.setting in ENGINE_FIXED, where


@pytest.mark.parametrize("case", CASES)
def test_the_endpoint_is_the_one_public_listener(case: str) -> None:
    plan = _plan(case)
    public = [(h.name, p.port) for h in plan.hosts for p in h.ports if p.public]
    port = urlsplit(plan.endpoint).port
    if plan.front is not None:  # the floating address: HAProxy on every front host
        assert public == [(h.name, port) for h in plan.front.hosts]
        assert {p.process for h in plan.hosts for p in h.ports if p.public} == {"haproxy"}
    else:
        assert public == [(plan.endpoint_host, port)]


def test_the_wildcards_the_engines_fix_are_the_ones_named() -> None:
    """Each exception occurs in some case: none is kept once an engine stops needing it."""
    found = {p.setting for c in CASES for h in _plan(c).hosts for p in h.ports if p.wildcard_why}
    assert found == ENGINE_FIXED
