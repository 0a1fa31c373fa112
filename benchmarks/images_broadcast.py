#!/usr/bin/env python3
"""Benchmark: a container image onto N hosts, relay chain versus registry pull, on shaped
links (not a test).

For each N of ``--hosts`` (default 4 8 16), one run times each way of putting one image of
``--size-mb`` (one layer of random bytes) on N hosts, from the start until the last host holds
it, verified (its image ID equal to the source's), and prints

    efficiency = (size / link rate) / time

for each (size: the image's ``docker save`` archive), and their ratio:

``chain``: the image, saved once as a docker-archive (``podman save``), is streamed by the
weights' relay (relay.pyz, as in weights_broadcast.py) from the seed down the chain of N
hosts, each forwarding while it receives; each host loads its copy into its own store
(``podman load``) as soon as its relay has verified it.

``pull``: a registry (Debian's ``docker-registry``) in the seed's namespace holds the image,
pushed before the clock starts; the N hosts run ``podman pull`` at once, each into its own
store, sharing the seed's one link. The layer is random, so it does not compress: the
registry holds it gzipped at about its size, and each pull also pays the decompression, as
real pulls do.

Each run also splits its time: ``transfer`` until the last host's bytes were all there (chain:
its relay verified the archive; pull: the registry's access log says the layer's response
was done) and ``load`` from there to its verified image. The N loads run at once on this
machine's cores, where real hosts each have their own: one host loading (and pulling over
loopback, no link) alone is timed first for comparison, and each run prints how busy the
cores were, and how much of that was its own processes (busy near 100% means the run
measures this machine; busy well above its own share, other jobs on it).

Hosts are weights_broadcast's: one network namespace per host (``k2ib-h1`` ...) and one for
the seed (``k2ib-c``) on a bridge (``k2ib-sw``), every veth shaped with ``tc tbf`` in both
directions. The link rate of each N is weights_broadcast's ``pick_mbit`` (N relaying hops
within ``--cpu-share`` cores at this machine's sha256 rate), at most ``--max-mbit``;
``--mbit`` sets one rate for all. Podman runs inside each host's namespace (``nsenter --net``)
on its own store (vfs driver: one layer, so overlay would write the same bytes), with runc,
cgroupfs and file events; never the lab's store. Everything lives on a tmpfs sized for three
copies of the image per host (archive, podman's temporary copy, layer) and three for the
seed, at most ``--mem-share`` of the available memory. A run whose image is not verified on every
host prints NOT OK and its reason, no figure, and the script exits 1. Everything it made
(namespaces, registry, processes, tmpfs) is removed at the end, also on Ctrl-C or SIGTERM.

Example (as root, about 10 minutes on 2 cores)::

    .venv/bin/python benchmarks/images_broadcast.py --hosts 4 8 16
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import weights_broadcast as wb
from benchmarks.outcome import NotOk, Outcome
from benchmarks.outcome import run as run_main
from benchmarks.relay_harness import Broadcast, RelayEvent, Target, failure, nsenter_launcher
from k2provision.weights.manifest import Manifest, manifest_from_dir

PREFIX = "k2ib"
RELAY_PORT = 29527
REGISTRY_PORT = 29528
REPO = "bench/image"
ARCHIVE = "image.tar"
VERIFIED = ("received", "repaired", "skipped")  # a relay's file events for a verified copy
STEP_TIMEOUT = 900.0  # seconds one podman command may take
CONTAINERS_CONF = (
    "# images_broadcast.py: runc, and ulimits within what podman may grant here.\n"
    '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]\n'
    '[engine]\nruntime = "runc"\n[network]\nnetwork_backend = "netavark"\n'
)
ACCESS_LINE = re.compile(
    r'^(?P<client>\S+) \S+ \S+ \[[^]]*\] "GET /v2/\S+/blobs/(?P<digest>sha256:[0-9a-f]{64})'
    r' [^"]*" 200 (?P<bytes>\d+)'
)


def podman_argv(store: Path, *args: str, netns: str | None = None) -> list[str]:
    """podman on the store under ``store`` only (its own root, runroot and libpod tmpdir),
    inside the network namespace ``netns`` when given."""
    enter = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    return [*enter, "podman", "--root", str(store / "root"), "--runroot", str(store / "run"),
            "--tmpdir", str(store / "libpod"), "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs", "--events-backend", "file", *args]  # fmt: skip


def registry_config(root: Path, address: str) -> str:
    """docker-registry's config: blobs under ``root``, HTTP on ``address`` (host:port)."""
    return (f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root}\nhttp:\n  addr: {address}\n")  # fmt: skip


