"""Every SGLang command line of the SGLang golden cases, through the real sglang 0.5.23 parser.

Each rendered `python3 -m sglang.launch_server` argv must pass the pinned release's argparse
step and its resolution/validation pipeline (`ServerArgs.resolve_once`, run by the checker as
on a CUDA host with Kimi-K2's config.json), with no warning that points at a stale or
deprecated flag; the sizes it parses must be the ones the plan decided. The router argv must
pass sglang-router's own parser and config build. The seed's original 4P12D commands must be
rejected, which proves the check can fail. Needs .venv-sglang from scripts/install-engine-parsers.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.templating import with_host_values
from k2provision.engines import REGISTRY
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

from . import goldens
from .goldens import Launch
from .runner import ParseResult, check

pytestmark = pytest.mark.parsers

CASES = ("sglang-tp", "sglang-pd-4p12d", "sglang-pd-1p1d", "sglang-pd-ipv6")
KTRANSFORMERS = "ktransformers"

# Warnings the pinned release prints for these layouts that say nothing about flag spellings:
# per-rank chunking under attention DP, DeepEP normal mode's eager prefill, PD decode's
# radix cache, and Mooncake's NIC auto-discovery on a host that lists no IB devices.
INFORMATIONAL = (
    "DP attention is enabled. chunked prefill size is adjusted from",
    "Cuda graph is disabled because deepep_mode=`normal`",
    "Radix cache is disabled for decode server",
    "No IB devices specified for Mooncake backend, falling back to auto discovery.",
    "EPLB is enabled. The expert_distribution_recorder_mode is automatically set.",
)

# Seed 001's 4P12D commands as written (shell variables filled in).
SEED_ENV = (
    "MC_TE_METRIC=true SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=10000000 "
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100000 "
    "PYTHONUNBUFFERED=1"
)
SEED_PREFILL = (
    "python -m sglang.launch_server --model-path /models/Kimi-K2-Instruct --trust-remote-code "
    "--disaggregation-mode prefill --dist-init-addr 10.10.0.11:5757 --tp-size 32 --dp-size 32 "
    "--enable-dp-attention --host 10.10.0.11 --decode-log-interval 1 --disable-radix-cache "
    "--enable-deepep-moe --moe-dense-tp-size 1 --enable-dp-lm-head "
    "--disable-shared-experts-fusion --watchdog-timeout 1000000 --enable-two-batch-overlap "
    "--disaggregation-ib-device mlx5_0 --chunked-prefill-size 131072 --mem-fraction-static 0.85 "
    "--deepep-mode normal --ep-dispatch-algorithm dynamic --eplb-algorithm deepseek "
    "--max-running-requests 1024 --nnodes 4 --node-rank 0 --tool-call-parser kimi_k2"
)
SEED_DECODE = (
    "python -m sglang.launch_server --model-path /models/Kimi-K2-Instruct --trust-remote-code "
    "--disaggregation-mode decode --dist-init-addr 10.10.0.21:5757 --tp-size 96 --dp-size 96 "
    "--enable-dp-attention --host 10.10.0.21 --decode-log-interval 1 --context-length 2176 "
    "--disable-radix-cache --enable-deepep-moe --moe-dense-tp-size 1 --enable-dp-lm-head "
    "--disable-shared-experts-fusion --watchdog-timeout 1000000 --enable-two-batch-overlap "
    "--disaggregation-ib-device mlx5_0 --deepep-mode low_latency --mem-fraction-static 0.8 "
    "--cuda-graph-bs 480 --max-running-requests 46080 --ep-num-redundant-experts 96 "
    "--nnodes 12 --node-rank 0 --tool-call-parser kimi_k2"
)


SERVERS = goldens.launches(CASES, goldens.SGLANG_SERVER)
ROUTERS = goldens.launches(CASES, goldens.SGLANG_ROUTER)
KT_SERVERS = goldens.launches([KTRANSFORMERS], goldens.SGLANG_SERVER)


def stale_warnings(result: ParseResult) -> list[str]:
    """Warnings other than the known informational ones (deprecations land here)."""
    return [w for w in result.warnings if not any(text in w for text in INFORMATIONAL)]


def test_cases_cover_both_layouts_and_every_host() -> None:
    assert {goldens.plan(c).layout for c in CASES} == {"tp", "pd"}
    expected = sum(len(p.hosts) for c in CASES for p in goldens.plan(c).pools)
    assert len(SERVERS) == expected == 2 + 16 + 2 + 4
    assert len(ROUTERS) == 3  # one per PD case
    assert len(KT_SERVERS) == 1


@pytest.mark.parametrize("launch", SERVERS, ids=str)
def test_server_argv_is_accepted_without_stale_flag_warnings(launch: Launch) -> None:
    result = goldens.verdict(launch)
    assert result.ok, f"{launch}: {result.stage}: {result.error}"
    assert result.version == REGISTRY["sglang"].RELEASE.version
    assert stale_warnings(result) == []
    assert not any("deprecated" in w.lower() for w in result.warnings)


@pytest.mark.parametrize("launch", SERVERS, ids=str)
def test_parsed_server_matches_the_plan(launch: Launch) -> None:
    case, host = launch.case, launch.host
    plan = goldens.plan(case)
    pool = goldens.pool_of(launch)
    par = pool.parallel
    cluster = goldens.cluster(case)
    t = cluster.tunables
    r = goldens.verdict(launch)
    assert r.ok, r.error
    for source in (r.parsed, r.resolved):  # as rendered, and after the release's resolution
        assert source["tp_size"] == par.tp
        assert source["nnodes"] == len(pool.hosts)
        assert source["node_rank"] == plan.host(host).node_rank == pool.hosts.index(host)
        if plan.layout == "pd":
            # Attention DP over the whole pool: no replica-level data parallelism.
            assert source["attn_dp_size"] == par.dp
            assert source["dp_size"] == 1
            assert source["ep_size"] == par.ep
            assert source["disaggregation_mode"] == pool.name
            assert source["moe_a2a_backend"] == "deepep"
        else:
            assert (source["dp_size"], source["attn_dp_size"], source["ep_size"]) == (1, 1, 1)
            assert source["disaggregation_mode"] == "null"
    # The rendezvous is on the pool's rank 0, on its cluster address (an IPv6 one bracketed).
    assert r.parsed["dist_init_addr"] == bracketed(cluster.host(pool.master).local_ip, t.dist_port)
    assert r.parsed["tool_call_parser"] == "kimi_k2"
    assert r.parsed["reasoning_parser"] is None  # Kimi-K2-Instruct does not think aloud
    assert r.parsed["trust_remote_code"] is True
    assert r.parsed["served_model_name"] == t.served_model_name
    assert r.parsed["context_length"] == plan.fit[0].context_length
    assert r.parsed["mem_fraction_static"] == pool.mem_fraction
    assert r.parsed["port"] == t.sglang_port
    if plan.layout == "tp":
        assert r.parsed["host"] == "0.0.0.0"
        return
    assert r.parsed["host"] == cluster.host(host).local_ip
    assert r.parsed["disaggregation_transfer_backend"] == t.pd_transfer_backend
    assert r.parsed["watchdog_timeout"] <= 3600
    assert r.parsed["decode_log_interval"] > 1
    # EPLB on both pools, each with one spare slot per GPU (the production PD config).
    assert r.value("enable_eplb") is True
    assert r.value("ep_num_redundant_experts") == par.redundant_experts == pool.gpus
    assert r.value("eplb_algorithm") == "deepseek"
    if pool.name == "prefill":
        assert r.value("deepep_mode") == "normal"
        assert r.parsed["disaggregation_bootstrap_port"] == t.bootstrap_port
        assert r.parsed["chunked_prefill_size"] == t.prefill_chunk_per_rank * par.dp
        assert r.resolved["chunked_prefill_size"] == t.prefill_chunk_per_rank
        assert r.parsed["max_running_requests"] == t.max_running_requests_prefill
        assert r.value("ep_dispatch_algorithm") == "dynamic"
    else:
        assert r.value("deepep_mode") == "low_latency"
        assert r.value("cuda_graph_max_bs_decode") == t.cuda_graph_max_bs_decode
        assert r.value("max_running_requests") == par.dp * t.cuda_graph_max_bs_decode
        assert r.value("ep_dispatch_algorithm") == "static"  # EPLB's default


@pytest.mark.parametrize("launch", ROUTERS, ids=str)
def test_router_argv_is_accepted_and_wired_to_both_pools(launch: Launch) -> None:
    case, host = launch.case, launch.host
    plan = goldens.plan(case)
    cluster = goldens.cluster(case)
    t = cluster.tunables
    r = goldens.verdict(launch)
    assert r.ok, f"{launch}: {r.stage}: {r.error}"
    assert r.version == catalog.ROUTER.version
    assert r.warnings == []
    prefill = cluster.host(next(p for p in plan.pools if p.name == "prefill").master)
    decode = cluster.host(next(p for p in plan.pools if p.name == "decode").master)
    assert r.parsed["pd_disaggregation"] is True
    assert r.parsed["prefill_urls"] == [
        [f"http://{bracketed(prefill.local_ip, t.sglang_port)}", t.bootstrap_port]
    ]
    assert r.parsed["decode_urls"] == [f"http://{bracketed(decode.local_ip, t.sglang_port)}"]
    assert r.parsed["host"] == ("::" if ":" in cluster.host(host).address else "0.0.0.0")
    assert r.parsed["port"] == t.api_port
    assert plan.endpoint == f"http://{bracketed(cluster.host(host).address, t.api_port)}"


def bracketed(address: str, port: int) -> str:
    """host:port as the engines read it: an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# ---------------------------------------------------------------- the checker can fail


