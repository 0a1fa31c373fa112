"""vLLM renderer: Ray TP / TP+PP and DP+EP layouts, checked fact by fact (no engine installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.records import Cluster, HealthGate, HostSpec, Plan, Process, Tunables
from k2provision.engines import REGISTRY, vllm
from k2provision.engines.base import Deployment
from k2provision.errors import PlanError
from k2provision.plan.assemble import build_plan
from tests.k2provision.access_support import GuardFiles

ADDRESSES = ("10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4")


def cluster(
    layout: str,
    nodes: int = 2,
    *,
    local_ips: tuple[str, ...] = (),
    lab: bool = False,
    context_length: int | None = None,
    **tunables: object,
) -> Cluster:
    hosts = tuple(
        HostSpec(
            name=f"n{i}",
            address=ADDRESSES[i],
            pool="nodes",
            local_ip=local_ips[i] if local_ips else ADDRESSES[i],
        )
        for i in range(nodes)
    )
    return Cluster(
        inventory="test.ini",
        engine="vllm",
        layout=layout,
        model="moonshotai/Kimi-K2-Instruct",
        model_dir="/models/K2",
        gpu="h200",
        gpus_per_node=8,
        hosts=hosts,
        lab=lab,
        context_length=context_length,
        tunables=Tunables.model_validate(tunables),
    )


def plan(layout: str, nodes: int = 2, **kwargs: object) -> Plan:
    return build_plan(cluster(layout, nodes, **kwargs))  # type: ignore[arg-type]


def procs(p: Plan) -> list[tuple[str, Process]]:
    return [(h.name, proc) for h in p.hosts for proc in h.processes]


def serves(p: Plan) -> list[Process]:
    return [proc for _, proc in procs(p) if proc.argv[:2] == ("vllm", "serve")]


def opt(argv: tuple[str, ...], flag: str) -> str:
    """The value after `flag` (which must occur exactly once)."""
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- Ray layouts


def test_tp16_serves_only_on_the_head_and_workers_only_run_ray() -> None:
    p = plan("tp")
    head, worker = p.hosts
    assert [proc.name for proc in head.processes] == ["ray-head", "vllm-serve"]
    assert [proc.name for proc in worker.processes] == ["ray-worker"]
    (serve,) = serves(p)
    assert serve in head.processes
    assert opt(serve.argv, "--tensor-parallel-size") == "16"
    assert "--pipeline-parallel-size" not in serve.argv
    assert opt(serve.argv, "--distributed-executor-backend") == "ray"
    assert worker.processes[0].argv[:2] == ("ray", "start")
    assert not any("vllm" in a for a in worker.processes[0].argv)


def test_tp8_pp2_uses_one_node_per_pipeline_stage() -> None:
    (serve,) = serves(plan("tp_pp"))
    assert opt(serve.argv, "--tensor-parallel-size") == "8"
    assert opt(serve.argv, "--pipeline-parallel-size") == "2"
    assert opt(serve.argv, "--distributed-executor-backend") == "ray"


def test_ray_start_order_and_gates() -> None:
    p = plan("tp_pp", nodes=3)
    head = p.hosts[0]
    ray_head, serve = head.processes
    assert ray_head.argv == (
        "ray",
        "start",
        "--head",
        "--port",
        "6379",
        "--node-ip-address",
        ADDRESSES[0],
        "--disable-usage-stats",
        "--block",
    )
    assert (ray_head.stage, ray_head.exec_in) == (0, False)
    assert ray_head.health is not None
    assert ray_head.health.command[-3:] == (f"{ADDRESSES[0]}:6379", "1", "8")
    for i, host in enumerate(p.hosts[1:], start=1):
        (worker,) = host.processes
        assert worker.argv == (
            "ray",
            "start",
            "--address",
            f"{ADDRESSES[0]}:6379",
            "--node-ip-address",
            ADDRESSES[i],
            "--disable-usage-stats",
            "--block",
        )
        assert (worker.stage, worker.exec_in) == (1, False)
        assert worker.health is not None
        assert worker.health.command[-3:] == (f"{ADDRESSES[0]}:6379", "3", "24")
    assert (serve.stage, serve.exec_in, serve.container) == (2, True, ray_head.container)
    assert serve.health == HealthGate(url=f"http://{ADDRESSES[0]}:8000/health")


def test_lab_ray_gate_is_the_production_gate() -> None:
    # The lab's stand-in Ray nodes offer GPUs too: the lab checks the same numbers.
    lab, prod = plan("tp", lab=True), plan("tp")
    assert lab.hosts[1].processes[0].health == prod.hosts[1].processes[0].health


def test_ray_ports_follow_tunables() -> None:
    p = plan("tp", ray_port=7000, api_port=9000)
    assert opt(p.hosts[0].processes[0].argv, "--port") == "7000"
    assert opt(p.hosts[1].processes[0].argv, "--address") == f"{ADDRESSES[0]}:7000"
    (serve,) = serves(p)
    assert opt(serve.argv, "--port") == "9000"
    assert p.endpoint == f"http://{ADDRESSES[0]}:9000"


# ---------------------------------------------------------------- DP + EP


def test_dp_ep_ranks_and_headless_workers() -> None:
    p = plan("dp_ep")
    head, worker = (h.processes[0] for h in p.hosts)
    # A start rank on the head would select hybrid load balancing, which refuses headless
    # ranks at the handshake (vllm/v1/engine/utils.py): the head takes none.
    assert "--data-parallel-start-rank" not in head.argv
    assert opt(worker.argv, "--data-parallel-start-rank") == "8"
    assert "--headless" not in head.argv
    assert "--headless" in worker.argv
    for proc in (head, worker):
        assert opt(proc.argv, "--data-parallel-size") == "16"
        assert opt(proc.argv, "--data-parallel-size-local") == "8"
        assert opt(proc.argv, "--data-parallel-rpc-port") == "13345"
        assert "--enable-expert-parallel" in proc.argv
        assert opt(proc.argv, "--all2all-backend") == "deepep_low_latency"
        assert "--enable-eplb" in proc.argv
        assert opt(proc.argv, "--eplb-config") == '{"num_redundant_experts":16}'
        assert opt(proc.argv, "--max-num-batched-tokens") == "8192"
        assert opt(proc.argv, "--max-num-seqs") == "256"
        assert opt(proc.argv, "--gpu-memory-utilization") == f"{p.pools[0].mem_fraction:g}"
        assert "--distributed-executor-backend" not in proc.argv
    assert not any(proc.argv[0] == "ray" for _, proc in procs(p))


def without_rank(argv: tuple[str, ...]) -> list[str]:
    """`argv` less `--headless` and `--data-parallel-start-rank N`."""
    if "--data-parallel-start-rank" not in argv:
        return list(argv)
    i = argv.index("--data-parallel-start-rank")
    return [a for a in argv[:i] + argv[i + 2 :] if a != "--headless"]


def test_dp_ep_spare_experts_and_all2all_follow_tunables() -> None:
    none = plan("dp_ep", vllm_redundant_experts=0).hosts[0].processes[0]
    assert "--enable-eplb" not in none.argv
    assert "--eplb-config" not in none.argv
    ht = plan("dp_ep", vllm_all2all_backend="deepep_high_throughput").hosts[1].processes[0]
    assert opt(ht.argv, "--all2all-backend") == "deepep_high_throughput"


def test_dp_ep_int4_experts_run_without_eplb_and_refuse_spare_slots() -> None:
    # The compressed-tensors INT4 Marlin MoE method has no EPLB in 0.33.0.
    thinking = {"model": "moonshotai/Kimi-K2-Thinking"}
    head = build_plan(cluster("dp_ep", 2).model_copy(update=thinking)).hosts[0].processes[0]
    assert "--enable-expert-parallel" in head.argv
    assert "--enable-eplb" not in head.argv
    spare = cluster("dp_ep", 2, vllm_redundant_experts=16).model_copy(update=thinking)
    with pytest.raises(PlanError, match="k2_vllm_redundant_experts=16: spare expert slots need"):
        build_plan(spare)


def test_every_process_waits_for_its_engines_as_long_as_the_gate() -> None:
    for layout in ("tp", "tp_pp", "dp_ep"):
        for _, proc in procs(plan(layout, health_timeout_s=5400)):
            assert proc.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "5400"


def test_dp_ep_workers_differ_from_the_head_only_by_rank_and_headless() -> None:
    p = plan("dp_ep", nodes=4)
    argvs = [h.processes[0].argv for h in p.hosts]
    for k, argv in enumerate(argvs[1:], start=1):
        assert opt(argv, "--data-parallel-start-rank") == str(8 * k)
        assert opt(argv, "--data-parallel-size") == "32"
        assert without_rank(argv) == without_rank(argvs[0])


def test_dp_ep_starts_all_ranks_together_and_gates_on_the_head() -> None:
    p = plan("dp_ep", nodes=3)
    head, *workers = (h.processes[0] for h in p.hosts)
    assert all(proc.stage == 0 and not proc.exec_in for proc in (head, *workers))
    assert head.health == HealthGate(url=f"http://{ADDRESSES[0]}:8000/health")
    assert all(w.health is None for w in workers)
    assert [proc.name for proc in (head, *workers)] == ["vllm-serve"] + ["vllm-headless"] * 2


# ---------------------------------------------------------------- every layout

LAYOUTS = ("tp", "tp_pp", "dp_ep")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_serve_has_auto_tool_choice_and_kimi_parser(layout: str) -> None:
    for serve in serves(plan(layout, context_length=65536)):
        assert "--enable-auto-tool-choice" in serve.argv
        assert opt(serve.argv, "--tool-call-parser") == "kimi_k2"
        assert serve.argv[2] == "/models/K2"
        assert opt(serve.argv, "--served-model-name") == "kimi-k2"
        assert opt(serve.argv, "--max-model-len") == "65536"
        assert opt(serve.argv, "--host") == "0.0.0.0"
        assert "--trust-remote-code" in serve.argv


@pytest.mark.parametrize("layout", LAYOUTS)
def test_vllm_host_ip_is_each_hosts_own_address(layout: str) -> None:
    # TP 32 would cut each FP8 expert into 64-wide slices: tp stops at 2 nodes.
    p = plan(layout, nodes=2 if layout == "tp" else 4)
    for h in p.hosts:
        assert h.processes
        for proc in h.processes:
            assert proc.env["VLLM_HOST_IP"] == h.address
            assert proc.env["HF_HUB_OFFLINE"] == "1"
            # The interface that holds this host's address, found by its launch script.
            assert proc.env["NCCL_SOCKET_IFNAME"] == "${K2_SOCKET_IFNAME}"
            assert proc.env["GLOO_SOCKET_IFNAME"] == "${K2_SOCKET_IFNAME}"
            assert [(v.kind, v.arg) for v in proc.resolve] == [("ifname-of", h.address)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_local_ip_is_announced_and_the_head_is_dialled_where_it_binds(layout: str) -> None:
    """Ray workers dial the head's inventory address (Ray binds every interface); headless DP
    ranks dial the head's k2_local_ip, the one address its DP handshake binds."""
    local = ("192.168.0.1", "192.168.0.2")
    p = plan(layout, local_ips=local, socket_ifname="ib0")
    for i, h in enumerate(p.hosts):
        for proc in h.processes:
            assert proc.env["VLLM_HOST_IP"] == local[i]
            assert proc.env["NCCL_SOCKET_IFNAME"] == "ib0"
            assert proc.env["GLOO_SOCKET_IFNAME"] == "ib0"
            if proc.argv[0] == "ray":
                assert opt(proc.argv, "--node-ip-address") == local[i]
    worker = p.hosts[1].processes[0]
    if layout == "dp_ep":
        assert opt(worker.argv, "--data-parallel-address") == local[0]
        assert opt(p.hosts[0].processes[0].argv, "--data-parallel-address") == local[0]
    else:
        assert opt(worker.argv, "--address") == f"{ADDRESSES[0]}:6379"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_head_address_is_everywhere_workers_point(layout: str) -> None:
    # TP 32 would cut each FP8 expert into 64-wide slices: tp stops at 2 nodes.
    p = plan(layout, nodes=2 if layout == "tp" else 4)
    head = ADDRESSES[0]
    assert p.endpoint == f"http://{head}:8000"
    for host in p.hosts[1:]:
        (proc,) = host.processes
        if layout == "dp_ep":
            assert opt(proc.argv, "--data-parallel-address") == head
        else:
            assert opt(proc.argv, "--address") == f"{head}:6379"
            assert proc.health is not None
            assert proc.health.command[-3] == f"{head}:6379"
    for proc in p.hosts[0].processes:
        if proc.health is not None and proc.health.url is not None:
            assert proc.health.url.startswith(f"http://{head}:")
        elif proc.health is not None:
            assert proc.health.command[-3] == f"{head}:6379"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_container_per_host_and_launch_scripts(layout: str) -> None:
    p = plan(layout)
    for h in p.hosts:
        assert {proc.container for proc in h.processes} == {"k2-vllm"}
        assert [proc for proc in h.processes if not proc.exec_in]  # a main command
        for proc in h.processes:
            script = h.files[f"/etc/k2provision/launch/{proc.name}.sh"]
            assert f"export VLLM_HOST_IP={proc.env['VLLM_HOST_IP']}" in script


