"""The memory fit against what engines publish, and the rules it derives fractions by."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k2provision.core import catalog
from k2provision.core.catalog import GIB
from k2provision.core.records import Parallel, Tunables
from k2provision.engines import vllm
from k2provision.engines.memory import PoolFit, deepep_low_latency_gib
from k2provision.engines.vllm import CALIBRATION, CalibrationPoint
from k2provision.plan.assemble import build_plan
from k2provision.plan.fit import fit_pool, weights_per_gpu
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]
FIT_DOC = ROOT / "docs" / "fit.md"


def pool_fit(
    engine: str = "vllm", model: str = "moonshotai/Kimi-K2-Thinking", **kw: object
) -> PoolFit:
    base = {
        "engine": engine,
        "layout": "tp",
        "pool": "nodes",
        "nodes": 1,
        "gpus": 8,
        "gpus_per_node": 8,
        "parallel": Parallel(tp=8),
        "spec": catalog.model(model),
        "gpu": catalog.gpu("h200"),
        "context_length": 262144,
        "kv_dtype": "bf16",
        "vision_loaded": False,
        "tunables": Tunables(),
    }
    return PoolFit(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("point", CALIBRATION, ids=lambda p: p.name)
def test_calibration_points_are_reproduced_within_5_percent(point: CalibrationPoint) -> None:
    predicted = point.predicted()
    assert abs(predicted - point.published) / point.published <= 0.05, (predicted, point)


def test_the_calibration_table_in_the_docs_is_the_one_the_code_computes() -> None:
    text = FIT_DOC.read_text()
    for point in CALIBRATION:
        row = next(line for line in text.splitlines() if line.startswith(f"| {point.name} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        numbers = [int(c.replace(",", "")) for c in cells if re.fullmatch(r"[\d,]+", c)]
        assert numbers == [point.published, point.predicted()], row
        error = (point.predicted() - point.published) / point.published * 100
        assert f"{error:+.1f}%" in row


def test_the_recipes_available_kv_memory_is_reproduced() -> None:
    # The same startup log: "Available KV cache memory: 46.80 GiB" at TP8.
    point = CALIBRATION[0]
    blocks_gib = point.predicted() * catalog.kv_bytes_per_token_per_layer(point.fit.spec) * 61
    assert abs(blocks_gib / GIB - 46.80) / 46.80 <= 0.05


def test_dcp_multiplies_the_tokens_not_the_memory() -> None:
    one, eight = CALIBRATION[0].predicted(), CALIBRATION[1].predicted()
    assert eight == 8 * one


def test_the_pinned_vllm_counts_cuda_graphs_the_old_one_did_not() -> None:
    f = pool_fit()
    old = vllm.kv_tokens(f, CALIBRATION[0].release, 0.9)
    new = vllm.kv_tokens(f, vllm.PINNED, 0.9)
    assert new < old


def test_kv_is_counted_in_the_dtype_rendered_for_every_engine() -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        bf16 = fit_pool(pool_fit(engine, kv_dtype="bf16"))
        fp8 = fit_pool(pool_fit(engine, kv_dtype="fp8"))
        assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
        assert fp8.kv_tokens_per_gpu >= 1.99 * bf16.kv_tokens_per_gpu
    golden = ROOT / "tests" / "golden" / "trtllm-tp16-ep8" / "inventory.ini"
    prod_trtllm = build_plan(load_cluster(golden))
    # TensorRT-LLM renders kv_cache_config.dtype fp8: 576 bytes per token and layer.
    assert prod_trtllm.fit[0].kv_dtype == "fp8"
    assert prod_trtllm.fit[0].kv_bytes_per_token == 576 * 61


def test_weights_follow_the_layout() -> None:
    tp8, _ = weights_per_gpu(pool_fit())
    total = catalog.weights(catalog.model("moonshotai/Kimi-K2-Thinking")).total
    # TP8 splits everything but the small replicated projections and routers.
    assert total / 8 < tp8 < total / 8 * 1.05
    dp_ep, _ = weights_per_gpu(pool_fit(layout="dp_ep", parallel=Parallel(tp=1, dp=8, ep=8)))
    assert dp_ep > tp8  # attention and dense layers are replicated per DP rank
    k25, vision = weights_per_gpu(pool_fit(model="moonshotai/Kimi-K2.5", vision_loaded=True))
    assert 0.8 * GIB < vision < 0.95 * GIB
    assert k25 == pytest.approx(tp8 + vision, rel=0.001)


def test_sglang_fraction_leaves_room_for_what_it_counts() -> None:
    for kw in ({}, {"model": "moonshotai/Kimi-K2.5", "vision_loaded": True}):
        report = fit_pool(pool_fit("sglang", **kw))  # type: ignore[arg-type]
        slack = (1 - report.mem_fraction) * (report.usable_gib - report.reserve.runtime)
        assert slack >= report.reserve.total - report.reserve.runtime - 0.01
        assert slack - (report.reserve.total - report.reserve.runtime) < 0.01 * report.usable_gib


def test_vllm_utilization_keeps_the_margin_outside() -> None:
    report = fit_pool(pool_fit(tunables=Tunables(reserve_gib=20)))
    assert (1 - report.mem_fraction) * report.usable_gib >= 20
    capped = fit_pool(pool_fit(tunables=Tunables(reserve_gib=1)))
    assert capped.mem_fraction == 0.95


def test_deepep_low_latency_buffer_follows_deepeps_layout() -> None:
    # 4 buffers (send/receive, odd/even) of experts x tokens x (BF16 hidden + 56 scales).
    spec = catalog.model("moonshotai/Kimi-K2-Instruct")
    p = Parallel(tp=96, dp=96, ep=96, dp_attention=True, redundant_experts=96)
    assert deepep_low_latency_gib(spec, p, 480) == pytest.approx(
        4 * 480 * 480 * (7168 * 2 + 56 * 4) / GIB
    )


def test_decode_pools_reserve_more_than_prefill_pools() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    prefill, decode = plan.fit
    assert decode.reserve.cuda_graphs > prefill.reserve.cuda_graphs == 0
    assert decode.reserve.comm_buffers > prefill.reserve.comm_buffers
    assert decode.mem_fraction < prefill.mem_fraction


def test_the_docs_fractions_beside_upstream_are_the_plans(tmp_path: Path) -> None:
    text = FIT_DOC.read_text()
    tp8 = tmp_path / "tp8.ini"
    tp8.write_text(
        "[nodes]\nn1 ansible_host=10.9.0.1\n[all:vars]\nk2_engine=sglang\nk2_layout=tp\n"
        "k2_context_length=32768\n"
    )
    single = build_plan(load_cluster(tp8)).fit[0].mem_fraction
    prod = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    prefill, decode = (f.mem_fraction for f in prod.fit)
    assert f"| 0.9 | {single:g} at `k2_context_length=32768` |" in text
    assert f"| 0.85 | {prefill:g} (16384 tokens per rank) |" in text
    assert text.count(f"| {decode:g} |") == 2
