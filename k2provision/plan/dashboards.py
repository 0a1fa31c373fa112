"""The fleet's Grafana dashboards, as provisioned JSON: fleet overview, per-instance serving,
PD transfer and GPU health.

Pure. Every query names only metrics the pinned engines, router and exporters export (the same
test as the alert rules checks them); SGLang's and vLLM's names are joined with `or`.
"""

from __future__ import annotations

from typing import Any

from k2provision.plan.alert_rules import either, quantile

DATASOURCE = {"type": "prometheus", "uid": "k2-prometheus"}


def _panel(
    pid: int, title: str, queries: list[tuple[str, str]], unit: str = "short"
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * ((pid - 1) % 2), "y": 8 * ((pid - 1) // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": DATASOURCE,
            }
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def _dashboard(uid: str, title: str, panels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["k2provision"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": panels,
    }


def _fleet() -> dict[str, Any]:
    return _dashboard(
        "k2-fleet",
        "K2 fleet overview",
        [
            _panel(
                1,
                "Endpoints up",
                [("sum by (job) (up)", "{{job}} up"), ("count by (job) (up)", "{{job}} planned")],
            ),
            _panel(
                2,
                "Output tokens/s per instance",
                [
                    (
                        either(
                            "sum by (instance) (rate(sglang:generation_tokens_total[1m]))",
                            "sum by (instance) (rate(vllm:generation_tokens_total[1m]))",
                        ),
                        "{{instance}}",
                    )
                ],
            ),
            _panel(
                3,
                "Running and queued requests",
                [
                    (
                        either(
                            "sum by (instance) (sglang:num_running_reqs)",
                            "sum by (instance) (vllm:num_requests_running)",
                        ),
                        "{{instance}} running",
                    ),
                    (
                        either(
                            "sum by (instance) (sglang:num_queue_reqs)",
                            "sum by (instance) (vllm:num_requests_waiting)",
                        ),
                        "{{instance}} queued",
                    ),
                ],
            ),
            _panel(
                4,
                "KV cache usage",
                [
                    (
                        either(
                            "max by (instance) (sglang:token_usage)",
                            "max by (instance) (vllm:kv_cache_usage_perc)",
                        ),
                        "{{instance}}",
                    )
                ],
                "percentunit",
            ),
            _panel(
                5,
                "Router requests/s",
                [("sum by (instance) (rate(smg_router_requests_total[1m]))", "{{instance}}")],
            ),
            _panel(
                6,
                "GPU utilisation per host",
                [("avg by (host) (DCGM_FI_DEV_GPU_UTIL)", "{{host}}")],
                "percent",
            ),
        ],
    )


def _instance() -> dict[str, Any]:
    return _dashboard(
        "k2-instance",
        "K2 per instance",
        [
            _panel(
                1,
                "Throughput (tokens/s)",
                [
                    (
                        either(
                            "sum by (instance) (rate(sglang:prompt_tokens_total[1m]))",
                            "sum by (instance) (rate(vllm:prompt_tokens_total[1m]))",
                        ),
                        "{{instance}} in",
                    ),
                    (
                        either(
                            "sum by (instance) (rate(sglang:generation_tokens_total[1m]))",
                            "sum by (instance) (rate(vllm:generation_tokens_total[1m]))",
                        ),
                        "{{instance}} out",
                    ),
                ],
            ),
            _panel(
                2,
                "TTFT p50/p90/p99",
                [
                    (
                        either(
                            quantile(q, "sglang:time_to_first_token_seconds"),
                            quantile(q, "vllm:time_to_first_token_seconds"),
                        ),
                        f"{{{{instance}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ],
                "s",
            ),
            _panel(
                3,
                "Inter-token latency p50/p90/p99",
                [
                    (
                        either(
                            quantile(q, "sglang:inter_token_latency_seconds"),
                            quantile(q, "vllm:inter_token_latency_seconds"),
                        ),
                        f"{{{{instance}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.9, 0.99)
                ],
                "s",
            ),
            _panel(
                4,
                "End-to-end latency p99",
                [
                    (
                        either(
                            quantile(0.99, "sglang:e2e_request_latency_seconds"),
                            quantile(0.99, "vllm:e2e_request_latency_seconds"),
                        ),
                        "{{instance}}",
                    )
                ],
                "s",
            ),
            _panel(
                5,
                "KV cache usage",
                [
                    (
                        either(
                            "max by (instance, host) (sglang:token_usage)",
                            "max by (instance, host) (vllm:kv_cache_usage_perc)",
                        ),
                        "{{instance}} {{host}}",
                    )
                ],
                "percentunit",
            ),
            _panel(
                6,
                "Queue",
                [
                    (
                        either(
                            "sum by (instance) (sglang:num_queue_reqs)",
                            "sum by (instance) (vllm:num_requests_waiting)",
                        ),
                        "{{instance}}",
                    )
                ],
            ),
        ],
    )


def _pd() -> dict[str, Any]:
    return _dashboard(
        "k2-pd",
        "K2 PD transfer",
        [
            _panel(
                1,
                "KV transfer latency p50/p99",
                [
                    (
                        quantile(q, "sglang:kv_transfer_latency_ms"),
                        f"{{{{instance}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ],
                "ms",
            ),
            _panel(
                2,
                "KV transfer speed p50",
                [(quantile(0.5, "sglang:kv_transfer_speed_gb_s"), "{{instance}}")],
            ),
            _panel(
                3,
                "KV bootstrap p99",
                [(quantile(0.99, "sglang:kv_transfer_bootstrap_ms"), "{{instance}}")],
                "ms",
            ),
            _panel(
                4,
                "Router TTFT p99",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        "(rate(smg_router_ttft_seconds_bucket[5m])))",
                        "router",
                    )
                ],
                "s",
            ),
        ],
    )


def _gpu() -> dict[str, Any]:
    return _dashboard(
        "k2-gpu",
        "K2 GPU health",
        [
            _panel(
                1,
                "Last XID per GPU",
                [("max by (host, gpu) (DCGM_FI_DEV_XID_ERRORS)", "{{host}} GPU {{gpu}}")],
            ),
            _panel(
                2,
                "Uncorrectable ECC (volatile)",
                [("sum by (host) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)", "{{host}}")],
            ),
            _panel(
                3,
                "Row remaps",
                [
                    (
                        "sum by (host) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)",
                        "{{host}} remapped",
                    ),
                    ("max by (host) (DCGM_FI_DEV_ROW_REMAP_FAILURE)", "{{host}} failure"),
                ],
            ),
            _panel(
                4,
                "GPU temperature",
                [("max by (host) (DCGM_FI_DEV_GPU_TEMP)", "{{host}}")],
                "celsius",
            ),
            _panel(
                5,
                "Framebuffer used",
                [("sum by (host) (DCGM_FI_DEV_FB_USED)", "{{host}}")],
                "decmbytes",
            ),
            _panel(
                6,
                "IB port state (4 = ACTIVE)",
                [
                    (
                        "min by (host, device, port) (node_infiniband_state_id)",
                        "{{host}} {{device}}/{{port}}",
                    )
                ],
            ),
        ],
    )


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON document."""
    return {
        "k2-fleet.json": _fleet(),
        "k2-instance.json": _instance(),
        "k2-pd.json": _pd(),
        "k2-gpu.json": _gpu(),
    }


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, query) of every panel."""
    return [
        (name, panel["title"], target["expr"])
        for name, doc in dashboards().items()
        for panel in doc["panels"]
        for target in panel["targets"]
    ]
