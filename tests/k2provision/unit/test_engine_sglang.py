"""SGLang renderer: TP across nodes and PD disaggregation, fact by fact (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k2provision.core.records import Cluster, HostSpec, Plan, PoolName, Process, Tunables
from k2provision.engines import sglang
from k2provision.errors import PlanError
from k2provision.plan import images
from k2provision.plan.assemble import build_plan
from k2provision.plan.images import LAB_IMAGE, build_tag
from k2provision.plan.inventory import load_cluster
from tests.k2provision.access_support import GuardFiles

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
IB = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
# Flags the seeds use that the pinned release renamed, rejects or deprecates.
STALE_FLAGS = (
    "--enable-deepep-moe",
    "--enable-ep-moe",
    "--nccl-init-addr",
    "--cuda-graph-bs",
    "--enable-dp-attention",
    "--dp-size",
    "--tp",
)


def tp_cluster(nodes: int = 2, **tunables: object) -> Cluster:
    hosts = tuple(
        HostSpec(name=f"n{i}", address=f"10.1.0.{i + 1}", pool="nodes", local_ip=f"10.1.0.{i + 1}")
        for i in range(nodes)
    )
    return Cluster(
        inventory="test.ini",
        engine="sglang",
        layout="tp",
        model="moonshotai/Kimi-K2-Instruct",
        model_dir="/models/k2",
        gpu="h200",
        gpus_per_node=8,
        context_length=131072,
        hosts=hosts,
        tunables=Tunables(**tunables),  # type: ignore[arg-type]
    )


def pd_cluster(
    prefill: int = 2,
    decode: int = 3,
    *,
    router: str | None = None,
    lab: bool = False,
    ib: dict[str, tuple[str, ...]] | None = None,
    **tunables: object,
) -> Cluster:
    hosts: list[HostSpec] = []
    for pool, count, net in (("prefill", prefill, 2), ("decode", decode, 3)):
        for i in range(count):
            name = f"{pool[0]}{i}"
            hosts.append(
                HostSpec(
                    name=name,
                    address=f"10.{net}.0.{i + 1}",
                    pool=pool,  # type: ignore[arg-type]
                    local_ip=f"192.168.{net}.{i + 1}",
                    ib_devices=IB if ib is None else ib.get(name, ()),
                )
            )
    if router and router not in {h.name for h in hosts}:
        hosts.append(HostSpec(name=router, address="10.9.0.1", pool="router", local_ip="10.9.0.1"))
    return Cluster(
        inventory="test.ini",
        engine="sglang",
        layout="pd",
        model="moonshotai/Kimi-K2-Instruct",
        model_dir="/models/k2",
        gpu="h200",
        gpus_per_node=8,
        context_length=32768,
        hosts=tuple(hosts),
        router=router or "p0",
        lab=lab,
        tunables=Tunables(**tunables),  # type: ignore[arg-type]
    )


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value following `name` in argv (exactly one occurrence)."""
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


def procs(plan: Plan, name: str) -> dict[str, Process]:
    return {p.name: p for p in plan.host(name).processes}


def servers(plan: Plan, pool: PoolName) -> list[Process]:
    """The launch_server process of every host of `pool`, in inventory order."""
    out = []
    for host in next(p for p in plan.pools if p.name == pool).hosts:
        found = [p for p in plan.host(host).processes if "sglang.launch_server" in p.argv]
        assert len(found) == 1, (host, found)
        out.append(found[0])
    return out


def all_processes(plan: Plan) -> list[Process]:
    return [p for h in plan.hosts for p in h.processes]


@pytest.fixture(scope="module")
def prod() -> Plan:
    return build_plan(load_cluster(GOLDEN / "sglang-pd-4p12d" / "inventory.ini"))


# ---------------------------------------------------------------- layout tp