def seed_command(command: str) -> tuple[list[str], dict[str, str]]:
    env = dict(item.split("=", 1) for item in SEED_ENV.split())
    return shlex.split(command), env


def test_seed_decode_command_is_rejected() -> None:
    argv, env = seed_command(SEED_DECODE)
    result = check("sglang", argv, env)
    assert not result.ok
    assert result.stage == "parse"
    assert "ambiguous option: --cuda-graph-bs" in result.error, result.error


def test_seed_prefill_command_is_rejected() -> None:
    argv, env = seed_command(SEED_PREFILL)
    result = check("sglang", argv, env)
    assert not result.ok
    assert "unrecognized arguments: --enable-deepep-moe" in result.error, result.error
    assert result.warned("'--enable-dp-attention' is deprecated")


def test_deprecated_dp_attention_spelling_would_be_caught() -> None:
    """The rendered decode argv, respelled the seed's way, parses but warns: the warning
    check above is what keeps that spelling out."""
    launch = next(k for k in SERVERS if k.case == "sglang-pd-1p1d" and k.name == "sglang-decode")
    proc = goldens.process(launch)
    argv = list(proc.argv)
    i = argv.index("--attn-dp-size")
    argv[i : i + 2] = ["--dp-size", argv[i + 1], "--enable-dp-attention"]
    result = check("sglang", argv, dict(proc.env))
    assert result.ok, result.error
    assert stale_warnings(result), result.warnings
    assert result.value("attn_dp_size") == goldens.pool_of(launch).parallel.dp


