"""The memory fit: what one GPU of a pool holds, and the fraction to render.

Per GPU: weights (each class in its own format, split the way the layout splits it), the
runtime reserve (activations of the largest forward pass and of the sampler, CUDA graphs for
the captured batch sizes, NCCL / custom all-reduce / DeepEP buffers, the vision encoder's
profiling), a safety margin (k2_reserve_gib) for what no engine accounts for, and the KV cache
in what remains, in the KV dtype actually rendered.

Each engine sizes its KV cache its own way: its module says what it reserves (`reserve`), how
its memory fraction becomes KV cache (`kv_budget`) and the page its cache is counted in
(`KV_PAGE_TOKENS`); engines/memory.py has the arithmetic they share, docs/fit.md the
derivations and the calibration against published engine figures. This module asks
REGISTRY[engine] and reports.
"""

from __future__ import annotations

from k2provision.core.catalog import GIB
from k2provision.core.records import FitReport, MemoryReserve
from k2provision.engines import REGISTRY
from k2provision.engines.calibration import fit_error_gib
from k2provision.engines.memory import KvBudget, PoolFit, kv_bytes_per_token
from k2provision.engines.memory import weights_per_gpu as _weights_per_gpu

__all__ = ["PoolFit", "edge_warnings", "fit_pool", "kv_headroom_gib", "weights_per_gpu"]


def weights_per_gpu(f: PoolFit) -> tuple[float, float]:
    """(all weights, of which vision) in bytes on the most loaded GPU of the pool."""
    return _weights_per_gpu(f, REGISTRY[f.engine].ROUTED_EXPERTS_ON_HOST)


def fit_pool(f: PoolFit) -> FitReport:
    """The fit of one pool: derived memory fraction, KV capacity, and whether it holds one
    request of `context_length`."""
    engine = REGISTRY[f.engine]
    weights_b, vision_b = weights_per_gpu(f)
    weights = weights_b / GIB
    reserve = engine.reserve(f)
    budget = engine.kv_budget(f, reserve, weights)
    return _report(f, reserve, budget, weights, vision_b / GIB)


def _report(
    f: PoolFit, reserve: MemoryReserve, split: KvBudget, weights: float, vision: float
) -> FitReport:
    p = f.parallel
    kv_gib = max(split.kv_gib, 0.0)
    per_token = kv_bytes_per_token(f)
    tokens = int(kv_gib * GIB // per_token)
    page = REGISTRY[f.engine].KV_PAGE_TOKENS
    tokens = tokens // page * page
    replica = tokens * p.dcp
    groups = max(f.gpus // (p.attention_tp * p.pp), 1)
    return FitReport(
        pool=f.pool,
        gpu_memory_gib=round(f.gpu.memory_mib / 1024, 1),
        usable_gib=round(f.gpu.usable_gib, 1),
        mem_fraction=split.fraction,
        budget_gib=round(split.budget_gib, 1),
        weights_gib=round(weights, 1),
        vision_gib=round(vision, 1),
        reserve=reserve,
        reserve_gib=round(reserve.total, 1),
        kv_gib=round(kv_gib, 1),
        kv_dtype=f.kv_dtype,
        kv_bytes_per_token=per_token,
        kv_tokens_per_gpu=tokens,
        kv_tokens_per_replica=replica,
        kv_tokens_total=replica * groups,
        context_length=f.context_length,
        fits=replica >= f.context_length,
    )


def kv_headroom_gib(r: FitReport) -> float:
    """KV cache per GPU beyond what one request of the full context takes there (with decode
    context parallelism each GPU holds 1/dcp of it)."""
    dcp = r.kv_tokens_per_replica // r.kv_tokens_per_gpu if r.kv_tokens_per_gpu else 1
    request = -(-r.context_length // max(dcp, 1))
    return (r.kv_tokens_per_gpu - request) * r.kv_bytes_per_token / GIB


def edge_warnings(reports: list[FitReport] | tuple[FitReport, ...]) -> list[str]:
    """A loud warning per pool whose KV headroom is within the fit's calibration error: the
    real engine may not hold one request of the context."""
    error = fit_error_gib()
    return [
        f"[{r.pool}] AT THE EDGE: {kv_headroom_gib(r):.1f} GiB of KV cache per GPU beyond one "
        f"{r.context_length}-token request, within the fit's own error ({error} GiB per GPU, "
        'docs/fit.md "Calibration"): the engine may refuse to start or hold only one such '
        "request; fix: add nodes, or lower k2_context_length"
        for r in reports
        if r.fits and kv_headroom_gib(r) < error
    ]
