"""Every alert rule through `promtool test rules`: for each rule, and for rules on engine series
for each engine's names (each engine module's METRICS), one case whose series must keep it
silent and one whose series must make it fire. A case asks Prometheus' own evaluation whether
the alert is firing (the ALERTS series) after the rule's `for`, so an expression whose
threshold reaches only part of it (PromQL binds `>` tighter than `or`) fires where it must not.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from k2provision.engines import metric_dialects
from k2provision.engines.base import MetricNames
from k2provision.plan.alert_rules import alert_rules

# The plan's RDMA devices in these cases: the IB rule watches these and nothing else.
IB_DEVICES = {"gpu-1": ("mlx5_0", "mlx5_1")}
EVAL_TIME = "20m"
STEPS = 30  # one sample a minute, past the longest window plus `for`


@dataclass(frozen=True)
class Case:
    alert: str
    fires: bool
    series: dict[str, str]
    """Series selector -> promtool's expanding values notation."""


def _histogram(name: str, slow: bool) -> dict[str, str]:
    """A latency histogram: every observation under 0.1 s, or every one between 0.1 and 10 s
    (p99 about 9.9 s)."""
    labels = 'instance="decode", host="gpu-1"'
    under = f"0x{STEPS}" if slow else f"0+10x{STEPS}"
    return {
        f'{name}_bucket{{{labels}, le="0.1"}}': under,
        f'{name}_bucket{{{labels}, le="10"}}': f"0+10x{STEPS}",
        f'{name}_bucket{{{labels}, le="+Inf"}}': f"0+10x{STEPS}",
    }


def _flat(selector: str, value: float) -> dict[str, str]:
    return {selector: f"{value:g}x{STEPS}"}


def _engine_cases(names: MetricNames) -> list[Case]:
    gauge = 'instance="decode", host="gpu-1"'
    return [
        Case("K2TtftP99High", False, _histogram(names.ttft, slow=False)),
        Case("K2TtftP99High", True, _histogram(names.ttft, slow=True)),
        Case("K2ItlP99High", False, _histogram(names.inter_token, slow=False)),
        Case("K2ItlP99High", True, _histogram(names.inter_token, slow=True)),
        Case("K2KvCacheFull", False, _flat(f"{names.kv_usage}{{{gauge}}}", 0.5)),
        Case("K2KvCacheFull", True, _flat(f"{names.kv_usage}{{{gauge}}}", 0.97)),
        Case("K2QueueGrowing", False, _flat(f"{names.queued}{{{gauge}}}", 3)),
        Case("K2QueueGrowing", True, {f"{names.queued}{{{gauge}}}": f"0+5x{STEPS}"}),
        *_rank_load_cases(names),
    ]


def _rank_load_cases(names: MetricNames) -> list[Case]:
    """Where the engine reads every rank's load from its instance's first host (rank_load), a
    rank on another host is full or queueing while the first host's own gauges look calm:
    the rules must see it, and stay silent while every rank is calm."""
    load = names.rank_load
    if load is None:
        return []
    first = 'instance="decode", host="gpu-1"'
    calm = {
        f"{names.kv_usage}{{{first}}}": f"0.5x{STEPS}",
        f"{names.queued}{{{first}}}": f"3x{STEPS}",
    }
    rank = f'{first}, dp_rank="40"'
    return [
        Case("K2KvCacheFull", False, {**calm, f"{load.kv_usage}{{{rank}}}": f"0.5x{STEPS}"}),
        Case("K2KvCacheFull", True, {**calm, f"{load.kv_usage}{{{rank}}}": f"0.97x{STEPS}"}),
        Case("K2QueueGrowing", False, {**calm, f"{load.queued}{{{rank}}}": f"3x{STEPS}"}),
        Case("K2QueueGrowing", True, {**calm, f"{load.queued}{{{rank}}}": f"0+5x{STEPS}"}),
    ]


