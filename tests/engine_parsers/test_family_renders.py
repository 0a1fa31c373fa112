"""The Kimi-K2 family's golden renders, through the pinned engines' real parsers, each with
the served model's own config.json (from the catalog) in the stand-in model directory.

K2-Thinking (DeepseekV3ForCausalLM, INT4 compressed-tensors) and K2.5
(KimiK25ForConditionalGeneration, text_config + vision_config) must be architectures the pinned
releases know: vLLM builds its engine config from them (model registry, quantization, DCP) and
SGLang resolves its server arguments against them. The flags the memory fit adds (decode context
parallelism, an FP8 KV cache, text-only serving) are checked the same way, and a config of an
architecture no release knows is rejected, which shows the config is really read.
Needs .venv-sglang and .venv-vllm from scripts/install-engine-parsers.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from k2provision.core import catalog, model_config
from k2provision.core.records import Cluster, Plan, Process
from k2provision.engines import REGISTRY
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

from .runner import ParseResult, check

pytestmark = pytest.mark.parsers

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = sorted(p.name for p in GOLDEN.glob("family-*") if (p / "inventory.ini").exists())
# Variants of the golden clusters: (case, tunables changed).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "k2.5-vllm-text-only": ("family-k2.5-vllm-tp8", {"multimodal": False}),
    "k2-thinking-vllm-fp8-kv": ("family-k2-thinking-vllm-tp8", {"kv_cache_dtype": "fp8"}),
    "k2-thinking-sglang-fp8-kv": ("family-k2-thinking-sglang-tp8", {"kv_cache_dtype": "fp8"}),
}
# Where the two engines keep the KV dtype they were given.
KV_FLAG = {"vllm": {"bf16": "auto", "fp8": "fp8"}, "sglang": {"bf16": "auto", "fp8": "fp8_e4m3"}}


def cluster(name: str) -> Cluster:
    case, update = VARIANTS.get(name, (name, {}))
    base = load_cluster(GOLDEN / case / "inventory.ini")
    return base.model_copy(update={"tunables": base.tunables.model_copy(update=update)})


@cache
def plan(name: str) -> Plan:
    return build_plan(cluster(name))


def server(name: str) -> Process:
    """The process that starts the engine's server on the node."""
    return next(
        proc
        for host in plan(name).hosts
        for proc in host.processes
        if proc.argv[:2] == ("vllm", "serve") or "sglang.launch_server" in proc.argv
    )


def engine_of(name: str) -> str:
    return plan(name).engine


def request(
    name: str, config: dict[str, Any] | None = None
) -> tuple[str, list[str], dict[str, Any]]:
    spec = catalog.model(plan(name).model)
    options: dict[str, Any] = {"config": config or model_config.config_json(spec)}
    if engine_of(name) == "vllm":
        options["engine_config"] = True
    return engine_of(name), list(server(name).argv), options


@cache
def verdicts() -> dict[str, ParseResult]:
    """Every case and variant checked once, several checker processes at a time."""
    names = [*CASES, *VARIANTS]
    k3 = {**model_config.config_json(catalog.model("moonshotai/Kimi-K2.5"))}
    k3["architectures"] = ["KimiK9ForConditionalGeneration"]
    jobs = {name: request(name) for name in names}
    jobs["unknown-architecture"] = request("family-k2.5-vllm-tp8", k3)

    def run(job: tuple[str, list[str], dict[str, Any]]) -> ParseResult:
        engine, argv, options = job
        return check(engine, argv, {}, options=options)

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        results = list(pool.map(run, jobs.values()))
    return dict(zip(jobs, results, strict=True))


def test_the_family_goldens_are_here() -> None:
    assert {(plan(c).model, plan(c).engine) for c in CASES} == {
        ("moonshotai/Kimi-K2-Thinking", "sglang"),
        ("moonshotai/Kimi-K2-Thinking", "vllm"),
        ("moonshotai/Kimi-K2.5", "sglang"),
        ("moonshotai/Kimi-K2.5", "vllm"),
    }
    for c in CASES:
        assert len(plan(c).hosts) == 1
        assert plan(c).pools[0].parallel.tp == 8
        assert all(r.fits for r in plan(c).fit)


FLASHMLA_PAGES = "FlashMLA only supports a page_size of 64"


@pytest.mark.parametrize("name", [*CASES, *VARIANTS])
def test_accepted_by_the_pinned_release_with_the_models_config(name: str) -> None:
    r = verdicts()[name]
    assert r.ok, f"{name}: {r.stage}: {r.error}"
    assert r.version == REGISTRY[engine_of(name)].RELEASE.version
    # FlashMLA (rendered with an FP8 KV cache) always logs that it pages by 64 tokens.
    assert [w for w in r.warnings if FLASHMLA_PAGES not in w] == []
    assert any("the given config.json" in n for n in r.notes)


@pytest.mark.parametrize("name", [*CASES, *VARIANTS])
def test_the_release_reads_what_the_fit_counted(name: str) -> None:
    p = plan(name)
    pool, fit = p.pools[0], p.fit[0]
    r = verdicts()[name]
    assert r.ok, r.error
    assert r.value("kv_cache_dtype") == KV_FLAG[p.engine][fit.kv_dtype]
    if p.engine == "vllm":
        assert r.value("tensor_parallel_size") == pool.parallel.tp
        assert r.value("decode_context_parallel_size") == pool.parallel.dcp == 8
        assert r.value("max_model_len") == fit.context_length == 262144
        assert r.value("gpu_memory_utilization") == pool.mem_fraction == fit.mem_fraction
        assert r.parsed["language_model_only"] is (fit.vision_gib == 0 and "K2.5" in p.model)
    else:
        assert r.value("tp_size") == pool.parallel.tp
        assert r.value("context_length") == fit.context_length == 262144
        assert r.value("mem_fraction_static") == pool.mem_fraction == fit.mem_fraction


def test_text_only_k25_drops_the_vision_tower_from_the_fit() -> None:
    multimodal = plan("family-k2.5-vllm-tp8").fit[0]
    text_only = plan("k2.5-vllm-text-only").fit[0]
    assert multimodal.vision_gib > 0.5
    assert text_only.vision_gib == 0
    assert text_only.kv_tokens_per_gpu > multimodal.kv_tokens_per_gpu


def test_an_architecture_no_release_knows_is_rejected() -> None:
    r = verdicts()["unknown-architecture"]
    assert not r.ok
    assert "KimiK9ForConditionalGeneration" in r.error


def test_one_host_vllm_runs_its_default_executor_and_a_data_parallel_encoder() -> None:
    """One host: no Ray (vLLM resolves its multiprocessing executor); Kimi-K2.5 with its
    vision tower loaded encodes data-parallel, and the text-only variant says nothing of it."""
    k25 = verdicts()["family-k2.5-vllm-tp8"]
    # Not given: vLLM's default, multiprocessing on one node (vllm/config/parallel.py).
    assert k25.value("distributed_executor_backend") in (None, "mp")
    assert k25.value("mm_encoder_tp_mode") == "data"
    text = verdicts()["k2.5-vllm-text-only"]
    assert text.value("mm_encoder_tp_mode") == "weights"
