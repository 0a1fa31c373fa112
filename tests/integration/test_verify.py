"""`k2provision verify` on real lab hosts: a 2-prefill / 2-decode SGLang PD cluster of stand-ins
behind the real pinned router. The chat completion with tools goes through the router to the
servers launched as rendered (with --tool-call-parser kimi_k2) and must come back parsed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.pd_lab import k2, pd_cluster_up, remove_engine_containers

pytestmark = pytest.mark.lab

TOOL_CALL = 'get_weather({"city": "Paris"}) [id functions.get_weather:0]'


@pytest.fixture(scope="module")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, Path]]:
    """4 lab hosts as a converged 2-prefill / 2-decode PD cluster (state, inventory, runs)."""
    inventory = tmp_path_factory.mktemp("inv") / "pd.ini"
    runs = tmp_path_factory.mktemp("runs")
    state = pd_cluster_up(inventory)
    applied = k2("apply", str(inventory), runs=runs)
    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    yield state, inventory, runs
    remove_engine_containers(state)


def test_verify_is_0_names_the_tool_call_and_records_both_answers(
    cluster: tuple[Any, Path, Path],
) -> None:
    _, inventory, runs = cluster
    before = set(runs.iterdir())
    out = k2("verify", str(inventory), runs=runs)
    print(out.stdout)  # the README's example output comes from here
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert f"tool call: ok {TOOL_CALL}" in out.stdout
    assert "chat: ok reply 'ready (stand-in)'" in out.stdout
    assert "verify succeeded" in out.stdout
    assert ": 0 changed," in out.stdout  # the smoke test alone: nothing launched or changed
    (record,) = set(runs.iterdir()) - before
    assert record.name.endswith("-verify")
    report = json.loads((record / "verify.json").read_text())
    assert report["thinking"] is False
    assert report["chat"]["ok"] is True
    assert report["tool"]["ok"] is True
    assert report["tool"]["tool_call"]["name"] == "get_weather"
    assert json.loads(report["tool"]["tool_call"]["arguments"]) == {"city": "Paris"}
    assert json.loads((record / "summary.json").read_text())["rc"] == 0