ENGINE_UP = 'up{job="engine", instance="decode", host="gpu-1", rank="0"}'
NODE_UP = 'up{job="node", host="gpu-1"}'
GPU = 'host="gpu-1", gpu="3"'
DISK = 'host="gpu-1", mountpoint="/models", fstype="ext4"'
GENERIC = [
    Case("K2EndpointDown", False, _flat(ENGINE_UP, 1)),
    Case("K2EndpointDown", True, _flat(ENGINE_UP, 0)),
    Case("K2ExporterDown", False, _flat(NODE_UP, 1)),
    Case("K2ExporterDown", True, _flat(NODE_UP, 0)),
    Case("K2InstanceUnhealthy", False, _flat('smg_worker_health{worker="http://d:30000"}', 1)),
    Case("K2InstanceUnhealthy", True, _flat('smg_worker_health{worker="http://d:30000"}', 0)),
    Case("K2RankRestarting", False, _flat(ENGINE_UP, 1)),
    Case("K2RankRestarting", True, {ENGINE_UP: "1 0 " * (STEPS // 2)}),
    Case("K2GpuFatalXid", False, _flat(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", 0)),
    Case("K2GpuFatalXid", True, _flat(f"DCGM_FI_DEV_XID_ERRORS{{{GPU}}}", 79)),
    Case("K2GpuEccUncorrectable", False, _flat(f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}", 0)),
    Case(
        "K2GpuEccUncorrectable",
        True,
        {f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GPU}}}": f"0+1x{STEPS}"},
    ),
    Case("K2GpuRowRemapFailure", False, _flat(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}", 0)),
    Case("K2GpuRowRemapFailure", True, _flat(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GPU}}}", 1)),
    Case(
        "K2NvlinkErrors",
        False,
        _flat(f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{GPU}}}", 0),
    ),
    Case(
        "K2NvlinkErrors",
        True,
        {f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{GPU}}}": f"0+1x{STEPS}"},
    ),
    # A port of a device the plan uses is down: fires. Every other device (a management NIC's
    # RoCE port, a host the plan names no devices for) is none of the cluster's business.
    Case(
        "K2IbPortDown",
        False,
        {
            'node_infiniband_state_id{host="gpu-1", device="mlx5_0", port="1"}': f"4x{STEPS}",
            'node_infiniband_state_id{host="gpu-1", device="mlx5_9", port="1"}': f"1x{STEPS}",
            'node_infiniband_state_id{host="gpu-2", device="mlx5_0", port="1"}': f"1x{STEPS}",
        },
    ),
    Case(
        "K2IbPortDown",
        True,
        _flat('node_infiniband_state_id{host="gpu-1", device="mlx5_1", port="1"}', 1),
    ),
    Case(
        "K2DiskFull",
        False,
        {
            f"node_filesystem_avail_bytes{{{DISK}}}": f"500x{STEPS}",
            f"node_filesystem_size_bytes{{{DISK}}}": f"1000x{STEPS}",
        },
    ),
    Case(
        "K2DiskFull",
        True,
        {
            f"node_filesystem_avail_bytes{{{DISK}}}": f"10x{STEPS}",
            f"node_filesystem_size_bytes{{{DISK}}}": f"1000x{STEPS}",
        },
    ),
]


def _cases() -> list[tuple[str, Case]]:
    out = [(f"{c.alert}-{'fires' if c.fires else 'silent'}", c) for c in GENERIC]
    for names in metric_dialects():
        engine = names.ttft.split(":")[0]
        out += [
            (f"{c.alert}-{engine}-{'fires' if c.fires else 'silent'}", c)
            for c in _engine_cases(names)
        ]
    return out


CASES = _cases()


def _rules() -> dict[str, object]:
    return alert_rules(ib_devices=IB_DEVICES)


def _promtool_test(
    tmp_path: Path, case: Case, rules: dict[str, object] | None = None
) -> subprocess.CompletedProcess[str]:
    """promtool's verdict on `case` against `rules` (default: the rendered rules)."""
    doc = _rules() if rules is None else rules
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    firing = f'count(ALERTS{{alertname="{case.alert}", alertstate="firing"}})'
    test = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "promql_expr_test": [
                    {
                        "expr": firing,
                        "eval_time": EVAL_TIME,
                        "exp_samples": [{"labels": "{}", "value": 1}] if case.fires else [],
                    }
                ],
            }
        ],
    }
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: scripts/install-lab-deps installs Debian's prometheus"
    return subprocess.run(
        [tool, "test", "rules", "alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_rule_has_a_silent_and_a_firing_case_for_each_engines_series() -> None:
    rules = {r["alert"] for g in _rules()["groups"] for r in g["rules"]}  # type: ignore[index]
    covered = {(c.alert, c.fires) for _, c in CASES}
    assert {(a, f) for a in rules for f in (False, True)} == covered
    engines = {name.split("-")[1] for name, _ in CASES if name.startswith("K2TtftP99High-")}
    assert engines - {"fires", "silent"} == {n.ttft.split(":")[0] for n in metric_dialects()}


@pytest.mark.parametrize(("name", "case"), CASES, ids=[n for n, _ in CASES])
def test_promtool_case(tmp_path: Path, name: str, case: Case) -> None:
    result = _promtool_test(tmp_path, case)
    assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"


def test_an_or_of_engines_compared_only_at_its_end_fires_on_the_other_engine(
    tmp_path: Path,
) -> None:
    """The old TTFT rule, `(sglang p99) or (vllm p99) > 5`: SGLang's p99 of 0.099 s fired."""
    doc = _rules()
    rules = doc["groups"][0]["rules"]  # type: ignore[index]
    (ttft,) = [r for r in rules if r["alert"] == "K2TtftP99High"]
    joined = ttft["expr"].removeprefix("(").rsplit(") > ", 1)[0]
    ttft["expr"] = f"{joined} > 5"
    sglang = next(n for n in metric_dialects() if n.ttft.startswith("sglang:"))
    case = Case("K2TtftP99High", False, _histogram(sglang.ttft, slow=False))
    assert _promtool_test(tmp_path, case).returncode == 0
    result = _promtool_test(tmp_path, case, doc)
    assert result.returncode != 0
    assert "got: {} 1E+00" in result.stdout + result.stderr
