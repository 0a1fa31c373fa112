"""TensorRT-LLM renderer: the YAML, the sshd mesh, and the mpirun line from rank 0."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from k2provision.core.records import Cluster, HostSpec, Plan, Process, Tunables
from k2provision.engines import trtllm
from k2provision.engines.trtllm_schema import validate_extra_llm_api_options
from k2provision.errors import InventoryError, PlanError
from k2provision.plan.assemble import build_plan
from tests.k2provision.access_support import GuardFiles

ADDRESSES = ("10.2.0.7", "10.2.0.3", "10.2.0.5", "10.2.0.9")
YAML_PATH = "/etc/k2provision/trtllm/extra-llm-api-config.yml"
SSH_DIR = "/etc/k2provision/ssh"


def cluster(nodes: int = 2, context_length: int | None = None, **tunables: object) -> Cluster:
    hosts = tuple(
        HostSpec(name=f"gpu-{i}", address=ADDRESSES[i], pool="nodes", local_ip=ADDRESSES[i])
        for i in range(nodes)
    )
    return Cluster(
        inventory="test.ini",
        engine="trtllm",
        layout="tp_ep",
        model="moonshotai/Kimi-K2-Instruct",
        model_dir="/models/K2",
        gpu="h200",
        gpus_per_node=8,
        hosts=hosts,
        context_length=context_length,
        tunables=Tunables.model_validate(tunables),
    )


def plan(nodes: int = 2, context_length: int | None = None, **tunables: object) -> Plan:
    return build_plan(cluster(nodes, context_length, **tunables))


def serve_process(p: Plan) -> tuple[str, Process]:
    found = [(h.name, proc) for h in p.hosts for proc in h.processes if proc.name == "trtllm-serve"]
    assert len(found) == 1, found
    return found[0]


def opt(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def serve_args(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The argv from `trtllm-serve serve MODEL` on."""
    start = argv.index("trtllm-serve")
    assert argv[start - 1] == "trtllm-llmapi-launch"
    assert argv[start + 1] == "serve"
    return argv[start:]


def rendered_options(p: Plan) -> dict[str, object]:
    data = yaml.safe_load(p.hosts[0].files[YAML_PATH])
    assert isinstance(data, dict)
    return data


# ---------------------------------------------------------------- the YAML


def test_yaml_is_identical_on_every_host_and_passes_the_schema() -> None:
    p = plan(4)
    texts = {h.files[YAML_PATH] for h in p.hosts}
    assert len(texts) == 1
    data = yaml.safe_load(texts.pop())
    options = validate_extra_llm_api_options(data)
    again = yaml.safe_load(yaml.safe_dump(options.model_dump(mode="json", exclude_unset=True)))
    assert again == data


def test_yaml_values() -> None:
    data = rendered_options(plan())
    assert data["cuda_graph_config"] == {
        "batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128],
        "enable_padding": True,
    }
    assert data["enable_attention_dp"] is True
    assert data["print_iter_log"] is False
    assert data["enable_chunked_prefill"] is True
    p = plan()
    assert data["kv_cache_config"] == {
        "free_gpu_memory_fraction": p.fit[0].mem_fraction,
        "dtype": "fp8",
    }
    assert p.fit[0].kv_dtype == "fp8"  # the fit counts the dtype rendered
    assert "padding_enabled" not in yaml.safe_dump(data)


def test_fp8_experts_name_deepgemm_on_blackwell_and_the_default_on_hopper() -> None:
    # The CUTLASS FP8 block-scale MoE GEMM (1.2's default for DeepSeek-V3) is Hopper-only.
    assert "moe_config" not in rendered_options(plan())
    b200 = build_plan(cluster(2).model_copy(update={"gpu": "b200"}))
    data = rendered_options(b200)
    assert data["moe_config"] == {"backend": "DEEPGEMM"}
    validate_extra_llm_api_options(data)


def test_yaml_and_command_line_agree_on_the_kv_fraction() -> None:
    p = plan()
    _, proc = serve_process(p)
    fraction = float(opt(proc.argv, "--kv_cache_free_gpu_memory_fraction"))
    kv = rendered_options(p)["kv_cache_config"]
    assert isinstance(kv, dict)
    assert kv["free_gpu_memory_fraction"] == fraction == p.pools[0].mem_fraction


def test_attention_dp_follows_the_plan() -> None:
    p = plan()
    assert rendered_options(p)["enable_attention_dp"] is p.pools[0].parallel.dp_attention


