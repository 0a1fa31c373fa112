"""What a fleet's rolling change costs per instance, and loses, per engine (a benchmark).

For each engine (``--engines``, default every engine of k2provision.engines.REGISTRY with
fleet layouts) and each fleet size (``--instances``, default 2 and 4 for SGLang and 2 for the
others), it brings up a fleet of stand-in engines (they drain on SIGTERM) behind the real
sglang-router alone on lab1: SGLang and vLLM ``tp`` instances of one lab host each,
TensorRT-LLM ``tp_ep`` instances of two (the memory fit needs 2 x 8 H200; each its own mpirun
world), KTransformers ``single`` instances of one. It applies the fleet (the weights and
prepare phases run then), then times, in one run, an apply of a changed
``k2_context_length`` (32768 -> 16384), which the rollout (playbooks/rollout.yml, role
k2_rollout) replaces instance by instance, while k2lab.traffic streams chat completions
through the router (4 clients, ~2 s in flight each).

Per instance, its rollout time is read from the apply's run record (the ansible-runner events
under ``artifacts/*/job_events``, each stamped ``created``): from the start of the task
``Wave | Start (INSTANCE)`` to the last host's end of ``Wave | The containers replaced here
(INSTANCE)``: out of the router, drained, replaced behind the health gates, smoke-tested, back
in the router and listed healthy. The apply's wall time is the whole ``k2provision apply``
(plan, look, rollout, launch, verify). Requests sent are every request the clients ended during
the apply; lost are those not answered 200 with a complete stream.

A fleet's run is ok when the apply succeeds, rolls every instance in order, loses no request,
and leaves the router listing every instance healthy, each serving the new context length:
the ``max_model_len`` of its /v1/models (SGLang's --context-length, vLLM's --max-model-len),
or for TensorRT-LLM, whose /v1/models names none, the ``--max_seq_len`` of the trtllm-serve
its head runs. One that is not ok prints NOT OK with its reason (the failed requests, when
some were lost) and no figure, and the script exits 1. It prints one row per fleet (engine,
instances, mean rollout seconds per instance, the whole apply's seconds, requests sent and
lost), then each instance's rollout time. Needs root (the lab). The lab instance is
K2_LAB_NAME / K2_LAB_SUBNET when set (else k2roll, 10.81.0.0/24); it is taken down at the
end. Usage:

    sudo .venv/bin/python benchmarks/rolling.py [--engines sglang vllm] [--instances 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from dp_ep_lab import BIN, MODEL_DIR, ROOT, WRITE_CHECKPOINT, ansible_env, on_host
from outcome import NotOk, Outcome
from outcome import run as run_main

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin
from k2lab.traffic import Traffic
from k2provision.engines import REGISTRY, trtllm

CONTEXT, NEW_CONTEXT = 32768, 16384
ROUTER_PORT = 8000
# Each engine's lab fleet: its layout and the lab hosts one instance takes.
SHAPES: dict[str, tuple[str, int]] = {
    "sglang": ("tp", 1),
    "vllm": ("tp", 1),
    "trtllm": ("tp_ep", 2),  # Kimi-K2's memory fit needs 2 x 8 H200 per instance
    "ktransformers": ("single", 1),
}
DEFAULT_INSTANCES: dict[str, tuple[int, ...]] = {"sglang": (2, 4)}  # else (2,)
ORDER_LINE = re.compile(r"rollout order: (\d+)\. (\S+) on ([^:]+):")
WAVE_START = re.compile(r"^Wave \| Start \((.+)\)$")
WAVE_END = re.compile(r"^Wave \| The containers replaced here \((.+)\)$")


def fleet_engines() -> list[str]:
    """Every registered engine with fleet layouts, in registry order."""
    return [name for name, engine in REGISTRY.items() if engine.FLEET_LAYOUTS]


def fleet_vars(engine: str, instances: int, context: int) -> dict[str, lab.VarValue]:
    return {
        "k2_engine": engine,
        "k2_layout": SHAPES[engine][0],
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
        raise NotOk(f"apply {inventory.name} (records under {runs}) exited {out.returncode}:\n"
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
    """(instance, its hosts, its rollout seconds), in rollout order."""
    apply_s: float
    sent: int
    lost: int

    @property
    def mean_s(self) -> float:
        return sum(seconds for _, _, seconds in self.instances) / len(self.instances)


def served_context(state: lab.LabState, engine: str, url: str) -> int:
    """The context length the instance at ``url`` (its head's) serves: its /v1/models'
    max_model_len, or the --max_seq_len of TensorRT-LLM's running trtllm-serve (its
    /v1/models names none)."""
    router = state.hosts[0].name
    if engine != "trtllm":
        models = on_host(state, router, f"curl -s {url}/v1/models")
        return int(json.loads(models)["data"][0]["max_model_len"])
    [head] = [h.name for h in state.hosts if h.address == urlsplit(url).hostname]
    argv_of = "tr '\\0' ' ' < /proc/$(cat /run/k2-trtllm-serve.pid)/cmdline"
    argv = on_host(state, head, f"docker exec {trtllm.CONTAINER} sh -c "
                                f"{shlex.quote(argv_of)}").split()  # fmt: skip
    if "--max_seq_len" not in argv:
        raise NotOk(f"{head}'s trtllm-serve runs without --max_seq_len: {' '.join(argv)}")
    return int(argv[argv.index("--max_seq_len") + 1])


def checked_fleet(state: lab.LabState, engine: str, instances: int) -> None:
    """NotOk unless the router lists every instance healthy and each serves NEW_CONTEXT."""
    router = state.hosts[0].name
    listed = json.loads(on_host(state, router, f"curl -s http://127.0.0.1:{ROUTER_PORT}/workers"))
    healthy = [w["url"] for w in listed["workers"] if w.get("is_healthy")]
    if len(healthy) != instances or len(listed["workers"]) != instances:
        raise NotOk(f"the router lists {len(healthy)} healthy worker(s), not {instances}: "
                    f"{listed['workers']}")  # fmt: skip
    for url in healthy:
        length = served_context(state, engine, url)
        if length != NEW_CONTEXT:
            raise NotOk(f"{url} serves a context length of {length}, not {NEW_CONTEXT}")


def roll(engine: str, instances: int, cfg: LabConfig, work: Path) -> Rolled:
    """A fleet of ``instances`` of ``engine`` applied from nothing, then the timed rolling
    change."""
    if engine not in SHAPES:
        raise NotOk(f"no lab fleet shape here for {engine} (SHAPES names {', '.join(SHAPES)})")
    nodes = instances * SHAPES[engine][1]
    inventory = work / f"{engine}{instances}.ini"
    state = lab.up(
        nodes + 1, inventory=inventory, groups={"router": 1, "nodes": nodes},
        all_vars=fleet_vars(engine, instances, CONTEXT), cfg=cfg,
    )  # fmt: skip
    build_standin(cfg)
    for index, host in enumerate(state.hosts):
        # The router's host gets no model dir: the launch gives it the empty one it mounts.
        model = f"rm -rf {MODEL_DIR}" if index == 0 else WRITE_CHECKPOINT
        on_host(state, host.name, f"docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null "
                                  f"2>&1; {model}")  # fmt: skip
    apply(inventory, work / f"{engine}{instances}-first")
    text = inventory.read_text()
    if f"k2_context_length={CONTEXT}" not in text:
        raise NotOk(f"{inventory} does not set k2_context_length={CONTEXT}")
    changed = work / f"{engine}{instances}-changed.ini"
    changed.write_text(text.replace(f"k2_context_length={CONTEXT}",
                                    f"k2_context_length={NEW_CONTEXT}"))  # fmt: skip
    runs = work / f"{engine}{instances}-runs"
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
    checked_fleet(state, engine, instances)
    return Rolled(tuple((name, hosts, times[name]) for name, hosts in order), elapsed,
                  len(traffic.answers), len(traffic.failures))  # fmt: skip


def table(results: dict[tuple[str, int], Rolled]) -> None:
    """One row per fleet (its mean rollout time per instance and the whole apply's figures),
    then each instance's rollout time."""
    print(f"{'engine':<15}{'instances':>10}{'rollout s':>11}{'apply s':>10}{'sent':>7}"
          f"{'lost':>6}")  # fmt: skip
    for (engine, count), rolled in results.items():
        print(f"{engine:<15}{count:>10}{rolled.mean_s:>11.1f}{rolled.apply_s:>10.1f}"
              f"{rolled.sent:>7}{rolled.lost:>6}")  # fmt: skip
    print(f"\n{'fleet':<20}{'instance':<26}{'rollout s':>10}")
    for (engine, count), rolled in results.items():
        for index, (name, hosts, seconds) in enumerate(rolled.instances):
            fleet = f"{engine} x{count}" if index == 0 else ""
            print(f"{fleet:<20}{f'{name} ({hosts})':<26}{seconds:>10.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=fleet_engines(), choices=sorted(REGISTRY))
    parser.add_argument(
        "--instances", type=int, nargs="+", help="fleet sizes (default: 2 and 4 for sglang, else 2)"
    )
    args = parser.parse_args()
    cfg = LabConfig(
        lab_dir=default_lab_dir(),
        name=os.environ.get("K2_LAB_NAME", "k2roll"),
        subnet=os.environ.get("K2_LAB_SUBNET", "10.81.0.0/24"),
    )
    work = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    outcome = Outcome()
    results: dict[tuple[str, int], Rolled] = {}
    load_before = os.getloadavg()[0]
    try:
        for engine in dict.fromkeys(args.engines):
            for count in sorted(args.instances or DEFAULT_INSTANCES.get(engine, (2,))):
                try:
                    results[engine, count] = roll(engine, count, cfg, work)
                except NotOk as failed:
                    outcome.not_ok(f"{engine}, {count} instances", str(failed))
    finally:
        lab.down(cfg)
    if results:
        print(f"\nrolling change of k2_context_length {CONTEXT} -> {NEW_CONTEXT}, stand-ins "
              f"behind sglang-router, 4 clients streaming ~2 s requests; {os.cpu_count()} "
              f"CPUs, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} at the "
              f"end; run records under {work}")  # fmt: skip
        table(results)
    return outcome.finish()


if __name__ == "__main__":
    sys.exit(run_main(main))
