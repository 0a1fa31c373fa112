"""Fleet golden cases through the real parsers: the router that fronts every instance must pass
sglang-router 0.3.2's parser, config build and its own configuration validation (run as the
router's start runs it) with each instance as a worker, and each instance's servers must
rendezvous at their own master with their own world size (sglang 0.5.23's ServerArgs). One
server per instance rank and one non-master rank per case are checked, which keeps the parsers
stream short. Fleet shapes beyond the goldens (one prefill or one decode instance, vLLM
replicas) put their router command lines through the same validation. Needs .venv-sglang."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.templating import with_host_values
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

from . import goldens
from .goldens import Launch
from .runner import check

EXAMPLES = Path(__file__).resolve().parents[2] / "inventory" / "examples"

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


def test_each_fleet_has_its_routers_and_the_sampled_servers() -> None:
    # The PD example has two routers behind its front; each is checked by the real parser.
    assert [r.case for r in ROUTERS] == [PD_FLEET, PD_FLEET, TP_FLEET]
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
        # Two instances in each pool: power_of_two on both (prefill takes --policy).
        assert (r.parsed["policy"], r.parsed["prefill_policy"]) == ("power_of_two", None)
        assert r.parsed["decode_policy"] == "power_of_two"
    else:
        assert r.parsed["pd_disaggregation"] is False
        assert r.parsed["worker_urls"] == _instances(TP_FLEET, "nodes")
        assert len(r.parsed["worker_urls"]) == 4
        assert r.parsed["policy"] == "cache_aware"
    assert r.parsed["health_check_endpoint"] == "/ready"
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


# Fleet shapes the goldens do not hold: (example, replacements of its inventory text, the
# policies expected: --policy, --decode-policy).
SHAPES: dict[str, tuple[str, dict[str, str], tuple[str, str | None]]] = {
    "pd-1p2d": (
        "sglang-pd-fleet-32.ini",
        {"k2_prefill_instances=2": "k2_prefill_instances=1"},
        ("round_robin", "power_of_two"),
    ),
    "pd-2p1d": (
        "sglang-pd-fleet-32.ini",
        {"k2_decode_instances=2": "k2_decode_instances=1"},
        ("power_of_two", "round_robin"),
    ),
    "pd-4p3d": (
        "sglang-pd-fleet-32.ini",
        {
            "k2_prefill_instances=2": "k2_prefill_instances=4",
            "k2_decode_instances=2": "k2_decode_instances=3",
        },
        ("power_of_two", "power_of_two"),
    ),
    "vllm-tp": (
        "sglang-tp-fleet.ini",
        {"k2_engine=sglang\nk2_layout=tp": "k2_engine=vllm\nk2_layout=tp"},
        ("cache_aware", None),
    ),
    "vllm-dp_ep": (
        "sglang-tp-fleet.ini",
        {"k2_engine=sglang\nk2_layout=tp": "k2_engine=vllm\nk2_layout=dp_ep"},
        ("cache_aware", None),
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_fleet_shapes_router_passes_the_routers_own_validation(
    tmp_path: Path, shape: str
) -> None:
    example, edits, (policy, decode_policy) = SHAPES[shape]
    text = (EXAMPLES / example).read_text()
    for old, new in edits.items():
        assert old in text, f"{example} lacks {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    plan = build_plan(load_cluster(path))
    routers = [p for h in plan.hosts for p in h.processes if p.argv[:3] == goldens.SGLANG_ROUTER]
    assert routers
    for router in routers:
        proc = with_host_values(router, goldens.SAMPLE_HOST_VALUES)
        r = check("sglang-router", list(proc.argv), dict(proc.env))
        assert r.ok, f"{shape}: {r.stage}: {r.error}"
        assert r.warnings == []
        assert (r.parsed["policy"], r.parsed["decode_policy"]) == (policy, decode_policy)