def test_tp_every_host_runs_one_rank_of_one_server() -> None:
    plan = build_plan(tp_cluster(nodes=2))
    ranks = servers(plan, "nodes")
    assert len(ranks) == 2
    for rank, proc in enumerate(ranks):
        argv = proc.argv
        assert argv[:3] == ("python3", "-m", "sglang.launch_server")
        assert proc.container == "k2-sglang"
        assert not proc.exec_in
        assert flag(argv, "--tp-size") == "16"
        assert flag(argv, "--nnodes") == "2"
        assert flag(argv, "--node-rank") == str(rank)
        assert flag(argv, "--dist-init-addr") == "10.1.0.1:5757"
        assert flag(argv, "--model-path") == "/models/k2"
        assert flag(argv, "--served-model-name") == "kimi-k2"
        assert flag(argv, "--host") == "0.0.0.0"
        assert flag(argv, "--port") == "30000"
        assert flag(argv, "--context-length") == "131072"
        # Derived by the plan's memory fit, as the fit reports it.
        assert flag(argv, "--mem-fraction-static") == str(plan.pools[0].mem_fraction)
        assert plan.pools[0].mem_fraction == plan.fit[0].mem_fraction
        assert "--trust-remote-code" in argv
        assert "--disaggregation-mode" not in argv
        assert "--moe-a2a-backend" not in argv


def test_tp_only_rank_zero_is_gated() -> None:
    plan = build_plan(tp_cluster(nodes=2))
    first, second = servers(plan, "nodes")
    assert first.health is not None
    assert first.health.url == "http://10.1.0.1:30000/ready"
    assert first.health.timeout_s == 3600
    assert second.health is None
    assert plan.endpoint == "http://10.1.0.1:30000"


def test_tp_ports_and_names_follow_tunables() -> None:
    plan = build_plan(
        tp_cluster(
            nodes=2,
            sglang_port=31000,
            dist_port=6000,
            served_model_name="k2",
            socket_ifname="ib0",
        )
    )
    proc = servers(plan, "nodes")[1]
    assert flag(proc.argv, "--port") == "31000"
    assert flag(proc.argv, "--dist-init-addr") == "10.1.0.1:6000"
    assert flag(proc.argv, "--served-model-name") == "k2"
    assert proc.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert proc.env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert plan.endpoint == "http://10.1.0.1:31000"


def test_socket_interface_is_found_on_each_host_unless_named() -> None:
    """Without k2_socket_ifname each host's launch script finds the interface that holds its
    k2_local_ip: NCCL and Gloo get that name, never a guess."""
    plan = build_plan(tp_cluster())
    for host in plan.hosts:
        (proc,) = host.processes
        assert proc.env["NCCL_SOCKET_IFNAME"] == "${K2_SOCKET_IFNAME}"
        assert proc.env["GLOO_SOCKET_IFNAME"] == "${K2_SOCKET_IFNAME}"
        (value,) = proc.resolve
        assert (value.name, value.kind, value.arg) == (
            "K2_SOCKET_IFNAME",
            "ifname-of",
            f"10.1.0.{plan.host(host.name).node_rank + 1}",
        )
        assert "/etc/k2provision/launch/k2-host-values.py" in host.files
    assert plan.warnings == ()


def test_a_local_ip_that_is_a_name_cannot_give_an_interface() -> None:
    cluster = tp_cluster()
    named = cluster.model_copy(
        update={
            "hosts": tuple(
                h.model_copy(update={"local_ip": f"node{i}.cluster"})
                for i, h in enumerate(cluster.hosts)
            )
        }
    )
    plan = build_plan(named)
    for proc in all_processes(plan):
        assert "NCCL_SOCKET_IFNAME" not in proc.env
    assert any("k2_local_ip of n0, n1 is a name" in w for w in plan.warnings)


# ---------------------------------------------------------------- layout pd: the seed's 4P12D


def test_prod_pool_sizes(prod: Plan) -> None:
    for pool, nodes, size in (("prefill", 4, 32), ("decode", 12, 96)):
        ranks = servers(prod, pool)
        assert len(ranks) == nodes
        for rank, proc in enumerate(ranks):
            argv = proc.argv
            assert flag(argv, "--disaggregation-mode") == pool
            assert flag(argv, "--tp-size") == str(size)
            # DP attention, current spelling: attention DP width, no replica-level --dp-size.
            assert flag(argv, "--attn-dp-size") == str(size)
            assert flag(argv, "--ep-size") == str(size)
            assert flag(argv, "--nnodes") == str(nodes)
            assert flag(argv, "--node-rank") == str(rank)