def test_cuda_graph_sizes_stop_at_max_batch_size() -> None:
    assert trtllm.cuda_graph_batch_sizes(48) == [1, 2, 4, 8, 16, 32]
    assert trtllm.cuda_graph_batch_sizes(1024) == [1, 2, 4, 8, 16, 32, 64, 128]
    graphs = rendered_options(plan(trtllm_max_batch_size=48))["cuda_graph_config"]
    assert isinstance(graphs, dict)
    assert graphs["batch_sizes"] == [1, 2, 4, 8, 16, 32]


def test_kv_dtype_can_be_left_to_the_engine() -> None:
    kv = rendered_options(plan(trtllm_kv_cache_dtype="auto"))["kv_cache_config"]
    assert isinstance(kv, dict)
    assert kv["dtype"] == "auto"


def test_chunked_prefill_only_when_a_prompt_can_exceed_max_num_tokens() -> None:
    assert rendered_options(plan(context_length=4096))["enable_chunked_prefill"] is False
    assert rendered_options(plan(context_length=4097))["enable_chunked_prefill"] is True


# ---------------------------------------------------------------- the mpirun line


@pytest.mark.parametrize("nodes", [2, 4])
def test_mpirun_covers_every_gpu_of_every_host_in_inventory_order(nodes: int) -> None:
    p = plan(nodes)
    _, proc = serve_process(p)
    argv = proc.argv
    assert argv[0] == "mpirun"
    assert opt(argv, "-np") == str(nodes * 8)
    assert opt(argv, "-H") == ",".join(f"{a}:8" for a in ADDRESSES[:nodes])
    assert "--allow-run-as-root" in argv


def test_three_nodes_are_refused_since_each_expert_would_split_in_thirds() -> None:
    # MoE TP = tp / ep = the node count: 2048 / 3 is no whole number of 128-wide FP8 blocks.
    with pytest.raises(PlanError, match=r"2048 split over 3 ranks gives 2048/3 per rank") as info:
        plan(3)
    assert "fits on 2 nodes" in str(info.value)
    assert "or 4 nodes" in str(info.value)


def test_plm_rsh_args_is_one_argv_element_naming_the_ssh_port() -> None:
    _, proc = serve_process(plan())
    i = proc.argv.index("plm_rsh_args")
    assert proc.argv[i - 1] == "-mca"
    assert proc.argv[i + 1] == f"-p 2233 -F {SSH_DIR}/ssh_config"


def test_mpirun_runs_on_rank_0_only_inside_the_running_container() -> None:
    p = plan(4)
    host, proc = serve_process(p)
    assert host == p.pools[0].master == "gpu-0"
    assert proc.exec_in is True
    assert proc.stage == 1
    assert proc.container == trtllm.CONTAINER
    assert proc.health is not None
    assert proc.health.url == f"http://{ADDRESSES[0]}:8000/health"
    assert p.endpoint == f"http://{ADDRESSES[0]}:8000"


def test_serve_options() -> None:
    p = plan()
    _, proc = serve_process(p)
    args = serve_args(proc.argv)
    assert args[2] == "/models/K2"
    assert opt(args, "--host") == "0.0.0.0"
    assert opt(args, "--port") == "8000"
    assert opt(args, "--backend") == "pytorch"
    assert opt(args, "--tp_size") == str(p.pools[0].parallel.tp) == "16"
    assert opt(args, "--ep_size") == str(p.pools[0].parallel.ep) == "8"
    assert opt(args, "--max_batch_size") == "128"
    assert opt(args, "--max_num_tokens") == "4096"
    assert opt(args, "--max_seq_len") == "131072"
    assert opt(args, "--tool_parser") == "kimi_k2"
    assert "--trust_remote_code" in args
    assert opt(args, "--extra_llm_api_options") == YAML_PATH


def test_every_rendered_serve_option_exists_in_the_release() -> None:
    _, proc = serve_process(plan(socket_ifname="ib0"))
    args = serve_args(proc.argv)[3:]
    i = 0
    while i < len(args):
        option = args[i]
        assert option in trtllm.SERVE_OPTIONS, option
        if option in trtllm.SERVE_FLAGS:
            i += 1
        else:
            assert not args[i + 1].startswith("--"), (option, args[i + 1])
            i += 2
    assert opt(args, "--tool_parser") in trtllm.TOOL_PARSERS


