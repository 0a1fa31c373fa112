"""The stand-ins' /metrics: each engine's own Prometheus metric names and types, as the pinned
release exports them (SGLang 0.5.23 srt/observability/metrics_collector.py, vLLM 0.33.0
v1/metrics/loggers.py), so dashboards and alerts read the lab as they read a real fleet.

The values are the stand-in's: requests it answered, the tokens of its canned answers, an
idle queue and cache. tests/engine_parsers/test_metric_names.py checks every name here
against the pinned sources.
"""

from __future__ import annotations

# engine -> (name, type) of each family, prometheus_client's exposition names
FAMILIES: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang": (
        ("sglang:num_running_reqs", "gauge"),
        ("sglang:num_queue_reqs", "gauge"),
        ("sglang:token_usage", "gauge"),
        ("sglang:gen_throughput", "gauge"),
        ("sglang:prompt_tokens_total", "counter"),
        ("sglang:generation_tokens_total", "counter"),
        ("sglang:num_requests_total", "counter"),
        ("sglang:time_to_first_token_seconds", "histogram"),
        ("sglang:inter_token_latency_seconds", "histogram"),
        ("sglang:e2e_request_latency_seconds", "histogram"),
    ),
    "vllm": (
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens", "counter"),
        ("vllm:generation_tokens", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
    ),
}
BUCKETS = (0.1, 0.5, 1.0, 5.0)
# What one stand-in answer counts as (a short canned reply, answered at once).
PROMPT_TOKENS = 16
GENERATION_TOKENS = 8
LATENCY_S = 0.05


def _exposed(name: str, kind: str) -> str:
    return name if kind != "counter" or name.endswith("_total") else name + "_total"


def exposition(engine: str, requests: int, *, ready: bool, pairs: tuple[int, int] = (0, 0)) -> str:
    """The text /metrics answers after `requests` answered requests (text format 0.0.4); a PD
    decode's `pairs`: the requests whose prefill it checked, and those it refused (a prefill
    of another generation)."""
    lines = [
        f'k2_standin_ready{{engine="{engine}"}} {int(ready)}',
        "# TYPE k2_standin_checked_pairs counter",
        f'k2_standin_checked_pairs_total{{engine="{engine}"}} {pairs[0]}',
        "# TYPE k2_standin_mixed_pairs counter",
        f'k2_standin_mixed_pairs_total{{engine="{engine}"}} {pairs[1]}',
    ]
    per_kind = {
        "prompt_tokens": requests * PROMPT_TOKENS,
        "generation_tokens": requests * GENERATION_TOKENS,
        "num_requests": requests,
    }
    for name, kind in FAMILIES.get(engine, ()):
        base = name.split(":", 1)[1].removesuffix("_total")
        lines.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        if kind == "counter":
            lines.append(f"{_exposed(name, kind)} {per_kind.get(base, 0)}")
        elif kind == "histogram":
            for le in BUCKETS:
                lines.append(f'{name}_bucket{{le="{le}"}} {requests if le >= LATENCY_S else 0}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {requests}')
            lines.append(f"{name}_sum {requests * LATENCY_S:g}")
            lines.append(f"{name}_count {requests}")
        else:
            lines.append(f"{name} 0")
    return "\n".join(lines) + "\n"


# The core gauges of SGLang 0.5.23's /v1/loads in its Prometheus form (entrypoints/v1_loads.py
# `_format_loads_prometheus`: `sglang_<field>{dp_rank="N"}`, each a gauge).
RANK_LOAD_GAUGES = ("sglang_num_running_reqs", "sglang_num_waiting_reqs", "sglang_token_usage")


def rank_loads(ranks: int = 1) -> str:
    """/v1/loads?format=prometheus of an idle server of `ranks` DP ranks."""
    lines: list[str] = []
    for name in RANK_LOAD_GAUGES:
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f'{name}{{dp_rank="{rank}"}} 0' for rank in range(ranks))
    return "\n".join(lines) + "\n"