def test_prod_node_ranks_follow_inventory_order(prod: Plan) -> None:
    for pool in ("prefill", "decode"):
        hosts = next(p for p in prod.pools if p.name == pool).hosts
        assert list(hosts) == sorted(hosts)  # gpu-p01.. / gpu-d01.. as written
        for rank, host in enumerate(hosts):
            assert prod.host(host).node_rank == rank
            (proc,) = [p for p in prod.host(host).processes if p.name == f"sglang-{pool}"]
            assert flag(proc.argv, "--node-rank") == str(rank)


def test_prod_pools_rendezvous_at_their_own_master(prod: Plan) -> None:
    for pool, master in (("prefill", "10.10.0.11"), ("decode", "10.10.0.21")):
        for proc in servers(prod, pool):
            assert flag(proc.argv, "--dist-init-addr") == f"{master}:5757"


def test_prod_prefill_flags(prod: Plan) -> None:
    for proc in servers(prod, "prefill"):
        argv = proc.argv
        assert flag(argv, "--moe-a2a-backend") == "deepep"
        assert flag(argv, "--deepep-mode") == "normal"
        # Per instance, as ome's production PD config: SGLang divides it by DP 32.
        assert flag(argv, "--chunked-prefill-size") == "524288"
        assert flag(argv, "--max-running-requests") == "1024"
        assert flag(argv, "--disaggregation-bootstrap-port") == "8998"
        assert flag(argv, "--mem-fraction-static") == str(prod.pools[0].mem_fraction)
        assert flag(argv, "--ep-num-redundant-experts") == "32"  # one per prefill GPU
        assert flag(argv, "--ep-dispatch-algorithm") == "dynamic"
        assert "--cuda-graph-max-bs-decode" not in argv
        assert "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK" not in proc.env


def test_prod_decode_flags(prod: Plan) -> None:
    for proc in servers(prod, "decode"):
        argv = proc.argv
        assert flag(argv, "--moe-a2a-backend") == "deepep"
        assert flag(argv, "--deepep-mode") == "low_latency"
        assert flag(argv, "--ep-num-redundant-experts") == "96"
        assert "--ep-dispatch-algorithm" not in argv  # EPLB's default: the static table
        assert flag(argv, "--cuda-graph-max-bs-decode") == "480"
        # dp x cuda-graph batch: the seed's 46080.
        assert flag(argv, "--max-running-requests") == str(96 * 480)
        assert flag(argv, "--mem-fraction-static") == str(prod.pools[1].mem_fraction)
        assert "--chunked-prefill-size" not in argv
        assert "--disaggregation-bootstrap-port" not in argv
        assert proc.env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "480"


def test_prod_shared_pd_flags(prod: Plan) -> None:
    for proc in servers(prod, "prefill") + servers(prod, "decode"):
        argv = proc.argv
        for switch in (
            "--enable-dp-lm-head",
            "--disable-shared-experts-fusion",
            "--enable-two-batch-overlap",
            "--disable-radix-cache",
            "--trust-remote-code",
        ):
            assert switch in argv, switch
        assert flag(argv, "--moe-dense-tp-size") == "1"
        # Spare expert slots are rebalanced by EPLB on both pools, never fixed copies.
        assert "--enable-eplb" in argv
        assert flag(argv, "--eplb-algorithm") == "deepseek"
        assert flag(argv, "--disaggregation-transfer-backend") == "mooncake"
        assert flag(argv, "--port") == "30000"
        assert flag(argv, "--context-length") == "131072"
        assert int(flag(argv, "--watchdog-timeout")) <= 3600
        assert int(flag(argv, "--decode-log-interval")) > 1
        assert proc.env["PYTHONUNBUFFERED"] == "1"
        assert proc.env["MC_TE_METRIC"] == "true"
        assert proc.stage == 0


