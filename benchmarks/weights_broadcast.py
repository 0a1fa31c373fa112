#!/usr/bin/env python3
"""Benchmark: pipelined chain versus controller fan-out, on shaped links (not a test).

For each N of ``--hosts`` (default 4 8 16 32), one run times the chain (seed -> h1 -> h2 ->
... -> hN, each host forwarding while it receives) and the fan-out baseline (the seed
streams the whole set to each of the N hosts itself, over its one link), and prints

    efficiency = (size / link rate) / time

for each, and their ratio. The chain should stay near 1 whatever N; the fan-out falls as 1/N.

The link rate is picked per N from what this machine can sustain, so that the machine, not
the relay, is never what is measured: N hosts writing at the link rate must stay under
``--disk-share`` of the measured write bandwidth of the destination (written with the
relay's fdatasync pattern), and N relaying hops (each costing about ``HOP_COST`` times a
sha256 of its bytes) under ``--cpu-share`` cores at the measured sha256 rate; capped at
``--max-mbit``. The chain's set is what the link moves in ``--seconds``; the fan-out's set
is 1/N of it, so both runs take about the same time (efficiency is normalised by size).

Scratch: the chain run at N holds the source and N copies of its set, (N + 1) x set. The
tmpfs is sized from that for the largest N, at most ``--mem-share`` of the memory available;
where the space is short (or ``--tmpfs-gb`` is given), the link rate of that N is lowered so
its set fits (``--keep-rate`` keeps the rate: the run then fails, and says so).

Each chain run prints where its time goes (forming: the chain links; filling: until the last
host's first byte; steady: until the seed's last byte; draining: until the end), from the
relays' own progress events, and the share of all cores busy meanwhile (any process), the
relays' own share and how long the most delayed relay waited for a core (its threads' run
queue wait, /proc/PID/task/TID/schedstat). A run that is not ok, or in which a relay waited
for a core longer than ``--wait-limit`` of the run (machine-bound: its time measures this
machine), prints ``NOT OK`` and its reason instead of an efficiency; a machine-bound N is run
again at half the rate (``--retries``). The markdown table lists only the N whose runs are all
ok, and the script exits 1 if any run was not.

Two ways to get hosts:

``--mode netns`` (default; root): builds its own hosts now. One network namespace per host
(``k2wb-h1`` ...) plus one for the seed (``k2wb-c``), each with a veth to a bridge in
``k2wb-sw``, and a ``tc tbf`` shaper on both directions of every veth, so every host (and
the seed) has one full-duplex link of that rate. Files go to a tmpfs under ``--workdir``.
Everything it made is removed by name at the end.

``--mode lab --lab-hosts FILE``: hosts someone else built (the k2provision lab with its
shaping option, or real machines), shaped by their owner to ``--max-mbit``, which is then
the rate used. FILE is JSON::

    {"seed": {"netns": "k2lab-c"},
     "hosts": [{"address": "10.77.0.11", "netns": "k2lab-h1", "dest": "/var/tmp/k2w"},
               {"address": "10.0.0.12", "ssh": "root@10.0.0.12",
                "remote_script": "/opt/k2provision/relay.pyz", "dest": "/data/k2w"}]}

where each entry gives one launcher: ``netns`` (nsenter into that network namespace on
this machine), ``ssh`` (relay.pyz already copied to ``remote_script``) or ``"local": true``.

Example (as root)::

    .venv/bin/python benchmarks/weights_broadcast.py --hosts 4 8 16 32
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.outcome import NotOk, Outcome
from benchmarks.outcome import run as run_main
from benchmarks.relay_harness import (
    Broadcast,
    BroadcastResult,
    Launcher,
    Mode,
    RelayEvent,
    Target,
    failure,
    local_launcher,
    nsenter_launcher,
    ssh_launcher,
    write_shards,
)
from k2provision.weights.manifest import Manifest, manifest_from_dir

PREFIX = "k2wb"
PORT = 29517
HOP_COST = 4.0  # a relaying hop's CPU per byte, in sha256s of it (see benchmarks/weights_cost.py)
SCRATCH_MARGIN = 1.05  # tmpfs bytes per byte of set (inodes, the manifest, partial pages)
SCRATCH_RESERVE = 64 << 20  # tmpfs bytes beyond the sets
PROGRESS_INTERVAL = 0.5  # seconds between a relay's progress events: the phases' resolution


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr.strip()}")
    return done


# ----------------------------------------------------------------------------- own namespaces


@dataclass
class NetnsLab:
    """Namespaces + veths + bridge + tc shaping, made and removed by name."""

    hosts: int
    mbit: float
    subnet: str = "10.97.0"
    mtu: int = 1500
    made: bool = False
    prefix: str = PREFIX
    """What every namespace and veth is named after (another benchmark's own: no clash)."""

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def ns(self, i: int) -> str:
        """Namespace of host i (1..N); 0 is the seed."""
        return f"{self.prefix}-c" if i == 0 else f"{self.prefix}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{1 if i == 0 else 10 + i}"

    def names(self) -> list[str]:
        return [self.switch] + [self.ns(i) for i in range(self.hosts + 1)]

    def down(self) -> None:
        existing = set(sh("ip", "netns", "list", check=False).stdout.split())
        for name in self.names():
            if name in existing:
                sh("ip", "netns", "del", name, check=False)
        # A veth half left in the root namespace by an interrupted setup.
        for i in range(self.hosts + 1):
            sh("ip", "link", "del", f"{self.prefix}{i}a", check=False)

    def shaper(self) -> list[str]:
        burst = max(32 * 1024, int(self.mbit * 1e6 / 8 / 250 * 2))
        return ["tbf", "rate", f"{self.mbit:.3f}mbit", "burst", str(burst), "latency", "100ms"]

    def shape(self, mbit: float) -> None:
        """Every link to ``mbit`` in both directions."""
        self.mbit = mbit
        for i in range(self.hosts + 1):
            ns, inner, outer = self.ns(i), f"{self.prefix}{i}a", f"{self.prefix}{i}b"
            sh("tc", "-n", ns, "qdisc", "replace", "dev", inner, "root", *self.shaper())
            sh("tc", "-n", self.switch, "qdisc", "replace", "dev", outer, "root", *self.shaper())

    def up(self) -> None:
        self.down()
        self.made = True
        shape = self.shaper()
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.hosts + 1):
            ns, inner, outer = self.ns(i), f"{self.prefix}{i}a", f"{self.prefix}{i}b"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", inner, "mtu", str(self.mtu), "type", "veth",
               "peer", "name", outer, "mtu", str(self.mtu))  # fmt: skip
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "netns", self.switch)
            sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", self.switch, "link", "set", outer, "master", "br0")
            sh("ip", "-n", self.switch, "link", "set", outer, "up")
            sh("tc", "-n", ns, "qdisc", "add", "dev", inner, "root", *shape)  # uplink
            sh("tc", "-n", self.switch, "qdisc", "add", "dev", outer, "root", *shape)  # down
        sh("ip", "netns", "exec", self.ns(0), "ping", "-c", "1", "-W", "2",
           self.address(self.hosts), check=False)  # fmt: skip


