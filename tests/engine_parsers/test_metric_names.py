"""Every metric the alert rules and dashboards read is one the pinned releases export: SGLang
0.5.23's and vLLM 0.33.0's sources, sglang-router 0.3.2's binary (only what it records in the
HTTP mode every rendered router runs in: its help marks the gRPC-only ones), the pinned
exporters' list."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from k2lab.standin import standin_dir
from k2provision.plan.alert_rules import alert_rules
from k2provision.plan.dashboards import panel_queries
from tests.engine_parsers.runner import REPO_ROOT
from tests.metric_names import (
    BUILTIN,
    GRPC_ONLY,
    binary_metric_help,
    binary_names,
    exporter_metrics,
    exposed,
    promql_metric_names,
    router_http_names,
    site_packages,
    source_metrics,
)

pytestmark = pytest.mark.parsers


def _router_binary() -> Path:
    sglang_site = site_packages(REPO_ROOT / ".venv-sglang")
    return next((sglang_site / "sglang_router").glob("sglang_router_rs*.so"))


def test_the_routers_grpc_only_metrics_are_not_taken_for_http_ones() -> None:
    """sglang-router 0.3.2 defines smg_router_ttft_seconds but records it for gRPC workers only
    (its help text says so); the rendered router's workers are HTTP."""
    binary = _router_binary()
    help_texts = binary_metric_help(binary, "smg_")
    assert GRPC_ONLY in help_texts["smg_router_ttft_seconds"]
    assert GRPC_ONLY not in help_texts["smg_http_request_duration_seconds"]
    assert "smg_router_ttft_seconds" in binary_names(binary, "smg_")
    http = router_http_names(binary)
    assert "smg_router_ttft_seconds" not in http
    assert {"smg_router_requests_total", "smg_worker_health"} <= http


def _load_route_names(sglang_site: Path) -> set[str]:
    """What sglang 0.5.23's /v1/loads?format=prometheus serves: `sglang_<field>` for each
    numeric core field of LoadSnapshot (srt/managers/load_snapshot.py;
    srt/entrypoints/v1_loads.py _format_loads_prometheus)."""
    source = sglang_site / "sglang" / "srt" / "managers" / "load_snapshot.py"
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LoadSnapshot")
    return {
        f"sglang_{item.target.id}"
        for item in cls.body
        if isinstance(item, ast.AnnAssign)
        and isinstance(item.target, ast.Name)
        and isinstance(item.annotation, ast.Name)
        and item.annotation.id in {"int", "float"}
        and item.target.id != "dp_rank"
    }


def test_the_every_rank_load_names_are_served_by_the_pinned_load_route() -> None:
    from k2provision.engines import sglang

    load = sglang.METRICS.rank_load if sglang.METRICS else None
    assert load is not None
    served = _load_route_names(site_packages(REPO_ROOT / ".venv-sglang"))
    assert {load.running, load.queued, load.kv_usage, load.published} <= served
    # dp_rank is each sample's label, not a series.
    assert "sglang_dp_rank" not in served


@pytest.fixture(scope="module")
def known() -> set[str]:
    sglang_site = site_packages(REPO_ROOT / ".venv-sglang")
    vllm_site = site_packages(REPO_ROOT / ".venv-vllm")
    sglang = source_metrics(sglang_site / "sglang" / "srt", "sglang:")
    vllm = source_metrics(vllm_site / "vllm", "vllm:")
    router = router_http_names(_router_binary())
    # The sources hold the names the rules lean on, with their types:
    assert sglang["sglang:time_to_first_token_seconds"] == "histogram"
    assert sglang["sglang:token_usage"] == "gauge"
    assert vllm["vllm:kv_cache_usage_perc"] == "gauge"
    assert vllm["vllm:generation_tokens"] == "counter"
    assert {"smg_router_requests_total", "smg_worker_health"} <= router
    return (
        exposed(sglang)
        | _load_route_names(sglang_site)
        | exposed(vllm)
        | exposed(dict.fromkeys(router, "histogram"))
        | exposed(exporter_metrics())
        | set(BUILTIN)
    )


def _expressions() -> list[tuple[str, str]]:
    rules = [(r["alert"], r["expr"]) for g in alert_rules()["groups"] for r in g["rules"]]
    panels = [(f"{f}: {title}", expr) for f, title, expr in panel_queries()]
    return rules + panels


@pytest.mark.parametrize(("where", "expr"), _expressions(), ids=lambda v: str(v)[:60])
def test_every_metric_named_is_exported(known: set[str], where: str, expr: str) -> None:
    names = promql_metric_names(expr)
    assert names, f"{where}: no metric found in {expr!r}"
    assert names <= known, f"{where}: {sorted(names - known)} is exported by no pinned release"


def test_a_misspelt_name_is_caught(known: set[str]) -> None:
    assert not promql_metric_names("rate(sglang:time_to_first_token_secs_bucket[5m])") <= known
    assert promql_metric_names(
        "histogram_quantile(0.99, sum by (le) "
        '(rate(vllm:e2e_request_latency_seconds_bucket{a="b"}[5m]))) > 1e3'
    ) == {"vllm:e2e_request_latency_seconds_bucket"}


def _standin_metrics() -> ModuleType:
    path = standin_dir() / "python" / "k2standin" / "metrics.py"
    spec = importlib.util.spec_from_file_location("k2standin_metrics", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("engine", "venv", "package"), [
    ("sglang", ".venv-sglang", "sglang/srt"), ("vllm", ".venv-vllm", "vllm"),
])  # fmt: skip
def test_the_standins_export_each_engines_own_names_and_types(
    engine: str, venv: str, package: str
) -> None:
    standin = _standin_metrics()
    source = source_metrics(site_packages(REPO_ROOT / venv) / package, f"{engine}:")
    families = standin.FAMILIES[engine]
    assert families
    for name, kind in families:
        assert source.get(name) == kind, f"{name} is a {source.get(name)} in the pinned {engine}"
    text = standin.exposition(engine, 3, ready=True)
    scraped = {line.split("{")[0].split()[0] for line in text.splitlines() if line[0] != "#"}
    # Besides the engine's names, only the stand-in's own (k2_standin_*: its readiness, a PD
    # decode's checked and mixed pairs), which no dashboard or alert reads.
    own = {name for name in scraped if name.startswith("k2_standin_")}
    assert own == {
        "k2_standin_ready",
        "k2_standin_checked_pairs_total",
        "k2_standin_mixed_pairs_total",
    }
    assert scraped - own <= exposed(dict(families))


def test_the_standin_serves_the_rank_loads_the_plan_scrapes() -> None:
    """The sglang stand-in's /v1/loads answers the gauges the monitoring plan reads there."""
    from k2provision.engines import REGISTRY

    metrics = REGISTRY["sglang"].METRICS
    assert metrics is not None
    assert metrics.rank_load is not None
    wanted = {metrics.rank_load.running, metrics.rank_load.queued, metrics.rank_load.kv_usage}
    standin = _standin_metrics()
    scraped = {line.split("{")[0] for line in standin.rank_loads(2).splitlines() if line[0] != "#"}
    assert scraped == wanted
    assert 'dp_rank="1"' in standin.rank_loads(2)