def test_prod_host_binds_its_local_ip_and_its_own_ib_devices(prod: Plan) -> None:
    for host in prod.hosts:
        (proc,) = [p for p in host.processes if "sglang.launch_server" in p.argv]
        assert flag(proc.argv, "--host") == host.address
        assert flag(proc.argv, "--disaggregation-ib-device") == ",".join(
            f"mlx5_{i}" for i in range(8)
        )


def test_pd_timeouts_keep_failure_detection_on(prod: Plan) -> None:
    for proc in servers(prod, "prefill") + servers(prod, "decode"):
        env = proc.env
        assert 0 < int(env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"]) <= 3600
        assert 0 < int(env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"]) <= 3600
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "5"
        assert env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] == "2"


def test_pd_timeouts_follow_tunable() -> None:
    plan = build_plan(pd_cluster(pd_timeout_s=900))
    for proc in servers(plan, "decode"):
        assert proc.env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "900"
        assert proc.env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] == "900"


def test_prod_gates_on_each_pool_master(prod: Plan) -> None:
    for pool, master in (("prefill", "10.10.0.11"), ("decode", "10.10.0.21")):
        first, *rest = servers(prod, pool)
        assert first.health is not None
        assert first.health.url == f"http://{master}:30000/ready"
        assert all(p.health is None for p in rest)


def test_prod_router_on_first_prefill_host(prod: Plan) -> None:
    router = procs(prod, "gpu-p01")["sglang-router"]
    assert router.argv[:3] == ("python3", "-m", "sglang_router.launch_router")
    assert router.container == "k2-router"
    assert router.image.startswith("k2provision/router:0.3.2-")  # built from containers/router
    assert router.stage == 1
    argv = router.argv
    assert "--pd-disaggregation" in argv
    i = argv.index("--prefill")
    assert argv[i + 1 : i + 3] == ("http://10.10.0.11:30000", "8998")
    assert flag(argv, "--decode") == "http://10.10.0.21:30000"
    assert flag(argv, "--host") == "0.0.0.0"
    assert flag(argv, "--port") == "8000"
    assert router.health is not None
    assert router.health.url == "http://10.10.0.11:8000/readiness"
    assert prod.endpoint == "http://10.10.0.11:8000"
    others = [p for h in prod.hosts if h.name != "gpu-p01" for p in h.processes]
    assert all(p.name != "sglang-router" for p in others)


# ---------------------------------------------------------------- layout pd: variations


def test_pd_sizes_follow_pool_plan() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=3))
    for pool_plan in plan.pools:
        size = pool_plan.parallel.tp
        assert size == 8 * len(pool_plan.hosts)
        for proc in servers(plan, pool_plan.name):
            assert flag(proc.argv, "--tp-size") == str(pool_plan.parallel.tp)
            assert flag(proc.argv, "--attn-dp-size") == str(pool_plan.parallel.dp)
            assert flag(proc.argv, "--ep-size") == str(pool_plan.parallel.ep)
    decode = next(p for p in plan.pools if p.name == "decode")
    for proc in servers(plan, "decode"):
        redundant = decode.parallel.redundant_experts
        assert flag(proc.argv, "--ep-num-redundant-experts") == str(redundant)
        assert flag(proc.argv, "--max-running-requests") == str(24 * 480)


def test_pd_spare_experts_follow_tunables_and_never_go_without_eplb() -> None:
    plan = build_plan(
        pd_cluster(prefill=2, decode=2, prefill_redundant_experts=0, decode_redundant_experts=32)
    )
    for proc in servers(plan, "prefill"):
        assert "--ep-num-redundant-experts" not in proc.argv
        assert "--enable-eplb" in proc.argv  # rebalancing pays without spare slots too
    for proc in servers(plan, "decode"):
        assert flag(proc.argv, "--ep-num-redundant-experts") == "32"
        assert "--enable-eplb" in proc.argv
    for name, pool in (("prefill", 0), ("decode", 32)):
        assert next(p for p in plan.pools if p.name == name).parallel.redundant_experts == pool


def test_pd_prefill_chunk_is_per_rank_times_the_pools_dp() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=2, prefill_chunk_per_rank=8192))
    for proc in servers(plan, "prefill"):
        assert flag(proc.argv, "--chunked-prefill-size") == str(8192 * 16)


