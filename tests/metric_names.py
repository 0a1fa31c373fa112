"""Metric names: those a PromQL expression reads, and those the pinned releases export.

The engines' names come from their sources (prometheus_client Counter/Gauge/Histogram/Summary
calls with a literal `name=`), the router's from its compiled extension's strings (a Rust
binary: its `smg_` names are string literals), the node exporter's from a pinned list with its
sources (tests/fixtures/monitoring/exporter-metrics.txt), the DCGM exporter's from the counters
file the monitoring role starts it with (k2provision/plan/dcgm_counters.py).
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from pathlib import Path

from k2provision.plan.dcgm_counters import DCGM_COUNTERS

ROOT = Path(__file__).resolve().parents[1]
EXPORTER_LIST = ROOT / "tests" / "fixtures" / "monitoring" / "exporter-metrics.txt"
BUILTIN = {"up": "gauge", "scrape_duration_seconds": "gauge", "scrape_samples_scraped": "gauge"}

_KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}
_PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "sum", "avg", "min", "max", "count", "count_values", "topk", "bottomk",
    "quantile", "stddev", "stdvar", "inf", "nan",
}  # fmt: skip


def site_packages(venv: Path) -> Path:
    """The venv's site-packages (its one python3.* directory)."""
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv}: no lib/python3*/site-packages (build the parser venvs)")
    return found[0]


def _kind(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    lowered = name.lower()
    for word, kind in _KINDS.items():
        if word in lowered:
            return kind
    return None


@functools.cache
def source_metrics(package_dir: Path, prefix: str) -> dict[str, str]:
    """name -> type of every prometheus_client metric with a literal name starting `prefix`.

    Only files whose text holds `prefix` are parsed: a literal starting with it is in the text.
    """
    found: dict[str, str] = {}
    for path in package_dir.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if prefix not in text:
            continue
        try:
            with warnings.catch_warnings():  # the releases' own bad escapes are theirs
                warnings.simplefilter("ignore", DeprecationWarning)
                tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            kind = _kind(node)
            if kind is None:
                continue
            for kw in node.keywords:
                value = kw.value
                if (
                    kw.arg == "name"
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                    and value.value.startswith(prefix)
                ):
                    found[value.value] = kind
    return found


@functools.cache
def binary_names(path: Path, prefix: str) -> frozenset[str]:
    """The `prefix…` identifiers among a binary's strings."""
    data = path.read_bytes()
    pattern = re.escape(prefix.encode()) + rb"[a-z0-9_]+"
    return frozenset(m.decode() for m in re.findall(pattern, data))


@functools.cache
def binary_metric_help(path: Path, prefix: str) -> dict[str, str]:
    """`prefix…` metric names of a Rust binary with the help text its `describe_*!` call stored
    right after the name (the names and help texts are adjacent string literals)."""
    data = path.read_bytes()
    pattern = (
        re.escape(prefix.encode())
        + rb"([a-z0-9_]+)([A-Z][ -~]*?)(?="
        + re.escape(prefix.encode())
        + rb"|[^ -~]|$)"
    )
    found: dict[str, str] = {}
    for m in re.finditer(pattern, data):
        found.setdefault(prefix + m.group(1).decode(), m.group(2).decode())
    return found


# What sglang-router's help text says of a metric that its HTTP routers never record.
GRPC_ONLY = "(gRPC only)"


def router_http_names(path: Path) -> frozenset[str]:
    """The router binary's `smg_` names less those its help marks gRPC-only: what a router of
    HTTP workers (every rendered router) can record."""
    grpc_only = {n for n, text in binary_metric_help(path, "smg_").items() if GRPC_ONLY in text}
    return binary_names(path, "smg_") - grpc_only


def exporter_metrics() -> dict[str, str]:
    """The pinned exporters' names and types: the node exporter's list, the DCGM exporter's
    counters file."""
    out: dict[str, str] = {field: kind for field, kind, _ in DCGM_COUNTERS}
    for line in EXPORTER_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind = line.split()
            out[name] = kind
    return out


def exposed(metrics: dict[str, str]) -> set[str]:
    """The series names Prometheus sees for metrics of these types (prometheus_client's
    exposition: counters end in `_total`, histograms and summaries add `_bucket`/`_sum`/
    `_count`)."""
    names: set[str] = set()
    for name, kind in metrics.items():
        if kind == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
            names.add(name)  # exporters that name counters as-is (DCGM)
        elif kind in ("histogram", "summary"):
            names.update({name + "_bucket", name + "_sum", name + "_count", name})
        else:
            names.add(name)
    return names


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (label matchers, groupings, ranges, strings and
    function names removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        rest = text[m.end() :].lstrip()
        if word.lower() in _PROMQL_WORDS or rest.startswith("("):
            continue
        if re.fullmatch(r"\d+[smhdwy]", word) or word[0].isdigit():
            continue
        if text[max(0, m.start() - 1)].isdigit() or (m.start() > 0 and text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(word)
    return names
