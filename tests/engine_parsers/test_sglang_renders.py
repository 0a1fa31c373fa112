"""Every SGLang command line of the SGLang golden cases, through the real sglang 0.5.23 parser.

Each rendered `python3 -m sglang.launch_server` argv must pass the pinned release's argparse
step and its resolution/validation pipeline (`ServerArgs.resolve_once`, run by the checker as
on a CUDA host with Kimi-K2's config.json), with no warning that points at a stale or
deprecated flag; the sizes it parses must be the ones the plan decided. The router argv must
pass sglang-router's own parser and config build. The seed's original 4P12D commands must be
rejected, which proves the check can fail. Needs .venv-sglang from scripts/install-engine-parsers.
"""

from __future__ import annotations

import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from k2provision import catalog
from k2provision.inventory import load_cluster
from k2provision.models import Plan, PoolPlan, Process
from k2provision.plan import build_plan

from .runner import ParseResult, check

pytestmark = pytest.mark.parsers

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = ("sglang-tp", "sglang-pd-4p12d", "sglang-pd-1p1d", "sglang-pd-ipv6")
SERVER = ("python3", "-m", "sglang.launch_server")
ROUTER = ("python3", "-m", "sglang_router.launch_router")

# Warnings the pinned release prints for these layouts that say nothing about flag spellings:
# per-rank chunking under attention DP, DeepEP normal mode's eager prefill, PD decode's
# radix cache, and Mooncake's NIC auto-discovery on a host that lists no IB devices.
INFORMATIONAL = (
    "DP attention is enabled. chunked prefill size is adjusted from",
    "Cuda graph is disabled because deepep_mode=`normal`",
    "Radix cache is disabled for decode server",
    "No IB devices specified for Mooncake backend, falling back to auto discovery.",
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


@cache
def golden_plan(case: str) -> Plan:
    return build_plan(load_cluster(GOLDEN / case / "inventory.ini"))


def processes(prefix: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(case, host, process name) of every process whose argv starts with `prefix`."""
    return [
        (case, host.name, proc.name)
        for case in CASES
        for host in golden_plan(case).hosts
        for proc in host.processes
        if proc.argv[: len(prefix)] == prefix
    ]


SERVERS = processes(SERVER)
ROUTERS = processes(ROUTER)


def process(case: str, host: str, name: str) -> Process:
    return next(p for p in golden_plan(case).host(host).processes if p.name == name)


def pool_of(case: str, host: str) -> PoolPlan:
    return next(p for p in golden_plan(case).pools if host in p.hosts)


@cache
def verdicts() -> dict[tuple[str, str, str], ParseResult]:
    """Every server and router argv checked once, several checker processes at a time."""
    jobs = [(key, "sglang") for key in SERVERS] + [(key, "sglang-router") for key in ROUTERS]

    def run(job: tuple[tuple[str, str, str], str]) -> ParseResult:
        key, engine = job
        proc = process(*key)
        return check(engine, list(proc.argv), dict(proc.env))

    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        results = list(pool.map(run, jobs))
    return {key: result for (key, _), result in zip(jobs, results, strict=True)}


def stale_warnings(result: ParseResult) -> list[str]:
    """Warnings other than the known informational ones (deprecations land here)."""
    return [w for w in result.warnings if not any(text in w for text in INFORMATIONAL)]


def test_cases_cover_both_layouts_and_every_host() -> None:
    assert {golden_plan(c).layout for c in CASES} == {"tp", "pd"}
    expected = sum(len(p.hosts) for c in CASES for p in golden_plan(c).pools)
    assert len(SERVERS) == expected == 2 + 16 + 2 + 4
    assert len(ROUTERS) == 3  # one per PD case


@pytest.mark.parametrize(("case", "host", "name"), SERVERS)
def test_server_argv_is_accepted_without_stale_flag_warnings(
    case: str, host: str, name: str
) -> None:
    result = verdicts()[(case, host, name)]
    assert result.ok, f"{case} {host} {name}: {result.stage}: {result.error}"
    assert result.version == catalog.RELEASES["sglang"].version
    assert stale_warnings(result) == []
    assert not any("deprecated" in w.lower() for w in result.warnings)


@pytest.mark.parametrize(("case", "host", "name"), SERVERS)
def test_parsed_server_matches_the_plan(case: str, host: str, name: str) -> None:
    plan = golden_plan(case)
    pool = pool_of(case, host)
    par = pool.parallel
    cluster = load_cluster(GOLDEN / case / "inventory.ini")
    t = cluster.tunables
    r = verdicts()[(case, host, name)]
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
    assert r.value("ep_dispatch_algorithm") == "dynamic"
    assert r.parsed["watchdog_timeout"] <= 3600
    assert r.parsed["decode_log_interval"] > 1
    if pool.name == "prefill":
        assert r.value("deepep_mode") == "normal"
        assert r.parsed["disaggregation_bootstrap_port"] == t.bootstrap_port
        assert r.parsed["chunked_prefill_size"] == t.chunked_prefill_size
        assert r.parsed["max_running_requests"] == t.max_running_requests_prefill
        assert r.parsed["ep_num_redundant_experts"] == 0
    else:
        assert r.value("deepep_mode") == "low_latency"
        assert r.value("cuda_graph_max_bs_decode") == t.cuda_graph_max_bs_decode
        assert r.value("max_running_requests") == par.dp * t.cuda_graph_max_bs_decode
        assert r.value("ep_num_redundant_experts") == par.redundant_experts > 0


@pytest.mark.parametrize(("case", "host", "name"), ROUTERS)
def test_router_argv_is_accepted_and_wired_to_both_pools(case: str, host: str, name: str) -> None:
    plan = golden_plan(case)
    cluster = load_cluster(GOLDEN / case / "inventory.ini")
    t = cluster.tunables
    r = verdicts()[(case, host, name)]
    assert r.ok, f"{case} {host} {name}: {r.stage}: {r.error}"
    assert r.version == catalog.SGLANG_ROUTER_VERSION
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
    key = next(k for k in SERVERS if k[0] == "sglang-pd-1p1d" and k[2] == "sglang-decode")
    proc = process(*key)
    argv = list(proc.argv)
    i = argv.index("--attn-dp-size")
    argv[i : i + 2] = ["--dp-size", argv[i + 1], "--enable-dp-attention"]
    result = check("sglang", argv, dict(proc.env))
    assert result.ok, result.error
    assert stale_warnings(result), result.warnings
    assert result.value("attn_dp_size") == pool_of(*key[:2]).parallel.dp
