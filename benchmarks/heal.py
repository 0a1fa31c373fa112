"""What a dead host costs a fleet that has a prepared spare: the time until the fleet serves at
full capacity again, and the requests lost (a benchmark, not a test).

One fleet of 2 SGLang TP stand-in instances on 5 hosts of one lab instance: routers, HAProxy
and keepalived on lab1 and lab2 behind one floating address (k2_front_address), replica-1 on
lab3, replica-2 on lab4, and lab5 a spare (inventory group [spare]: prepared like the others,
holding the weights, serving nothing). It is applied, then killed `--kills` times (default 3):
while 4 clients stream chat completions through the floating address, replica-2's host lab4
loses power (`lab stop`: it dies at once, its kernel refusing connections) and
`k2provision watch INVENTORY --once --max-hosts 100` finds it unreachable and heals replica-2
onto the spare: the state file records lab5 in lab4's place, and an apply starts the instance
there and rolls both routers onto it. Per kill it records, from the stop:
  - full capacity: to both routers listing exactly the two instances (lab3, lab5) healthy
    (each router's GET /workers asked on its host, every POLL_S): first, and for good (from
    when they have listed both healthy ever since, through the heal's end), with the dips
    between (whole, then not again: the heal's apply took an instance out);
  - heal: to the end of the watch's round;
  - the requests lost (those that ended after the stop not answered 200 with a whole stream)
    of those sent, and how many of them were sent after full capacity for good.
Outside the timed window lab4 is then started again and `k2provision return INVENTORY lab4`
puts replica-2 back on it (lab5 a spare again) before the next kill.

It prints, in one run, a line per kill, then the times to full capacity (for good, first) and
to the heal's end (min / median / max), the dips, and the requests lost of those sent over all
kills. A kill whose heal or return fails, or after which the fleet is not whole within
CAPACITY_S, prints NOT OK and no figure and ends the kills; the script then exits 1. Needs
root (the lab). The lab instance is K2_LAB_NAME / K2_LAB_SUBNET when set (else k2heal,
10.83.0.0/24); it is taken down at the end. Usage:

    sudo .venv/bin/python benchmarks/heal.py [--kills 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dp_ep_lab import BIN, MODEL_DIR, ROOT, WRITE_CHECKPOINT, ansible_env, on_host
from outcome import NotOk, Outcome
from outcome import run as run_main
from rolling import apply

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin
from k2lab.traffic import Answer, Traffic
from k2provision.core.host_state import read_state

API_PORT, ROUTER_PORT, ENGINE_PORT = 8000, 8080, 30000
GROUPS = {"router": 2, "nodes": 2, "spare": 1}
ROUTERS, REPLICA_1, VICTIM, SPARE = ("lab1", "lab2"), "lab3", "lab4", "lab5"
THREADS, STREAM_TIMEOUT_S = 4, 15.0
POLL_S = 0.5
CAPACITY_S = 180.0
"""How long after the heal's end the fleet may take to be whole again (then NOT OK)."""
TAIL_S = 5.0
"""Clients keep streaming this long after full capacity: what the whole fleet loses."""
MAX_HOSTS = 100
"""The circuit breaker's limit for the watch: every kill of the run takes a host out."""


@dataclass
class Dip:
    """A while the fleet was not whole after it had been (seconds after the stop)."""

    start: float
    what: str
    """What the routers listed healthy as it began."""
    end: float | None = None


@dataclass(frozen=True)
class Kill:
    """One death of replica-2's host, healed onto the spare."""

    heal_s: float
    """The stop to the end of `watch --once`."""
    first_s: float
    """The stop to both routers first listing both instances (the spare's included) healthy."""
    capacity_s: float
    """The stop to the moment from which they have listed both healthy ever since (through
    the heal's end): full capacity for good."""
    dips: tuple[Dip, ...]
    """The fleet whole, then not again, before it was for good."""
    sent: int
    lost: tuple[Answer, ...]
    lost_after_capacity: int


