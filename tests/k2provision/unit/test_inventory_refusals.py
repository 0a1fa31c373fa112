"""Wrong inventories, each refused before any host is touched.

Every case runs the real `k2provision apply` (the command that would reach the hosts) on an
inventory with one mistake and asserts: exit 2, no traceback, every stderr line an `error:`
line, the variable or host named, and no SSH run or connection to a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.k2provision.unit.contract_support import HostTrap

TWO = ("n1 ansible_host=192.0.2.11", "n2 ansible_host=192.0.2.12")


def nodes(
    extra: str = "",
    *,
    engine: str = "vllm",
    layout: str = "tp",
    hosts: tuple[str, ...] = TWO,
    groups: str = "",
) -> str:
    """A single-pool inventory (vLLM TP on 2 hosts unless told) plus `extra` [all:vars] lines."""
    return (
        "[nodes]\n"
        + "\n".join(hosts)
        + "\n"
        + groups
        + f"[all:vars]\nk2_engine={engine}\nk2_layout={layout}\n"
        + extra
    )


def pd(extra: str = "", *, groups: str = "", prefill: str = "", decode: str = "") -> str:
    """SGLang PD, 2 prefill + 2 decode hosts, plus `extra` [all:vars] lines."""
    return (
        f"[prefill]\np1 ansible_host=192.0.2.21 {prefill}\np2 ansible_host=192.0.2.22\n"
        f"[decode]\nd1 ansible_host=192.0.2.31 {decode}\nd2 ansible_host=192.0.2.32\n"
        + groups
        + "[all:vars]\nk2_engine=sglang\nk2_layout=pd\n"
        + extra
    )


@dataclass(frozen=True)
class Case:
    """One wrong inventory: its files (the first is passed to the CLI) and what must be named."""

    id: str
    files: dict[str, str]
    named: tuple[str, ...]


def case(id: str, text: str, *named: str, name: str = "inv.ini") -> Case:
    return Case(id, {name: text}, named)


CASES = [
    # --- values the issue found accepted
    case(
        "ipv6-trtllm",
        nodes(
            engine="trtllm",
            layout="tp_ep",
            hosts=("t1 ansible_host=fd00::11", "t2 ansible_host=fd00::12"),
        ),
        "t1",
        "IPv6",
        "trtllm",
    ),
    case(
        "pd-router-port-clash",
        pd("k2_api_port=30000\n"),
        "p1",
        "k2_api_port=30000",
        "k2_sglang_port=30000",
    ),
    case("port-zero", nodes("k2_api_port=0\n"), "k2_api_port=0", "from 1 to 65535"),
    case("port-70000", nodes("k2_api_port=70000\n"), "k2_api_port=70000"),
    case("context-negative", nodes("k2_context_length=-5\n"), "k2_context_length=-5"),
    case("context-zero", nodes("k2_context_length=0\n"), "k2_context_length=0"),
    case("reserve-negative", nodes("k2_reserve_gib=-100\n"), "k2_reserve_gib=-100"),
    case(
        "redundant-negative",
        pd("k2_decode_redundant_experts=-16\n"),
        "k2_decode_redundant_experts=-16",
    ),
    case(
        "role-typo-driver",
        nodes("k2_nvidia_driver_manag=false\n"),
        "k2_nvidia_driver_manag",
        "did you mean k2_nvidia_driver_manage?",
    ),
    case("role-typo-weights", nodes("k2_weights_sorce=hub\n"), "did you mean k2_weights_source?"),
    case(
        "role-typo-nccl",
        nodes("k2_nccl_check_enable=true\n"),
        "did you mean k2_nccl_check_enabled?",
    ),
    case("bool-ture", nodes("k2_lab=ture\n"), "k2_lab=ture", "true or false"),
    case(
        "host-with-port",
        nodes(hosts=("n1 ansible_host=10.0.0.1:2222", TWO[1])),
        "n1",
        "ansible_host=10.0.0.1:2222",
        "ansible_port=2222",
    ),
    case("ipv4-300", nodes(hosts=("n1 ansible_host=10.0.0.300", TWO[1])), "n1", "10.0.0.300"),
    case(
        "local-ip-twice",
        nodes(hosts=(f"{TWO[0]} k2_local_ip=192.168.0.1", f"{TWO[1]} k2_local_ip=192.168.0.1")),
        "n2",
        "k2_local_ip=192.168.0.1",
    ),
    case(
        "lab-fault-unknown",
        pd("k2_lab=true\n", decode="k2_lab_fault=crash"),
        "d1",
        "k2_lab_fault=crash",
        "exit_at_start, never_healthy, wrong_answer, die_after=<seconds>, slow=<seconds>",
    ),
    case(
        "lab-fault-die-after-no-seconds",
        pd("k2_lab=true\n", decode="k2_lab_fault=die_after"),
        "d1",
        "k2_lab_fault=die_after",
        "seconds",
    ),
    case(
        "lab-fault-not-a-lab",
        pd(decode="k2_lab_fault=exit_at_start"),
        "d1",
        "k2_lab_fault",
        "not a lab inventory",
    ),
    case("ib-semicolon", pd("k2_ib_devices=mlx5_0;mlx5_1 mlx5_2\n"), "k2_ib_devices"),
    case(
        "ib-empty-item",
        pd(prefill="k2_ib_devices=mlx5_0,,mlx5_0"),
        "p1",
        "k2_ib_devices",
        "empty item",
    ),
    case("ib-number", pd(decode="k2_ib_devices=42"), "d1", "k2_ib_devices=42"),
    case("ib-twice", pd(decode="k2_ib_devices=mlx5_0,mlx5_0"), "d1", "more than once"),
    case(
        "model-dir-relative",
        nodes("k2_model_dir=models/k2\n"),
        "k2_model_dir=models/k2",
        "absolute path",
    ),
    case("served-name-empty", nodes("k2_served_model_name=''\n"), "k2_served_model_name"),
    case("router-two", pd(groups="[router]\np1\nd1\n"), "[router] has 2 hosts", "p1, d1"),
    case("router-without-pd", nodes(groups="[router]\nn1\n"), "[router]", "only for layout pd"),
    case(
        "override-first-host",
        nodes(hosts=(f"{TWO[0]} k2_context_length=4096", TWO[1], "n3 ansible_host=192.0.2.13")),
        "n1: k2_context_length=4096 differs from the other 2 hosts'",
    ),
    # --- groups
    case("engine-unknown", nodes(engine="tgi"), "k2_engine=tgi"),
    case(
        "engine-unset",
        "[nodes]\nn1 ansible_host=192.0.2.11\n[all:vars]\nk2_layout=tp\n",
        "k2_engine=(unset)",
    ),
    case("layout-wrong", nodes(engine="sglang", layout="tp_pp"), "k2_layout=tp_pp"),
    case(
        "pd-without-decode",
        "[prefill]\np1 ansible_host=192.0.2.21\n[all:vars]\nk2_engine=sglang\nk2_layout=pd\n",
        "[decode]",
    ),
    case("pd-with-nodes", pd(groups="[nodes]\nn9 ansible_host=192.0.2.99\n"), "[nodes]"),
    case("prefill-on-tp", nodes(groups="[prefill]\nx ansible_host=192.0.2.50\n"), "[prefill]"),
    case(
        "host-in-two-pools",
        pd().replace("d2 ansible_host=192.0.2.32", "d2 ansible_host=192.0.2.32\np1"),
        "host p1",
    ),
    case("no-pools", "[web]\nw1 ansible_host=192.0.2.5\n", "[nodes]"),
    case("ktransformers-two", nodes(engine="ktransformers", layout="single"), "exactly one host"),
    case(
        "address-twice",
        nodes(hosts=("n1 ansible_host=192.0.2.11", "n2 ansible_host=192.0.2.11")),
        "n2",
        "address 192.0.2.11",
    ),
    case("name-as-bad-address", nodes(hosts=("bad_host!",)), "bad_host!", "ansible_host"),
    case("escape-name-as-address", nodes(hosts=("../../escape",)), "../../escape"),
    case(
        "ansible-port-range",
        nodes(hosts=(f"{TWO[0]} ansible_port=70000", TWO[1])),
        "n1",
        "ansible_port=70000",
    ),
    case(
        "local-ip-not-ip",
        nodes(hosts=(f"{TWO[0]} k2_local_ip=gpu-a", TWO[1])),
        "n1",
        "k2_local_ip=gpu-a",
    ),
    case(
        "ipv4-and-ipv6",
        nodes(hosts=("n1 ansible_host=10.0.0.1", "n2 ansible_host=fd00::2")),
        "IPv4",
        "IPv6",
        "n1",
        "n2",
    ),
    case(
        "override-tie",
        nodes(hosts=(f"{TWO[0]} k2_engine=sglang", f"{TWO[1]} k2_engine=vllm")).replace(
            "k2_engine=vllm\nk2_layout", "k2_layout"
        ),
        "k2_engine differs between hosts",
    ),
    # --- numbers
    case("gpus-zero", nodes("k2_gpus_per_node=0\n"), "k2_gpus_per_node=0"),
    case("gpus-17", nodes("k2_gpus_per_node=17\n"), "k2_gpus_per_node=17", "from 1 to 16"),
    case("gpus-bool", nodes("k2_gpus_per_node=true\n"), "k2_gpus_per_node"),
    case("instances-zero", nodes("k2_instances=0\n"), "k2_instances=0", "from 1 to 64"),
    case("instances-bool", nodes("k2_instances=true\n"), "k2_instances"),
    case(
        "instances-uneven",
        nodes("k2_instances=3\n", engine="sglang"),
        "[nodes]",
        "has 2 hosts",
        "k2_instances=3",
        "expected one of 1, 2",
    ),
    case("context-huge", nodes("k2_context_length=99999999\n"), "k2_context_length=99999999"),
    case("context-over-model", nodes("k2_context_length=300000\n"), "k2_context_length=300000"),
    case("port-text", nodes("k2_sglang_port=abc\n"), "k2_sglang_port=abc"),
    case("port-bool", nodes("k2_api_port=True\n"), "k2_api_port=true"),
    case("dist-port-65536", nodes("k2_dist_port=65536\n"), "k2_dist_port=65536"),
    case("pd-timeout-short", pd("k2_pd_timeout_s=10\n"), "k2_pd_timeout_s=10", "from 30 to 3600"),
    case("health-timeout-short", nodes("k2_health_timeout_s=5\n"), "k2_health_timeout_s=5"),
    case("vllm-seqs-zero", nodes("k2_vllm_max_num_seqs=0\n"), "k2_vllm_max_num_seqs=0"),
    case(
        "vllm-tokens-negative",
        nodes("k2_vllm_max_num_batched_tokens=-1\n"),
        "k2_vllm_max_num_batched_tokens=-1",
    ),
    case(
        "cuda-graph-huge",
        pd("k2_cuda_graph_max_bs_decode=100000\n"),
        "k2_cuda_graph_max_bs_decode=100000",
    ),
    case(
        "chunked-prefill-negative",
        pd("k2_prefill_chunk_per_rank=-1\n"),
        "k2_prefill_chunk_per_rank=-1",
    ),
    case(
        "prefill-requests-zero",
        pd("k2_max_running_requests_prefill=0\n"),
        "k2_max_running_requests_prefill=0",
    ),
    case("trtllm-batch-zero", nodes("k2_trtllm_max_batch_size=0\n"), "k2_trtllm_max_batch_size=0"),
    case(
        "ktransformers-cache-zero",
        nodes("k2_ktransformers_cache_lens=0\n"),
        "k2_ktransformers_cache_lens=0",
    ),
    case(
        "redundant-huge",
        pd("k2_decode_redundant_experts=5000\n"),
        "k2_decode_redundant_experts=5000",
    ),
    case("reserve-text", nodes("k2_reserve_gib=lots\n"), "k2_reserve_gib=lots"),
    # --- words, paths and choices
    case(
        "backend-unknown",
        pd("k2_pd_transfer_backend=rdma\n"),
        "k2_pd_transfer_backend=rdma",
        "mooncake, nixl",
    ),
    case("kv-dtype-unknown", nodes("k2_trtllm_kv_cache_dtype=fp16\n"), "k2_trtllm_kv_cache_dtype"),
    case("config-dir-relative", nodes("k2_config_dir=etc/k2\n"), "k2_config_dir=etc/k2"),
    case("config-dir-dotdot", nodes("k2_config_dir=/etc/../../tmp\n"), "k2_config_dir"),
    case("model-dir-colon", nodes("k2_model_dir=/models/a:b\n"), "k2_model_dir=/models/a:b"),
    case("served-name-space", nodes("k2_served_model_name=kimi k2\n"), "k2_served_model_name"),
    case("image-space", nodes("k2_image=a b\n"), "k2_image"),
    case("unknown-variable", nodes("k2_banana=1\n"), "unknown variable k2_banana"),
    case(
        "template-undefined",
        nodes("k2_model_dir={{ nowhere }}\n"),
        "k2_model_dir",
        "cannot be evaluated",
    ),
    case("gpu-a100", nodes("k2_gpu=a100\n"), "k2_gpu=a100"),
    case("gpu-unknown", nodes("k2_gpu=tesla\n"), "tesla"),
    case("model-unknown", nodes("k2_model=acme/llm\n"), "acme/llm"),
    case(
        "config-json-missing",
        nodes("k2_model_config_json=nope/config.json\n"),
        "k2_model_config_json",
    ),
    # --- role variables: types and choices from the roles' argument specs
    case(
        "role-int",
        nodes("k2_launch_gate_delay=soon\n"),
        "k2_launch_gate_delay=soon",
        "an integer",
        "roles/k2_launch/meta/argument_specs.yml",
    ),
    case(
        "role-choice",
        nodes("k2_container_runtime_engine=podman\n"),
        "k2_container_runtime_engine=podman",
        "docker-ce, docker.io",
    ),
    case("role-bool", nodes("k2_nvidia_driver_manage=maybe\n"), "k2_nvidia_driver_manage=maybe"),
    case(
        "role-unknown-option",
        nodes("k2_launch_colour=red\n"),
        "k2_launch_colour",
        "role k2_launch has no such option",
    ),
    # --- listeners of one host
    case("relay-clash", nodes("k2_weights_port=8000\n"), "k2_weights_port=8000", "k2_api_port"),
    case("dp-rpc-clash", nodes("k2_dp_rpc_port=8000\n", layout="dp_ep"), "k2_dp_rpc_port=8000"),
    case("ray-clash", nodes("k2_ray_port=8000\n"), "k2_ray_port=8000", "n1"),
    case(
        "bootstrap-in-dist-run",
        pd("k2_bootstrap_port=5760\n"),
        "k2_bootstrap_port=5760",
        "k2_dist_port=5757",
    ),
    case(
        "ssh-clash",
        nodes("k2_ssh_port=8000\n", engine="trtllm", layout="tp_ep"),
        "k2_ssh_port=8000",
    ),
    # --- other forms, and files that are no inventory
    case("yaml-syntax", "all:\n  children:\n    nodes: [\n", "inv.yml", name="inv.yml"),
    case("ini-syntax", "[nodes\nhost a=\n", "not a valid INI inventory"),
    Case(
        "dir-bad-file",
        {"inv/hosts.ini": nodes(), "inv/extra.yml": "all: [oops\n"},
        ("extra.yml", "not a valid YAML inventory"),
    ),
    Case(
        "dir-group-vars-value",
        {"inv/hosts.ini": nodes(), "inv/group_vars/all.yml": "k2_api_port: 99999\n"},
        ("k2_api_port=99999",),
    ),
    Case(
        "host-vars-override",
        {
            "inv/hosts.ini": nodes(hosts=(*TWO, "n3 ansible_host=192.0.2.13")),
            "inv/host_vars/n2.yml": "k2_gpu: b200\n",
        },
        ("n2: k2_gpu=b200 differs",),
    ),
]


def test_at_least_sixty_cases() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("wrong", CASES, ids=[c.id for c in CASES])
def test_wrong_inventory_is_refused_before_any_host(
    wrong: Case, tmp_path: Path, host_trap: HostTrap
) -> None:
    for name, text in wrong.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        port = f"\n[all:vars]\nansible_port={host_trap.port}\n" if path.suffix == ".ini" else ""
        path.write_text(text + port)
    target = tmp_path / next(iter(wrong.files))
    if len(wrong.files) > 1:
        target = tmp_path / Path(next(iter(wrong.files))).parts[0]
    code, out, err, unexpected = host_trap.run("apply", str(target))
    assert unexpected is None, unexpected
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert lines, "no error line"
    assert all(line.startswith("error: ") for line in lines), err
    for named in wrong.named:
        assert any(named in line for line in lines), (named, err)