class Tmpfs:
    """A tmpfs of ``size_bytes`` mounted at ``path`` (a limit: memory is taken as it fills)."""

    def __init__(self, path: Path, size_bytes: int, prefix: str = PREFIX) -> None:
        self.path = path
        self.size = size_bytes
        path.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", f"{prefix}-data", str(path))

    def resize(self, size_bytes: int) -> None:
        sh("mount", "-o", f"remount,size={size_bytes}", str(self.path))
        self.size = size_bytes

    def close(self) -> None:
        sh("umount", str(self.path), check=False)


# ----------------------------------------------------------------------------- lab hosts


@dataclass
class Host:
    address: str
    dest: Path
    launcher: Launcher
    remote: str = ""  # ssh destination when the dest is on another machine
    port: int = PORT


def launcher_of(spec: dict[str, Any], python: str) -> tuple[Launcher, str]:
    if spec.get("netns"):
        return nsenter_launcher(str(spec["netns"]), python=python), ""
    if spec.get("ssh"):
        remote = str(spec["ssh"])
        script = str(spec.get("remote_script", "/opt/k2provision/relay.pyz"))
        return ssh_launcher(
            remote, remote_script=script, python=spec.get("python", "python3")
        ), remote
    return local_launcher(python), ""


def lab_hosts(path: Path, python: str) -> tuple[Launcher, list[Host]]:
    data = json.loads(path.read_text())
    seed, _ = launcher_of(data.get("seed", {"local": True}), python)
    hosts = []
    for spec in data["hosts"]:
        launcher, remote = launcher_of(spec, python)
        hosts.append(Host(str(spec["address"]), Path(spec["dest"]), launcher, remote,
                          int(spec.get("port", PORT))))  # fmt: skip
    return seed, hosts


