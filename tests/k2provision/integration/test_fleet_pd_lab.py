"""A PD fleet's rolling change on real lab hosts (beside test_fleet_lab.py, on the same lab
instance): two prefill and two decode SGLang stand-in instances of one host each behind the
real sglang-router (PD mode) on a fifth host. While a client streams requests through the
router, `apply` rolls a changed k2_context_length across all four instances, pool by pool:
every request is answered 200, and the router takes each half back as what it is (a prefill
worker with its KV bootstrap port, a decode worker), all four healthy.

One host per instance needs more memory than an H200 has for Kimi-K2's FP8 weights, so the
lab plans B200s (8 x 178.6 GiB) with decode CUDA graphs up to batch 64: the stand-ins have
no GPUs either way, and the plan's fit is what admits the shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from k2lab.traffic import Traffic
from tests.pd_lab import (
    MODEL_DIR,
    applied_fleet,
    fleet_endpoint,
    k2,
    max_model_len,
    router_listing,
)

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet]

ROUTER = "lab1"
PREFILL, DECODE = ("lab2", "lab3"), ("lab4", "lab5")
VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_gpu": "b200",
    "k2_prefill_instances": 2,
    "k2_decode_instances": 2,
    "k2_cuda_graph_max_bs_decode": 64,
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}
BOOTSTRAP_PORT = 8998


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """5 lab hosts: the router on lab1, prefill-1/2 on lab2/lab3, decode-1/2 on lab4/lab5."""
    groups = {"router": 1, "prefill": 2, "decode": 2}
    yield from applied_fleet(tmp_path_factory, "pd-fleet", groups, VARS)


def test_a_changed_spec_rolls_each_pd_instance_and_the_router_takes_each_half_back(
    pd_fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = pd_fleet
    text = inventory.read_text()
    assert "k2_context_length=32768" in text
    changed = tmp_path / inventory.name  # the mesh's key pair is named after the file
    changed.write_text(text.replace("k2_context_length=32768", "k2_context_length=16384"))
    with Traffic(fleet_endpoint(state)) as client:
        run = k2("apply", str(changed), runs=tmp_path / "runs")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    for n, (instance, host) in enumerate(
        zip(("prefill-1", "prefill-2", "decode-1", "decode-2"), (*PREFILL, *DECODE), strict=True),
        start=1,
    ):
        assert f"rollout order: {n}. {instance} on {host}:" in run.stdout
    assert client.failures == [], client.counts
    assert client.counts["200"] > 10
    assert [max_model_len(state, ROUTER, h) for h in (*PREFILL, *DECODE)] == [16384] * 4
    workers = router_listing(state)
    for host in PREFILL:
        worker = workers[f"http://{state.host(host).address}:30000"]
        assert worker["worker_type"] == "prefill", worker
        assert worker["is_healthy"] is True
    for host in DECODE:
        worker = workers[f"http://{state.host(host).address}:30000"]
        assert worker["worker_type"] == "decode", worker
        assert worker["is_healthy"] is True
