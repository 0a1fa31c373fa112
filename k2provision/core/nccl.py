"""NCCL ``all_reduce_perf`` output, and which host pair of a pairwise sweep is slow. Pure.

The cluster check (role ``k2_nccl_check``) runs ``all_reduce_perf`` from nccl-tests under
``mpirun`` for every pair of hosts, one round of disjoint pairs at a time
(:func:`pair_rounds`), reads each run with :func:`parse_all_reduce_perf` and names the pairs
whose bus bandwidth falls behind the others (:func:`slow_pairs`). A host that is in every slow
pair is the likely culprit (a bad cable, a port at the wrong speed, a missing GPUDirect RDMA).

The parser reads the table nccl-tests prints (with or without the ``root`` column of newer
releases; ``#wrong``/``error`` may be ``N/A`` when validation is off) and skips whatever else
is interleaved (``NCCL INFO`` lines, mpirun warnings).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "NcclParseError",
    "NcclRank",
    "NcclRow",
    "NcclRun",
    "SlowPair",
    "pair_bandwidth",
    "pair_rounds",
    "parse_all_reduce_perf",
    "slow_pairs",
]

GB = 1e9


class NcclParseError(ValueError):
    """The text holds no all_reduce_perf result table."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NcclRank(_Record):
    """One ``#  Rank  N ... on HOST device D [BUS] NAME`` line."""

    rank: int
    host: str
    device: int
    bus_id: str
    gpu: str


class NcclRow(_Record):
    """One message size: out-of-place and in-place time (us), algorithm and bus bandwidth
    (GB/s), and wrong elements (None where the run did not validate)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    in_place_time_us: float
    in_place_algbw: float
    in_place_busbw: float
    in_place_wrong: int | None


class NcclRun(_Record):
    """One all_reduce_perf run."""

    rows: tuple[NcclRow, ...]
    ranks: tuple[NcclRank, ...] = ()
    avg_busbw: float | None = None
    """The ``# Avg bus bandwidth`` line, averaged over all sizes (small ones included)."""
    out_of_bounds: int | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        """Hosts of the ranks, in rank order, each once."""
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def largest(self) -> NcclRow:
        """The row of the largest message size: the bandwidth a link sustains."""
        return max(self.rows, key=lambda r: r.size_bytes)

    @property
    def wrong_elements(self) -> int:
        """Wrong elements over all rows and both modes (0 when not validated)."""
        return sum((r.wrong or 0) + (r.in_place_wrong or 0) for r in self.rows)


_RANK = re.compile(
    r"#\s*Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[([^\]]*)\]\s+(.*?)\s*$"
)
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _wrong(token: str) -> int | None:
    return int(token) if token.isdigit() else None


def _row(fields: list[str], has_root: bool) -> NcclRow | None:
    """A data line, or None when the line is not one (a log line that starts with a number)."""
    width = 13 if has_root else 12
    if len(fields) != width or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    rest = fields[5:] if has_root else fields[4:]
    numbers = [rest[i] for i in (0, 1, 2, 4, 5, 6)]
    if not all(_NUMBER.fullmatch(n) for n in numbers):
        return None
    t, a, b, ti, ai, bi = (float(n) for n in numbers)
    return NcclRow(
        size_bytes=int(fields[0]),
        count=int(fields[1]),
        dtype=fields[2],
        redop=fields[3],
        time_us=t,
        algbw=a,
        busbw=b,
        wrong=_wrong(rest[3]),
        in_place_time_us=ti,
        in_place_algbw=ai,
        in_place_busbw=bi,
        in_place_wrong=_wrong(rest[7]),
    )