def test_pd_servers_pin_nccl_gloo_and_nvshmem_to_the_local_ip_interface() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=2))
    for host in plan.hosts:
        for proc in host.processes:
            if proc.name == "sglang-router":
                assert proc.resolve == ()
                assert "NCCL_SOCKET_IFNAME" not in proc.env
                continue
            (value,) = proc.resolve
            assert value.arg == next(
                h.local_ip for h in pd_cluster(2, 2).hosts if h.name == host.name
            )
            for var in (
                "NCCL_SOCKET_IFNAME",
                "GLOO_SOCKET_IFNAME",
                "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
            ):
                assert proc.env[var] == "${K2_SOCKET_IFNAME}"


def router_of(plan: Plan) -> Process:
    (router,) = [p for h in plan.hosts for p in h.processes if p.name == "sglang-router"]
    return router


def test_router_runs_in_its_own_image_when_given() -> None:
    plan = build_plan(pd_cluster(router_image="reg/sglang-router:0.3.2"))
    assert router_of(plan).image == "reg/sglang-router:0.3.2"
    assert router_of(plan).argv[:3] == ("python3", "-m", "sglang_router.launch_router")
    assert ("reg/sglang-router:0.3.2", "") in [(i.ref, i.build) for i in plan.images]
    assert not any("image" in w for w in plan.warnings)


def test_router_image_is_built_from_its_containerfile_without_one() -> None:
    built = build_plan(pd_cluster())
    image = next(i for i in built.images if i.build == "router")
    assert router_of(built).image == image.ref
    assert image.ref == build_tag("router", "0.3.2")
    assert image.hosts == tuple(h.name for h in built.hosts if router_of(built) in h.processes)
    assert not any("image" in w for w in built.warnings)
    lab = build_plan(pd_cluster(lab=True))
    assert router_of(lab).image == LAB_IMAGE
    assert [i.build for i in lab.images] == [""]


def test_a_plan_naming_its_own_images_never_reads_the_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "CONTAINERS_DIR", tmp_path)  # no build directory at all
    images.build_digest.cache_clear()
    try:
        own = build_plan(pd_cluster(image="reg/sglang:1", router_image="reg/router:1"))
        assert [(i.ref, i.build) for i in own.images] == [
            ("reg/sglang:1", ""),
            ("reg/router:1", ""),
        ]
        with pytest.raises(PlanError, match="containers/router"):
            build_plan(pd_cluster(image="reg/sglang:1"))
    finally:
        images.build_digest.cache_clear()


def test_pd_decode_batch_follows_tunable() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=2, cuda_graph_max_bs_decode=256))
    for proc in servers(plan, "decode"):
        assert flag(proc.argv, "--cuda-graph-max-bs-decode") == "256"
        assert flag(proc.argv, "--max-running-requests") == str(16 * 256)
        assert proc.env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "256"


def test_pd_ib_devices_are_per_host_and_omitted_without_any() -> None:
    ib = {"p0": ("mlx5_0",), "p1": ("mlx5_4", "mlx5_5"), "d0": IB, "d1": ()}
    plan = build_plan(pd_cluster(prefill=2, decode=2, ib=ib))
    got = {
        h.name: (
            flag(p.argv, "--disaggregation-ib-device")
            if "--disaggregation-ib-device" in p.argv
            else None
        )
        for h in plan.hosts
        for p in h.processes
        if "sglang.launch_server" in p.argv
    }
    assert got == {"p0": "mlx5_0", "p1": "mlx5_4,mlx5_5", "d0": ",".join(IB), "d1": None}


def test_pd_lab_renders_no_ib_devices() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=2, lab=True))
    for proc in all_processes(plan):
        assert "--disaggregation-ib-device" not in proc.argv


