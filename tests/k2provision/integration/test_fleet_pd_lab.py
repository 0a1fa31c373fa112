"""A PD fleet's generation-safe change on real lab hosts (beside test_fleet_lab.py, on the same
lab instance): two prefill and two decode SGLang stand-in instances of one host each behind two
real sglang-routers (PD mode) and the front (HAProxy and keepalived on both router hosts, the
floating address the endpoint). While a client streams requests through that address, `apply`
changes k2_context_length on all four instances generation by generation: the second router
leaves HAProxy and drops the changing instances, prefill-1 and decode-1 move into it alone,
it comes back, the first router leaves before prefill-2 and decode-2 move, then takes every
new worker and comes back. No router ever lists both generations, so no request is
prefilled by one spec and decoded by the other: the decode stand-ins check each request's
prefill (its bootstrap server says its model and KV shape) and count a mixed pair
(k2_standin_mixed_pairs_total), which stays 0; every request is answered 200; and both
routers take each half back as what it is, all four healthy.

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
from k2lab.config import LabConfig
from k2lab.traffic import Traffic
from tests.pd_lab import (
    MODEL_DIR,
    applied_fleet,
    k2,
    max_model_len,
    metric_sum,
    router_listing,
)

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet]

ROUTERS = ("lab1", "lab2")
PREFILL, DECODE = ("lab3", "lab4"), ("lab5", "lab6")
FLOATING = LabConfig.default().floating_address()
VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_gpu": "b200",
    "k2_prefill_instances": 2,
    "k2_decode_instances": 2,
    "k2_cuda_graph_max_bs_decode": 64,
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
    "k2_front_address": FLOATING,
}
ENDPOINT = f"http://{FLOATING.split('/')[0]}:8000"


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """6 lab hosts: the routers and the front on lab1 and lab2, prefill-1/2 on lab3/lab4,
    decode-1/2 on lab5/lab6."""
    groups = {"router": 2, "prefill": 2, "decode": 2}
    yield from applied_fleet(tmp_path_factory, "pd-fleet", groups, VARS)


def pairs(state: Any, name: str) -> float:
    """The decode stand-ins' k2_standin_<name>_total, summed (asked from lab1)."""
    return sum(
        metric_sum(state, f"http://{state.host(h).address}:30000", f"k2_standin_{name}_total")
        for h in DECODE
    )


def test_a_spec_change_of_both_pools_moves_generation_by_generation_without_a_mixed_pair(
    pd_fleet: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = pd_fleet
    text = inventory.read_text()
    assert "k2_context_length=32768" in text
    changed = tmp_path / inventory.name  # the mesh's key pair is named after the file
    changed.write_text(text.replace("k2_context_length=32768", "k2_context_length=16384"))
    check = k2("apply", str(changed), "--check", runs=tmp_path / "check")
    assert check.returncode == 0, check.stdout[-4000:]
    order = [
        x.split("rollout order: ", 1)[1]
        for x in check.stdout.splitlines()
        if "rollout order: " in x
    ]
    assert order[0].startswith("1. the router on lab2 (the new generation's): out of HAProxy"), (
        order
    )
    assert order[1].startswith(
        "2. prefill-1, decode-1 on lab3, lab5: out of the router(s) on lab1"
    ), order
    assert "into the router on lab2 only" in order[1], order
    assert order[2].startswith(
        "3. prefill-2, decode-2 on lab4, lab6: the router(s) on lab1 out of HAProxy first"
    ), order
    assert order[3].startswith("4. the router(s) on lab1: every worker of the new generation"), (
        order
    )
    checked = pairs(state, "checked_pairs")
    with Traffic(ENDPOINT) as client:
        run = k2("apply", str(changed), runs=tmp_path / "runs")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert client.failures == [], client.counts
    assert client.counts["200"] > 10
    # The decode stand-ins checked the pairs the routers made, and none was mixed.
    assert pairs(state, "checked_pairs") > checked
    assert pairs(state, "mixed_pairs") == 0
    assert [max_model_len(state, ROUTERS[0], h) for h in (*PREFILL, *DECODE)] == [16384] * 4
    for router in ROUTERS:
        url = f"http://{state.host(router).address}:8080"
        workers = router_listing(state, router, url)
        for host, kind in [(h, "prefill") for h in PREFILL] + [(h, "decode") for h in DECODE]:
            worker = workers[f"http://{state.host(host).address}:30000"]
            assert worker["worker_type"] == kind, (router, worker)
            assert worker["is_healthy"] is True, (router, worker)