def blob_sent(line: str) -> tuple[str, str, int] | None:
    """(client, digest, bytes) of a registry access-log line for a blob sent whole; else None."""
    m = ACCESS_LINE.match(line)
    return (m["client"], m["digest"], int(m["bytes"])) if m else None


def last_line(text: str) -> str:
    """What a failed command said last; for ``podman load``, which lists why each archive
    format did not fit, its docker-archive reason."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    said = [x for x in lines if x.startswith("* docker-archive:")] or lines
    return said[-1] if said else ""


class RandomBytes:
    """An endless file of random bytes (incompressible), for tarfile."""

    def read(self, size: int = -1) -> bytes:
        return os.urandom(max(size, 0))


# ----------------------------------------------------------------------------- processes


@dataclass
class Scratch:
    """Everything under one scratch directory, and every process started for it."""

    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.conf.write_text(CONTAINERS_CONF)

    @property
    def conf(self) -> Path:
        return self.root / "containers.conf"

    def popen(self, argv: list[str], env: dict[str, str] | None = None, stdin: int | None = None
              ) -> subprocess.Popen[bytes]:  # fmt: skip
        proc = subprocess.Popen(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **(env or {})})  # fmt: skip
        with self.lock:
            self.procs.append(proc)
        return proc

    def podman(self, store: Path, *args: str, netns: str | None = None, check: bool = True,
               tar: tuple[int, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """podman on ``store``; ``tar`` (bytes, name) feeds it a tar of one random file."""
        for sub in ("root", "run", "libpod", "tmp"):
            (store / sub).mkdir(parents=True, exist_ok=True)
        env = {"CONTAINERS_CONF": str(self.conf), "TMPDIR": str(store / "tmp")}
        argv = podman_argv(store, *args, netns=netns)
        proc = self.popen(argv, env, subprocess.PIPE if tar else None)
        if tar is not None:
            assert proc.stdin is not None
            with tarfile.open(fileobj=proc.stdin, mode="w|") as out:
                info = tarfile.TarInfo(tar[1])
                info.size, info.mode, info.mtime = tar[0], 0o644, 0
                out.addfile(info, cast(IO[bytes], RandomBytes()))  # communicate() closes stdin
        try:
            out_b, err_b = proc.communicate(timeout=STEP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out_b, err_b = proc.communicate()
        done = subprocess.CompletedProcess(argv, proc.returncode, out_b.decode(errors="replace"),
                                           err_b.decode(errors="replace"))  # fmt: skip
        if check and done.returncode != 0:
            raise NotOk(f"podman {args[0]} exited {done.returncode}: {last_line(done.stderr)}")
        return done

    def stop(self) -> None:
        """End every process started here that still runs (by its pid, never by name)."""
        with self.lock:
            live = [p for p in self.procs if p.poll() is None]
        for p in live:
            p.terminate()
        for p in live:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Registry:
    """docker-registry in the seed's namespace; notes when each blob response ended, per client."""

    def __init__(self, scratch: Scratch, netns: str, address: str) -> None:
        config = scratch.root / "registry.yml"
        config.write_text(registry_config(scratch.root / "registry", address))
        self.address = address
        self.listening = threading.Event()
        self.sent: list[tuple[float, str, str, int]] = []  # (monotonic, client, digest, bytes)
        self.tail = ""
        self.proc = scratch.popen(["nsenter", f"--net=/run/netns/{netns}", "docker-registry",
                                   "serve", str(config)])  # fmt: skip
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        if not self.listening.wait(20) or self.proc.poll() is not None:
            raise NotOk(f"docker-registry did not start: {last_line(self.tail)}")

    def _read(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        for raw in stream:
            line = raw.decode(errors="replace")
            self.tail = (self.tail + line)[-2000:]
            if "listening on" in line:
                self.listening.set()
            sent = blob_sent(line)
            if sent:
                self.sent.append((time.monotonic(), *sent))

    def layer_done(self, client: str) -> float | None:
        """When the registry finished sending ``client`` its largest blob (the layer)."""
        mine = [(size, t) for t, c, _, size in self.sent if c == client]
        return max(mine)[1] if mine else None


# ----------------------------------------------------------------------------- runs


@dataclass
class HostImage:
    """One host's copy: when its bytes were all there, when its image was, and its ID."""

    name: str
    address: str
    arrived: float | None = None
    done: float | None = None
    image_id: str = ""
    error: str = ""


def verdict(want: str, hosts: Sequence[HostImage], shown: int = 3) -> str:
    """Why a run gives no figure: the hosts without the image ID ``want`` ("" when none)."""
    bad = []
    for h in hosts:
        if h.error:
            bad.append(f"{h.name}: {h.error}")
        elif h.image_id != want:
            bad.append(f"{h.name}: image {h.image_id[:12] or 'missing'} is not {want[:12]}")
    if not bad:
        return ""
    more = f"; {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} of {len(hosts)} hosts without the image ({'; '.join(bad[:shown])}{more})"


def proc_cpu(stat: str) -> float:
    """CPU seconds (user + system) of a process, from its /proc/PID/stat."""
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Timing:
    """One run: seconds to the last verified image, and how they split; why it is not ok."""

    seconds: float
    transfer: float
    alone: float  # seconds one host's load (or pull, over loopback) takes alone
    busy: float  # share of all cores busy during the run (any process)
    own: float  # share of all cores this run's processes used
    load_average: float
    why: str

    @property
    def load(self) -> float:
        return self.seconds - self.transfer

    def machine(self, mode: str) -> str:
        verb = "load" if mode == "chain" else "pull"
        return (f"load tail {self.load:.2f} s (one host's whole {verb} alone {self.alone:.2f} s);"
                f" CPU busy {self.busy:.0%} of {os.cpu_count()} cores, {self.own:.0%} by this"
                f" run; load average {self.load_average:.1f}")  # fmt: skip


@dataclass
class Bench:
    """What the runs share: the hosts, the scratch, the source image and its archive."""

    scratch: Scratch
    lab: wb.NetnsLab
    registry: Registry
    image_id: str
    tag: str
    manifest: Manifest
    python: str
    alone: dict[str, float]  # mode -> seconds one host takes alone (no link)

    def host_dir(self, i: int) -> Path:
        return self.scratch.root / "hosts" / f"h{i}"

    def hosts(self, n: int) -> list[HostImage]:
        for i in range(1, n + 1):
            shutil.rmtree(self.host_dir(i), ignore_errors=True)
        return [HostImage(f"h{i}", self.lab.address(i)) for i in range(1, n + 1)]

    def install(self, i: int, host: HostImage, ref: str, *args: str) -> threading.Thread:
        """In a thread: podman ``args`` on host i's store, then its image ID of ``ref``."""

        def work() -> None:
            store, ns = self.host_dir(i) / "store", self.lab.ns(i)
            for step in (args, ("image", "inspect", "--format", "{{.Id}}", ref)):
                done = self.scratch.podman(store, *step, netns=ns, check=False)
                if done.returncode != 0:
                    host.error = (f"podman {' '.join(step[:2])} exited {done.returncode}:"
                                  f" {last_line(done.stderr)}")  # fmt: skip
                    return
            host.image_id, host.done = done.stdout.strip(), time.monotonic()

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        return thread

    def cpu(self) -> tuple[tuple[int, int], float]:
        """All cores' (busy, total) jiffies, and CPU seconds used by this script, its reaped
        children (podman, relays) and the registry."""
        used = sum(getattr(resource.getrusage(who), f) for f in ("ru_utime", "ru_stime")
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))  # fmt: skip
        with contextlib.suppress(OSError):
            used += proc_cpu(Path(f"/proc/{self.registry.proc.pid}/stat").read_text())
        return wb.cpu_times(), used

    def timing(self, mode: str, start: float, before: tuple[tuple[int, int], float],
               hosts: Sequence[HostImage], why: str) -> Timing:  # fmt: skip
        end = max((h.done or 0.0 for h in hosts), default=start)
        arrived = max((h.arrived or end for h in hosts), default=end)
        after = self.cpu()
        own = (after[1] - before[1]) / (max(time.monotonic() - start, 1e-6) * (os.cpu_count() or 1))
        return Timing(end - start, min(arrived, end) - start, self.alone[mode],
                      wb.busy_share(before[0], after[0]), own, os.getloadavg()[0],
                      why)  # fmt: skip

    def chain(self, n: int) -> Timing:
        hosts = self.hosts(n)
        threads: list[threading.Thread] = []
        targets = [Target(host=h.address, dest=str(self.host_dir(i) / "relay"),
                          launcher=nsenter_launcher(self.lab.ns(i), self.python),
                          port=RELAY_PORT, listen="0.0.0.0", name=h.name)
                   for i, h in enumerate(hosts, start=1)]  # fmt: skip
        index = {h.name: (i, h) for i, h in enumerate(hosts, start=1)}

        def on_event(event: RelayEvent) -> None:
            if event.event == "file" and event.data.get("status") in VERIFIED:
                i, host = index[event.source]
                host.arrived = time.monotonic()
                archive = str(self.host_dir(i) / "relay" / ARCHIVE)
                threads.append(self.install(i, host, f"localhost/{REPO}:{self.tag}", "load",
                                            "-i", archive))  # fmt: skip

        with Broadcast(self.manifest, self.scratch.root / "archive", targets, mode="chain",
                       seed_launcher=nsenter_launcher(self.lab.ns(0), self.python),
                       chunk_size=4 << 20, io_timeout=60.0, connect_timeout=10.0,
                       grace=20.0, on_event=on_event) as run:  # fmt: skip
            before, start = self.cpu(), time.monotonic()
            run.start()
            result = run.wait()
        for t in list(threads):
            t.join(STEP_TIMEOUT)
        for h in hosts:
            if h.arrived is None:
                h.error = "the relay did not deliver the archive"
        why = verdict(self.image_id, hosts)
        if why and not result.ok:
            why = f"{failure(result)}; {why}"
        return self.timing("chain", start, before, hosts, why)

    def pull(self, n: int) -> Timing:
        hosts = self.hosts(n)
        ref = f"{self.registry.address}/{REPO}:{self.tag}"
        self.registry.sent.clear()
        before, start = self.cpu(), time.monotonic()
        threads = [self.install(i, h, ref, "pull", "--tls-verify=false", ref)
                   for i, h in enumerate(hosts, start=1)]  # fmt: skip
        for t in threads:
            t.join(STEP_TIMEOUT)
        for h in hosts:
            h.arrived = self.registry.layer_done(h.address)
        return self.timing("pull", start, before, hosts, verdict(self.image_id, hosts))