def wipe(host: Host, dest: Path) -> None:
    if host.remote:
        sh("ssh", "-o", "BatchMode=yes", host.remote, f"rm -rf -- '{dest}'", check=False)
    else:
        shutil.rmtree(dest, ignore_errors=True)


# ----------------------------------------------------------------------------- sizing


def efficiency(size: int, mbit: float, seconds: float) -> float:
    return (size * 8 / (mbit * 1e6)) / seconds if seconds > 0 else 0.0


def write_bandwidth(directory: Path, total: int = 256 << 20) -> float:
    """Bytes/s written to ``directory`` the way the relay writes (8 MiB writes, fdatasync
    every 64 MiB)."""
    path = directory / ".k2wb-write-test"
    block = os.urandom(8 << 20)
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(max(1, total // len(block))):
            os.write(fd, block)
            if (i + 1) % 8 == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return max(1, total // len(block)) * len(block) / (time.monotonic() - t0)


def hash_rate(total: int = 256 << 20) -> float:
    """Bytes/s of sha256 in one thread."""
    block = os.urandom(8 << 20)
    h = hashlib.sha256()
    t0 = time.monotonic()
    for _ in range(total // len(block)):
        h.update(block)
    return total / (time.monotonic() - t0)


def pick_mbit(
    n: int,
    *,
    write_bps: float,
    hash_bps: float,
    max_mbit: float,
    disk_share: float,
    cpu_share: float,
    seconds: float,
    space: float = float("inf"),
) -> float:
    """The link rate for N hosts: N hosts writing under the disk's share, N relaying hops
    under the CPU's share, the chain run's N+1 copies of its set (``seconds`` of the link)
    inside the scratch ``space``; at most ``max_mbit``."""
    by_disk = disk_share * write_bps / n
    by_cpu = cpu_share * hash_bps / (HOP_COST * n)
    by_space = max(0.0, space - SCRATCH_RESERVE) / (SCRATCH_MARGIN * (n + 1) * seconds)
    return min(max_mbit * 1e6 / 8, by_disk, by_cpu, by_space) * 8 / 1e6


def set_bytes(mbit: float, seconds: float) -> int:
    """The chain's set: what a link of ``mbit`` moves in ``seconds``."""
    return int(mbit * 1e6 / 8 * seconds)


def scratch_bytes(plan: dict[int, int]) -> int:
    """Scratch a netns run needs for ``plan`` (N -> chain set bytes): its largest chain run
    holds the source and N copies, (N + 1) x set, plus a margin for file system overhead."""
    peak = max(((n + 1) * size for n, size in plan.items()), default=0)
    return int(SCRATCH_RESERVE + SCRATCH_MARGIN * peak)


def mem_available(meminfo: str | None = None) -> int:
    """Bytes of memory available (MemAvailable of /proc/meminfo): a tmpfs lives in it."""
    text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemAvailable in /proc/meminfo")


def free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged writer on the file system that would hold ``path``."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# ----------------------------------------------------------------------------- where time goes


def cpu_times(stat: str | None = None) -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from the first line of /proc/stat."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(x) for x in text.splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields)
    return total - idle, total


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of all cores' time that was busy between two ``cpu_times`` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total if total > 0 else 0.0


def relay_cpu(result: BroadcastResult) -> float:
    """CPU seconds (user + system) the run's relays report for themselves, seed included."""
    reports = [result.seed_cpu, *(h.cpu for h in result.hosts)]
    return sum(c.get("process_user", 0.0) + c.get("process_sys", 0.0) for c in reports)


@dataclass(frozen=True)
class Phases:
    """Where one chain run's seconds go.

    forming: the seed's start until the chain is linked (the seed's ``plan``: every host has
    linked to the next and said what it needs); filling: until the last host's first byte;
    steady: until the seed's last byte (handed to its socket); draining: until the run's end
    (what the hops' socket buffers and shapers still hold crosses the links, is written and
    reported). ``tail_rate`` is the last host's receive rate during the
    steady phase, as a share of the link.
    """

    forming: float
    filling: float
    steady: float
    draining: float
    tail_rate: float

    def line(self) -> str:
        return (f"forming {self.forming:.2f} s, filling {self.filling:.2f} s,"
                f" steady {self.steady:.2f} s (last host at {self.tail_rate:.3f} of the link),"
                f" draining {self.draining:.2f} s")  # fmt: skip


def _crossing(points: list[tuple[float, int]], level: int, rate: float) -> float | None:
    """When a byte counter sampled at ``points`` (time, bytes) reached ``level``, moving at
    ``rate`` bytes/s between samples; None if it never did."""
    prev: tuple[float, int] | None = None
    for t, value in points:
        if value >= level:
            if prev is None:
                return t - (value - level) / rate if rate > 0 else t
            return min(t, max(prev[0], prev[0] + (level - prev[1]) / rate))
        prev = (t, value)
    return None


def phases(
    events: Sequence[RelayEvent], tail: str, start: float, end: float, total: int, link_bps: float
) -> Phases | None:
    """The phases of a chain run from its relays' events (wall times ``t``): ``tail`` is the
    last host's label, ``start``/``end`` the run's wall times, ``link_bps`` bytes/s of a link.
    None when the events do not show every boundary."""
    plan = next((e.data["t"] for e in events if e.source == "seed" and e.event == "plan"), None)
    sent = [(float(e.data["t"]), int(e.data.get("tx", 0)))
            for e in events if e.source == "seed" and e.event == "progress"]  # fmt: skip
    got = [(float(e.data["t"]), int(e.data.get("rx", 0)))
           for e in events if e.source == tail and e.event == "progress"]  # fmt: skip
    first = _crossing(got, 1, link_bps)
    last = _crossing(sent, total, link_bps)
    if plan is None or first is None or last is None:
        return None
    formed = min(max(float(plan), start), end)
    first = min(max(first, formed), end)
    last = min(max(last, first), end)
    inside = [(t, rx) for t, rx in got if first <= t <= last]
    tail_rate = 0.0
    if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
        moved = inside[-1][1] - inside[0][1]
        tail_rate = moved / (inside[-1][0] - inside[0][0]) / link_bps
    return Phases(formed - start, first - formed, last - first, end - last, tail_rate)


# ----------------------------------------------------------------------------- runs


def schedstat_wait(text: str) -> float:
    """Seconds a thread waited on a run queue for a core, from its /proc/.../schedstat."""
    return int(text.split()[1]) / 1e9


class CpuWait:
    """How long each relay's threads waited for a core: their ``schedstat`` sampled every
    ``interval`` seconds while they run (a thread's last sample counts once it is gone)."""

    def __init__(self, pids: dict[str, int], interval: float = 0.2) -> None:
        self.pids = pids
        self.interval = interval
        self.last: dict[tuple[str, str], float] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for label, pid in self.pids.items():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    text = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text()
                except OSError:
                    continue
                self.last[(label, tid)] = schedstat_wait(text)

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.sample()

    def __enter__(self) -> CpuWait:
        self.sample()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()

    def waited(self) -> dict[str, float]:
        out: dict[str, float] = dict.fromkeys(self.pids, 0.0)
        for (label, _), seconds in self.last.items():
            out[label] += seconds
        return out


@dataclass
class Run:
    """One run's outcome: the harness's result, the relays' events, the machine meanwhile."""

    result: BroadcastResult
    events: list[RelayEvent]
    start: float  # wall time of the seed's start
    busy: float  # share of all cores busy during the run (any process)
    load: float  # 1-minute load average at the end
    waited: dict[str, float]  # relay label -> seconds its threads waited for a core

    @property
    def relay_share(self) -> float:
        """The relays' own CPU as a share of all cores over the run."""
        cores = os.cpu_count() or 1
        return relay_cpu(self.result) / (max(self.result.seconds, 1e-6) * cores)

    @property
    def wait_share(self) -> tuple[str, float]:
        """The relay that waited longest for a core, and that wait as a share of the run."""
        label = max(self.waited, key=lambda k: self.waited[k], default="")
        return label, self.waited.get(label, 0.0) / max(self.result.seconds, 1e-6)

    def machine(self) -> str:
        label, share = self.wait_share
        return (f"CPU busy {self.busy:.0%} of {os.cpu_count()} cores"
                f" (relays {self.relay_share:.0%}), load average {self.load:.1f};"
                f" {label} waited longest for a core: {share:.1%} of the run")  # fmt: skip


def verdict(run: Run, wait_limit: float) -> str:
    """Why a run gives no figure ("" when it does): not ok, or bound by the machine (a relay
    waited for a core longer than ``wait_limit`` of the run)."""
    if not run.result.ok:
        return failure(run.result)
    if run.wait_share[1] > wait_limit:
        return (f"machine-bound: {run.machine()}, over the limit of {wait_limit:.0%}; its time"
                " measures this machine, not the relay")  # fmt: skip
    return ""


def write_set(directory: Path, size: int, files: int) -> Manifest:
    shutil.rmtree(directory, ignore_errors=True)
    write_shards(directory, files, max(64 << 10, size // files))
    (directory / "config.json").unlink()
    return manifest_from_dir(directory, model="bench/synthetic", revision="bench")


def run_one(
    mode: Mode,
    n: int,
    manifest: Manifest,
    source: Path,
    seed: Launcher,
    hosts: Sequence[Host],
    args: argparse.Namespace,
) -> Run:
    chosen = hosts[:n]
    targets = []
    for i, h in enumerate(chosen, start=1):
        dest = h.dest / f"n{n}-{mode}" / f"h{i}"
        wipe(h, dest)
        targets.append(Target(host=h.address, dest=str(dest), launcher=h.launcher,
                              port=h.port, listen="0.0.0.0", name=f"h{i}"))  # fmt: skip
    events: list[RelayEvent] = []
    with Broadcast(
        manifest,
        source,
        targets,
        mode=mode,
        seed_launcher=seed,
        chunk_size=args.chunk_mb << 20,
        io_timeout=60.0,
        connect_timeout=10.0,
        progress_interval=PROGRESS_INTERVAL,
        grace=20.0,
        on_event=events.append,
    ) as broadcast:
        before = cpu_times()
        broadcast.start()
        start = time.time() - (time.monotonic() - broadcast.t0)
        pids = {label: r.proc.pid for label, r in broadcast.relays.items()}
        if broadcast.seed is not None:
            pids["seed"] = broadcast.seed.proc.pid
        with CpuWait(pids) as wait:
            result = broadcast.wait()
        busy = busy_share(before, cpu_times())
    for h, t in zip(chosen, targets, strict=True):
        wipe(h, Path(t.dest))
    return Run(result, events, start, busy, os.getloadavg()[0], wait.waited())


def report(n: int, mode: str, mbit: float, total: int, run: Run, why: str, outcome: Outcome
           ) -> dict[str, Any]:  # fmt: skip
    """Print one run: its figures, or (``why`` not empty) NOT OK and the reason, no figure.
    Returns its row for the JSON file and the table (an efficiency only when it is ok)."""
    row: dict[str, Any] = {"hosts": n, "mode": mode, "mbit": mbit, "bytes": total,
                           "ok": not why, "busy": run.busy, "waited": run.waited,
                           "relay_share": run.relay_share, "load": run.load}  # fmt: skip
    if why:
        row["reason"] = why
        outcome.not_ok(f"N={n} {mode}", why)
        return row
    e = efficiency(total, mbit, run.result.seconds)
    row.update(seconds=run.result.seconds, efficiency=e)
    print(f"{n:>3} {mode:<7} {mbit:>7.1f} {total / 1e6:>7.1f} {run.result.seconds:>8.2f}"
          f" {e:>10.3f}", file=outcome.out, flush=True)  # fmt: skip
    ph = None
    if mode == "chain":
        end = run.start + run.result.seconds
        ph = phases(run.events, f"h{n}", run.start, end, total, mbit * 1e6 / 8)
        row["phases"] = asdict(ph) if ph else None
    where = f"{ph.line()}; " if ph else ""
    print(f"    {where}{run.machine()}", file=outcome.out, flush=True)
    return row


def markdown_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The results table: one line per N whose chain and fan-out runs are both ok."""
    lines = []
    for n in dict.fromkeys(r["hosts"] for r in rows):
        ok = {r["mode"]: r for r in rows if r["hosts"] == n and r["ok"]}
        if "chain" not in ok or "fanout" not in ok:
            continue
        ce, fe = ok["chain"]["efficiency"], ok["fanout"]["efficiency"]
        cells = [f"{ok['chain']['mbit']:.1f}", f"{ce:.3f}", f"{fe:.3f}", f"{fe * n:.2f}"]
        lines.append(f"| {n} | {' | '.join(cells)} | {ce / fe:.2f}x |")
    if not lines:
        return []
    return ["", "| hosts | link Mbit/s | chain | fan-out | fan-out x N | chain / fan-out |",
            "| --- | --- | --- | --- | --- | --- |", *lines]  # fmt: skip


def lab_space(hosts: Sequence[Host], plan: dict[int, int]) -> dict[int, str]:
    """For hosts on this machine (netns, local): N -> why the space is short ("" if not)."""
    short: dict[int, str] = {}
    for n, size in plan.items():
        need: dict[int, tuple[Path, int]] = {}
        for h in hosts[:n]:
            if h.remote:
                continue  # another machine's disk: its owner sized it
            probe = h.dest
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            dev = probe.stat().st_dev
            path, count = need.get(dev, (h.dest, 0))
            need[dev] = (path, count + 1)
        for path, count in need.values():
            if free_bytes(path) < count * size * SCRATCH_MARGIN:
                short[n] = (f"{count} hosts x {size / 1e9:.2f} GB do not fit in the"
                            f" {free_bytes(path) / 1e9:.2f} GB free under {path}")  # fmt: skip
    return short


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=30.0, help="one link-time of a set")
    parser.add_argument("--files", type=int, default=6, help="number of shards")
    parser.add_argument("--max-mbit", type=float, default=400.0, help="highest link rate")
    parser.add_argument("--disk-share", type=float, default=0.5,
                        help="share of the write bandwidth N hosts may use")  # fmt: skip
    parser.add_argument("--cpu-share", type=float, default=0.4,
                        help="cores the N relaying hops may use")  # fmt: skip
    parser.add_argument("--wait-limit", type=float, default=0.05,
                        help="share of a run a relay may wait for a core; above it the run is"
                             " machine-bound and gives no figure")  # fmt: skip
    parser.add_argument("--retries", type=int, default=1,
                        help="runs again at half the link rate when machine-bound")  # fmt: skip
    parser.add_argument("--tmpfs-gb", type=float,
                        help="netns mode: scratch tmpfs size (default: sized from the sets"
                             " and N, at most --mem-share of available memory)")  # fmt: skip
    parser.add_argument("--mem-share", type=float, default=0.5,
                        help="netns mode: most of the free memory the tmpfs takes")  # fmt: skip
    parser.add_argument("--keep-rate", action="store_true",
                        help="do not lower a link rate to fit the sets in the scratch space"
                             " (a run that does not fit then fails, and says so)")  # fmt: skip
    parser.add_argument("--mode", choices=["netns", "lab"], default="netns")
    parser.add_argument("--lab-hosts", type=Path, help="JSON host list for --mode lab")
    parser.add_argument("--runs", nargs="+", choices=["chain", "fanout"],
                        default=["chain", "fanout"])  # fmt: skip
    parser.add_argument("--chunk-mb", type=int, default=4, help="data frame size, MiB")
    parser.add_argument("--workdir", type=Path, help="scratch dir (default: a new temp dir)")
    parser.add_argument("--subnet", default="10.97.0", help="netns mode: first three octets")
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--python", default=sys.executable, help="interpreter for relays")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    if args.mode == "lab" and not args.lab_hosts:
        parser.error("--mode lab needs --lab-hosts FILE")
    if args.mode == "netns" and os.geteuid() != 0:
        parser.error("--mode netns builds namespaces and mounts a tmpfs: run as root")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    lab: NetnsLab | None = None
    tmpfs: Tmpfs | None = None

    def cleanup() -> None:
        nonlocal lab, tmpfs
        if lab is not None and lab.made:
            lab.down()
            lab.made = False
        if tmpfs is not None:
            tmpfs.close()
            tmpfs = None

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    outcome = Outcome()

    hash_bps = hash_rate()
    space = float("inf")
    available = mem_available()
    if args.mode == "netns":
        space = args.tmpfs_gb * 1e9 if args.tmpfs_gb else args.mem_share * available
        if space > available:
            raise NotOk(f"a tmpfs of {space / 1e9:.2f} GB does not fit in the"
                        f" {available / 1e9:.2f} GB of memory available")  # fmt: skip
        tmpfs = Tmpfs(workdir, int(space))
        write_bps = write_bandwidth(workdir, min(256 << 20, int(space) // 2))
    else:
        write_bps = float("inf")
    plan: dict[int, tuple[float, int]] = {}
    for n in args.hosts:
        if args.mode == "netns":
            mbit = pick_mbit(n, write_bps=write_bps, hash_bps=hash_bps, max_mbit=args.max_mbit,
                             disk_share=args.disk_share, cpu_share=args.cpu_share,
                             seconds=args.seconds,
                             space=float("inf") if args.keep_rate else space)  # fmt: skip
        else:
            mbit = args.max_mbit
        plan[n] = (mbit, set_bytes(mbit, args.seconds))
    print(f"write bandwidth {write_bps / 1e6:.0f} MB/s, sha256 {hash_bps / 1e6:.0f} MB/s per core,"
          f" load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores,"
          f" {available / 1e9:.1f} GB memory available")  # fmt: skip
    for n, (mbit, size) in plan.items():
        print(f"  N={n}: links at {mbit:.1f} Mbit/s, chain set {size / 1e6:.1f} MB,"
              f" fan-out set {size / n / 1e6:.1f} MB, scratch for the chain run"
              f" {scratch_bytes({n: size}) / 1e9:.2f} GB")  # fmt: skip
    short: dict[int, str] = {}
    if tmpfs is not None:
        need = scratch_bytes({n: size for n, (_, size) in plan.items()})
        if args.tmpfs_gb is None:
            tmpfs.resize(int(min(need, space)))
        print(f"scratch: a {tmpfs.size / 1e9:.2f} GB tmpfs at {workdir}; the largest chain run"
              f" needs {need / 1e9:.2f} GB")  # fmt: skip
        for n, (_, size) in plan.items():
            if scratch_bytes({n: size}) > tmpfs.size:
                print(f"  N={n}: {n + 1} x {size / 1e9:.2f} GB does not fit: its chain run"
                      " will fail")  # fmt: skip
    elif args.mode == "lab":
        lab_seed, lab_list = lab_hosts(args.lab_hosts, args.python)
        short = lab_space(lab_list, {n: size for n, (_, size) in plan.items()})

    if args.mode == "netns":
        lab = NetnsLab(max(args.hosts), plan[args.hosts[0]][0], args.subnet, args.mtu)
        print(f"building {lab.hosts} hosts + seed ...", flush=True)
        lab.up()
        seed = nsenter_launcher(lab.ns(0), python=args.python)
        hosts = [Host(lab.address(i), workdir / "hosts", nsenter_launcher(lab.ns(i), args.python))
                 for i in range(1, lab.hosts + 1)]  # fmt: skip
    else:
        seed, hosts = lab_seed, lab_list
        if len(hosts) < max(args.hosts):
            parser.error(
                f"{args.lab_hosts} lists {len(hosts)} hosts, --hosts wants {max(args.hosts)}"
            )

    rows: list[dict[str, Any]] = []
    started_all = time.monotonic()
    head = f"{'N':>3} {'mode':<7} {'Mbit/s':>7} {'MB':>7} {'seconds':>8} {'efficiency':>10}"
    print(f"\n{head}", flush=True)
    for n in args.hosts:
        mbit, size = plan[n]
        if n in short:
            for mode in args.runs:
                outcome.not_ok(f"N={n} {mode}", short[n])
            continue
        for attempt in range(args.retries + 1):
            if lab is not None:
                lab.shape(mbit)
            done: dict[str, tuple[Run, int, str]] = {}
            for mode in args.runs:
                set_size = size if mode == "chain" else max(size // n, args.files << 16)
                manifest = write_set(workdir / "source", set_size, args.files)
                run = run_one(mode, n, manifest, workdir / "source", seed, hosts, args)
                done[mode] = (run, manifest.total_bytes, verdict(run, args.wait_limit))
            bound = [m for m, (r, _, why) in done.items() if r.result.ok and why]
            if not bound or attempt == args.retries:
                break
            print(f"{n:>3} machine-bound at {mbit:.1f} Mbit/s ({done[bound[0]][0].machine()}):"
                  f" again at {mbit / 2:.1f} Mbit/s", flush=True)  # fmt: skip
            mbit, size = mbit / 2, size // 2
        for mode, (run, total, why) in done.items():
            rows.append(report(n, mode, mbit, total, run, why, outcome))
        ok = {r["mode"]: r for r in rows if r["hosts"] == n and r["ok"]}
        if "chain" in ok and "fanout" in ok:
            ratio = ok["chain"]["efficiency"] / ok["fanout"]["efficiency"]
            print(f"{n:>3} chain/fanout = {ratio:.2f}  (fan-out ideal 1/N = {1 / n:.3f})",
                  flush=True)  # fmt: skip
    print(f"\nwhole run: {time.monotonic() - started_all:.0f} s;"
          f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for line in markdown_table(rows):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    cleanup()
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome.finish()


if __name__ == "__main__":
    sys.exit(run_main(main))
