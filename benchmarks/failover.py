"""What losing the endpoint's host costs: a front of two routers against one router (a benchmark,
not a test).

Two fleets of 2 SGLang TP stand-in instances, each on lab hosts of one lab instance in turn:
  - front: routers, HAProxy and keepalived on lab1 and lab2 behind one floating address
    (k2_front_address), the instances on lab3 and lab4;
  - single: one router on lab1 (the endpoint is lab1's address), the instances on lab2, lab3.
Each is applied, then killed `--kills` times (default 10): while 4 clients stream chat
completions through the endpoint and 4 probes send short requests (0.5 s timeout, so the
takeover is read to about half a second), the host
that serves the endpoint (the address's holder; the router's host) loses power
(`lab stop --cut-link`); `WINDOW_S` later it is started again and an apply brings its daemons
and router back before the next kill. Per kill it records the takeover, from the stop to the
first answer of a probe started after the stop (none within the window: the endpoint stayed
down), and the requests lost (every request of the window not answered 200 with a whole
stream). It prints, in one run, per fleet: the takeover (min / median / p95 over the kills
that had one), the kills without one, and the lost requests per kill. A run whose apply fails
prints NOT OK and no figure; the script exits 1. Needs root (the lab). The lab instance is
K2_LAB_NAME / K2_LAB_SUBNET when set (else k2fail, 10.82.0.0/24); it is taken down at the end.
Usage:

    sudo .venv/bin/python benchmarks/failover.py [--kills 10] [--fleets front single]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dp_ep_lab import MODEL_DIR, WRITE_CHECKPOINT, on_host
from outcome import NotOk, Outcome
from outcome import run as run_main
from rolling import apply

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin
from k2lab.traffic import Traffic

API_PORT = 8000
WINDOW_S = 15.0
STREAM_TIMEOUT_S = 8.0
PROBES, PROBE_TIMEOUT_S = 4, 0.5


@dataclass(frozen=True)
class Kill:
    """One loss of the endpoint's host."""

    host: str
    takeover_s: float | None
    """Stop to the first answer of a probe started after it; None: none in the window."""
    sent: int
    lost: int


def fleet_vars(front: str | None) -> dict[str, lab.VarValue]:
    found: dict[str, lab.VarValue] = {
        "k2_engine": "sglang",
        "k2_layout": "tp",
        "k2_instances": 2,
        "k2_model_dir": MODEL_DIR,
        "k2_context_length": 32768,
    }
    if front:
        found["k2_front_address"] = front
    return found


def holder(state: lab.LabState, address: str, hosts: tuple[str, ...]) -> str:
    """The host of `hosts` that holds `address` now; NotOk when not exactly one does."""
    held = [h for h in hosts if f" {address}/" in on_host(state, h, "ip -o -4 addr show")]
    if len(held) != 1:
        raise NotOk(f"{address} is held by {held or 'no host'}, expected exactly one")
    return held[0]


def one_kill(state: lab.LabState, endpoint: str, host: str, cfg: LabConfig) -> Kill:
    """Clients through `endpoint`, `host` loses power; what the window saw."""
    with (
        Traffic(endpoint, threads=4, tokens=200, timeout=STREAM_TIMEOUT_S) as streams,
        Traffic(endpoint, threads=PROBES, tokens=2, timeout=PROBE_TIMEOUT_S) as probes,
    ):
        deadline = time.monotonic() + 30
        while streams.counts["200"] < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        if probes.failures or streams.failures:
            raise NotOk(f"requests failed before the kill: {streams.counts} {probes.counts}")
        stopped = time.monotonic()
        lab.stop_host(host, cfg, log=lambda _: None, cut_link=True)
        time.sleep(WINDOW_S)
    after = [a for a in probes.answers if a.started >= stopped and a.outcome == "200"]
    takeover = min((a.ended for a in after), default=None)
    window = [a for t in (streams, probes) for a in t.answers if a.ended >= stopped]
    return Kill(
        host=host,
        takeover_s=None if takeover is None else takeover - stopped,
        sent=len(window),
        lost=sum(a.outcome != "200" for a in window),
    )


def run_fleet(kind: str, kills: int, cfg: LabConfig, work: Path) -> list[Kill]:
    """The fleet `kind` applied, then killed `kills` times, each time started and re-applied."""
    front = cfg.floating_address() if kind == "front" else None
    groups = {"router": 2, "nodes": 2} if front else {"router": 1, "nodes": 2}
    inventory = work / f"{kind}.ini"
    state = lab.up(sum(groups.values()), inventory=inventory, groups=groups,
                   all_vars=fleet_vars(front), cfg=cfg)  # fmt: skip
    build_standin(cfg)
    for h in state.hosts:
        on_host(state, h.name, f"docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null "
                               f"2>&1; {WRITE_CHECKPOINT}")  # fmt: skip
    apply(inventory, work / f"{kind}-runs")
    routers = tuple(h.name for h in state.hosts[: groups["router"]])
    address = front.split("/")[0] if front else state.hosts[0].address
    endpoint = f"http://{address}:{API_PORT}"
    found = []
    for n in range(kills):
        host = holder(state, address, routers) if front else routers[0]
        try:
            found.append(one_kill(state, endpoint, host, cfg))
        finally:
            state = lab.start_host(host, cfg, log=lambda _: None)
        apply(inventory, work / f"{kind}-runs")
        print(f"{kind}: kill {n + 1}/{kills} of {host}: {found[-1]}", flush=True)
    return found


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def table(results: dict[str, list[Kill]]) -> None:
    print(f"{'fleet':<8}{'kills':>6}{'takeover min / median / p95 s':>32}{'no takeover':>13}"
          f"{'lost per kill':>15}{'of sent':>9}")  # fmt: skip
    for kind, kills in results.items():
        took = [k.takeover_s for k in kills if k.takeover_s is not None]
        figures = (f"{min(took):.2f} / {statistics.median(took):.2f} / {p95(took):.2f}"
                   if took else "-")  # fmt: skip
        lost = statistics.mean(k.lost for k in kills)
        sent = statistics.mean(k.sent for k in kills)
        print(f"{kind:<8}{len(kills):>6}{figures:>32}{len(kills) - len(took):>13}"
              f"{lost:>15.1f}{sent:>9.1f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--fleets", nargs="+", choices=["front", "single"],
                        default=["front", "single"])  # fmt: skip
    args = parser.parse_args()
    cfg = LabConfig(
        lab_dir=default_lab_dir(),
        name=os.environ.get("K2_LAB_NAME", "k2fail"),
        subnet=os.environ.get("K2_LAB_SUBNET", "10.82.0.0/24"),
    )
    work = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    outcome = Outcome()
    results: dict[str, list[Kill]] = {}
    load_before = os.getloadavg()[0]
    for kind in args.fleets:
        try:
            results[kind] = run_fleet(kind, args.kills, cfg, work)
        except NotOk as failed:
            outcome.not_ok(f"{kind} fleet", str(failed))
        finally:
            lab.down(cfg)
    if results:
        print(f"\nthe endpoint's host loses power (lab stop --cut-link), {WINDOW_S:.0f} s window, "
              f"4 streaming clients and {PROBES} probes ({PROBE_TIMEOUT_S} s timeout); "
              f"{os.cpu_count()} CPUs, load "
              f"average {load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
        table(results)
    return outcome.finish()


if __name__ == "__main__":
    raise SystemExit(run_main(main))