def fleet_vars(front: str) -> dict[str, lab.VarValue]:
    return {
        "k2_engine": "sglang",
        "k2_layout": "tp",
        "k2_instances": 2,
        "k2_model_dir": MODEL_DIR,
        "k2_context_length": 32768,
        "k2_front_address": front,
    }


def k2(*args: str, runs: Path) -> tuple[int, str]:
    """``k2provision ARGS`` with its records under ``runs``: its exit code and its output (the
    whitespace folded, so a phrase wrapped by the console still matches). No time limit of its
    own, as `apply`: the heal's gates and drains have theirs."""
    env = {**ansible_env(ROOT / "ansible.cfg"), "K2_RUNS_DIR": str(runs), "COLUMNS": "250"}
    out = subprocess.run([str(BIN / "k2provision"), *args], cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)  # fmt: skip
    return out.returncode, " ".join(f"{out.stdout}\n{out.stderr}".split())


def worker_url(state: lab.LabState, host: str) -> str:
    return f"http://{state.host(host).address}:{ENGINE_PORT}"


def router_view(state: lab.LabState, router: str) -> dict[str, bool]:
    """Whether the router on `router` (asked on its host) takes each worker (URL) as healthy;
    NotOk when it does not answer."""
    url = f"http://{state.host(router).address}:{ROUTER_PORT}/workers"
    listed = on_host(state, router, f"curl -sf -m 5 {url}")
    try:
        return {w["url"]: bool(w["is_healthy"]) for w in json.loads(listed)["workers"]}
    except (ValueError, KeyError, TypeError) as error:
        raise NotOk(f"{router}'s router answered {listed[:300]!r}: {error}") from error


def listed(state: lab.LabState, views: list[dict[str, bool]]) -> str:
    """What each router lists healthy, by host name."""
    names = {worker_url(state, h.name): h.name for h in state.hosts}
    return "; ".join(
        f"{router}: {', '.join(names.get(u, u) for u, ok in view.items() if ok) or 'none'}"
        for router, view in zip(ROUTERS, views, strict=True)
    )


def whole(state: lab.LabState, instances: tuple[str, str]) -> list[dict[str, bool]] | None:
    """None when both routers list exactly `instances`' hosts healthy; else what they list."""
    want = {worker_url(state, h): True for h in instances}
    views = []
    for router in ROUTERS:
        try:
            views.append(router_view(state, router))
        except NotOk:  # a router being replaced by the roll: not whole yet
            views.append({})
    return None if all(v == want for v in views) else views