def test_process_env_reaches_every_rank() -> None:
    _, proc = serve_process(plan(socket_ifname="ens1f0"))
    forwarded = [proc.argv[i + 1] for i, a in enumerate(proc.argv) if a == "-x"]
    assert set(proc.env) <= set(forwarded)
    assert {"PATH", "LD_LIBRARY_PATH"} <= set(forwarded)
    assert proc.env["NCCL_SOCKET_IFNAME"] == proc.env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert opt(proc.argv, "btl_tcp_if_include") == "ens1f0"
    assert opt(proc.argv, "oob_tcp_if_include") == "ens1f0"
    assert proc.env["HF_HUB_OFFLINE"] == "1"


def test_interfaces_are_found_on_rank_0_unless_named() -> None:
    """NCCL/Gloo get the name of rank 0's interface holding its k2_local_ip (mpirun forwards
    it to every rank); Open MPI's own TCP is pinned to that interface's subnet, which holds
    whatever the interfaces are called on the other hosts."""
    _, proc = serve_process(plan())
    assert opt(proc.argv, "btl_tcp_if_include") == "${K2_SOCKET_SUBNET}"
    assert opt(proc.argv, "oob_tcp_if_include") == "${K2_SOCKET_SUBNET}"
    assert proc.env["NCCL_SOCKET_IFNAME"] == proc.env["GLOO_SOCKET_IFNAME"] == "${K2_SOCKET_IFNAME}"
    assert {(v.name, v.kind, v.arg) for v in proc.resolve} == {
        ("K2_SOCKET_IFNAME", "ifname-of", ADDRESSES[0]),
        ("K2_SOCKET_SUBNET", "cidr-of", ADDRESSES[0]),
    }


def test_served_name_is_the_model_directorys_base_name() -> None:
    """trtllm-serve 1.2 lists a model given as a directory by its base name
    (tensorrt_llm/serve/openai_server.py): that is the name verify asks for."""
    assert plan().served_model_name == "K2"
    assert trtllm.served_model_name("/models/Kimi-K2-Instruct/") == "Kimi-K2-Instruct"


def test_container_runs_unprivileged_with_what_mpi_and_rdma_need() -> None:
    options = plan().container
    assert options.privileged is False
    assert set(options.cap_add) == {"IPC_LOCK", "SYS_PTRACE"}
    assert options.devices == ("/dev/infiniband",)
    assert "stack=67108864:67108864" in options.ulimits
    assert all(f"--cap-add {cap}" in options.reasons for cap in options.cap_add)


# ---------------------------------------------------------------- sshd on every host


def test_every_host_runs_sshd_as_its_container_main_command() -> None:
    p = plan(4)
    for h in p.hosts:
        sshd = [proc for proc in h.processes if proc.name == "sshd"]
        assert len(sshd) == 1
        proc = sshd[0]
        assert proc.stage == 0
        assert proc.exec_in is False
        assert proc.health is None
        assert proc.container == trtllm.CONTAINER
        assert proc.argv == ("/bin/sh", "/etc/k2provision/trtllm/sshd-start.sh")
        assert "/etc/k2provision/trtllm/sshd-start.sh" in h.files


def test_sshd_start_script_execs_sshd_in_the_foreground() -> None:
    script = plan().hosts[1].files["/etc/k2provision/trtllm/sshd-start.sh"]
    # It listens on its host's k2_local_ip only.
    listen = plan().hosts[1].local_ip
    assert f"exec /usr/sbin/sshd -D -e -f {SSH_DIR}/sshd_config -o ListenAddress={listen}" in script
    assert "mkdir -p /run/sshd" in script
    sh = shutil.which("sh")
    if sh:
        subprocess.run([sh, "-n", "-c", script], check=True)


def test_sshd_config_is_key_only_on_the_ssh_port() -> None:
    conf = plan().hosts[1].files[f"{SSH_DIR}/sshd_config"]
    lines = set(conf.splitlines())
    assert {
        "Port 2233",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "PubkeyAuthentication yes",
        f"AuthorizedKeysFile {SSH_DIR}/authorized_keys",
        f"HostKey {SSH_DIR}/ssh_host_ed25519_key",
    } <= lines


def test_ssh_client_config_checks_host_keys() -> None:
    conf = plan().hosts[0].files[f"{SSH_DIR}/ssh_config"]
    lines = {line.strip() for line in conf.splitlines()}
    assert {
        "Port 2233",
        f"UserKnownHostsFile {SSH_DIR}/known_hosts",
        "StrictHostKeyChecking yes",
        f"IdentityFile {SSH_DIR}/id_ed25519",
        "BatchMode yes",
    } <= lines