def test_pd_cluster_addresses_use_local_ip() -> None:
    plan = build_plan(pd_cluster(prefill=2, decode=2))
    for host in plan.hosts:
        for proc in host.processes:
            if "sglang.launch_server" in proc.argv:
                net = "2" if host.pool == "prefill" else "3"
                assert flag(proc.argv, "--host").startswith(f"192.168.{net}.")
                assert flag(proc.argv, "--dist-init-addr") == f"192.168.{net}.1:5757"
    router = procs(plan, "p0")["sglang-router"]
    i = router.argv.index("--prefill")
    assert router.argv[i + 1] == "http://192.168.2.1:30000"
    assert flag(router.argv, "--decode") == "http://192.168.3.1:30000"
    first = servers(plan, "decode")[0]
    assert first.health is not None
    assert first.health.url == "http://192.168.3.1:30000/ready"


def test_pd_dedicated_router_host() -> None:
    plan = build_plan(
        pd_cluster(
            prefill=2,
            decode=2,
            router="gw",
            bootstrap_port=9000,
            api_port=8080,
            pd_transfer_backend="nixl",
        )
    )
    gw = plan.host("gw")
    assert gw.role == "router"
    (router,) = gw.processes
    assert router.name == "sglang-router"
    i = router.argv.index("--prefill")
    assert router.argv[i + 1 : i + 3] == ("http://192.168.2.1:30000", "9000")
    assert flag(router.argv, "--port") == "8080"
    assert router.health is not None
    assert router.health.url == "http://10.9.0.1:8080/readiness"
    assert plan.endpoint == "http://10.9.0.1:8080"
    assert all(p.name != "sglang-router" for p in plan.host("p0").processes)
    for proc in servers(plan, "prefill"):
        assert flag(proc.argv, "--disaggregation-bootstrap-port") == "9000"
        assert flag(proc.argv, "--disaggregation-transfer-backend") == "nixl"


# ---------------------------------------------------------------- every render


@pytest.mark.parametrize("case", ["sglang-tp", "sglang-pd-4p12d", "sglang-pd-1p1d"])
def test_golden_inventories_render_no_stale_flags(case: str) -> None:
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    for proc in all_processes(plan):
        for stale in STALE_FLAGS:
            assert stale not in proc.argv, (proc.name, stale)
        for key, value in proc.env.items():
            if "TIMEOUT" in key or "INTERVAL" in key:  # the seed's 1e5..1e7 switch detection off
                assert 0 < int(value) <= 3600, (proc.name, key, value)
        assert all(not k.startswith("SGL_") for k in proc.env), proc.env


@pytest.mark.parametrize("case", ["sglang-tp", "sglang-pd-4p12d", "sglang-pd-1p1d"])
def test_every_server_takes_the_kimi_tool_parser(case: str) -> None:
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    found = 0
    for proc in all_processes(plan):
        if "sglang.launch_server" in proc.argv:
            found += 1
            assert flag(proc.argv, "--tool-call-parser") == "kimi_k2"
            assert "--trust-remote-code" in proc.argv
    assert found == sum(len(p.hosts) for p in plan.pools)


def test_module_constants_are_sane() -> None:
    assert sglang.WATCHDOG_TIMEOUT_S <= 3600
    assert sglang.DECODE_LOG_INTERVAL > 1
    assert sglang.PD_HEARTBEAT_INTERVAL_S == 5
    assert sglang.PD_HEARTBEAT_MAX_FAILURE == 2


def test_pd_refuses_int4_experts_that_deepep_cannot_run() -> None:
    # 0.5.23's DeepEPMoE runs FP8 and W4AFP8 experts only; tp runs INT4 on Marlin.
    thinking = {"model": "moonshotai/Kimi-K2-Thinking"}
    with pytest.raises(PlanError, match=r"DeepEP MoE layer .* has no kernel") as info:
        build_plan(pd_cluster(1, 1).model_copy(update=thinking))
    assert "k2_layout=tp on 1 node (tp 8)" in str(info.value)
    assert build_plan(tp_cluster(1).model_copy(update=thinking)).pools[0].parallel.tp == 8


def test_tp_refuses_tp32_which_cuts_fp8_blocks() -> None:
    with pytest.raises(PlanError, match="2048 split over 32 ranks gives 64 per rank"):
        build_plan(tp_cluster(4))