class Capacity(threading.Thread):
    """Asks both routers every POLL_S whether they list exactly `instances` healthy, until
    stopped. Times are time.monotonic() at the end of a round of questions: `first`, the
    first round that saw the fleet whole; `settled`, the first of the rounds that have seen it
    whole since (None while it is not); `dips`, the whiles it was whole and then not again
    (relative to `since`)."""

    def __init__(self, state: lab.LabState, instances: tuple[str, str], since: float) -> None:
        super().__init__(daemon=True)
        self.state, self.instances, self.since = state, instances, since
        self.first: float | None = None
        self.settled: float | None = None
        self.checked = 0.0
        """When the last round ended."""
        self.dips: list[Dip] = []
        self.last: list[dict[str, bool]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            views = whole(self.state, self.instances)
            now = time.monotonic()
            if views is None:
                if self.first and not self.settled:
                    self.dips[-1].end = now - self.since
                self.first = self.first or now
                self.settled = self.settled or now
            else:
                if self.settled:
                    self.dips.append(Dip(now - self.since, listed(self.state, views)))
                self.settled, self.last = None, views
            self.checked = now
            self.stopping.wait(POLL_S)

    def whole_after(self, moment: float, deadline: float) -> float | None:
        """Wait until a round that ended after `moment` saw the fleet whole (or `deadline`);
        then stop asking. `settled` then, None if the fleet was not whole by the deadline."""
        while time.monotonic() < deadline and not (self.settled and self.checked > moment):
            time.sleep(0.1)
        self.stopping.set()
        self.join()
        return self.settled if self.checked > moment else None


def one_kill(state: lab.LabState, inventory: Path, runs: Path, cfg: LabConfig) -> Kill:
    """Clients through the floating address, VICTIM loses power, `watch --once` heals it onto
    SPARE; what the window saw."""
    if views := whole(state, (REPLICA_1, VICTIM)):
        raise NotOk(f"before the kill the routers do not list {REPLICA_1} and {VICTIM} healthy "
                    f"(alone): {views}")  # fmt: skip
    endpoint = f"http://{cfg.floating_address().split('/')[0]}:{API_PORT}"
    with Traffic(endpoint, threads=THREADS, timeout=STREAM_TIMEOUT_S) as client:
        deadline = time.monotonic() + 60
        while client.counts["200"] < THREADS and time.monotonic() < deadline:
            time.sleep(0.5)
        if client.failures or client.counts["200"] < THREADS:
            raise NotOk(f"requests failed (or too few answered) before the kill: {client.counts}")
        stopped = time.monotonic()  # before the kill: a stream may fail as it happens
        capacity = Capacity(state, (REPLICA_1, SPARE), stopped)
        lab.stop_host(VICTIM, cfg, log=lab.quiet_log)
        capacity.start()
        try:
            code, said = k2("watch", str(inventory), "--once", "--max-hosts", str(MAX_HOSTS),
                            runs=runs)  # fmt: skip
            healed = time.monotonic()
            if code != 0:
                raise NotOk(f"watch --once exited {code}:\n{said[-4000:]}")
            for phrase in (f"heal: {VICTIM} (unreachable: ",
                           f"{SPARE} takes its place in replica-2"):  # fmt: skip
                if phrase not in said:
                    raise NotOk(f"watch --once did not say {phrase!r}:\n{said[-4000:]}")
            full = capacity.whole_after(healed, healed + CAPACITY_S)
        finally:
            capacity.stopping.set()
            capacity.join()
        if full is None or capacity.first is None:
            raise NotOk(f"the routers did not list {REPLICA_1} and {SPARE} healthy within "
                        f"{CAPACITY_S:.0f} s of the heal's end: "
                        f"{listed(state, capacity.last)}")  # fmt: skip
        time.sleep(TAIL_S)
    window = client.since(stopped)
    lost = tuple(a for a in window if a.outcome != "200")
    return Kill(heal_s=healed - stopped, first_s=capacity.first - stopped,
                capacity_s=full - stopped, dips=tuple(capacity.dips), sent=len(window), lost=lost,
                lost_after_capacity=sum(a.started >= full for a in lost))  # fmt: skip


def give_back(state: lab.LabState, inventory: Path, runs: Path) -> None:
    """VICTIM's instance back on it and SPARE a spare again (`return`); NotOk if not."""
    code, said = k2("return", str(inventory), VICTIM, runs=runs)
    if code != 0:
        raise NotOk(f"return {VICTIM} exited {code}:\n{said[-4000:]}")
    if left := read_state(inventory).substitutes:
        raise NotOk(f"after return {VICTIM} the state file still records {left}")
    deadline = time.monotonic() + CAPACITY_S
    while views := whole(state, (REPLICA_1, VICTIM)):
        if time.monotonic() > deadline:
            raise NotOk(f"after return {VICTIM} the routers do not list {REPLICA_1} and "
                        f"{VICTIM} healthy within {CAPACITY_S:.0f} s: {views}")  # fmt: skip
        time.sleep(POLL_S)


def dips_text(kill: Kill) -> str:
    shown = ", ".join(f"{d.start:.1f}-{d.end:.1f} s ({d.what})" for d in kill.dips if d.end)
    return f": {shown}" if shown else ""


def lost_text(kill: Kill) -> str:
    shown = ", ".join(f"{a.outcome} after {a.ended - a.started:.1f} s" for a in kill.lost[:8])
    more = f", {len(kill.lost) - 8} more" if len(kill.lost) > 8 else ""
    return f" ({shown}{more})" if shown else ""


def run_kills(kills: int, cfg: LabConfig, work: Path, outcome: Outcome) -> list[Kill]:
    """The fleet applied, then killed `kills` times; the kills that were ok (the first that
    is not ends them)."""
    inventory = work / "heal.ini"
    state = lab.up(sum(GROUPS.values()), inventory=inventory, groups=GROUPS,
                   all_vars=fleet_vars(cfg.floating_address()), cfg=cfg)  # fmt: skip
    build_standin(cfg)
    for h in state.hosts:
        on_host(state, h.name, f"docker rm -f $(docker ps -aq --filter name=k2-) >/dev/null "
                               f"2>&1; {WRITE_CHECKPOINT}")  # fmt: skip
    apply(inventory, work / "apply")
    found: list[Kill] = []
    for n in range(1, kills + 1):
        try:
            try:
                kill = one_kill(state, inventory, work / f"watch{n}", cfg)
            finally:
                state = lab.start_host(VICTIM, cfg, log=lab.quiet_log)
            give_back(state, inventory, work / f"return{n}")
        except NotOk as failed:
            outcome.not_ok(f"kill {n}/{kills}", str(failed))
            break
        found.append(kill)
        print(f"kill {n}/{kills}: {VICTIM} stopped, healed onto {SPARE}: after the stop, full "
              f"capacity first at {kill.first_s:.1f} s, for good at {kill.capacity_s:.1f} s "
              f"({len(kill.dips)} dip(s) between{dips_text(kill)}), the heal's end at "
              f"{kill.heal_s:.1f} s; "
              f"{len(kill.lost)} lost of {kill.sent} sent{lost_text(kill)}, "
              f"{kill.lost_after_capacity} after full capacity for good", flush=True)  # fmt: skip
    return found


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    cfg = LabConfig(
        lab_dir=default_lab_dir(),
        name=os.environ.get("K2_LAB_NAME", "k2heal"),
        subnet=os.environ.get("K2_LAB_SUBNET", "10.83.0.0/24"),
    )
    work = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    outcome = Outcome()
    kills: list[Kill] = []
    load_before = os.getloadavg()[0]
    try:
        kills = run_kills(args.kills, cfg, work, outcome)
    except NotOk as failed:
        outcome.not_ok("fleet", str(failed))
    finally:
        lab.down(cfg)
    if kills:
        print(f"\nreplica-2's host dies (lab stop), `watch --once --max-hosts {MAX_HOSTS}` heals "
              f"it onto the spare; {THREADS} clients streaming through the floating address; "
              f"routers asked every {POLL_S} s; {os.cpu_count()} CPUs, load average "
              f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
        print(f"{'kills':>5}{'full capacity for good':>25}{'first full capacity':>22}"
              f"{'heal end':>22}{'dips':>6}{'lost':>6}{'of sent':>9}")  # fmt: skip
        print(f"{'':>5}{'min / median / max s':>25}{'min / median / max s':>22}"
              f"{'min / median / max s':>22}")  # fmt: skip
        print(f"{len(kills):>5}{spread([k.capacity_s for k in kills]):>25}"
              f"{spread([k.first_s for k in kills]):>22}{spread([k.heal_s for k in kills]):>22}"
              f"{sum(len(k.dips) for k in kills):>6}{sum(len(k.lost) for k in kills):>6}"
              f"{sum(k.sent for k in kills):>9}")  # fmt: skip
    return outcome.finish()


if __name__ == "__main__":
    raise SystemExit(run_main(main))
