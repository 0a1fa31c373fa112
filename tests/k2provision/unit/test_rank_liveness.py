"""A DP rank that holds requests and advances no more: the per-rank sign SGLang's /health
hides, read from its rank-load route (/v1/loads?format=prometheus&include=core, whose text
`_format_loads_prometheus` writes one gauge per LoadSnapshot core field and rank), and what
`status` makes of it on an instance's first host."""

from __future__ import annotations

from dataclasses import replace

from k2provision.engines import sglang
from k2provision.ops.rank_liveness import STALE_S, rank_samples, stuck_ranks
from k2provision.ops.status_probe import host_status, status_probe
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from k2provision.plan.monitoring import rank_load_targets
from tests.k2provision.unit.test_fleet import PD_FLEET, TP_FLEET
from tests.k2provision.unit.test_status_logs_core import answer, part

NOW = 1769860800.0
NAMES = sglang.METRICS.rank_load if sglang.METRICS else None


def loads_text(ranks: list[tuple[int, int, float]]) -> str:
    """The route's text for ranks of (running, waiting, published), as sglang 0.5.23 writes
    it: a `# TYPE` line per gauge, then one `{dp_rank="N"}` sample per rank."""
    gauges = {
        "sglang_timestamp": [published for _, _, published in ranks],
        "sglang_num_running_reqs": [running for running, _, _ in ranks],
        "sglang_num_waiting_reqs": [waiting for _, waiting, _ in ranks],
        "sglang_token_usage": [0.25 for _ in ranks],
    }
    lines = []
    for name, values in gauges.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in enumerate(values)]
    return "\n".join(lines) + "\n"


def test_the_routes_text_reads_per_rank() -> None:
    text = loads_text([(2, 0, NOW), (0, 1, NOW - 5)])
    assert rank_samples(text)[1] == {
        "sglang_timestamp": NOW - 5,
        "sglang_num_running_reqs": 0.0,
        "sglang_num_waiting_reqs": 1.0,
        "sglang_token_usage": 0.25,
    }
    assert rank_samples('no answer: connection refused\ngarbage{dp_rank="x"} 1\n') == {}


def test_only_a_rank_that_holds_work_and_is_silent_for_long_is_stuck() -> None:
    assert NAMES is not None
    stale = NOW - STALE_S - 15
    text = loads_text(
        [
            (3, 0, NOW - 1),  # busy, publishing: fine
            (0, 0, stale),  # idle: it publishes once and then nothing, fine
            (1, 4, stale),  # holds 5 and silent: stuck
            (0, 2, NOW - STALE_S + 5),  # queued but recent: not yet
        ]
    )
    (stuck,) = stuck_ranks(text, NAMES, NOW)
    assert (stuck.rank, stuck.holds, round(stuck.silent_s)) == (2, 5, STALE_S + 15)
    assert stuck.text("decode-1") == (
        "instance decode-1: DP rank 2 holds 5 request(s) and has published no load for 75 s "
        "(its scheduler is stuck; /health does not show it)"
    )
    # No publish time served (the lab's stand-in, another engine): nothing is judged.
    silent = loads_text([(1, 4, stale)]).replace("sglang_timestamp", "sglang_other")
    assert stuck_ranks(silent, NAMES, NOW) == ()
    assert stuck_ranks(text, replace(NAMES, published=""), NOW) == ()


def test_status_asks_each_dp_attention_instances_first_host_and_names_a_stuck_rank() -> None:
    plan = build_plan(load_cluster(PD_FLEET))
    targets = rank_load_targets(plan)
    heads = {t.host for t in targets}
    assert {i.hosts[0] for p in plan.pools for i in p.members()} == heads
    assert not rank_load_targets(build_plan(load_cluster(TP_FLEET)))  # no DP attention there
    target = targets[0]
    host = plan.host(target.host)
    asked = status_probe(plan, host)
    assert list(asked.loads) == [target.instance]
    assert f"http://{target.address}/v1/loads?format=prometheus&include=core" in (
        asked.batch.script()
    )
    other = next(h for h in plan.hosts if h.name not in heads and h.processes)
    assert status_probe(plan, other).loads == {}
    stale = NOW - STALE_S - 40
    stuck = part(f"loads {target.instance}", *loads_text([(2, 0, NOW), (0, 3, stale)]).split("\n"))
    found = host_status(plan, host, answer(host, plan, extra=stuck))
    (line,) = found.stuck_ranks
    assert line.startswith(f"instance {target.instance}: DP rank 1 holds 3 request(s)")
    assert line.endswith(f"fix: k2provision restart INVENTORY --limit {host.name}")
    assert line in found.problems
    fine = part(f"loads {target.instance}", *loads_text([(2, 0, NOW)]).split("\n"))
    assert host_status(plan, host, answer(host, plan, extra=fine)).stuck_ranks == ()
