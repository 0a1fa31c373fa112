"""The fleet's Prometheus alert rules, with the latency targets as parameters.

Pure. Every metric named here is one the pinned engines, the router or the pinned exporters
export (tests/engine_parsers/test_metric_names.py reads them from the sources). The engines'
series are named by the engines (each engine module's METRICS); where engines name the same
thing differently, one expression joins every engine's name with `or`: only the engine the
plan runs has series. A comparison applies to the whole join (`above`): PromQL binds `>`
tighter than `or`, so `(a) or (b) > T` compares only b. Every rule has `promtool test rules`
cases, silent and firing, for each engine's series (tests/k2provision/unit/test_alert_cases.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from k2provision.core.gpu_health import FATAL_XIDS
from k2provision.engines import metric_dialects
from k2provision.engines.base import MetricNames

ENDPOINT_DOWN_FOR = "30s"


@dataclass(frozen=True)
class AlertTargets:
    """What the latency and capacity alerts compare against."""

    ttft_p99_s: float = 5.0
    itl_p99_s: float = 0.2
    kv_usage: float = 0.95
    queue_growing_min: int = 10
    disk_free_fraction: float = 0.05


def quantile(q: float, metric: str) -> str:
    """The q-quantile per instance of histogram `metric` over five minutes."""
    return f"histogram_quantile({q}, sum by (le, instance) (rate({metric}_bucket[5m])))"


def either(*exprs: str) -> str:
    """One expression over every engine's names (only the running engine has series); one
    expression alone as it is."""
    if len(exprs) == 1:
        return exprs[0]
    return " or ".join(f"({expr})" for expr in exprs)


def above(expr: str, threshold: float) -> str:
    """`expr` > `threshold`, the whole of `expr` compared (it may be an `or` of engines)."""
    return f"({expr}) > {threshold:g}"


def _regex_of(names: Sequence[str]) -> str:
    """A PromQL label regex matching exactly these names (escaped for the string literal)."""
    return "|".join(re.escape(n) for n in names).replace("\\", "\\\\")


def ib_port_down(ib_devices: Mapping[str, Sequence[str]]) -> str | None:
    """Ports of the RDMA devices the plan uses (each host's `k2_ib_devices`) that are not
    ACTIVE; hosts with the same devices share one selector. None when the plan names none:
    other devices (a management NIC's RoCE port, an unused HCA) are not the cluster's."""
    by_devices: dict[tuple[str, ...], list[str]] = {}
    for host, devices in sorted(ib_devices.items()):
        if devices:
            by_devices.setdefault(tuple(sorted(devices)), []).append(host)
    if not by_devices:
        return None
    return either(
        *(
            f'node_infiniband_state_id{{host=~"{_regex_of(hosts)}", '
            f'device=~"{_regex_of(devices)}"}} != 4'
            for devices, hosts in sorted(by_devices.items(), key=lambda kv: kv[1])
        )
    )


def each_engine(expr: Callable[[MetricNames], str | None]) -> str:
    """`expr` of every registered engine's metric names, joined by `either`; engines for which
    it is None (a series they do not export) are left out."""
    found = [text for names in metric_dialects() if (text := expr(names)) is not None]
    return either(*found)


LoadField = Literal["running", "queued", "kv_usage"]


def instance_load(m: MetricNames, field: LoadField, agg: str, by: str = "instance") -> str:
    """`agg by (by)` of a load gauge: from the engine's every-rank source (`rank_load`) where
    it has series (an instance whose ranks span several hosts), else from its own gauge."""
    own = f"{agg} by ({by}) ({getattr(m, field)})"
    if m.rank_load is None:
        return own
    return f"{agg} by ({by}) ({getattr(m.rank_load, field)}) or {own}"


def _queue_growing(m: MetricNames, minimum: int) -> str:
    """A queue gauge that keeps growing above `minimum`: per rank from the every-rank source
    where it has series, the engine's own gauge for instances it does not cover."""

    def growing(series: str) -> str:
        return f"deriv({series}[5m]) > 0 and {series} > {minimum}"

    if m.rank_load is None:
        return growing(m.queued)
    ranks = m.rank_load.queued
    return f"({growing(ranks)}) or (({growing(m.queued)}) unless on (instance) {ranks})"


def _rule(name: str, expr: str, for_: str, severity: str, summary: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary},
    }


def alert_rules(
    targets: AlertTargets = AlertTargets(), ib_devices: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """The rules file (Prometheus' rule-file YAML as a document). `ib_devices`: each host's
    RDMA devices from the plan (`k2_ib_devices`); without any, no IB port rule."""
    t = targets
    ib = ib_port_down(ib_devices or {})
    rules = [
        _rule(
            "K2EndpointDown",
            'up{job=~"engine|router"} == 0',
            ENDPOINT_DOWN_FOR,
            "critical",
            "{{ $labels.job }} endpoint of {{ $labels.instance }} on {{ $labels.host }} "
            "(rank {{ $labels.rank }}) is down",
        ),
        _rule(
            "K2ExporterDown",
            'up{job=~"node|dcgm"} == 0',
            "2m",
            "warning",
            "the {{ $labels.job }} exporter on {{ $labels.host }} is down",
        ),
        _rule(
            "K2InstanceUnhealthy",
            "smg_worker_health == 0",
            "1m",
            "critical",
            "the router sees an unhealthy worker ({{ $labels.worker }})",
        ),
        _rule(
            "K2RankRestarting",
            'changes(up{job="engine"}[15m]) > 2',
            "0s",
            "warning",
            "{{ $labels.instance }} on {{ $labels.host }} keeps going down and up",
        ),
        _rule(
            "K2GpuFatalXid",
            " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in sorted(FATAL_XIDS)),
            "0s",
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} raised XID {{ $value }}: drain the "
            "host and reset or replace the GPU",
        ),
        _rule(
            "K2GpuEccUncorrectable",
            "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0",
            "0s",
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} has uncorrectable ECC errors",
        ),
        _rule(
            "K2GpuRowRemapFailure",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            "0s",
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} failed a row remap: replace it",
        ),
        _rule(
            "K2NvlinkErrors",
            "increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[5m]) > 0",
            "0s",
            "warning",
            "NVLink on GPU {{ $labels.gpu }} of {{ $labels.host }} is recovering links",
        ),
        _rule(
            "K2TtftP99High",
            above(each_engine(lambda m: quantile(0.99, m.ttft)), t.ttft_p99_s),
            "5m",
            "warning",
            f"{{{{ $labels.instance }}}}: TTFT p99 {{{{ $value }}}} s over {t.ttft_p99_s:g} s",
        ),
        _rule(
            "K2ItlP99High",
            above(each_engine(lambda m: quantile(0.99, m.inter_token)), t.itl_p99_s),
            "5m",
            "warning",
            "{{ $labels.instance }}: inter-token p99 {{ $value }} s over "
            f"{t.itl_p99_s:g} s",
        ),
        _rule(
            "K2KvCacheFull",
            above(
                each_engine(lambda m: instance_load(m, "kv_usage", "max", "instance, host")),
                t.kv_usage,
            ),
            "5m",
            "warning",
            "{{ $labels.instance }}: KV cache {{ $value | humanizePercentage }} full on its "
            "fullest rank (every rank of an instance on several hosts, through its first "
            "host's load route)",
        ),
        _rule(
            "K2QueueGrowing",
            each_engine(lambda m: _queue_growing(m, t.queue_growing_min)),
            "10m",
            "warning",
            "{{ $labels.instance }}: the request queue keeps growing",
        ),
        _rule(
            "K2DiskFull",
            'node_filesystem_avail_bytes{fstype!~"tmpfs|overlay|squashfs"} '
            '/ node_filesystem_size_bytes{fstype!~"tmpfs|overlay|squashfs"} '
            f"< {t.disk_free_fraction:g}",
            "5m",
            "warning",
            "{{ $labels.mountpoint }} on {{ $labels.host }} (the model directory's disk) is "
            "{{ $value | humanizePercentage }} free",
        ),
    ]
    if ib is not None:
        rules.append(
            _rule(
                "K2IbPortDown",
                ib,
                "1m",
                "critical",
                "IB port {{ $labels.device }}/{{ $labels.port }} on {{ $labels.host }} is not "
                "ACTIVE",
            )
        )
    return {"groups": [{"name": "k2provision", "rules": rules}]}
