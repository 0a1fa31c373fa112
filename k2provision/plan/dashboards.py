"""The fleet's Grafana dashboards, as provisioned JSON: fleet overview, per-instance serving,
PD transfer and GPU health.

Pure. Every query names only metrics the pinned engines, router and exporters export, the
router's only those it records in the HTTP mode it is rendered in (the same test as the alert
rules checks them); the engines' names are their own (each engine module's
METRICS), every engine's joined with `or`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k2provision.engines.base import MetricNames
from k2provision.plan.alert_rules import each_engine, instance_load, quantile

DATASOURCE = {"type": "prometheus", "uid": "k2-prometheus"}
# The router's routes that run a generation (its `path` label on smg_http_* series).
ROUTER_GENERATION_PATHS = "/v1/chat/completions|/v1/completions|/generate"


def _engine_quantile(q: float, series: Callable[[MetricNames], str | None]) -> str:
    """The q-quantile per instance of an engine histogram, every engine's name joined (engines
    whose `series` is None export none)."""
    return each_engine(lambda m: None if (name := series(m)) is None else quantile(q, name))


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
                        each_engine(
                            lambda m: f"sum by (instance) (rate({m.generation_tokens}[1m]))"
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
                        each_engine(lambda m: instance_load(m, "running", "sum")),
                        "{{instance}} running",
                    ),
                    (
                        each_engine(lambda m: instance_load(m, "queued", "sum")),
                        "{{instance}} queued",
                    ),
                ],
            ),
            _panel(
                4,
                "KV cache usage",
                [
                    (
                        each_engine(lambda m: instance_load(m, "kv_usage", "max")),
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
                        each_engine(lambda m: f"sum by (instance) (rate({m.prompt_tokens}[1m]))"),
                        "{{instance}} in",
                    ),
                    (
                        each_engine(
                            lambda m: f"sum by (instance) (rate({m.generation_tokens}[1m]))"
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
                        _engine_quantile(q, lambda m: m.ttft),
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
                        _engine_quantile(q, lambda m: m.inter_token),
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
                        _engine_quantile(0.99, lambda m: m.e2e),
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
                        each_engine(
                            lambda m: instance_load(m, "kv_usage", "max", "instance, host")
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
                        each_engine(lambda m: instance_load(m, "queued", "sum")),
                        "{{instance}}",
                    )
                ],
            ),
        ],
    )


# The KV transfer histograms are the schedulers' own: an SGLang instance's /metrics holds
# those of the ranks on its first host only (its other hosts run no HTTP server), and the
# every-rank load route carries no transfer timings, so the titles say whose they are.
def _pd() -> dict[str, Any]:
    return _dashboard(
        "k2-pd",
        "K2 PD transfer",
        [
            _panel(
                1,
                "KV transfer latency p50/p99 (ranks on each instance's first host)",
                [
                    (
                        _engine_quantile(q, lambda m: m.kv_transfer_latency),
                        f"{{{{instance}}}} p{int(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ],
                "ms",
            ),
            _panel(
                2,
                "KV transfer speed p50 (ranks on each instance's first host)",
                [(_engine_quantile(0.5, lambda m: m.kv_transfer_speed), "{{instance}}")],
            ),
            _panel(
                3,
                "KV bootstrap p99 (ranks on each instance's first host)",
                [(_engine_quantile(0.99, lambda m: m.kv_bootstrap), "{{instance}}")],
                "ms",
            ),
            # Not the router's TTFT: sglang-router 0.3.2 records smg_router_ttft_seconds in gRPC
            # mode only (its help text: "(gRPC only)"), and the rendered router routes HTTP
            # workers. Its HTTP layer times every request by method and path (seen on the
            # pinned router's /metrics, failed requests included); the engines' TTFT panels
            # (K2 per instance) show the time to first token.
            _panel(
                4,
                "Router request duration p99 (generation routes)",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        "(rate(smg_http_request_duration_seconds_bucket"
                        f'{{path=~"{ROUTER_GENERATION_PATHS}"}}[5m])))',
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