def test_pd_router_limits_follow_the_decode_capacity_unless_set() -> None:
    plan = build_plan(pd_cluster())
    argv = procs(plan, "p0")["sglang-router"].argv
    decode = flag(servers(plan, "decode")[0].argv, "--max-running-requests")
    assert flag(argv, "--max-concurrent-requests") == decode
    assert flag(argv, "--queue-size") == decode
    assert flag(argv, "--queue-timeout-secs") == "60"
    set_ = build_plan(pd_cluster(router_max_concurrent_requests=64, router_queue_size=0))
    argv = procs(set_, "p0")["sglang-router"].argv
    assert (flag(argv, "--max-concurrent-requests"), flag(argv, "--queue-size")) == ("64", "0")
    assert "--api-key" not in argv
    assert "--tls-cert-path" not in argv
    assert plan.endpoint.startswith("http://")


def test_pd_router_key_is_read_at_launch_and_tls_makes_the_endpoint_https(
    guard_files: GuardFiles,
) -> None:
    from k2provision.core.endpoint_guard import API_KEY, TLS_CERT, TLS_KEY, guard_path

    plan = build_plan(
        pd_cluster(
            api_key_file=guard_files.api_key,
            tls_cert_file=guard_files.cert,
            tls_key_file=guard_files.key,
        )
    )
    router = procs(plan, "p0")["sglang-router"]
    assert flag(router.argv, "--api-key") == "${K2_API_KEY}"
    (key,) = router.resolve
    assert (key.kind, key.arg) == ("secret-file", guard_path("/etc/k2provision", API_KEY))
    assert flag(router.argv, "--tls-cert-path") == guard_path("/etc/k2provision", TLS_CERT)
    assert flag(router.argv, "--tls-key-path") == guard_path("/etc/k2provision", TLS_KEY)
    assert plan.endpoint == "https://10.2.0.1:8000"
    assert router.health is not None
    assert router.health.url.startswith("https://10.2.0.1:8000/")
    script = plan.host("p0").files["/etc/k2provision/launch/sglang-router.sh"]
    assert "K2_API_KEY=$(python3 " in script
    assert "k2provision: K2_API_KEY read from /etc/k2provision/secrets/api_key" in script
    assert '--api-key "${K2_API_KEY}"' in script
    assert guard_files.api_key not in script  # the controller's path stays on the controller


def test_tls_needs_both_the_certificate_and_its_key() -> None:
    with pytest.raises(ValueError, match=r"k2_tls_cert_file=/c\.pem is set without k2_tls_key"):
        Tunables(tls_cert_file="/c.pem")
    with pytest.raises(ValueError, match=r"k2_tls_key_file=/k\.pem is set without k2_tls_cert"):
        Tunables(tls_key_file="/k.pem")


def test_the_launch_role_writes_the_guard_files_where_the_render_reads_them() -> None:
    from k2provision.core import endpoint_guard

    guard = (Path(__file__).resolve().parents[3] / "roles/k2_launch/tasks/guard.yml").read_text()
    for relative in (
        endpoint_guard.API_KEY,
        endpoint_guard.API_KEY_HEADER,
        endpoint_guard.API_KEY_YAML,
        endpoint_guard.TLS_CERT,
        endpoint_guard.TLS_KEY,
        endpoint_guard.TLS_CA,
    ):
        assert f'{{{{ k2_launch_plan.config_dir }}}}/{relative}"' in guard, relative


def test_tp_server_reads_the_api_key_from_the_launch_phases_options_file(
    guard_files: GuardFiles,
) -> None:
    """With no router the rank-0 server is the endpoint: `--config` names the YAML file the
    launch phase writes (the key itself is in no argv); the other ranks take no key."""
    from k2provision.core.endpoint_guard import API_KEY_YAML, guard_path

    plan = build_plan(tp_cluster(api_key_file=guard_files.api_key))
    rank0, rank1 = (procs(plan, name)["sglang"] for name in ("n0", "n1"))
    assert flag(rank0.argv, "--config") == guard_path("/etc/k2provision", API_KEY_YAML)
    assert "--config" not in rank1.argv
    for proc in (rank0, rank1):
        assert "--api-key" not in proc.argv
    assert "--config" not in procs(build_plan(tp_cluster()), "n0")["sglang"].argv
    # The controller's key file is named once, in the plan's access; no host's part names it.
    assert plan.access.api_key_file == guard_files.api_key
    assert guard_files.api_key not in json.dumps([h.model_dump(mode="json") for h in plan.hosts])


