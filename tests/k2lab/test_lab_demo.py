"""`lab up N` without --group/--var: the inventory it writes plans for every N it accepts, and
an N without a plan is refused at once, naming the counts that have one. Plans only, no hosts:
every inventory is written to a file and read back by Ansible's loader, as `apply` reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from k2lab import demo
from k2lab.config import MAX_HOSTS, LabConfig
from k2lab.errors import LabError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

BOUND = 16
"""Host counts tested: a 2-core machine runs a lab of at most about this many hosts."""


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> LabConfig:
    return LabConfig(lab_dir=tmp_path_factory.mktemp("lab"), name="k2demo", subnet="10.79.0.0/24")


def plans_from_file(text: str, directory: Path) -> bool:
    path = directory / "lab.ini"
    path.write_text(text)
    try:
        build_plan(load_cluster(path))
    except Exception:  # the planner's refusal: this candidate does not plan
        return False
    return True


@pytest.mark.parametrize("n", range(1, BOUND + 1))
def test_the_inventory_for_n_hosts_plans_with_every_host_in_it(
    cfg: LabConfig, n: int, tmp_path: Path
) -> None:
    choice = demo.choose(cfg, n)
    text = demo.inventory_text(cfg, n, choice)
    path = tmp_path / "lab.ini"
    path.write_text(text)
    plan = build_plan(load_cluster(path))
    pool_hosts = {h for pool in plan.pools for h in pool.hosts}
    assert pool_hosts == {cfg.host_name(i) for i in range(1, n + 1)}
    assert sum(choice.groups.values()) == n
    assert (plan.engine, plan.layout, plan.model) == (choice.engine, choice.layout, choice.model)
    assert plan.lab
    assert "k2_weights_source=synthetic" in text


@pytest.mark.parametrize("n", [1, 3, 4])
def test_the_choice_is_the_first_candidate_that_plans(
    cfg: LabConfig, n: int, tmp_path: Path
) -> None:
    choice = demo.choose(cfg, n)
    ordered = list(demo.candidates(n))
    for earlier in ordered[: ordered.index(choice)]:
        assert not plans_from_file(demo.inventory_text(cfg, n, earlier), tmp_path), earlier


def test_candidates_follow_the_documented_order() -> None:
    pairs = list(dict.fromkeys((c.engine, c.layout) for c in demo.candidates(5)))
    assert pairs[: len(demo.LAYOUT_ORDER)] == list(demo.LAYOUT_ORDER)
    pd = [c.groups["prefill"] for c in demo.candidates(5) if c.layout == "pd"]
    assert demo.CONTEXT_LENGTHS == (32768, 8192)
    assert pd[:8] == [2, 2, 3, 3, 1, 1, 4, 4]
    models = list(dict.fromkeys(c.model for c in demo.candidates(2)))
    assert models[0] == "moonshotai/Kimi-K2-Instruct"


def test_a_count_without_a_plan_is_refused_naming_those_with_one(
    cfg: LabConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only SGLang TP: its tensor-parallel size 8 x N must divide the model's 64 heads.
    monkeypatch.setattr(demo, "layouts", lambda: [("sglang", "tp")])
    monkeypatch.setattr(demo, "VALID_SCAN_LIMIT", 8)
    with pytest.raises(LabError) as refused:
        demo.choose(cfg, 3)
    (message,) = refused.value.problems
    valid = [
        n
        for n in range(1, demo.VALID_SCAN_LIMIT + 1)
        if any(
            plans_from_file(demo.inventory_text(cfg, n, c), tmp_path) for c in demo.candidates(n)
        )
    ]
    assert valid
    assert 3 not in valid
    shown = demo._ranges(valid)
    assert f"host counts that plan, up to {demo.VALID_SCAN_LIMIT}: {shown};" in message
    assert message.startswith("lab up 3: no lab layout plans on 3 hosts")


@pytest.mark.parametrize("n", [0, MAX_HOSTS + 1])
def test_counts_outside_the_lab_are_refused(cfg: LabConfig, n: int) -> None:
    with pytest.raises(LabError, match=rf"lab up {n}: expected 1\.\.{MAX_HOSTS} hosts"):
        demo.choose(cfg, n)


def test_ranges_are_shortened() -> None:
    assert demo._ranges([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
    assert demo._ranges([]) == ""


def test_the_command_refuses_before_it_makes_anything(tmp_path: Path) -> None:
    env = {**os.environ, "K2_LAB_DIR": str(tmp_path / ".lab")}
    out = subprocess.run(
        [sys.executable, "-m", "k2provision.cli", "lab", "up", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"lab: lab up 0: expected 1..{MAX_HOSTS} hosts"]
    assert list(tmp_path.iterdir()) == []


def test_a_fleet_puts_the_router_alone_and_plans_its_instances(
    cfg: LabConfig, tmp_path: Path
) -> None:
    choice = demo.choose(cfg, 3, instances=2)
    assert choice.groups == {"router": 1, "nodes": 2}
    assert choice.all_vars["k2_instances"] == 2
    assert plans_from_file(demo.inventory_text(cfg, 3, choice), tmp_path)
    plan = build_plan(load_cluster(tmp_path / "lab.ini"))
    assert [i.instance for i in plan.pools[0].instances] == ["replica-1", "replica-2"]
    assert plan.endpoint_host == cfg.host_name(1)
    with pytest.raises(LabError, match="lab up 4 --instances 2: no fleet plans"):
        demo.choose(cfg, 4, instances=2)


def test_a_fleet_behind_a_front_puts_each_router_alone_and_plans_the_front(
    cfg: LabConfig, tmp_path: Path
) -> None:
    choice = demo.choose(cfg, 4, instances=2, routers=2)
    assert choice.groups == {"router": 2, "nodes": 2}
    assert choice.all_vars["k2_front_address"] == cfg.floating_address()
    assert plans_from_file(demo.inventory_text(cfg, 4, choice), tmp_path)
    plan = build_plan(load_cluster(tmp_path / "lab.ini"))
    assert plan.front is not None
    assert [r.host for r in plan.routers] == [cfg.host_name(1), cfg.host_name(2)]
    assert plan.endpoint.startswith(f"http://{cfg.floating_address().split('/')[0]}:")
    assert "behind the front" in choice.describe()
    with pytest.raises(LabError, match="--routers 2: routers front a fleet; fix: add --instances"):
        demo.choose(cfg, 4, routers=2)
    with pytest.raises(LabError, match=r"e.g. `lab up 4 --instances 2 --routers 2`"):
        demo.choose(cfg, 3, instances=2, routers=2)


def test_a_fleets_spares_go_last_in_their_own_group_and_serve_nothing(
    cfg: LabConfig, tmp_path: Path
) -> None:
    choice = demo.choose(cfg, 5, instances=2, routers=2, spares=1)
    assert choice.groups == {"router": 2, "nodes": 2, "spare": 1}
    assert plans_from_file(demo.inventory_text(cfg, 5, choice), tmp_path)
    plan = build_plan(load_cluster(tmp_path / "lab.ini"))
    assert plan.fleet.spares == (cfg.host_name(5),)
    assert [i.hosts for i in plan.pools[0].instances] == [(cfg.host_name(3),), (cfg.host_name(4),)]
    with pytest.raises(LabError, match="--spares 1: spares stand by for a fleet's hosts"):
        demo.choose(cfg, 3, spares=1)
    with pytest.raises(LabError, match=r"e.g. `lab up 5 --instances 2 --routers 2 --spares 1`"):
        demo.choose(cfg, 4, instances=2, routers=2, spares=1)
