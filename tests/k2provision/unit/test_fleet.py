"""Fleets: a pool of several serving instances behind one router (k2_instances,
k2_prefill_instances, k2_decode_instances). Each instance has its own hosts, ranks and master;
the router's command line lists every instance; single-instance inventories plan as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    launch_registrations,
)
from k2provision.core.records import Plan, Process
from k2provision.engines import REGISTRY
from k2provision.engines.base import layout_names
from k2provision.errors import InventoryError, PlanError
from k2provision.ops.restart import restart_set
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.containers import spec_hash
from k2provision.plan.inventory import load_cluster
from k2provision.plan.monitoring import scrape_targets
from k2provision.plan.rollout import instances_wave
from tests.k2provision.access_support import GuardFiles

EXAMPLES = Path(__file__).resolve().parents[3] / "inventory" / "examples"
PD_FLEET = EXAMPLES / "sglang-pd-fleet-32.ini"
TP_FLEET = EXAMPLES / "sglang-tp-fleet.ini"
TRTLLM_FLEET = EXAMPLES / "trtllm-tp-ep-fleet.ini"
ROUTER = ("python3", "-m", "sglang_router.launch_router")


def _plan(path: Path) -> Plan:
    return build_plan(load_cluster(path))


def _edited(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    text = source.read_text()
    assert old in text
    path = tmp_path / "inventory.ini"
    path.write_text(text.replace(old, new))
    return path


def _routers(plan: Plan) -> list[Process]:
    return [p for h in plan.hosts for p in h.processes if p.argv[:3] == ROUTER]


def _flag_values(argv: tuple[str, ...], flag: str, width: int) -> list[tuple[str, ...]]:
    return [argv[i + 1 : i + 1 + width] for i, a in enumerate(argv) if a == flag]


def test_the_32_node_example_is_two_prefill_and_two_decode_instances_behind_its_routers() -> None:
    plan = _plan(PD_FLEET)
    prefill, decode = (next(p for p in plan.pools if p.name == n) for n in ("prefill", "decode"))
    assert [i.instance for i in prefill.instances] == ["prefill-1", "prefill-2"]
    assert [i.instance for i in decode.instances] == ["decode-1", "decode-2"]
    assert [len(i.hosts) for i in (*prefill.instances, *decode.instances)] == [4, 4, 12, 12]
    # Consecutive groups in inventory order.
    assert prefill.instances[1].hosts == tuple(f"gpu-p{n:02d}" for n in range(5, 9))
    assert decode.instances[1].master == "gpu-d13"
    # Two routers behind the front (tests/k2provision/unit/test_front.py), each with the
    # same workers.
    first, second = _routers(plan)
    # The same but for their own addresses (--host, --prometheus-host).
    assert first.argv.count("10.10.0.5") == 2
    assert [a for a in first.argv if a != "10.10.0.5"] == [
        a for a in second.argv if a != "10.10.0.6"
    ]
    router = first
    assert _flag_values(router.argv, "--prefill", 2) == [
        ("http://10.10.0.11:30000", "8998"),
        ("http://10.10.0.15:30000", "8998"),
    ]
    assert _flag_values(router.argv, "--decode", 1) == [
        ("http://10.10.0.31:30000",),
        ("http://10.10.0.43:30000",),
    ]
    assert [i.url for i in (*prefill.instances, *decode.instances)] == [
        "http://10.10.0.11:30000",
        "http://10.10.0.15:30000",
        "http://10.10.0.31:30000",
        "http://10.10.0.43:30000",
    ]
    assert "--pd-disaggregation" in router.argv
    # sglang 0.5.23 reports dp_size 1 under --attn-dp-size: dp-aware would pin DP rank 0.
    assert "--dp-aware" not in router.argv
    assert plan.endpoint == "http://10.10.0.100:8000"


def test_each_instance_ranks_meet_at_their_own_master() -> None:
    plan = _plan(PD_FLEET)
    for host in plan.hosts:
        if host.pool == "router":
            continue
        instance = next(i for p in plan.pools for i in p.instances if host.name in i.hosts)
        (server,) = host.processes
        argv = server.argv
        master = next(h.local_ip for h in plan.hosts if h.name == instance.master)
        assert _flag_values(argv, "--dist-init-addr", 1) == [(f"{master}:5757",)], host.name
        assert _flag_values(argv, "--nnodes", 1) == [(str(len(instance.hosts)),)], host.name
        assert host.node_rank == instance.hosts.index(host.name)
        assert _flag_values(argv, "--node-rank", 1) == [(str(host.node_rank),)]
        assert host.instance == instance.instance
        assert server.instance is not None
        assert server.instance.name == instance.instance
    # Every instance's rank 0 has a health gate of its own.
    gated = [h.name for h in plan.hosts for p in h.processes if p.health and h.pool != "router"]
    assert gated == ["gpu-p01", "gpu-p05", "gpu-d01", "gpu-d13"]


def test_replica_fleet_routes_through_one_router_in_regular_mode() -> None:
    plan = _plan(TP_FLEET)
    assert launch_registrations(plan.model_dump(mode="json")) == []  # SGLang's name themselves
    (router,) = _routers(plan)
    urls = [i.url for i in plan.pools[0].instances]
    assert len(urls) == 4
    i = router.argv.index("--worker-urls")
    assert list(router.argv[i + 1 : i + 5]) == urls
    assert "--pd-disaggregation" not in router.argv
    assert plan.endpoint == "http://10.20.1.5:8000"
    # The replicas are workers behind the router: none is the public endpoint.
    served = [b for h in plan.hosts for b in h.ports if b.setting == "k2_sglang_port"]
    assert [b.bind for b in served] == [plan.hosts[n].local_ip for n in (0, 2, 4, 6)]


def test_the_spec_hash_names_the_instance() -> None:
    plan = _plan(TP_FLEET)
    host = plan.hosts[0]
    (server,) = host.processes
    assert server.instance is not None
    bare = server.model_copy(update={"instance": None})
    assert spec_hash(plan.container, server, host.files) != spec_hash(
        plan.container, bare, host.files
    )


def test_one_instance_plans_exactly_as_without_the_variable(tmp_path: Path) -> None:
    source = EXAMPLES / "sglang-tp.ini"
    explicit = _edited(tmp_path, source, "k2_engine=sglang", "k2_engine=sglang\nk2_instances=1")
    assert plan_digest(_plan(explicit)) == plan_digest(_plan(source))
    assert "instance" not in _plan(source).model_dump(mode="json")["hosts"][0]


def test_hosts_that_make_no_whole_instance_are_refused_with_the_counts_that_work(
    tmp_path: Path,
) -> None:
    path = _edited(tmp_path, PD_FLEET, "k2_decode_instances=2", "k2_decode_instances=5")
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    (line,) = caught.value.problems
    assert "[decode]" in line
    assert "has 24 hosts" in line
    assert "k2_decode_instances=5" in line
    assert "expected one of 1, 2, 3, 4, 6, 8, 12, 24" in line


def test_instance_counts_of_pools_the_layout_lacks_are_refused(tmp_path: Path) -> None:
    path = _edited(tmp_path, TP_FLEET, "k2_instances=4", "k2_instances=4\nk2_decode_instances=2")
    with pytest.raises(InventoryError, match="k2_decode_instances=2 counts the instances of"):
        load_cluster(path)


def test_every_engine_renders_fleets_of_every_layout() -> None:
    """No shipped engine refuses k2_instances above 1: each renders every layout as a fleet."""
    for name, engine in REGISTRY.items():
        assert layout_names(engine.LAYOUTS) == engine.FLEET_LAYOUTS, name


def test_an_engine_without_fleets_refuses_them_naming_what_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine whose release could not serve that way (none ships today) keeps the refusal.
    monkeypatch.setattr(REGISTRY["trtllm"], "FLEET_LAYOUTS", ())
    path = _edited(tmp_path, TRTLLM_FLEET, "k2_instances=4", "k2_instances=2")
    with pytest.raises(PlanError) as caught:
        _plan(path)
    (line,) = caught.value.problems
    assert line.startswith("k2_instances=2: TensorRT-LLM layout tp_ep renders one instance")
    assert "SGLang tp, pd; vLLM tp, tp_pp, dp_ep; KTransformers single" in line


def test_a_trtllm_fleet_is_one_mpirun_world_per_instance_behind_the_routers() -> None:
    """The shipped example: four 4-node instances, each its own MPI world (its own -H list
    and rank 0, its sshd taking its own hosts only), serving the routers on its head's
    k2_local_ip and k2_trtllm_port, registered by the launch with the served name."""
    plan = _plan(TRTLLM_FLEET)
    (nodes,) = [p for p in plan.pools if p.name == "nodes"]
    assert [len(i.hosts) for i in nodes.instances] == [4, 4, 4, 4]
    local = {h.name: h.local_ip for h in plan.hosts}
    urls = [f"http://{local[i.master]}:8200" for i in nodes.instances]
    assert [i.url for i in nodes.instances] == urls
    launches = {
        p.instance.name: p
        for h in plan.hosts
        for p in h.processes
        if p.name == "trtllm-serve" and p.instance
    }
    assert sorted(launches) == ["replica-1", "replica-2", "replica-3", "replica-4"]
    for instance in nodes.instances:
        argv = launches[instance.instance].argv
        assert argv[argv.index("-np") + 1] == "32"
        assert argv[argv.index("-H") + 1] == ",".join(f"{local[h]}:8" for h in instance.hosts)
        assert argv[argv.index("--host") + 1] == local[instance.master]
        assert argv[argv.index("--port") + 1] == "8200"
        assert "trtllm-serve" in [p.name for p in plan.host(instance.master).processes]
        for host in instance.hosts:
            sshd_config = str(plan.host(host).files["/etc/k2provision/ssh/sshd_config"])
            allowed = next(x for x in sshd_config.splitlines() if x.startswith("AllowUsers"))
            assert set(allowed.split()[1:]) == {f"root@{local[h]}" for h in instance.hosts}
    # A rolling change starts the sshd containers, then execs mpirun into the head's (stage 1).
    wave = instances_wave(plan, ["replica-2"])
    assert wave.stages == (0, 1)
    assert wave.containers == dict.fromkeys(nodes.instances[1].hosts, ("k2-trtllm",))
    # Only the heads run trtllm-serve; every instance host runs its sshd.
    assert sum(len(h.processes) for h in plan.hosts if h.role != "router") == 16 + 4
    assert launch_registrations(plan.model_dump(mode="json")) == [
        {"url": url, "model_id": "Kimi-K2-Instruct"} for url in urls
    ]
    for router in _routers(plan):
        assert "--worker-urls" not in router.argv
        assert router.registrar is not None
        assert [w["url"] for w in router.registrar.workers] == urls
        assert router.argv[router.argv.index("--health-check-endpoint") + 1] == "/health"
    assert plan.endpoint == "http://10.20.1.100:8000"
    public = sorted({h.name for h in plan.hosts for b in h.ports if b.public})
    assert public == ["router-01", "router-02"]


def test_a_trtllm_fleet_s_router_holds_the_key_one_instance_cannot_take(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    """trtllm-serve takes no key and no certificate: one instance is refused them, a fleet's
    router (the endpoint) takes both, and the instances behind it take neither."""
    guarded = f"k2_api_key_file={guard_files.api_key}\nk2_tls_cert_file={guard_files.cert}\n"
    guarded += f"k2_tls_key_file={guard_files.key}\n"
    # One router (a front tier's HAProxy serves no TLS in this release).
    lines = TRTLLM_FLEET.read_text().splitlines(keepends=True)
    kept = [x for x in lines if not x.startswith(("router-02 ", "k2_front_address="))]
    fleet = tmp_path / "fleet.ini"
    fleet.write_text("".join(kept) + guarded)
    plan = _plan(fleet)
    for router in _routers(plan):
        assert "--api-key" in router.argv
        assert "--tls-cert-path" in router.argv
    assert plan.endpoint.startswith("https://")
    single = tmp_path / "single.ini"
    single.write_text((EXAMPLES / "trtllm-tp-ep.ini").read_text() + guarded)
    with pytest.raises(InventoryError) as refused:
        _plan(single)
    assert any("takes no API key" in p for p in refused.value.problems)
    assert any("serves no TLS" in p for p in refused.value.problems)


def test_a_trtllm_instance_alone_keeps_its_endpoint_and_open_mesh() -> None:
    plan = _plan(EXAMPLES / "trtllm-tp-ep.ini")
    (serve,) = [p for h in plan.hosts for p in h.processes if p.name == "trtllm-serve"]
    assert serve.argv[serve.argv.index("--port") + 1] == "8000"
    assert serve.instance is None
    assert "AllowUsers root\n" in str(
        plan.host("node-01").files["/etc/k2provision/ssh/sshd_config"]
    )


def test_a_ktransformers_fleet_is_one_host_replicas_behind_the_router(tmp_path: Path) -> None:
    path = _edited(
        tmp_path,
        EXAMPLES / "ktransformers.ini",
        "[nodes]\nkt-01 ansible_host=10.20.0.11\n",
        "[router]\nrouter-01 ansible_host=10.20.0.5\n\n[nodes]\n"
        "kt-01 ansible_host=10.20.0.11\nkt-02 ansible_host=10.20.0.12\n",
    )
    path.write_text(path.read_text() + "k2_instances=2\n")
    plan = _plan(path)
    urls = ["http://10.20.0.11:30000", "http://10.20.0.12:30000"]
    assert [i.url for i in plan.pools[0].instances] == urls
    (router,) = _routers(plan)
    assert _flag_values(router.argv, "--worker-urls", 2) == [tuple(urls)]
    assert launch_registrations(plan.model_dump(mode="json")) == []
    for host, url in zip(("kt-01", "kt-02"), urls, strict=True):
        (server,) = plan.host(host).processes
        assert server.argv[server.argv.index("--host") + 1] == url.split("//")[1].split(":")[0]
        assert server.argv[server.argv.index("--port") + 1] == "30000"
    assert plan.endpoint == "http://10.20.0.5:8000"


def test_a_ktransformers_fleet_needs_one_host_per_replica(tmp_path: Path) -> None:
    path = _edited(
        tmp_path,
        EXAMPLES / "ktransformers.ini",
        "k2_layout=single",
        "k2_layout=single\nk2_instances=2",
    )
    with pytest.raises(
        InventoryError,
        match="runs each instance on exactly one host, \\[nodes\\] has 1 for k2_instances=2",
    ):
        load_cluster(path)


@pytest.mark.parametrize("layout", ["tp", "dp_ep"])
def test_a_vllm_fleet_is_replicas_behind_the_router_on_the_private_address(
    tmp_path: Path, layout: str, guard_files: GuardFiles
) -> None:
    """Four 2-node vLLM instances (Ray TP, or DP+EP), each serving the router on its head's
    k2_local_ip and k2_vllm_port and registered by the launch with its model id (the router
    starts without them, gated on its liveness); the router alone is the endpoint, holds the
    key, and is scraped on its metrics port only."""
    path = _edited(
        tmp_path,
        TP_FLEET,
        "k2_engine=sglang\nk2_layout=tp",
        f"k2_engine=vllm\nk2_layout={layout}\nk2_api_key_file={guard_files.api_key}",
    )
    plan = _plan(path)
    heads = [i.master for i in plan.pools[0].instances]
    assert heads == ["node-01", "node-03", "node-05", "node-07"]
    local = {h.name: h.local_ip for h in plan.hosts}
    urls = [f"http://{local[h]}:8100" for h in heads]
    assert [i.url for i in plan.pools[0].instances] == urls
    (router,) = _routers(plan)
    assert "--worker-urls" not in router.argv
    assert router.health is not None
    assert router.health.url == "http://10.20.1.5:8000/health"
    # The router checks vLLM workers on vLLM's own liveness route, not SGLang's /ready.
    checks = router.argv[router.argv.index("--health-check-endpoint") + 1]
    assert checks == "/health"
    assert launch_registrations(plan.model_dump(mode="json")) == [
        {"url": url, "model_id": "kimi-k2"} for url in urls
    ]
    # The router's launch script registers them too, once the router answers: a router that
    # restarts serves them without an apply (the key read there from the launch's file).
    assert router.registrar is not None
    assert router.registrar.url == "http://10.20.1.5:8000"
    assert list(router.registrar.workers) == launch_registrations(plan.model_dump(mode="json"))
    assert router.registrar.key_file == "/etc/k2provision/secrets/api_key"
    files = plan.host("router-01").files
    script = str(files["/etc/k2provision/launch/sglang-router.sh"])
    registrar = "python3 /etc/k2provision/launch/k2-router-registrar.py http://10.20.1.5:8000 '["
    assert registrar in script
    assert script.index(registrar) < script.index("exec python3")
    assert "/etc/k2provision/launch/k2-router-registrar.py" in files
    assert "--api-key" in router.argv
    assert plan.endpoint == "http://10.20.1.5:8000"
    served = [b for h in plan.hosts for b in h.ports if b.setting == "k2_vllm_port"]
    assert [(b.bind, b.port, b.public) for b in served] == [(local[h], 8100, False) for h in heads]
    public = [(h.name, b.setting) for h in plan.hosts for b in h.ports if b.public]
    assert public == [("router-01", "k2_api_port")]
    serves = [p for h in plan.hosts for p in h.processes if p.name == "vllm-serve"]
    assert len(serves) == 4
    for serve in serves:
        assert serve.instance is not None
        assert "VLLM_API_KEY" not in serve.env
        assert "--ssl-certfile" not in serve.argv
        assert serve.health is not None
        assert serve.health.url is not None
        assert serve.health.url.endswith(":8100/health")
    engine = sorted(t.address for t in scrape_targets(plan) if t.job == "engine")
    assert engine == sorted(f"{local[h]}:8100" for h in heads)
    assert [t.address for t in scrape_targets(plan) if t.job == "router"] == [
        f"{local['router-01']}:29000"
    ]


def test_metrics_are_labelled_by_instance() -> None:
    targets = scrape_targets(_plan(PD_FLEET))
    engine = {t.instance for t in targets if t.job == "engine"}
    assert engine == {"prefill-1", "prefill-2", "decode-1", "decode-2"}
    assert {t.instance for t in targets if t.job == "router"} == {"router"}
    assert {t.instance for t in targets if t.host == "gpu-d14"} == {"decode-2"}


def test_restarting_a_host_widens_to_its_instance_only() -> None:
    plan = _plan(PD_FLEET)
    decode_2 = {f"gpu-d{n:02d}" for n in range(13, 25)}
    assert set(restart_set(plan, ["gpu-d14"]).hosts) == decode_2
    assert set(restart_set(plan, ["decode-2"]).hosts) == decode_2
    assert set(restart_set(plan, ["decode"]).hosts) == {f"gpu-d{n:02d}" for n in range(1, 25)}


@pytest.mark.parametrize(
    ("prefill", "decode", "policies"),
    [
        (1, 2, ("round_robin", "power_of_two")),
        (2, 1, ("power_of_two", "round_robin")),
        (2, 2, ("power_of_two", "power_of_two")),
    ],
)
def test_each_pd_pools_routing_policy_follows_its_instance_count(
    tmp_path: Path, prefill: int, decode: int, policies: tuple[str, str]
) -> None:
    """sglang-router 0.3.2 refuses power_of_two for a pool of one worker; the prefill servers
    run without a radix cache, so no pool is routed cache-aware."""
    text = PD_FLEET.read_text()
    text = text.replace("k2_prefill_instances=2", f"k2_prefill_instances={prefill}")
    text = text.replace("k2_decode_instances=2", f"k2_decode_instances={decode}")
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    router, _ = _routers(_plan(path))  # the example's two routers, alike
    assert _flag_values(router.argv, "--policy", 1) == [policies[:1]]
    assert _flag_values(router.argv, "--decode-policy", 1) == [policies[1:]]
    assert "cache_aware" not in router.argv


def test_the_plan_says_what_the_pd_routers_power_of_two_compares(tmp_path: Path) -> None:
    """sglang 0.5.23 serves no /get_load, so power_of_two weighs the router's own in-flight
    counts; the plan says so for the pools it balances, and not for single instances."""
    (warning,) = [w for w in _plan(PD_FLEET).warnings if "power_of_two" in w]
    assert "prefill and among the decode instances" in warning
    assert "own count of requests in flight" in warning
    assert "/get_load" in warning
    path = _edited(tmp_path, PD_FLEET, "k2_prefill_instances=2", "k2_prefill_instances=1")
    (warning,) = [w for w in _plan(path).warnings if "power_of_two" in w]
    assert "among the decode instances" in warning
    assert "prefill" not in warning
    single = _edited(tmp_path, path, "k2_decode_instances=2", "k2_decode_instances=1")
    assert not [w for w in _plan(single).warnings if "power_of_two" in w]


def test_an_sglang_fleets_router_names_its_workers_itself_and_has_no_registrar() -> None:
    plan = _plan(PD_FLEET)
    assert all(r.registrar is None for r in _routers(plan))
    assert not any(path.endswith("k2-router-registrar.py") for h in plan.hosts for path in h.files)