def test_tp_server_serves_tls_on_rank_0_and_its_gate_and_endpoint_are_https(
    guard_files: GuardFiles,
) -> None:
    """Without a router rank 0's server is the endpoint: --ssl-certfile / --ssl-keyfile on the
    launch phase's files (on its host only, so no other rank names them), no CA (its own
    warm-up would check the certificate against the loopback address)."""
    from k2provision.core.endpoint_guard import TLS_CERT, TLS_KEY, guard_path

    plan = build_plan(tp_cluster(tls_cert_file=guard_files.cert, tls_key_file=guard_files.key))
    rank0, rank1 = (procs(plan, name)["sglang"] for name in ("n0", "n1"))
    assert flag(rank0.argv, "--ssl-certfile") == guard_path("/etc/k2provision", TLS_CERT)
    assert flag(rank0.argv, "--ssl-keyfile") == guard_path("/etc/k2provision", TLS_KEY)
    assert "--ssl-ca-certs" not in rank0.argv
    assert not {"--ssl-certfile", "--ssl-keyfile"} & set(rank1.argv)
    assert plan.endpoint.startswith("https://")
    assert plan.endpoint_host == "n0"
    assert rank0.health is not None
    assert rank0.health.url is not None
    assert rank0.health.url.startswith("https://")
    plain = build_plan(tp_cluster())
    assert "--ssl-certfile" not in procs(plain, "n0")["sglang"].argv
    assert plain.endpoint.startswith("http://")


# ---------------------------------------------------------------- what the checks ask


def _router_flag(router: Process, flag: str) -> str:
    return router.argv[router.argv.index(flag) + 1]


@pytest.mark.parametrize("case", ["sglang-tp", "sglang-pd-1p1d", "sglang-pd-fleet-32"])
def test_server_checks_ask_liveness_and_never_queue_a_generation(case: str) -> None:
    """sglang 0.5.23's /health runs a generation unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
    is false; the gates ask /ready, which queues none, and /health is made liveness too."""
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    servers = [p for p in all_processes(plan) if "sglang.launch_server" in p.argv]
    assert servers
    for server in servers:
        assert server.env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "false"
        if server.health is not None:
            assert server.health.url is not None
            assert server.health.url.endswith(":30000/ready")


def test_a_fleet_router_checks_each_worker_on_its_engines_liveness_route() -> None:
    examples = GOLDEN.parents[1] / "inventory" / "examples"
    pd = build_plan(load_cluster(examples / "sglang-pd-fleet-32.ini"))
    routers = [p for p in all_processes(pd) if p.name == "sglang-router"]
    assert len(routers) == 2  # behind the example's front
    for router in routers:
        assert _router_flag(router, "--health-check-endpoint") == "/ready"
        assert _router_flag(router, "--health-check-timeout-secs") == "5"


def test_nixl_gets_the_ib_devices_and_no_mooncake_or_ucx_override_environment() -> None:
    """sglang 0.5.23's NIXL (UCX) path reads --disaggregation-ib-device per GPU; a set
    UCX_NET_DEVICES would override it, and MC_TE_METRIC is Mooncake's alone."""
    nixl = build_plan(pd_cluster(pd_transfer_backend="nixl"))
    for proc in servers(nixl, "prefill") + servers(nixl, "decode"):
        assert _router_flag(proc, "--disaggregation-transfer-backend") == "nixl"
        assert _router_flag(proc, "--disaggregation-ib-device") == ",".join(IB)
        assert "MC_TE_METRIC" not in proc.env
        assert not any(name.startswith("UCX_") for name in proc.env)
    mooncake = build_plan(pd_cluster())
    assert all(p.env["MC_TE_METRIC"] == "true" for p in servers(mooncake, "decode"))
