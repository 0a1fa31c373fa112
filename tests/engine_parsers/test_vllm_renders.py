"""Every `vllm serve` command line of the vLLM golden cases, through the real vLLM parser.

The pinned release's own CLI parser, validation, EngineArgs, launch-mode choice and engine
config (on vLLM's CPU platform) must accept each rendered argv, and the sizes it parses must be
the ones the plan decided. Needs .venv-vllm from scripts/install-engine-parsers.
"""

from __future__ import annotations

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
CASES = sorted(p.name for p in GOLDEN.glob("vllm-*") if (p / "inventory.ini").exists())


@cache
def golden_plan(case: str) -> Plan:
    return build_plan(load_cluster(GOLDEN / case / "inventory.ini"))


def serve_processes() -> list[tuple[str, str, str]]:
    """(case, host, process) of every `vllm serve` in the vLLM golden cases."""
    found = []
    for case in CASES:
        for host in golden_plan(case).hosts:
            for proc in host.processes:
                if proc.argv[:2] == ("vllm", "serve"):
                    found.append((case, host.name, proc.name))
    return found


SERVES = serve_processes()


@cache
def parsed(case: str, host: str, name: str) -> ParseResult:
    proc = process(case, host, name)
    return check("vllm", list(proc.argv), dict(proc.env), options={"engine_config": True})


def process(case: str, host: str, name: str) -> Process:
    return next(p for p in golden_plan(case).host(host).processes if p.name == name)


def pool(case: str) -> PoolPlan:
    return golden_plan(case).pools[0]


def test_every_layout_has_a_golden_case() -> None:
    layouts = {golden_plan(case).layout for case in CASES}
    assert layouts == {"tp", "tp_pp", "dp_ep"}
    # One head each for tp, tp (IPv6) and tp_pp, head + headless worker for dp_ep.
    assert len(SERVES) == 5


@pytest.mark.parametrize(("case", "host", "name"), SERVES)
def test_rendered_serve_is_accepted(case: str, host: str, name: str) -> None:
    result = parsed(case, host, name)
    assert result.ok, f"{case} {host} {name}: {result.stage}: {result.error}"
    assert result.version == catalog.RELEASES["vllm"].version
    assert result.warnings == []


@pytest.mark.parametrize(("case", "host", "name"), SERVES)
def test_parsed_sizes_match_the_plan(case: str, host: str, name: str) -> None:
    plan = golden_plan(case)
    p = pool(case)
    par = p.parallel
    proc = process(case, host, name)
    t = load_cluster(GOLDEN / case / "inventory.ini").tunables
    r = parsed(case, host, name)
    assert r.ok, r.error
    assert r.value("model") == plan.model_dir
    assert r.value("served_model_name") == [t.served_model_name]
    assert r.value("trust_remote_code") is True
    assert r.value("tensor_parallel_size") == par.tp
    assert r.value("pipeline_parallel_size") == par.pp
    assert r.value("data_parallel_size") == par.dp
    assert r.value("enable_expert_parallel") is (par.ep > 1)
    assert r.value("max_model_len") == plan.fit[0].context_length
    assert r.value("gpu_memory_utilization") == p.mem_fraction
    assert r.parsed["enable_auto_tool_choice"] is True
    assert r.parsed["tool_call_parser"] == "kimi_k2"
    assert r.parsed["host"] == ("::" if ":" in p.master_address else "0.0.0.0")
    assert r.parsed["port"] == t.api_port
    if plan.layout == "dp_ep":
        rank = p.hosts.index(host)
        local = par.dp // len(p.hosts)
        assert r.value("data_parallel_size_local") == local
        assert r.value("data_parallel_start_rank") == rank * local
        assert r.value("data_parallel_address") == p.master_address
        assert r.value("data_parallel_rpc_port") == t.dp_rpc_port
        assert r.value("max_num_batched_tokens") == t.vllm_max_num_batched_tokens
        assert r.value("max_num_seqs") == t.vllm_max_num_seqs
        assert r.parsed["headless"] is (rank > 0)
        # The head runs one API server process per local DP rank (vLLM's default under DP).
        if rank:
            assert (r.parsed["launch"], r.parsed["api_server_count"]) == ("headless", 0)
        else:
            assert (r.parsed["launch"], r.parsed["api_server_count"]) == ("multi_api_server", local)
        assert r.value("distributed_executor_backend") in (None, "mp")
    else:
        assert host == p.master
        assert proc.exec_in
        assert r.value("distributed_executor_backend") == "ray"
        assert r.parsed["headless"] is False
        assert r.parsed["launch"] == "single_api_server"


def mutated(argv: tuple[str, ...], flag: str, replacement: list[str]) -> list[str]:
    """`argv` with `flag` and its value replaced by `replacement`."""
    i = argv.index(flag)
    return [*argv[:i], *replacement, *argv[i + 2 :]]


@pytest.mark.parametrize(
    ("flag", "replacement", "error"),
    [
        # SGLang's stale spelling of expert parallelism: no such vLLM flag.
        ("--max-num-seqs", ["--enable-ep-moe"], "unrecognized arguments: --enable-ep-moe"),
        # A made-up flag.
        ("--max-num-seqs", ["--data-parallel-rpc-ports", "1"], "unrecognized arguments"),
        # The tool parser's name is checked when the API server starts.
        ("--tool-call-parser", ["--tool-call-parser", "kimi"], "invalid tool call parser: kimi"),
        # Auto tool choice without a parser.
        ("--tool-call-parser", [], "--enable-auto-tool-choice requires --tool-call-parser"),
    ],
)
def test_stale_or_made_up_flags_are_rejected(flag: str, replacement: list[str], error: str) -> None:
    head = next(s for s in SERVES if s[0] == "vllm-dp16-ep" and s[2] == "vllm-serve")
    proc = process(*head)
    result = check("vllm", mutated(proc.argv, flag, replacement), dict(proc.env))
    assert not result.ok
    assert error in result.error, result.error
