"""Every `vllm serve` command line of the vLLM golden cases, through the real vLLM parser.

The pinned release's own CLI parser, validation, EngineArgs, launch-mode choice and engine
config (on vLLM's CPU platform) must accept each rendered argv, and the sizes it parses must be
the ones the plan decided. Needs .venv-vllm from scripts/install-engine-parsers.
"""

from __future__ import annotations

import pytest

from k2provision.engines import REGISTRY

from . import goldens
from .goldens import Launch
from .runner import check

pytestmark = pytest.mark.parsers

CASES = goldens.cases("vllm-")
# Warnings the pinned release prints for these layouts that ask nothing of the command line:
# pipeline parallelism runs with synchronous scheduling (vllm/config/vllm.py).
INFORMATIONAL = (
    "Async scheduling is disabled because the V1 model runner does not support it with "
    "pipeline parallelism.",
)
SERVES = goldens.launches(CASES, goldens.VLLM_SERVE)


def test_every_layout_has_a_golden_case() -> None:
    layouts = {goldens.plan(case).layout for case in CASES}
    assert layouts == {"tp", "tp_pp", "dp_ep"}
    # One head each for tp, tp (IPv6) and tp_pp, head + headless worker for dp_ep.
    assert len(SERVES) == 5


@pytest.mark.parametrize("launch", SERVES, ids=str)
def test_rendered_serve_is_accepted(launch: Launch) -> None:
    result = goldens.verdict(launch)
    assert result.ok, f"{launch}: {result.stage}: {result.error}"
    assert result.version == REGISTRY["vllm"].RELEASE.version
    assert [w for w in result.warnings if not any(i in w for i in INFORMATIONAL)] == []


@pytest.mark.parametrize("launch", SERVES, ids=str)
def test_parsed_sizes_match_the_plan(launch: Launch) -> None:
    case, host = launch.case, launch.host
    plan = goldens.plan(case)
    p = goldens.pool_of(launch)
    par = p.parallel
    proc = goldens.process(launch)
    t = goldens.cluster(case).tunables
    r = goldens.verdict(launch)
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
        # The head takes no start rank (internal load balancing); workers take theirs.
        assert r.parsed["data_parallel_start_rank"] == (rank * local if rank else None)
        assert r.value("data_parallel_address") == p.master_address
        assert r.value("data_parallel_rpc_port") == t.dp_rpc_port
        assert r.value("max_num_batched_tokens") == t.vllm_max_num_batched_tokens
        assert r.value("max_num_seqs") == t.vllm_max_num_seqs
        assert r.value("all2all_backend") == t.vllm_all2all_backend
        assert r.value("enable_eplb") is True
        assert r.parsed["headless"] is (rank > 0)
        # The head runs one API server process per DP rank (vLLM's internal load balancer).
        if rank:
            assert (r.parsed["launch"], r.parsed["api_server_count"]) == ("headless", 0)
        else:
            assert (r.parsed["launch"], r.parsed["api_server_count"]) == (
                "multi_api_server",
                par.dp,
            )
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
    head = next(s for s in SERVES if s.case == "vllm-dp16-ep" and s.name == "vllm-serve")
    proc = goldens.process(head)
    result = check("vllm", mutated(proc.argv, flag, replacement), dict(proc.env))
    assert not result.ok
    assert error in result.error, result.error
