"""`k2provision models`, the README's model table and the planner agree with the catalog."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k2provision import catalog
from k2provision.errors import PlanError
from k2provision.models import Cluster, HostSpec, PoolName, Tunables
from k2provision.models_table import UNSERVED, markdown, rows
from k2provision.plan import build_plan, pool_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
START = "<!-- generated: k2provision models --format markdown --gpu h200 --gpu h100 -->\n"
END = "<!-- end of generated models table -->"


def k2(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k2provision.cli", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_readme_table_is_the_catalogs() -> None:
    text = README.read_text()
    block = text[text.index(START) + len(START) : text.index(END)]
    assert block == markdown(rows(("h200", "h100")))


def test_json_lists_every_catalog_model_with_its_facts() -> None:
    out = k2("models", "--format", "json", "--gpu", "h200")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [d["model"] for d in data] == list(catalog.MODELS)
    for d in data:
        spec = catalog.model(d["model"])
        assert d["checkpoint_gib"] == spec.checkpoint_gib
        assert d["shards"] == spec.shard_count
        assert d["context"] == spec.max_position_embeddings
        assert d["multimodal"] is spec.multimodal
        assert d["reasoning_parser"] == spec.reasoning_parser
        assert set(d["smallest_nodes"]) == {"h200"}


def test_bad_arguments_exit_2_one_line_each() -> None:
    out = k2("models", "--format", "yaml", "--gpu", "x100", "--context-length", "0")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 3


def cluster(model: str, engine: str, layout: str, counts: dict[PoolName, int]) -> Cluster:
    hosts = []
    n = 0
    for pool, count in counts.items():
        for _ in range(count):
            n += 1
            address = f"10.9.{n}.1"
            hosts.append(HostSpec(name=f"h{n}", address=address, pool=pool, local_ip=address))
    return Cluster(
        inventory="test",
        engine=engine,  # type: ignore[arg-type]
        layout=layout,
        model=model,
        model_dir="/models/m",
        gpu="h200",
        gpus_per_node=8,
        hosts=tuple(hosts),
        router="h1" if layout == "pd" else None,
        tunables=Tunables(),
    )


def fits(model: str, engine: str, layout: str, nodes: int) -> bool:
    names = pool_names(layout)
    counts = {names[0]: nodes} if len(names) == 1 else {}
    try:
        build_plan(cluster(model, engine, layout, counts))
    except PlanError:
        return False
    return True


@pytest.mark.parametrize("model", list(catalog.MODELS))
def test_the_smallest_node_counts_are_the_planners(model: str) -> None:
    (row,) = [r for r in rows(("h200",)) if r["model"] == model]
    for key, nodes in row["smallest_nodes"]["h200"].items():
        engine, layout = key.split("/")
        if layout == "pd" or nodes == UNSERVED or isinstance(nodes, str):
            continue
        assert fits(model, engine, layout, nodes), key
        if nodes > 1:
            assert not fits(model, engine, layout, nodes - 1), key
