"""Filters that judge hosts against the plan (k2.cluster.preflight_*) and read NCCL runs.

Each is a thin bridge from Ansible's data to the pure code of k2provision.core.expectations and
k2provision.core.nccl, so the verdicts are tested without a host:

- ``texts | k2.cluster.preflight_problems(plan, host, options)``: one host's verdict,
  ``{refuse: [lines], defer: [lines], skipped: [checks], summary: line}``.
- ``texts_by_host | k2.cluster.preflight_cluster_problems(plan, options)``: the same for checks
  across hosts (one driver version everywhere).
- ``texts | k2.cluster.ib_devices_from_facts``: each GPU's nearest RDMA device with an Active
  port, from the texts of k2.cluster.host_facts (the per-host ``k2_ib_devices`` when the
  inventory gives none).
- ``ids_by_host | k2.cluster.image_id_mismatches``: hosts whose copy of an image differs.
- ``hosts | k2.cluster.nccl_pair_rounds``: every host pair once, in rounds of disjoint pairs.
- ``outputs | k2.cluster.nccl_report(fraction, min_busbw)``: bus bandwidth per pair and the slow
  pairs, from ``{"a|b": all_reduce_perf output}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k2provision.core.expectations import (
    PreflightOptions,
    evaluate_cluster,
    evaluate_host,
    ib_devices_from_texts,
    image_id_mismatches,
)
from k2provision.core.facts import FactParseError
from k2provision.core.inventory import plain_value as _plain
from k2provision.core.nccl import (
    NcclParseError,
    pair_bandwidth,
    pair_rounds,
    parse_all_reduce_perf,
    slow_pairs,
)
from k2provision.core.records import Plan


def _options(options: Mapping[str, Any] | None) -> PreflightOptions:
    return PreflightOptions.model_validate(_plain(options or {}))


def preflight_problems(
    texts: Mapping[str, Any], plan: Mapping[str, Any], host: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """The verdict on `host` from the command texts collected there."""
    verdict = evaluate_host(
        Plan.model_validate(_plain(plan)), str(host), _plain(texts), _options(options)
    )
    return verdict.as_dict()


def preflight_cluster_problems(
    texts_by_host: Mapping[str, Mapping[str, Any]],
    plan: Mapping[str, Any],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """Problems across hosts (one driver version on every GPU host)."""
    verdict = evaluate_cluster(
        Plan.model_validate(_plain(plan)), _plain(texts_by_host), _options(options)
    )
    return verdict.as_dict()


def ib_devices_from_facts(texts: Mapping[str, Any]) -> list[str]:
    """Each GPU's nearest RDMA device (Active ports only when ibstat output is there), from
    the texts k2.cluster.host_facts read; empty without a topology."""
    try:
        return ib_devices_from_texts(_plain(texts))
    except FactParseError as exc:
        raise ValueError(f"cannot derive k2_ib_devices: {exc}") from exc


def image_ids_differ(ids_by_host: Mapping[str, Mapping[str, str] | None]) -> list[str]:
    """One line per group of hosts whose copy of an image differs from the others'."""
    return image_id_mismatches(_plain(ids_by_host))


def nccl_pair_rounds(hosts: list[str]) -> list[list[list[str]]]:
    """Rounds of disjoint host pairs covering every pair once."""
    return [[list(pair) for pair in round_] for round_ in pair_rounds([str(h) for h in hosts])]


def nccl_report(
    outputs: Mapping[str, str], fraction: float = 0.9, min_busbw: float | None = None
) -> dict[str, Any]:
    """Bus bandwidth per pair (keys "a|b") and one line per slow or failed pair."""
    bandwidth: dict[tuple[str, str], float] = {}
    failed: list[str] = []
    for key, text in _plain(outputs).items():
        a, _, b = str(key).partition("|")
        try:
            run = parse_all_reduce_perf(str(text))
        except NcclParseError as exc:
            failed.append(
                f"{a} <-> {b}: {exc}; fix: read the mpirun output above (ssh on the mesh port, "
                "NCCL_DEBUG=INFO) and run the pair again"
            )
            continue
        if run.wrong_elements:
            failed.append(
                f"{a} <-> {b}: all_reduce returned {run.wrong_elements} wrong elements, "
                "expected 0; fix: check GPU and NIC health (`nvidia-smi -q -d ECC`, dmesg) on "
                "both hosts"
            )
        bandwidth[(a, b)] = pair_bandwidth(run)
    slow = slow_pairs(bandwidth, fraction=fraction, min_busbw=min_busbw)
    return {
        "pairs": [{"hosts": list(pair), "busbw": bw} for pair, bw in sorted(bandwidth.items())],
        "problems": failed + [s.line() for s in slow],
    }


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {
            "preflight_problems": preflight_problems,
            "preflight_cluster_problems": preflight_cluster_problems,
            "ib_devices_from_facts": ib_devices_from_facts,
            "image_id_mismatches": image_ids_differ,
            "nccl_pair_rounds": nccl_pair_rounds,
            "nccl_report": nccl_report,
        }