def parse_all_reduce_perf(text: str) -> NcclRun:
    """Read one run of ``all_reduce_perf``: ranks, the size table and the summary lines."""
    ranks: list[NcclRank] = []
    rows: list[NcclRow] = []
    avg: float | None = None
    oob: int | None = None
    has_root: bool | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if (match := _RANK.search(stripped)) is not None:
            ranks.append(
                NcclRank(
                    rank=int(match.group(1)),
                    host=match.group(2),
                    device=int(match.group(3)),
                    bus_id=match.group(4),
                    gpu=match.group(5),
                )
            )
            continue
        if (match := _AVG.match(stripped)) is not None:
            avg = float(match.group(1))
            continue
        if (match := _OOB.match(stripped)) is not None:
            oob = int(match.group(1))
            continue
        if stripped.startswith("#"):
            words = stripped.lstrip("#").split()
            if words[:2] == ["size", "count"]:
                has_root = "root" in words
            continue
        fields = stripped.split()
        root = has_root if has_root is not None else len(fields) == 13
        row = _row(fields, root)
        if row is not None:
            rows.append(row)
    if not rows:
        raise NcclParseError(
            "all_reduce_perf: no result rows (size, count, type, redop, time, algbw, busbw...); "
            "did the run fail before the first size?"
        )
    return NcclRun(rows=tuple(rows), ranks=tuple(ranks), avg_busbw=avg, out_of_bounds=oob)


def pair_bandwidth(run: NcclRun) -> float:
    """The bus bandwidth (GB/s) a run sustained: out-of-place, at its largest message size."""
    return run.largest.busbw


def pair_rounds(hosts: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Every pair of ``hosts`` exactly once, in rounds of disjoint pairs (a host is in at most
    one pair per round), so a round's runs can go side by side: N-1 rounds for N hosts (N for
    odd N). The first host of each pair is the one that launches the run."""
    ring: list[str | None] = list(dict.fromkeys(hosts))
    if len(ring) < 2:
        return []
    if len(ring) % 2:
        ring.append(None)
    rounds: list[list[tuple[str, str]]] = []
    n = len(ring)
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b) if hosts.index(a) < hosts.index(b) else (b, a))
        rounds.append(sorted(pairs, key=lambda p: (hosts.index(p[0]), hosts.index(p[1]))))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


class SlowPair(_Record):
    """A host pair whose bus bandwidth falls behind the rest."""

    hosts: tuple[str, str]
    busbw: float
    expected: float
    reference: str
    suspects: tuple[str, ...] = Field(default=())
    """Hosts that are in every slow pair (when more than one pair is slow)."""

    def line(self) -> str:
        """One line for a person: the pair, the value, the expectation and the fix."""
        a, b = self.hosts
        suspects = f"; {', '.join(self.suspects)} is in every slow pair" if self.suspects else ""
        return (
            f"{a} <-> {b}: all_reduce bus bandwidth {self.busbw:.1f} GB/s, expected at least "
            f"{self.expected:.1f} GB/s ({self.reference}){suspects}; fix: check the RDMA ports "
            f"of both hosts (`ibstat`: Active at the full rate), their cables and switch ports, "
            "and that nvidia-peermem is loaded (GPUDirect RDMA)"
        )


def slow_pairs(
    bandwidth: Mapping[tuple[str, str], float],
    *,
    fraction: float = 0.9,
    min_busbw: float | None = None,
) -> list[SlowPair]:
    """Pairs below ``fraction`` of the median of all pairs, or below ``min_busbw`` (GB/s) when
    given. With one pair only the absolute floor can judge it."""
    if not bandwidth:
        return []
    median = statistics.median(bandwidth.values())
    relative = fraction * median if len(bandwidth) > 1 else 0.0
    floor = max(relative, min_busbw or 0.0)
    if min_busbw is not None and min_busbw >= relative:
        reference = "the configured floor"
    else:
        reference = f"{fraction:.0%} of the median {median:.1f} GB/s of all pairs"
    slow = [(pair, bw) for pair, bw in bandwidth.items() if bw < floor]
    counts = Counter(host for pair, _ in slow for host in pair)
    suspects = (
        tuple(sorted(h for h, n in counts.items() if n == len(slow))) if len(slow) > 1 else ()
    )
    return [
        SlowPair(hosts=pair, busbw=bw, expected=floor, reference=reference, suspects=suspects)
        for pair, bw in sorted(slow, key=lambda item: item[1])
    ]