def test_ktransformers_server_is_checked_by_sglang_kt_and_resolves() -> None:
    """The KTransformers render goes through sglang-kt 0.7.2's own parser and server-args
    resolution (not upstream sglang's), and passes both."""
    (launch,) = KT_SERVERS
    r = goldens.verdict(launch)
    assert r.engine == "sglang-kt"
    assert r.version == "sglang-kt 0.7.2"
    assert r.ok, f"{launch}: {r.stage}: {r.error}"
    assert r.resolved["kt_method"] == "FP8"
    assert not any("deprecated" in w.lower() for w in r.warnings)


def test_ktransformers_server_hands_the_routed_experts_to_kt_kernel() -> None:
    """KTransformers is SGLang with kt-kernel: the options exist in sglang-kt and carry the
    plan's values."""
    (launch,) = KT_SERVERS
    r = goldens.verdict(launch)
    t = goldens.cluster(KTRANSFORMERS).tunables
    assert r.ok, r.error
    assert r.parsed["kt_weight_path"] == goldens.plan(KTRANSFORMERS).model_dir
    assert r.parsed["kt_method"] == "FP8"
    assert r.parsed["kt_cpuinfer"] == int(goldens.SAMPLE_HOST_VALUES["K2_KT_CPUINFER"])
    assert r.parsed["kt_threadpool_count"] == int(goldens.SAMPLE_HOST_VALUES["K2_NUMA_NODES"])
    assert r.parsed["kt_num_gpu_experts"] == t.ktransformers_gpu_experts
    assert r.parsed["max_total_tokens"] == t.ktransformers_cache_lens
    assert r.parsed["tool_call_parser"] == "kimi_k2"
    assert r.parsed["tp_size"] == 1
    assert r.parsed["port"] == t.api_port


def test_sglang_kt_refuses_what_only_upstream_sglang_accepts() -> None:
    """The KTransformers check is the fork's own parser: upstream 0.5.23's `--attn-dp-size`
    (which sglang accepts) is unknown to sglang-kt 0.7.2."""
    (launch,) = KT_SERVERS
    proc = goldens.process(launch)
    argv = [*proc.argv, "--attn-dp-size", "2"]
    assert check(
        "sglang",
        ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--attn-dp-size", "2"],
        {},
        options={"resolve": False},
    ).ok
    refused = check("sglang-kt", argv, dict(proc.env))
    assert not refused.ok
    assert refused.stage == "parse"
    assert "--attn-dp-size" in refused.error


def test_fp8_kv_cache_renders_with_flashmla_which_sglang_resolves(tmp_path: Path) -> None:
    """With k2_kv_cache_dtype=fp8 the server keeps an FP8 cache FP8 (docs/engines.md, "FP8 KV
    cache on SGLang"): sglang 0.5.23 resolves the render to FlashMLA with its 64-token pages
    and an fp8_e4m3 cache."""
    inventory = tmp_path / "fp8.ini"
    inventory.write_text(
        "[nodes]\nn1 ansible_host=10.9.0.1\nn2 ansible_host=10.9.0.2\n[all:vars]\n"
        "k2_engine=sglang\nk2_layout=tp\nk2_kv_cache_dtype=fp8\nk2_context_length=32768\n"
    )
    plan = build_plan(load_cluster(inventory))
    proc = with_host_values(plan.hosts[0].processes[0], goldens.SAMPLE_HOST_VALUES)
    r = check("sglang", list(proc.argv), dict(proc.env))
    assert r.ok, f"{r.stage}: {r.error}"
    assert r.value("attention_backend") == "flashmla"
    assert r.value("kv_cache_dtype") == "fp8_e4m3"
    assert r.value("page_size") == 64