def test_host_key_checking_is_never_switched_off() -> None:
    for h in plan(4, ssh_port=2200).hosts:
        for path, text in h.files.items():
            assert "StrictHostKeyChecking no" not in text, path
            assert "StrictHostKeyChecking=no" not in text, path


def test_ssh_port_tunable_reaches_sshd_ssh_and_mpirun() -> None:
    p = plan(ssh_port=2200)
    _, proc = serve_process(p)
    assert opt(proc.argv, "plm_rsh_args").startswith("-p 2200 ")
    for h in p.hosts:
        assert "Port 2200" in h.files[f"{SSH_DIR}/sshd_config"].splitlines()
        assert "    Port 2200" in h.files[f"{SSH_DIR}/ssh_config"].splitlines()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_ssh_client_config_parses(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(plan().hosts[0].files[f"{SSH_DIR}/ssh_config"])
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), ADDRESSES[1]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert "port 2233" in out
    assert "stricthostkeychecking true" in out
    assert f"userknownhostsfile {SSH_DIR}/known_hosts" in out


SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


@pytest.mark.skipif(
    SSHD is None or shutil.which("ssh-keygen") is None,
    reason="needs OpenSSH's sshd and ssh-keygen (scripts/test installs them)",
)
def test_sshd_config_passes_sshd_test_mode(tmp_path: Path) -> None:
    if not Path("/run/sshd").is_dir():
        if os.geteuid() != 0:
            pytest.skip("sshd -t needs /run/sshd, which only root can create")
        Path("/run/sshd").mkdir(mode=0o755)
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir()
    host_key = ssh_dir / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    p = plan(config_dir=str(tmp_path))
    config = ssh_dir / "sshd_config"
    config.write_text(p.hosts[0].files[str(config)])
    assert SSHD is not None
    subprocess.run([SSHD, "-t", "-f", str(config)], check=True)


@pytest.mark.parametrize(
    ("guard", "says"),
    [
        (("api_key_file",), "k2_api_key_file={api_key_file}: trtllm takes no API key"),
        (
            ("tls_cert_file", "tls_key_file"),
            "k2_tls_cert_file={tls_cert_file}: trtllm serves no TLS",
        ),
    ],
)
def test_a_key_or_certificate_trtllm_serve_cannot_take_is_refused(
    guard: tuple[str, ...], says: str, guard_files: GuardFiles
) -> None:
    """An endpoint the inventory guards must not answer unguarded: the plan refuses, naming
    the release and the fix, instead of warning."""
    paths = {
        "api_key_file": guard_files.api_key,
        "tls_cert_file": guard_files.cert,
        "tls_key_file": guard_files.key,
    }
    files = {name: paths[name] for name in guard}
    says = says.format(**files)
    with pytest.raises(InventoryError) as refused:
        plan(**files)
    (problem,) = refused.value.problems
    assert problem.startswith(says)
    assert "trtllm-serve 1.2 has no" in problem
    assert "fix: choose k2_engine=sglang" in problem
    assert "proxy of your own" in problem
    assert not [w for w in plan().warnings if "k2_api_key_file" in w]


def test_the_prometheus_route_stays_off_with_the_switches_the_docs_name() -> None:
    """trtllm-serve mounts /prometheus/metrics only with return_perf_metrics (and feeds its load
    gauges only with enable_iter_perf_stats): both are 1.2.1 options, off by default, and the
    render leaves them off, so no rank is scraped and status says so."""
    from k2provision.engines.trtllm_schema import ExtraLlmApiOptions
    from k2provision.plan.monitoring import scrape_targets, where_line

    fields = ExtraLlmApiOptions.model_fields
    assert fields["return_perf_metrics"].default is False
    assert fields["enable_iter_perf_stats"].default is False
    p = plan()
    options = next(
        text for h in p.hosts for path, text in h.files.items() if path.endswith("api-config.yml")
    )
    parsed = yaml.safe_load(options)
    assert "return_perf_metrics" not in parsed
    assert "enable_iter_perf_stats" not in parsed
    assert trtllm.METRICS_PATH is None
    assert {t.job for t in scrape_targets(p)} == {"node", "dcgm"}
    assert "TensorRT-LLM metrics: none" in where_line(p, [])
