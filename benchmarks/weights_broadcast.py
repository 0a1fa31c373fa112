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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.relay_harness import (
    BroadcastResult,
    Launcher,
    Target,
    broadcast,
    fanout,
    local_launcher,
    nsenter_launcher,
    ssh_launcher,
    write_shards,
)
from k2provision.weights.manifest import Manifest, manifest_from_dir

PREFIX = "k2wb"
PORT = 29517
HOP_COST = 4.0  # a relaying hop's CPU per byte, in sha256s of it (see benchmarks/weights_cost.py)


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

    @property
    def switch(self) -> str:
        return f"{PREFIX}-sw"

    def ns(self, i: int) -> str:
        """Namespace of host i (1..N); 0 is the seed."""
        return f"{PREFIX}-c" if i == 0 else f"{PREFIX}-h{i}"

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
            sh("ip", "link", "del", f"{PREFIX}{i}a", check=False)

    def shaper(self) -> list[str]:
        burst = max(32 * 1024, int(self.mbit * 1e6 / 8 / 250 * 2))
        return ["tbf", "rate", f"{self.mbit:.3f}mbit", "burst", str(burst), "latency", "100ms"]

    def shape(self, mbit: float) -> None:
        """Every link to ``mbit`` in both directions."""
        self.mbit = mbit
        for i in range(self.hosts + 1):
            ns, inner, outer = self.ns(i), f"{PREFIX}{i}a", f"{PREFIX}{i}b"
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
            ns, inner, outer = self.ns(i), f"{PREFIX}{i}a", f"{PREFIX}{i}b"
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
    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", f"{PREFIX}-data", str(path))

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


