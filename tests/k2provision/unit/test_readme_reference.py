"""The generated tables of the inventory reference (docs/inventory.md) and the model catalog
(docs/models.md) are what the code says today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from k2provision.engines import REGISTRY

ROOT = Path(__file__).resolve().parents[3]


def test_readme_tables_match_the_planner_and_the_tunables() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme-tables"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_pool_size_table_has_a_row_per_pool_of_every_layout() -> None:
    reference = (ROOT / "docs" / "inventory.md").read_text()
    table = reference.split("readme-tables: pool-sizes -->")[1].split("<!-- end")[0]
    for engine, declared in REGISTRY.items():
        for layout in declared.LAYOUTS:
            for pool in layout.pools:
                assert f"| {engine} | `{layout.name}` | `[{pool}]` |" in table
    assert "| ktransformers | `single` | `[nodes]` | 1 | 1 |" in table  # one host, always
