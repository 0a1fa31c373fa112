"""Golden cases: an inventory in, the exact per-host argv, env and files out.

Each folder under tests/golden/ holds `inventory.ini` and `expected.json` (the plan's hosts and
endpoint). `K2_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py` rewrites the expectations; the
diff is then reviewed like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from k2provision.inventory import load_cluster
from k2provision.plan import build_plan

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "inventory.ini").exists())


def observed(case: str) -> dict[str, Any]:
    """The parts of a plan a golden case pins down."""
    plan = build_plan(load_cluster(GOLDEN / case / "inventory.ini"))
    data = plan.model_dump(mode="json")
    return {
        "endpoint": data["endpoint"],
        "warnings": data["warnings"],
        "pools": data["pools"],
        "container": data["container"],
        "hosts": data["hosts"],
    }


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 5, CASES


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    expected_path = GOLDEN / case / "expected.json"
    got = observed(case)
    if os.environ.get("K2_UPDATE_GOLDEN") == "1":
        expected_path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    expected = json.loads(expected_path.read_text())
    assert got == expected
