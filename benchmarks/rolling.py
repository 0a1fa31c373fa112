"""What a fleet's rolling change costs, per instance, and what it loses (a benchmark, not a test).

For a fleet of 2 and one of 4 SGLang TP instances of one lab host each (stand-in engines that
drain on SIGTERM) behind the real sglang-router alone on lab1, it applies the fleet, then
times, in one run, an apply of a changed ``k2_context_length`` (32768 -> 16384), which the
rollout (playbooks/rollout.yml, role k2_rollout) replaces instance by instance, while
k2lab.traffic streams chat completions through the router (4 clients, ~2 s in flight each).

Per instance, its rollout time is read from the apply's run record (the ansible-runner events
under ``artifacts/*/job_events``, each stamped ``created``): from the start of the task
``Wave | Start (INSTANCE)`` to the last host's end of ``Wave | The containers replaced here
(INSTANCE)``: out of the router, drained, replaced behind the health gates, smoke-tested, back
in the router and listed healthy. The apply's wall time is the whole ``k2provision apply``
(plan, look, rollout, launch, verify). Requests sent are every request the clients ended during
the apply; lost are those not answered 200 with a complete stream.

A fleet's run is ok when the apply succeeds, rolls every instance in order, loses no request,
and leaves every instance serving the new context length with the router listing them all
healthy; one that is not ok prints NOT OK with its reason (the failed requests, when some were
lost) and no figure, and the script exits 1. Needs root (the lab). The lab instance is
K2_LAB_NAME / K2_LAB_SUBNET when set (else k2roll, 10.81.0.0/24); it is taken down at the
end. Usage:

    sudo .venv/bin/python benchmarks/rolling.py [--instances 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from dp_ep_lab import BIN, MODEL_DIR, ROOT, WRITE_CHECKPOINT, ansible_env, on_host
from outcome import NotOk, Outcome
from outcome import run as run_main

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin
from k2lab.traffic import Traffic

CONTEXT, NEW_CONTEXT = 32768, 16384
ROUTER_PORT, ENGINE_PORT = 8000, 30000
ORDER_LINE = re.compile(r"rollout order: (\d+)\. (\S+) on (\S+):")
WAVE_START = re.compile(r"^Wave \| Start \((.+)\)$")
WAVE_END = re.compile(r"^Wave \| The containers replaced here \((.+)\)$")


def fleet_vars(instances: int, context: int) -> dict[str, lab.VarValue]:
    return {
        "k2_engine": "sglang",
        "k2_layout": "tp",
        "k2_instances": instances,
        "k2_model_dir": MODEL_DIR,
        "k2_context_length": context,
    }


def apply(inventory: Path, runs: Path) -> tuple[str, float]:
    """``k2provision apply INVENTORY`` with its records under ``runs``: its output and wall
    time; NotOk if it fails. No time limit of its own: the apply's gates and drains have theirs
    (and Ctrl-C stops it as it stops a user's apply)."""
    env = {**ansible_env(ROOT / "ansible.cfg"), "K2_RUNS_DIR": str(runs)}
    started = time.monotonic()
    out = subprocess.run([str(BIN / "k2provision"), "apply", str(inventory)], cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)  # fmt: skip
    elapsed = time.monotonic() - started
    if out.returncode != 0:
        raise NotOk(f"apply {inventory.name} exited {out.returncode}:\n"
                    f"{out.stdout[-4000:]}{out.stderr[-2000:]}")  # fmt: skip
    return out.stdout, elapsed


def wave_times(record: Path) -> dict[str, float]:
    """Seconds each wave (its instances' names) took, from the run record's events: the start
    of ``Wave | Start (...)`` to the last event of ``Wave | The containers replaced here (...)``."""
    starts: dict[str, datetime] = {}
    ends: dict[str, datetime] = {}
    for path in record.glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        task = str((event.get("event_data") or {}).get("task", ""))
        created = event.get("created")
        if not created:
            continue
        when = datetime.fromisoformat(created)
        if found := WAVE_START.match(task):
            name = found[1]
            starts[name] = min(when, starts.get(name, when))
        elif found := WAVE_END.match(task):
            name = found[1]
            ends[name] = max(when, ends.get(name, when))
    unfinished = sorted(set(starts) ^ set(ends))
    if unfinished:
        raise NotOk(f"{record}: waves without both a start and an end in the events: "
                    f"{', '.join(unfinished)}")  # fmt: skip
    return {name: (ends[name] - starts[name]).total_seconds() for name in starts}


@dataclass(frozen=True)
class Rolled:
    """One fleet's measured rolling change."""

    instances: tuple[tuple[str, str, float], ...]
    """(instance, its host, its rollout seconds), in rollout order."""
    apply_s: float
    sent: int
    lost: int


def checked_fleet(state: lab.LabState, instances: int) -> None:
    """NotOk unless the router lists every instance healthy and each serves NEW_CONTEXT."""
    router = state.hosts[0].name
    listed = json.loads(on_host(state, router, f"curl -s http://127.0.0.1:{ROUTER_PORT}/workers"))
    healthy = [w["url"] for w in listed["workers"] if w.get("is_healthy")]
    if len(healthy) != instances:
        raise NotOk(f"the router lists {len(healthy)} healthy worker(s), not {instances}: "
                    f"{listed['workers']}")  # fmt: skip
    for host in state.hosts[1:]:
        models = on_host(state, router, f"curl -s http://{host.address}:{ENGINE_PORT}/v1/models")
        length = int(json.loads(models)["data"][0]["max_model_len"])
        if length != NEW_CONTEXT:
            raise NotOk(f"{host.name} serves max_model_len {length}, not {NEW_CONTEXT}")


def roll(instances: int, cfg: LabConfig, work: Path) -> Rolled:
    """A fleet of ``instances`` applied from nothing, then the timed rolling change."""
    inventory = work / f"fleet{instances}.ini"
    state = lab.up(
        instances + 1, inventory=inventory, groups={"router": 1, "nodes": instances},
        all_vars=fleet_vars(instances, CONTEXT), cfg=cfg,
    )  # fmt: skip
    build_standin(cfg)
    for host in state.hosts:
        on_host(state, host.name, f"docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null "
                                  f"2>&1; {WRITE_CHECKPOINT}")  # fmt: skip
    apply(inventory, work / f"first{instances}")
    text = inventory.read_text()
    if f"k2_context_length={CONTEXT}" not in text:
        raise NotOk(f"{inventory} does not set k2_context_length={CONTEXT}")
    changed = work / f"changed{instances}.ini"
    changed.write_text(text.replace(f"k2_context_length={CONTEXT}",
                                    f"k2_context_length={NEW_CONTEXT}"))  # fmt: skip
    runs = work / f"runs{instances}"
    with Traffic(f"http://{state.hosts[0].address}:{ROUTER_PORT}") as traffic:
        output, elapsed = apply(changed, runs)
    if traffic.failures:
        lost = "\n".join(f"  {a.outcome} (ended {a.ended - a.started:.1f} s after it started)"
                         for a in traffic.failures[:20])  # fmt: skip
        raise NotOk(f"{len(traffic.failures)} of {len(traffic.answers)} requests lost "
                    f"({dict(traffic.counts)}):\n{lost}")  # fmt: skip
    order = list({m[2]: (m[2], m[3]) for m in ORDER_LINE.finditer(output)}.values())
    if len(order) != instances:
        raise NotOk(f"the apply's rollout order names {len(order)} instance(s), not "
                    f"{instances}:\n{output[-3000:]}")  # fmt: skip
    records = [p for p in runs.iterdir() if p.is_dir()]
    if len(records) != 1:
        raise NotOk(f"{runs}: expected the apply's one run record, found {len(records)}")
    times = wave_times(records[0])
    if sorted(times) != sorted(name for name, _ in order):
        raise NotOk(f"the events' waves {sorted(times)} are not the rollout order {order}")
    checked_fleet(state, instances)
    return Rolled(tuple((name, host, times[name]) for name, host in order), elapsed,
                  len(traffic.answers), len(traffic.failures))  # fmt: skip


def table(results: dict[int, Rolled]) -> None:
    """The measured fleets: each instance's rollout time, then the whole apply's figures."""
    print(f"{'fleet':<13}{'instance':<20}{'rollout s':>10}{'apply s':>10}{'sent':>7}"
          f"{'lost':>6}")  # fmt: skip
    for count, rolled in results.items():
        for index, (name, host, seconds) in enumerate(rolled.instances):
            fleet = f"{count} instances" if index == 0 else ""
            print(f"{fleet:<13}{f'{name} ({host})':<20}{seconds:>10.1f}")
        print(f"{'':<13}{'whole apply':<20}{'':>10}{rolled.apply_s:>10.1f}{rolled.sent:>7}"
              f"{rolled.lost:>6}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    cfg = LabConfig(
        lab_dir=default_lab_dir(),
        name=os.environ.get("K2_LAB_NAME", "k2roll"),
        subnet=os.environ.get("K2_LAB_SUBNET", "10.81.0.0/24"),
    )
    work = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    outcome = Outcome()
    results: dict[int, Rolled] = {}
    load_before = os.getloadavg()[0]
    try:
        for count in sorted(args.instances):
            try:
                results[count] = roll(count, cfg, work)
            except NotOk as failed:
                outcome.not_ok(f"{count} instances", str(failed))
    finally:
        lab.down(cfg)
    if results:
        print(f"\nrolling change of k2_context_length {CONTEXT} -> {NEW_CONTEXT}, SGLang TP "
              f"stand-ins behind sglang-router, 4 clients streaming ~2 s requests; "
              f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, "
              f"{os.getloadavg()[0]:.1f} at the end")  # fmt: skip
        table(results)
    return outcome.finish()


if __name__ == "__main__":
    sys.exit(run_main(main))
