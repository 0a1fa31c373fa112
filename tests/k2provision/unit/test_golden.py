"""Golden cases (tests/golden_cases.py): every case's plan and container commands are exactly
what its expected.json holds. The test only compares; `scripts/regen-goldens` rewrites the
expectations for review."""

from __future__ import annotations

import json

import pytest

from tests.golden_cases import CASES, expected_path, observed


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 5, CASES


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    expected = json.loads(expected_path(case).read_text())
    assert observed(case) == expected


@pytest.mark.parametrize("case", CASES)
def test_golden_pins_the_fit_and_every_container_command(case: str) -> None:
    """The format holds what a review must see: the memory fit of every pool and, for every
    process of every host, the docker argv that starts it."""
    expected = json.loads(expected_path(case).read_text())
    plan = expected["plan"]
    assert [f["pool"] for f in plan["fit"]] == [p["name"] for p in plan["pools"]]
    assert all(f["fits"] for f in plan["fit"])
    for host in plan["hosts"]:
        commands = expected["docker"][host["name"]]
        assert sorted(commands) == sorted(p["name"] for p in host["processes"])
        for proc in host["processes"]:
            argv = commands[proc["name"]]
            assert argv[:2] == (["docker", "exec"] if proc["exec_in"] else ["docker", "run"])
