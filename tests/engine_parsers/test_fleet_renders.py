"""Fleet golden cases through the real parsers: the router that fronts every instance must pass
sglang-router 0.3.2's parser and config build with each instance as a worker, and each
instance's servers must rendezvous at their own master with their own world size (sglang
0.5.23's ServerArgs). One server per instance rank and one non-master rank per case are checked,
which keeps the parsers stream short. Needs .venv-sglang."""

from __future__ import annotations

import pytest

from k2provision.core import catalog

from . import goldens
from .goldens import Launch

pytestmark = pytest.mark.parsers

PD_FLEET = "sglang-pd-fleet-32"
TP_FLEET = "sglang-tp-fleet"
ROUTERS = goldens.launches((PD_FLEET, TP_FLEET), goldens.SGLANG_ROUTER)
# Every instance's master, and one host of each case that is not a master.
SAMPLED = ("gpu-p01", "gpu-p05", "gpu-p06", "gpu-d01", "gpu-d13", "node-01", "node-04")
SERVERS = [
    launch
    for launch in goldens.launches((PD_FLEET, TP_FLEET), goldens.SGLANG_SERVER)
    if launch.host in SAMPLED
]


def _instances(case: str, pool: str) -> list[str]:
    return [i.url for p in goldens.plan(case).pools if p.name == pool for i in p.instances]


def test_each_fleet_has_one_router_and_the_sampled_servers() -> None:
    assert [r.case for r in ROUTERS] == [PD_FLEET, TP_FLEET]
    assert len(SERVERS) == len(SAMPLED)


@pytest.mark.parametrize("launch", ROUTERS, ids=str)
def test_fleet_router_is_accepted_with_every_instance(launch: Launch) -> None:
    r = goldens.verdict(launch)
    assert r.ok, f"{launch}: {r.stage}: {r.error}"
    assert r.version == catalog.ROUTER.version
    assert r.warnings == []
    bootstrap = goldens.cluster(launch.case).tunables.bootstrap_port
    if launch.case == PD_FLEET:
        assert r.parsed["pd_disaggregation"] is True
        assert r.parsed["prefill_urls"] == [[u, bootstrap] for u in _instances(PD_FLEET, "prefill")]
        assert r.parsed["decode_urls"] == _instances(PD_FLEET, "decode")
        assert len(r.parsed["prefill_urls"]) == len(r.parsed["decode_urls"]) == 2
        assert r.parsed["dp_aware"] is False
        assert (r.parsed["policy"], r.parsed["prefill_policy"]) == ("cache_aware", None)
        assert r.parsed["decode_policy"] == "power_of_two"
    else:
        assert r.parsed["pd_disaggregation"] is False
        assert r.parsed["worker_urls"] == _instances(TP_FLEET, "nodes")
        assert len(r.parsed["worker_urls"]) == 4
        assert r.parsed["policy"] == "cache_aware"
    assert r.parsed["health_check_endpoint"] == "/health"
    assert r.parsed["request_timeout_secs"] > 1800


@pytest.mark.parametrize("launch", SERVERS, ids=str)
def test_fleet_server_meets_its_own_instance(launch: Launch) -> None:
    plan = goldens.plan(launch.case)
    cluster = goldens.cluster(launch.case)
    instance = next(i for p in plan.pools for i in p.instances if launch.host in i.hosts)
    r = goldens.verdict(launch)
    assert r.ok, f"{launch}: {r.stage}: {r.error}"
    master = cluster.host(instance.master).local_ip
    assert r.parsed["dist_init_addr"] == f"{master}:{cluster.tunables.dist_port}"
    assert r.parsed["nnodes"] == len(instance.hosts)
    assert r.parsed["node_rank"] == instance.hosts.index(launch.host)
    assert r.parsed["tp_size"] == instance.parallel.tp
    # Behind the router, each instance's server binds its host's cluster address.
    assert r.parsed["host"] == cluster.host(launch.host).local_ip