def test_unknown_layout_is_refused() -> None:
    deployment = Deployment(
        cluster=cluster("tp").model_copy(update={"layout": "single"}),
        model=catalog.model("moonshotai/Kimi-K2-Instruct"),
        release=REGISTRY["vllm"].RELEASE,
        pools=(),
        context_length=4096,
        image="img",
    )
    with pytest.raises(ValueError, match="no layout 'single'"):
        vllm.render(deployment)


# ---------------------------------------------------------------- the Ray gate itself

FAKE_RAY = """
import json, os
def init(address, **kwargs):
    assert address == os.environ["EXPECT_ADDRESS"], address
def nodes():
    return json.loads(os.environ["FAKE_NODES"])
"""


def run_gate(tmp_path: Path, gate: HealthGate, nodes: list[dict[str, object]]) -> int:
    (tmp_path / "ray.py").write_text(FAKE_RAY)
    address = gate.command[-3]
    script = gate.command[gate.command.index("python3") + 1 :]
    result = subprocess.run(
        [sys.executable, *script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "PYTHONPATH": str(tmp_path),
            "EXPECT_ADDRESS": address,
            "FAKE_NODES": json.dumps(nodes),
        },
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode


def test_ray_gate_passes_only_with_all_nodes_and_gpus(tmp_path: Path) -> None:
    gate = vllm.ray_gate("10.1.0.1:6379", 2, 16, 60)
    assert gate.command[:4] == ("timeout", "-k", "5", str(vllm.RAY_CHECK_ATTEMPT_S))
    node = {"Alive": True, "Resources": {"GPU": 8.0, "CPU": 192.0}}
    dead = {"Alive": False, "Resources": {"GPU": 8.0}}
    no_gpu = {"Alive": True, "Resources": {"CPU": 192.0}}
    assert run_gate(tmp_path, gate, [node, node]) == 0
    assert run_gate(tmp_path, gate, [node]) == 1
    assert run_gate(tmp_path, gate, [node, dead]) == 1
    assert run_gate(tmp_path, gate, [node, no_gpu]) == 1
    assert run_gate(tmp_path, vllm.ray_gate("10.1.0.1:6379", 2, 0, 60), [no_gpu, no_gpu]) == 0


def test_health_gate_kinds() -> None:
    url = HealthGate(url="http://h:1/health")
    assert url.model_dump(mode="json") == {
        "url": "http://h:1/health",
        "expect_status": 200,
        "timeout_s": 3600,
    }
    cmd = HealthGate(command=("true",), timeout_s=5)
    assert cmd.model_dump(mode="json") == {"command": ["true"], "timeout_s": 5}
    assert HealthGate.model_validate(cmd.model_dump(mode="json")) == cmd
    with pytest.raises(ValueError, match="exactly one"):
        HealthGate()
    with pytest.raises(ValueError, match="exactly one"):
        HealthGate(url="http://h:1/", command=("true",))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_api_key_reaches_the_api_server_through_its_environment(
    layout: str, guard_files: GuardFiles
) -> None:
    """k2_api_key_file: the API server's launch script reads the launch phase's key file into
    VLLM_API_KEY; no argv, no other process and no render holds the key or its source."""
    p = plan(layout, api_key_file=guard_files.api_key)
    (server,) = [proc for _, proc in procs(p) if proc.name == "vllm-serve"]
    assert server.env["VLLM_API_KEY"] == "${K2_API_KEY}"
    key = next(v for v in server.resolve if v.name == "K2_API_KEY")
    assert (key.kind, key.arg) == ("secret-file", "/etc/k2provision/secrets/api_key")
    for _, proc in procs(p):
        assert "--api-key" not in proc.argv
        if proc is not server:
            assert "VLLM_API_KEY" not in proc.env
    script = p.hosts[0].files["/etc/k2provision/launch/vllm-serve.sh"]
    assert 'export VLLM_API_KEY="${K2_API_KEY}"' in script
    # The controller's key file is named once, in the plan's access (the launch role copies
    # it from there); no host's part, render or argv names it.
    assert p.access.api_key_file == guard_files.api_key
    assert guard_files.api_key not in json.dumps([h.model_dump(mode="json") for h in p.hosts])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tls_is_served_by_the_api_server_alone_and_makes_the_endpoint_https(
    layout: str, guard_files: GuardFiles
) -> None:
    """k2_tls_cert_file: the API server takes --ssl-certfile / --ssl-keyfile on the launch
    phase's files (on the endpoint's host only); no other process names them; the health gate
    and the endpoint are https."""
    p = plan(layout, tls_cert_file=guard_files.cert, tls_key_file=guard_files.key)
    (server,) = [proc for _, proc in procs(p) if proc.name == "vllm-serve"]
    argv = server.argv
    assert argv[argv.index("--ssl-certfile") + 1] == "/etc/k2provision/tls/cert.pem"
    assert argv[argv.index("--ssl-keyfile") + 1] == "/etc/k2provision/tls/key.pem"
    for host, proc in procs(p):
        if proc is not server:
            assert "--ssl-certfile" not in proc.argv
        else:
            assert host == p.endpoint_host
    assert p.endpoint.startswith("https://")
    assert server.health is not None
    assert server.health.url is not None
    assert server.health.url.startswith("https://")
    assert plan(layout).endpoint.startswith("http://")
    assert "VLLM_API_KEY" not in json.dumps(plan(layout).model_dump(mode="json"))