# ----------------------------------------------------------------------------- output


HEAD = (f"{'N':>3} {'mode':<6} {'Mbit/s':>7} {'MB':>7} {'seconds':>8} {'transfer':>8}"
        f" {'load':>6} {'efficiency':>10}")  # fmt: skip


def report(n: int, mode: str, mbit: float, size: int, t: Timing, outcome: Outcome
           ) -> dict[str, Any]:  # fmt: skip
    """Print one run (or NOT OK and why, no figure); its row for the markdown table."""
    row: dict[str, Any] = {"hosts": n, "mode": mode, "mbit": mbit, "bytes": size, "ok": not t.why}
    if t.why:
        outcome.not_ok(f"N={n} {mode}", t.why)
        return row
    e = wb.efficiency(size, mbit, t.seconds)
    row.update(seconds=t.seconds, efficiency=e)
    print(f"{n:>3} {mode:<6} {mbit:>7.1f} {size / 1e6:>7.1f} {t.seconds:>8.2f} {t.transfer:>8.2f}"
          f" {t.load:>6.2f} {e:>10.3f}", file=outcome.out)  # fmt: skip
    print(f"    {t.machine(mode)}", file=outcome.out, flush=True)
    return row


def markdown_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per N whose chain and pull runs are both ok."""
    lines = []
    for n in dict.fromkeys(r["hosts"] for r in rows):
        ok = {r["mode"]: r for r in rows if r["hosts"] == n and r["ok"]}
        if "chain" not in ok or "pull" not in ok:
            continue
        c, p = ok["chain"], ok["pull"]
        cells = [f"{c['mbit']:.1f}", f"{c['bytes'] / 1e6:.1f}", f"{c['seconds']:.2f}",
                 f"{p['seconds']:.2f}", f"{c['efficiency']:.3f}",
                 f"{p['efficiency']:.3f}"]  # fmt: skip
        lines.append(f"| {n} | {' | '.join(cells)} | {c['efficiency'] / p['efficiency']:.2f}x |")
    if not lines:
        return []
    return ["", "| hosts | link Mbit/s | image MB | chain s | pull s | chain | pull"
                " | chain / pull |", "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *lines]  # fmt: skip


def scratch_bytes(size: int, n: int) -> int:
    """Scratch for the largest run: the seed's store, archive and registry copy, and on each
    of N hosts the archive, podman's temporary copy of the layer and the unpacked layer."""
    return int(wb.SCRATCH_RESERVE + wb.SCRATCH_MARGIN * 3 * (1 + n) * size)


