"""Whether each data-parallel rank of an instance still advances: the sign /health hides. Pure.

An SGLang instance with DP attention answers ``/health`` without asking any rank, and
``/health_generate`` as soon as one rank answers its one-token request (sglang 0.5.23,
srt/entrypoints/http_server.py:721-800), so a rank whose scheduler hangs keeps the instance
"healthy" while the requests routed to that rank wait forever. Each rank's scheduler
publishes its load after every batch, and at least every 50 ms while it holds work without
one; the instance's HTTP server serves those snapshots per rank on its rank-load route, with
the time each was taken (the engine's RankLoadNames.published; sglang's ``sglang_timestamp``,
see engines/sglang.py). A rank that holds requests, running or waiting, and whose last
snapshot is older than :data:`STALE_S` is stuck. An idle rank publishes once and then
nothing, so its age alone says nothing; an engine or stand-in that serves no publish time is
judged on nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from k2provision.engines.base import RankLoadNames

__all__ = ["STALE_S", "StuckRank", "rank_samples", "stuck_ranks"]

STALE_S = 60.0
"""Seconds a rank holding requests may go without publishing its load before it is stuck:
far above the 50 ms it publishes at while it holds work, and above the clock skew between
the instance's hosts that NTP leaves."""

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][\w:]*)\{dp_rank="(?P<rank>\d+)"\}\s+(?P<value>\S+)')


@dataclass(frozen=True)
class StuckRank:
    """A rank that holds requests and has published no load for `silent_s` seconds."""

    rank: int
    holds: int
    silent_s: float

    def text(self, instance: str) -> str:
        """One line naming the instance, the rank, what it holds and for how long."""
        return (
            f"instance {instance}: DP rank {self.rank} holds {self.holds} request(s) and has "
            f"published no load for {self.silent_s:.0f} s (its scheduler is stuck; /health "
            "does not show it)"
        )


def rank_samples(text: str) -> dict[int, dict[str, float]]:
    """The rank-load route's Prometheus text as {rank: {gauge: value}} (other lines ignored)."""
    found: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        found.setdefault(int(match["rank"]), {})[match["name"]] = value
    return found


def stuck_ranks(
    text: str, names: RankLoadNames, now: float, stale_s: float = STALE_S
) -> tuple[StuckRank, ...]:
    """The ranks of `text` (the rank-load route's answer) that hold requests and whose last
    published load is older than `stale_s` at `now` (Unix seconds, the instance's host's
    clock), by rank; () when the engine publishes no time."""
    if not names.published:
        return ()
    stuck = []
    for rank, gauges in sorted(rank_samples(text).items()):
        holds = _count(gauges, names.running) + _count(gauges, names.queued)
        published = gauges.get(names.published)
        if holds > 0 and published is not None and published > 0 and now - published > stale_s:
            stuck.append(StuckRank(rank=rank, holds=holds, silent_s=now - published))
    return tuple(stuck)


def _count(gauges: Mapping[str, float], name: str) -> int:
    return int(gauges.get(name, 0.0))