# ----------------------------------------------------------------------------- runs


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
        for i in range(total // len(block)):
            os.write(fd, block)
            if (i + 1) % 8 == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return total / (time.monotonic() - t0)


def hash_rate(total: int = 256 << 20) -> float:
    """Bytes/s of sha256 in one thread."""
    block = os.urandom(8 << 20)
    h = hashlib.sha256()
    t0 = time.monotonic()
    for _ in range(total // len(block)):
        h.update(block)
    return total / (time.monotonic() - t0)


def pick_mbit(n: int, write_bps: float, hash_bps: float, args: argparse.Namespace) -> float:
    """The link rate for N hosts: under the disk's and the CPU's share, at most --max-mbit."""
    by_disk = args.disk_share * write_bps / n
    by_cpu = args.cpu_share * hash_bps / (HOP_COST * n)
    return min(args.max_mbit * 1e6 / 8, by_disk, by_cpu) * 8 / 1e6


def write_set(directory: Path, size: int, files: int) -> Manifest:
    shutil.rmtree(directory, ignore_errors=True)
    write_shards(directory, files, max(64 << 10, size // files))
    (directory / "config.json").unlink()
    return manifest_from_dir(directory, model="bench/synthetic", revision="bench")


def run_one(
    mode: str,
    n: int,
    manifest: Manifest,
    source: Path,
    seed: Launcher,
    hosts: Sequence[Host],
    args: argparse.Namespace,
) -> BroadcastResult:
    chosen = hosts[:n]
    targets = []
    for i, h in enumerate(chosen, start=1):
        dest = h.dest / f"n{n}-{mode}" / f"h{i}"
        wipe(h, dest)
        targets.append(Target(host=h.address, dest=str(dest), launcher=h.launcher,
                              port=h.port, listen="0.0.0.0", name=f"h{i}"))  # fmt: skip
    run = broadcast if mode == "chain" else fanout
    result = run(
        manifest,
        source,
        targets,
        seed_launcher=seed,
        chunk_size=args.chunk_mb << 20,
        io_timeout=60.0,
        connect_timeout=10.0,
        progress_interval=2.0,
        grace=20.0,
    )
    for h, t in zip(chosen, targets, strict=True):
        wipe(h, Path(t.dest))
    return result


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
    parser.add_argument("--tmpfs-gb", type=float, default=4.0, help="netns mode: tmpfs size")
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
        if lab is not None and lab.made:
            lab.down()
            lab.made = False
        if tmpfs is not None:
            tmpfs.close()

    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    hash_bps = hash_rate()
    if args.mode == "netns":
        tmpfs = Tmpfs(workdir, int(args.tmpfs_gb * 1e9))
        write_bps = write_bandwidth(workdir)
    else:
        write_bps = float("inf")
    plan = {}
    for n in args.hosts:
        mbit = pick_mbit(n, write_bps, hash_bps, args) if args.mode == "netns" else args.max_mbit
        size = int(mbit * 1e6 / 8 * args.seconds)
        plan[n] = (mbit, size)
    print(f"write bandwidth {write_bps / 1e6:.0f} MB/s, sha256 {hash_bps / 1e6:.0f} MB/s per core,"
          f" load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")  # fmt: skip
    for n, (mbit, size) in plan.items():
        print(f"  N={n}: links at {mbit:.1f} Mbit/s, chain set {size / 1e6:.1f} MB,"
              f" fan-out set {size / n / 1e6:.1f} MB")  # fmt: skip

    if args.mode == "netns":
        lab = NetnsLab(max(args.hosts), plan[args.hosts[0]][0], args.subnet, args.mtu)
        print(f"building {lab.hosts} hosts + seed ...", flush=True)
        lab.up()
        seed = nsenter_launcher(lab.ns(0), python=args.python)
        hosts = [Host(lab.address(i), workdir / "hosts", nsenter_launcher(lab.ns(i), args.python))
                 for i in range(1, lab.hosts + 1)]  # fmt: skip
    else:
        seed, hosts = lab_hosts(args.lab_hosts, args.python)
        if len(hosts) < max(args.hosts):
            parser.error(
                f"{args.lab_hosts} lists {len(hosts)} hosts, --hosts wants {max(args.hosts)}"
            )

    rows: list[dict[str, Any]] = []
    started_all = time.monotonic()
    head = f"{'N':>3} {'mode':<7} {'Mbit/s':>7} {'MB':>7} {'seconds':>8} {'efficiency':>10}"
    print(f"\n{head}  status", flush=True)
    for n in args.hosts:
        mbit, size = plan[n]
        if lab is not None:
            lab.shape(mbit)
        eff: dict[str, float] = {}
        for mode in args.runs:
            set_size = size if mode == "chain" else max(size // n, args.files << 16)
            manifest = write_set(workdir / "source", set_size, args.files)
            total = manifest.total_bytes
            started = time.monotonic()
            result = run_one(mode, n, manifest, workdir / "source", seed, hosts, args)
            e = efficiency(total, mbit, result.seconds)
            eff[mode] = e
            bad = [h.name for h in result.hosts if not h.ok]
            status = "ok" if result.ok else f"NOT OK: {bad} {result.seed_message}"
            print(f"{n:>3} {mode:<7} {mbit:>7.1f} {total / 1e6:>7.1f} {result.seconds:>8.2f}"
                  f" {e:>10.3f}  {status}  (wall {time.monotonic() - started:.1f} s)",
                  flush=True)  # fmt: skip
            rows.append({"hosts": n, "mode": mode, "seconds": result.seconds, "efficiency": e,
                         "ok": result.ok, "bytes": total, "mbit": mbit})  # fmt: skip
        if "chain" in eff and "fanout" in eff and eff["fanout"] > 0:
            print(f"{n:>3} chain/fanout = {eff['chain'] / eff['fanout']:.2f}"
                  f"  (fan-out ideal 1/N = {1 / n:.3f})", flush=True)  # fmt: skip
    print(f"\nwhole run: {time.monotonic() - started_all:.0f} s;"
          f" load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("\n| hosts | link Mbit/s | chain | fan-out | fan-out x N | chain / fan-out |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in args.hosts:
        c = next((r for r in rows if r["hosts"] == n and r["mode"] == "chain"), None)
        f = next((r for r in rows if r["hosts"] == n and r["mode"] == "fanout"), None)
        if c and f:
            ce, fe = c["efficiency"], f["efficiency"]
            cells = [f"{c['mbit']:.1f}", f"{ce:.3f}", f"{fe:.3f}", f"{fe * n:.2f}"]
            cells.append(f"{ce / fe:.2f}x")
            print(f"| {n} | {' | '.join(cells)} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    cleanup()
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