# ----------------------------------------------------------------------------- main


def prepare(scratch: Scratch, lab: wb.NetnsLab, size_mb: int, python: str) -> Bench:
    """The source image (one random layer), its archive, the registry holding it; prints the
    time of each step and one host loading and pulling alone."""
    seed, tag = scratch.root / "seed", f"{size_mb}mb"
    local = f"localhost/{REPO}:{tag}"
    t0 = time.monotonic()
    scratch.podman(seed, "import", "-", local, tar=(size_mb * 1_000_000, "random.bin"))
    image_id = scratch.podman(seed, "image", "inspect", "--format", "{{.Id}}", local).stdout.strip()
    t1 = time.monotonic()
    (scratch.root / "archive").mkdir()
    archive = scratch.root / "archive" / ARCHIVE
    scratch.podman(seed, "save", "--format", "docker-archive", "-o", str(archive), local)
    manifest = manifest_from_dir(archive.parent, model=REPO, revision=tag)
    t2 = time.monotonic()
    registry = Registry(scratch, lab.ns(0), f"{lab.address(0)}:{REGISTRY_PORT}")
    ref = f"{registry.address}/{REPO}:{tag}"
    scratch.podman(seed, "push", "--tls-verify=false", local, ref, netns=lab.ns(0))
    t3 = time.monotonic()
    blob = max(p.stat().st_size for p in (scratch.root / "registry").rglob("data"))
    print(f"image {image_id[:12]}: built in {t1 - t0:.1f} s; archive"
          f" {archive.stat().st_size / 1e6:.1f} MB saved and hashed in {t2 - t1:.1f} s;"
          f" pushed in {t3 - t2:.1f} s (registry layer {blob / 1e6:.1f} MB gzipped)")  # fmt: skip
    alone = []
    for args in (("load", "-i", str(archive)), ("pull", "--tls-verify=false", ref)):
        store = scratch.root / "alone"
        t = time.monotonic()
        scratch.podman(store, *args, netns=lab.ns(0))
        alone.append(time.monotonic() - t)
        shutil.rmtree(store)
    print(f"one host alone, no link: load {alone[0]:.2f} s, pull over loopback {alone[1]:.2f} s")
    return Bench(scratch, lab, registry, image_id, tag, manifest, python,
                 {"chain": alone[0], "pull": alone[1]})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--size-mb", type=int, default=256, help="the image's layer, MB")
    parser.add_argument("--mbit", type=float, help="one link rate for every N (default: per N)")
    parser.add_argument("--max-mbit", type=float, default=1000.0, help="highest link rate")
    parser.add_argument("--cpu-share", type=float, default=0.4,
                        help="cores the chain's N relaying hops may use")  # fmt: skip
    parser.add_argument("--disk-share", type=float, default=0.5,
                        help="share of the scratch's write bandwidth N hosts may use")  # fmt: skip
    parser.add_argument("--mem-share", type=float, default=0.7,
                        help="most of the available memory the scratch tmpfs takes")  # fmt: skip
    parser.add_argument("--runs", nargs="+", choices=["chain", "pull"], default=["chain", "pull"])
    parser.add_argument("--subnet", default="10.93.0", help="first three octets")
    parser.add_argument("--python", default=sys.executable, help="interpreter for relays")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("builds namespaces, mounts a tmpfs and runs podman as root: run as root")
    for tool in ("podman", "docker-registry", "nsenter", "tc"):
        if shutil.which(tool) is None:
            raise NotOk(f"{tool} is not installed")

    size_guess = args.size_mb * 1_000_000
    need = scratch_bytes(size_guess, max(args.hosts))
    room = args.mem_share * wb.mem_available()
    if need > room:
        raise NotOk(f"{max(args.hosts)} hosts of a {args.size_mb} MB image need a"
                    f" {need / 1e9:.1f} GB tmpfs; --mem-share allows"
                    f" {room / 1e9:.1f} GB")  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    lab = wb.NetnsLab(max(args.hosts), args.mbit or args.max_mbit, args.subnet, prefix=PREFIX)
    made: list[Scratch | wb.Tmpfs] = []

    def cleanup() -> None:
        while made:
            thing = made.pop()
            if isinstance(thing, Scratch):
                thing.stop()  # its processes, before the tmpfs they use goes
            else:
                thing.close()
        if lab.made:
            lab.down()
            lab.made = False
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    outcome = Outcome()
    try:
        made.append(wb.Tmpfs(workdir, need, prefix=PREFIX))
        scratch = Scratch(workdir)
        made.append(scratch)
        hash_bps, write_bps = wb.hash_rate(), wb.write_bandwidth(workdir)
        plan = {n: args.mbit or wb.pick_mbit(n, write_bps=write_bps, hash_bps=hash_bps,
                                             max_mbit=args.max_mbit, disk_share=args.disk_share,
                                             cpu_share=args.cpu_share, seconds=1.0)
                for n in args.hosts}  # fmt: skip
        print(f"sha256 {hash_bps / 1e6:.0f} MB/s per core, tmpfs writes {write_bps / 1e6:.0f} MB/s,"
              f" {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f};"
              f" a {need / 1e9:.1f} GB tmpfs at {workdir}")  # fmt: skip
        print(f"building {lab.hosts} hosts + seed ...", flush=True)
        lab.up()
        bench = prepare(scratch, lab, args.size_mb, args.python)
        size = bench.manifest.total_bytes
        guess = sum((("chain" in args.runs) + ("pull" in args.runs) * n) * size * 8 / (m * 1e6)
                    for n, m in plan.items())  # fmt: skip
        for n, mbit in plan.items():
            print(f"  N={n}: links at {mbit:.1f} Mbit/s, {size * 8 / (mbit * 1e6):.1f} s a copy")
        print(f"the links alone need about {guess:.0f} s; then the loads")
        rows: list[dict[str, Any]] = []
        started = time.monotonic()
        print(f"\n{HEAD}", flush=True)
        for n, mbit in plan.items():
            lab.shape(mbit)
            timings = {mode: getattr(bench, mode)(n) for mode in args.runs}
            got = {m: report(n, m, mbit, size, t, outcome) for m, t in timings.items()}
            if all(r["ok"] for r in got.values()) and len(got) == 2:
                ratio = got["chain"]["efficiency"] / got["pull"]["efficiency"]
                print(f"{n:>3} chain/pull = {ratio:.2f}", flush=True)
            rows += got.values()
        print(f"\nwhole run: {time.monotonic() - started:.0f} s;"
              f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        for line in markdown_table(rows):
            print(line)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    finally:
        cleanup()
    return outcome.finish()


if __name__ == "__main__":
    sys.exit(run_main(main))
