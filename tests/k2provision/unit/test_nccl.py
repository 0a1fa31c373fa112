"""all_reduce_perf output and slow host pairs (tests/fixtures/nccl/SOURCES.md)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from k2provision.core.nccl import (
    NcclParseError,
    pair_bandwidth,
    pair_rounds,
    parse_all_reduce_perf,
    slow_pairs,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
A3MEGA = FIXTURES / "a3mega-2x8-h100" / "all_reduce_perf.txt"


def test_parses_the_published_two_node_run() -> None:
    run = parse_all_reduce_perf(A3MEGA.read_text())
    assert len(run.rows) == 31
    assert run.rows[0].size_bytes == 8
    assert run.largest.size_bytes == 8589934592
    assert run.largest.busbw == 338.82
    assert run.largest.in_place_busbw == 337.35
    assert run.largest.algbw == 180.71
    assert run.largest.time_us == 47535
    assert run.largest.dtype == "float"
    assert run.largest.redop == "sum"
    assert run.avg_busbw == 70.742
    assert run.out_of_bounds == 0
    assert run.wrong_elements == 0
    assert pair_bandwidth(run) == 338.82


def test_reads_ranks_and_hosts_in_rank_order() -> None:
    run = parse_all_reduce_perf(A3MEGA.read_text())
    assert len(run.ranks) == 16
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    eighth = run.ranks[8]
    assert (eighth.host, eighth.device, eighth.bus_id) == ("ztan-mig-gq73", 0, "0000:04:00")
    assert eighth.gpu == "NVIDIA H100 80GB HBM3"


def test_skips_log_lines_interleaved_with_the_table() -> None:
    lines = A3MEGA.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("134217728"))
    noisy = [
        *lines[:at],
        "ztan-mig-235z:6899:6950 [0] NCCL INFO comm 0x55c6f1c65b50 rank 0 nranks 16 - Init OK",
        "1024 lines of something else 3 4",
        *lines[at:],
    ]
    run = parse_all_reduce_perf("\n".join(noisy))
    assert len(run.rows) == 31
    assert run.largest.busbw == 338.82


def test_reads_the_older_table_without_root_and_unvalidated_runs() -> None:
    # The column layout of nccl-tests before the root column, validation off (-c 0).
    text = "\n".join(
        [
            "#       size         count    type   redop     time   algbw   busbw  error     "
            "time   algbw   busbw  error",
            "   268435456      67108864   float     sum   2360.9  113.70  213.19    N/A   "
            "2359.9  113.75  213.28    N/A",
        ]
    )
    run = parse_all_reduce_perf(text)
    assert run.largest.busbw == 213.19
    assert run.largest.wrong is None
    assert run.wrong_elements == 0


def test_a_run_that_died_before_the_table_is_an_error() -> None:
    lines = A3MEGA.read_text().splitlines()
    head = "\n".join(line for line in lines if not line.strip()[:1].isdigit())
    with pytest.raises(NcclParseError, match="no result rows"):
        parse_all_reduce_perf(head)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_pair_rounds_cover_every_pair_once_with_disjoint_rounds(n: int) -> None:
    hosts = [f"gpu-{i:02d}" for i in range(n)]
    rounds = pair_rounds(hosts)
    pairs = [pair for round_ in rounds for pair in round_]
    assert sorted(pairs) == sorted(itertools.combinations(hosts, 2))
    for round_ in rounds:
        busy = [h for pair in round_ for h in pair]
        assert len(busy) == len(set(busy))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


def test_one_host_has_no_pairs() -> None:
    assert pair_rounds(["gpu-01"]) == []


def test_a_slow_pair_is_named_with_value_expectation_and_fix() -> None:
    measured = pair_bandwidth(parse_all_reduce_perf(A3MEGA.read_text()))
    bandwidth = {
        ("gpu-01", "gpu-02"): measured,
        ("gpu-01", "gpu-03"): measured,
        ("gpu-02", "gpu-03"): measured,
        ("gpu-01", "gpu-04"): measured,
        ("gpu-02", "gpu-04"): 150.4,
        ("gpu-03", "gpu-04"): measured,
    }
    slow = slow_pairs(bandwidth)
    assert [s.hosts for s in slow] == [("gpu-02", "gpu-04")]
    line = slow[0].line()
    assert line.startswith("gpu-02 <-> gpu-04: all_reduce bus bandwidth 150.4 GB/s")
    assert "expected at least 304.9 GB/s (90% of the median 338.8 GB/s of all pairs)" in line
    assert "; fix: check the RDMA ports of both hosts" in line


def test_a_host_in_every_slow_pair_is_the_suspect() -> None:
    bandwidth = {
        ("a", "b"): 338.8,
        ("a", "c"): 338.0,
        ("a", "d"): 120.0,
        ("b", "c"): 337.0,
        ("b", "d"): 118.0,
        ("c", "d"): 121.0,
    }
    slow = slow_pairs(bandwidth)
    assert {s.hosts for s in slow} == {("a", "d"), ("b", "d"), ("c", "d")}
    assert all(s.suspects == ("d",) for s in slow)
    assert "d is in every slow pair" in slow[0].line()


def test_an_even_cluster_has_no_slow_pair_and_one_pair_needs_a_floor() -> None:
    assert slow_pairs({("a", "b"): 338.8, ("a", "c"): 330.1, ("b", "c"): 336.0}) == []
    assert slow_pairs({("a", "b"): 120.0}) == []
    floor = slow_pairs({("a", "b"): 120.0}, min_busbw=300.0)
    assert [s.hosts for s in floor] == [("a", "b")]
    assert "(the configured floor)" in floor[0].line()
