"""A new engine is its module and one registry line: a toy engine (tests/k2provision/
toy_engine.py), registered here at test time, is accepted by the inventory contract, planned,
rendered to files and scraped, with no other file of the product changed for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from k2provision.commands.flow import load_plan
from k2provision.commands.models_table import rows
from k2provision.engines import REGISTRY
from k2provision.errors import InventoryError
from k2provision.plan.alert_rules import alert_rules
from k2provision.plan.containers import run_argv
from k2provision.plan.inventory import load_cluster
from k2provision.run.render_files import write_render
from tests.k2provision import toy_engine

INVENTORY = """\
[nodes]
toy-01 ansible_host=10.50.0.11

[all:vars]
k2_engine=toy
k2_layout=solo
k2_model=moonshotai/Kimi-K2-Thinking
k2_context_length=32768
"""


@pytest.fixture
def toy() -> Iterator[ModuleType]:
    """The toy engine in the registry, for this test only: the one line a new engine adds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(REGISTRY, toy_engine.NAME, toy_engine)
        yield toy_engine


def _inventory(tmp_path: Path, text: str = INVENTORY) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    return path


def test_a_toy_engine_plans_and_renders_its_files(toy: ModuleType, tmp_path: Path) -> None:
    plan = load_plan(_inventory(tmp_path)).plan
    assert (plan.engine, plan.layout, plan.engine_version) == ("toy", "solo", "1.0")
    assert plan.engine_min_driver == "570.26"
    assert plan.endpoint == "http://10.50.0.11:8000"
    (host,) = plan.hosts
    (server,) = host.processes
    assert server.argv[:2] == ("toy-serve", "--model")
    assert server.argv[server.argv.index("--tp") + 1] == "8"
    assert [binding.setting for binding in host.ports] == ["k2_api_port"]
    docker = run_argv(plan.container, server, plan.config_dir, host.files)
    assert "registry.example/toy:1.0" in docker
    assert "/models/k2-compile-cache/toy:/models/k2-compile-cache/toy" in docker
    launch = host.files["/etc/k2provision/launch/toy-server.sh"]
    assert "TOY_CACHE_DIR=" in launch
    assert "--config /etc/k2provision/toy/server.yaml" in launch

    out = tmp_path / "render"
    write_render(plan, out)
    config = (out / "toy-01" / "etc/k2provision/toy/server.yaml").read_text()
    fraction = plan.pools[0].mem_fraction
    assert config == (
        f"port: 8000\nhost: 0.0.0.0\nmemory_fraction: {fraction}\ncontext_length: 32768\n"
    )
    assert 0 < fraction < 1
    assert json.loads((out / "plan.json").read_text())["engine"] == "toy"
    scrape = (out / "monitoring" / "prometheus.yml").read_text()
    assert "10.50.0.11:8000" in scrape


def test_the_lists_of_engines_and_layouts_follow_the_registry(
    toy: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(InventoryError) as refused:
        load_cluster(_inventory(tmp_path, INVENTORY.replace("k2_engine=toy", "k2_engine=tgi")))
    assert "expected one of sglang, trtllm, vllm, ktransformers, toy;" in str(refused.value)
    with pytest.raises(InventoryError) as refused:
        load_cluster(_inventory(tmp_path, INVENTORY + "[decode]\ntoy-02\n"))
    assert "[decode] is only for layout pd, but k2_layout=solo" in str(refused.value)
    (row,) = [r for r in rows(("h200",)) if r["model"] == "moonshotai/Kimi-K2-Thinking"]
    assert row["engines"]["toy"] == {
        "pinned": "1.0",
        "support": "yes",
        "min_version": "1.0",
        "source": "the toy's own tests",
    }
    assert row["smallest_nodes"]["h200"]["toy/solo"] == 1
    rules = json.dumps(alert_rules())
    assert "toy:ttft_seconds_bucket" in rules
    assert "sglang:time_to_first_token_seconds_bucket" in rules


def test_without_its_registry_line_the_engine_is_unknown(tmp_path: Path) -> None:
    assert "toy" not in REGISTRY
    with pytest.raises(InventoryError, match="k2_engine=toy is not an engine"):
        load_cluster(_inventory(tmp_path))
