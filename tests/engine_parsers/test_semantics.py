"""Beyond argparse: what the pinned engines make of every golden launch, and whether it works.

A command line every parser accepts can still fail on the cluster or waste it. Here each
golden launch goes through the engine's own configuration logic, on this CPU host:

- vLLM 0.33.0: `AsyncEngineArgs` through `create_engine_config` for the launching node
  (data-parallel load-balancing mode, world sizes, ranks per node, each node's first DP rank,
  the all-to-all backend, EPLB's spare slots);
- SGLang 0.5.23: `ServerArgs` resolution (per-rank prefill chunk, attention-DP / EP sizes,
  EPLB's dispatch and recorder settings) and SGLang's own initial expert placement
  (`ExpertLocationMetadata.init_trivial`), which also asserts that the physical expert slots
  split over the EP ranks.

Rules that only the running engines apply, across processes or at model load on GPUs, are
checked against those derived values below, each beside the upstream file it mirrors; the
lab stand-in (k2lab/standin_image) enforces the same rules at run time. The renders this
project used to produce (a DP head with a start rank, PD spare experts without EPLB) are
checked too, and must fail.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from k2provision.core.records import Plan, PoolPlan, Process

from . import goldens
from .goldens import Launch
from .runner import ParseResult, check

pytestmark = pytest.mark.parsers

KIMI_K2_EXPERTS = 384  # n_routed_experts of the checkers' config.json


# ---------------------------------------------------------------- vLLM


def vllm_problems(pool: PoolPlan, gpus_per_node: int, verdicts: Sequence[ParseResult]) -> list[str]:
    """What would break or waste a vLLM launch whose nodes' verdicts are `verdicts` (the
    head first)."""
    problems = [f"rejected: {r.stage}: {r.error}" for r in verdicts if not r.ok]
    if problems:
        return problems
    par = [r.raw["parallel"] for r in verdicts]
    head = par[0]
    # vllm/v1/engine/utils.py wait_for_engine_startup: remote engines must be headless iff the
    # head runs neither hybrid nor external load balancing; otherwise the head refuses them.
    remote_should_be_headless = head["lb_mode"] == "internal"
    for r, p in zip(verdicts[1:], par[1:], strict=True):
        if bool(r.parsed.get("headless")) != remote_should_be_headless:
            first = p["data_parallel_rank"]
            problems.append(
                f"Remote engine {first} must {'' if remote_should_be_headless else 'not '}use "
                f"--headless {'unless' if remote_should_be_headless else 'in'} external or "
                f"hybrid dp lb mode (the head runs {head['lb_mode']} load balancing)"
            )
    # Every DP rank is held by exactly one node, starting where the previous node stopped.
    held: list[int] = []
    for p in par:
        first = p["data_parallel_rank"] or 0
        held += range(first, first + p["data_parallel_size_local"])
    if sorted(held) != list(range(head["data_parallel_size"])):
        problems.append(f"data-parallel ranks held {sorted(held)}, not 0..dp-1 once each")
    for p in par:
        if p["world_size_across_dp"] != pool.gpus:
            problems.append(f"world size across DP {p['world_size_across_dp']} != {pool.gpus} GPUs")
        on_node = p["world_size"] * (p["data_parallel_size_local"] or 1)
        if p["data_parallel_size"] > 1 and on_node != gpus_per_node:
            problems.append(f"{on_node} ranks on a node of {gpus_per_node} GPUs")
        if p["enable_expert_parallel"]:
            ep = p["tensor_parallel_size"] * p["data_parallel_size"]
            slots = KIMI_K2_EXPERTS + p["num_redundant_experts"]
            # vllm/model_executor/layers/fused_moe/layer.py: EPLB needs an even split.
            if p["enable_eplb"] and slots % ep:
                problems.append(f"{slots} expert slots do not split over EP {ep}")
            # vLLM's expert-parallel deployment guide: DeepEP kernels across nodes.
            if len(pool.hosts) > 1 and not p["all2all_backend"].startswith("deepep"):
                problems.append(f"all2all backend {p['all2all_backend']} across nodes")
    return problems


def vllm_launches(case: str) -> list[Launch]:
    return goldens.launches([case], goldens.VLLM_SERVE)


def node_verdicts(plan: Plan, launches: Sequence[Launch]) -> list[ParseResult]:
    """Verdicts in pool rank order (the head first)."""
    pool = plan.pools[0]
    ordered = sorted(launches, key=lambda launch: pool.hosts.index(launch.host))
    return [goldens.verdict(launch) for launch in ordered]


@pytest.mark.parametrize("case", goldens.cases("vllm-"))
def test_vllm_layouts_configure_and_hand_shake(case: str) -> None:
    plan = goldens.plan(case)
    verdicts = node_verdicts(plan, vllm_launches(case))
    gpn = goldens.cluster(case).gpus_per_node
    assert vllm_problems(plan.pools[0], gpn, verdicts) == []
    head = verdicts[0].raw["parallel"]
    assert head["data_parallel_rank"] == 0
    if plan.layout == "dp_ep":
        assert head["lb_mode"] == "internal"
        assert head["num_redundant_experts"] == plan.pools[0].parallel.redundant_experts > 0
    else:
        assert head["world_size"] == plan.pools[0].gpus  # one engine over every GPU


def with_flag(proc: Process, *extra: str, drop: Sequence[str] = ()) -> list[str]:
    """`proc.argv` without the flags in `drop` (and their values), with `extra` appended."""
    argv = list(proc.argv)
    for flag in drop:
        i = argv.index(flag)
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        del argv[i : i + (2 if takes_value else 1)]
    return [*argv, *extra]


def test_the_old_dp_head_with_a_start_rank_fails_the_handshake() -> None:
    """The head as rendered before: `--data-parallel-start-rank 0` on a node that is not
    headless selects hybrid load balancing, which refuses the headless worker."""
    case = "vllm-dp16-ep"
    plan = goldens.plan(case)
    launches = sorted(vllm_launches(case), key=lambda x: plan.pools[0].hosts.index(x.host))
    head = goldens.process(launches[0])
    old = check(
        "vllm",
        with_flag(head, "--data-parallel-start-rank", "0"),
        dict(head.env),
        options=goldens.OPTIONS["vllm"],
    )
    assert old.ok, old.error  # every parser accepts it
    assert old.raw["parallel"]["lb_mode"] == "hybrid"
    workers = [goldens.verdict(launch) for launch in launches[1:]]
    problems = vllm_problems(plan.pools[0], 8, [old, *workers])
    assert any("must not use --headless in external or hybrid dp lb mode" in p for p in problems), (
        problems
    )


def test_vllm_refuses_spare_experts_without_eplb() -> None:
    case = "vllm-dp16-ep"
    head = goldens.process(vllm_launches(case)[0])
    result = check(
        "vllm",
        with_flag(head, drop=["--enable-eplb"]),
        dict(head.env),
        options=goldens.OPTIONS["vllm"],
    )
    assert not result.ok
    assert "but EPLB is not enabled" in result.error, result.error


# ---------------------------------------------------------------- SGLang


def sglang_problems(pool: PoolPlan, chunk_per_rank: int, r: ParseResult) -> list[str]:
    """What would break or waste an SGLang server of `pool` whose verdict is `r`."""
    if not r.ok:
        return [f"rejected: {r.stage}: {r.error}"]
    v = r.resolved
    problems = []
    if v["attn_dp_size"] > 1:
        # sglang/srt/arg_groups/parallel_hook.py divides the chunk by the attention-DP size:
        # what it resolves per rank must be what the plan (and its memory fit) means.
        if pool.name == "prefill" and v["chunked_prefill_size"] != chunk_per_rank:
            problems.append(
                f"prefill chunk per rank {v['chunked_prefill_size']}, not {chunk_per_rank}"
            )
        if not v["attn_dp_size"] == v["ep_size"] == v["tp_size"] == pool.gpus:
            problems.append("attention DP, EP and TP do not all span the pool")
    placement = r.raw.get("expert_location")
    if v["ep_size"] > 1:
        if placement is None:
            return [*problems, "no expert placement computed"]
        spare = placement["spare_slots_hold"]
        # sglang/srt/eplb/expert_location.py init_trivial: spare slots hold fixed copies of
        # experts 0..N-1, and only EPLB (--enable-eplb) ever moves experts into them.
        if spare and not placement["rebalanced"]:
            problems.append(
                f"{len(spare)} spare expert slots hold fixed copies of experts "
                f"{spare[0]}..{spare[-1]} and are never rebalanced (EPLB is off)"
            )
        if placement["rebalanced"] and v["expert_distribution_recorder_mode"] is None:
            problems.append("EPLB without an expert distribution recorder")
    return problems


PD_SERVERS = goldens.launches(goldens.cases("sglang-pd"), goldens.SGLANG_SERVER)
TP_SERVERS = goldens.launches(["sglang-tp"], goldens.SGLANG_SERVER)


@pytest.mark.parametrize("launch", PD_SERVERS + TP_SERVERS, ids=str)
def test_sglang_servers_resolve_to_a_working_placement(launch: Launch) -> None:
    pool = goldens.pool_of(launch)
    t = goldens.cluster(launch.case).tunables
    r = goldens.verdict(launch)
    assert sglang_problems(pool, t.prefill_chunk_per_rank, r) == []
    placement = r.raw.get("expert_location")
    if pool.name in ("prefill", "decode"):
        assert placement is not None
        slots = KIMI_K2_EXPERTS + pool.parallel.redundant_experts
        assert placement["num_physical_experts"] == slots
        assert placement["num_local_physical_experts"] == slots // pool.gpus
        assert placement["rebalanced"] is True


def test_production_prefill_chunk_is_16k_tokens_per_rank() -> None:
    """The 4P12D prefill pool at the production chunk: 524288 over attention DP 32."""
    launch = next(x for x in PD_SERVERS if x.case == "sglang-pd-4p12d" and "prefill" in x.name)
    assert goldens.verdict(launch).resolved["chunked_prefill_size"] == 16384


def test_the_old_eplb_less_pd_render_is_caught() -> None:
    """The decode pool as rendered before: 8 spare slots, no --enable-eplb."""
    launch = next(x for x in PD_SERVERS if x.case == "sglang-pd-1p1d" and "decode" in x.name)
    proc = goldens.process(launch)
    old = check(
        "sglang",
        with_flag(proc, drop=["--enable-eplb"]),
        dict(proc.env),
        options=goldens.OPTIONS["sglang"],
    )
    assert old.ok, old.error  # SGLang accepts it and starts
    problems = sglang_problems(goldens.pool_of(launch), 0, old)
    assert any("fixed copies of experts 0..7 and are never rebalanced" in p for p in problems), (
        problems
    )


def test_uneven_expert_slots_fail_sglangs_placement() -> None:
    """SGLang asserts at model load that the slots split over the EP ranks."""
    launch = next(x for x in PD_SERVERS if x.case == "sglang-pd-1p1d" and "decode" in x.name)
    proc = goldens.process(launch)
    argv = with_flag(proc, "--ep-num-redundant-experts", "6")
    result = check("sglang", argv, dict(proc.env), options=goldens.OPTIONS["sglang"])
    assert not result.ok
    assert result.stage == "expert_location"
    assert "390 physical expert slots do not split over ep_size 8" in result.error
