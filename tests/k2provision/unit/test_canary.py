"""A fleet's canary behind the front (k2provision/plan/canary.py): which wave, which router,
HAProxy's weights, the `apply --check` lines, refusals, and the verdict from the front's
counters and the probes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.k2 import (
    rollout_canary_verdict,
    rollout_order,
)
from k2provision.core.records import CanarySettings, Plan
from k2provision.errors import InventoryError
from k2provision.plan.canary import canary_problem, canary_rollout, canary_verdict
from k2provision.plan.rollout import rollout_waves
from k2provision.run.events import HostResult, parse_event
from tests.k2provision.unit.test_fleet import PD_FLEET, TP_FLEET, _plan
from tests.k2provision.unit.test_rollout import _looked, _other_spec


def _front_fleet(tmp_path: Path, extra: str = "", routers: int = 2) -> Plan:
    """sglang-tp-fleet.ini (4 replicas) behind `routers` routers and the front."""
    text = TP_FLEET.read_text()
    more = "".join(f"\nrouter-0{n} ansible_host=10.20.1.{4 + n}" for n in range(2, routers + 1))
    text = text.replace(
        "router-01 ansible_host=10.20.1.5", "router-01 ansible_host=10.20.1.5" + more
    )
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(text + "k2_front_address=10.20.1.100/24\n" + extra)
    return _plan(inventory)


def test_the_first_wave_serves_its_share_behind_the_last_router_alone(tmp_path: Path) -> None:
    plan = _front_fleet(tmp_path, "k2_canary_percent=10\nk2_canary_hold_s=60\n")
    assert plan.fleet.canary == CanarySettings(percent=10, hold_s=60)
    changed = ["replica-1", "replica-2", "replica-3", "replica-4"]
    waves = rollout_waves(plan, changed, 1)
    canary = canary_rollout(plan, waves, plan.fleet.canary)
    assert canary is not None
    assert canary.wave == waves[0]
    assert canary.router.host == "router-02"
    assert [r.host for r in canary.others] == ["router-01"]
    assert canary.weights == (("router-01", 90), ("router-02", 10))
    assert set(canary.worker_urls) == {i.url for p in plan.pools for i in p.instances}
    # Three routers: the two others share the rest evenly, the canary's share exact.
    three = _front_fleet(tmp_path, "k2_canary_percent=10\n", routers=3)
    shared = canary_rollout(three, rollout_waves(three, changed, 1), three.fleet.canary)
    assert shared is not None
    assert shared.weights == (("router-01", 45), ("router-02", 45), ("router-03", 10))


def test_the_look_puts_the_canary_first_and_the_run_may_ask_another_share(tmp_path: Path) -> None:
    plan = _front_fleet(tmp_path)
    assert plan.fleet.canary.percent == 0
    looked = _looked(_other_spec(plan, {"node-01", "node-03", "node-05", "node-07"}))
    plain = rollout_order(plan.model_dump(mode="json"), looked)
    assert plain["canary"] is None
    assert len(plain["waves"]) == 4
    order = rollout_order(plan.model_dump(mode="json"), looked, None, "10")
    assert order["canary"]["wave"]["instances"] == ["replica-1"]
    assert order["canary"]["weights"] == [
        {"server": "router-01", "weight": 90},
        {"server": "router-02", "weight": 10},
    ]
    assert [w["instances"] for w in order["waves"]] == [["replica-2"], ["replica-3"], ["replica-4"]]
    lines = order["lines"]
    assert lines[0] == (
        "1. canary: the router on router-02 out of HAProxy on router-01, router-02, drained, "
        "every worker taken out of it"
    )
    assert lines[1].startswith("2. canary: replica-1 on node-01, node-02: out of the router(s) on")
    assert (
        "into the router on router-02 alone; HAProxy weights router-01 90, router-02 10"
        in (lines[1])
    )
    assert lines[2].startswith("3. canary: held 300 s, probed beside the others; kept if its")
    assert lines[3].startswith("4. replica-2 on node-03, node-04: out of the router")
    # A run that asks for no canary (--canary 0) has none, whatever the inventory says.
    asked = _front_fleet(tmp_path, "k2_canary_percent=20\n")
    none = rollout_order(asked.model_dump(mode="json"), looked, None, 0)
    assert none["canary"] is None
    # Nothing changed: no canary either.
    assert (
        rollout_order(asked.model_dump(mode="json"), _looked(_other_spec(asked, set())))["canary"]
        is None
    )


def test_a_canary_needs_the_front_and_no_pd(tmp_path: Path) -> None:
    alone = _plan(TP_FLEET)
    assert "needs the front tier" in canary_problem(alone, 10)
    assert canary_problem(alone, 0) == ""
    assert (
        canary_rollout(alone, rollout_waves(alone, ["replica-1"], 1), CanarySettings(percent=10))
        is None
    )
    pd = _plan(PD_FLEET)
    assert "no PD canary" in canary_problem(pd, 10)
    assert canary_problem(_front_fleet(tmp_path), 10) == ""
    # The inventory's k2_canary_percent is refused for a PD fleet before any host is touched.
    text = PD_FLEET.read_text()
    inventory = tmp_path / "pd.ini"
    inventory.write_text(text + "k2_canary_percent=10\n")
    with pytest.raises(InventoryError, match=r"k2_canary_percent=10: .*no PD canary"):
        _plan(inventory)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("k2_canary_percent=60", "k2_canary_percent"),
        ("k2_canary_hold_s=5", "k2_canary_hold_s"),
        ("k2_canary_max_latency_ratio=0.5", "k2_canary_max_latency_ratio"),
        ("k2_canary_max_error_pct=true", "k2_canary_max_error_pct"),
    ],
)
def test_canary_settings_are_validated(tmp_path: Path, line: str, field: str) -> None:
    with pytest.raises(InventoryError, match=field):
        _front_fleet(tmp_path, line + "\n")


def _canary(tmp_path: Path) -> dict[str, Any]:
    plan = _front_fleet(tmp_path, "k2_canary_percent=10\n")
    looked = _looked(_other_spec(plan, {"node-01", "node-03"}))
    canary = rollout_order(plan.model_dump(mode="json"), looked)["canary"]
    assert canary is not None
    return dict(canary)


def _counters(r1: tuple[int, int], r2: tuple[int, int]) -> dict[str, Any]:
    return {
        "servers": {
            "router-01": {"requests": r1[0], "errors": r1[1]},
            "router-02": {"requests": r2[0], "errors": r2[1]},
        }
    }


def _probes(canary: list[float], others: list[float], errors: int = 0) -> dict[str, Any]:
    return {
        "canary": {"times": canary, "errors": errors, "error": "HTTP 500" if errors else ""},
        "others": {"times": others, "errors": 0, "error": ""},
        "started": 1796000000.0,
        "ended": 1796000030.0,
    }


def test_a_canary_that_answers_like_the_others_is_kept(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    # Two front hosts: the holder counted the traffic, the backup nothing.
    before = [_counters((1000, 2), (500, 0)), _counters((0, 0), (0, 0))]
    after = [_counters((1900, 2), (600, 0)), _counters((0, 0), (0, 0))]
    verdict = canary_verdict(canary, before, after, _probes([0.05, 0.06, 0.05], [0.05] * 3))
    assert verdict.kept
    assert verdict.figures.startswith(
        "replica-1 behind the router on router-02 took 10.0 % of the front's 1000 requests "
        "(10 % asked) from 2026-11-30T"
    )
    assert "canary 0.0 % errors (0 of 103, probes included), median probe 0.050 s" in (
        verdict.figures
    )
    assert verdict.figures.endswith(": kept")
    assert rollout_canary_verdict(canary, before, after, _probes([0.05], [0.05]))["kept"]


def test_a_canary_with_too_many_errors_or_too_slow_is_rolled_back(tmp_path: Path) -> None:
    canary = _canary(tmp_path)
    before = [_counters((0, 0), (0, 0))]
    # 5 of 100 canary requests failed: 5 % > 1 %.
    failing = canary_verdict(
        canary, before, [_counters((900, 0), (100, 5))], _probes([0.05] * 10, [0.05] * 10)
    )
    assert not failing.kept
    assert "rolled back: errors 4.5 % > 1 %" in failing.figures  # 5 of 110, probes included
    # Twice as slow and 1 s slower: over x1.5.
    slow = canary_verdict(
        canary, before, [_counters((900, 0), (100, 0))], _probes([2.05] * 5, [1.0] * 5)
    )
    assert not slow.kept
    assert slow.figures.endswith("rolled back: median latency x2.05 > x1.5")
    # x2 but by 20 ms: jitter, not a slow canary.
    jitter = canary_verdict(
        canary, before, [_counters((900, 0), (100, 0))], _probes([0.04] * 5, [0.02] * 5)
    )
    assert jitter.kept
    # No probe answered: rolled back, naming the probes' error.
    dead = canary_verdict(canary, before, [_counters((900, 0), (0, 0))], _probes([], [0.05], 3))
    assert not dead.kept
    assert "no probe answered 200 (HTTP 500)" in dead.figures


def test_the_cli_shows_the_verdict_the_hold_sets() -> None:
    event = parse_event(
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": "lab1",
                "task": "Canary hold | The verdict",
                "res": {
                    "ansible_facts": {
                        "k2_rollout_canary_verdict": {
                            "kept": True,
                            "figures": "replica-1 ...: kept",
                        }
                    }
                },
            },
        }
    )
    assert isinstance(event, HostResult)
    assert event.differences == ("canary: replica-1 ...: kept",)


def test_apply_canary_on_a_plan_without_a_front_is_refused_before_any_host(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from k2provision.cli import build_app

    result = CliRunner().invoke(build_app(), ["apply", str(TP_FLEET), "--canary", "10"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "--canary 10: a canary needs the front tier" in said
    assert "record in" not in said  # no run started
    bad = CliRunner().invoke(build_app(), ["apply", str(TP_FLEET), "--canary", "70"])
    assert bad.exit_code == 2
