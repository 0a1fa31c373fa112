#!/usr/bin/env python3
"""Benchmark: pipelined chain versus controller fan-out, on shaped links (not a test).

For each N of ``--hosts``, one run times the chain (seed -> h1 -> h2 -> ... -> hN, each
host forwarding while it receives) and the fan-out baseline (the seed streams the whole
set to each of the N hosts itself, over its one link), and prints

    efficiency = (size / link rate) / time

for each, and their ratio. The chain should stay near 1 whatever N; the fan-out falls as 1/N.

Two ways to get hosts:

``--mode netns`` (default; root): builds its own hosts now. One network namespace per host
(``k2wb-h1`` ...) plus one for the seed (``k2wb-c``), each with a veth to a bridge in
``k2wb-sw``, and a ``tc tbf`` shaper of ``--mbit`` on both directions of every veth, so
every host (and the seed) has one full-duplex link of that rate. Files go to a tmpfs under
``--workdir``. Everything it made is removed by name at the end.

``--mode lab --lab-hosts FILE``: hosts someone else built (the k2provision lab with its
shaping option, or real machines). FILE is JSON::

    {"seed": {"netns": "k2lab-c"},
     "hosts": [{"address": "10.77.0.11", "netns": "k2lab-h1", "dest": "/var/tmp/k2w"},
               {"address": "10.0.0.12", "ssh": "root@10.0.0.12",
                "remote_script": "/opt/k2provision/relay.pyz", "dest": "/data/k2w"}]}

where each entry gives one launcher: ``netns`` (nsenter into that network namespace on
this machine), ``ssh`` (relay.pyz already copied to ``remote_script``) or ``"local": true``.
The seed's link must be shaped to the same ``--mbit`` for the numbers to mean anything.

Example (as root)::

    python3 benchmarks/weights_broadcast.py --hosts 4 8 16 --size-mb 300 --mbit 200
"""

from __future__ import annotations

import argparse
import atexit
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

from k2provision.weights.manifest import Manifest, manifest_from_dir
from tests.relay_harness import (
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

PREFIX = "k2wb"
PORT = 29517


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

    def up(self) -> None:
        self.down()
        self.made = True
        burst = max(32 * 1024, int(self.mbit * 1e6 / 8 / 250 * 2))
        shape = ["tbf", "rate", f"{self.mbit}mbit", "burst", str(burst), "latency", "25ms"]
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
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--size-mb", type=float, default=300.0, help="synthetic set, 10^6 bytes")
    parser.add_argument("--files", type=int, default=6, help="number of shards")
    parser.add_argument("--mbit", type=float, default=200.0, help="link rate (tc), Mbit/s")
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

    size = int(args.size_mb * 1e6)
    shard = size // args.files
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

    if args.mode == "netns":
        lab = NetnsLab(max(args.hosts), args.mbit, args.subnet, args.mtu)
        # The set once at the source plus the largest N copies (runs are wiped between).
        tmpfs = Tmpfs(workdir, int(size * (max(args.hosts) + 1) * 1.05) + (64 << 20))
        print(f"building {lab.hosts} hosts + seed on {args.mbit:g} Mbit/s links ...", flush=True)
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

    source = workdir / "source"
    print(f"writing {args.files} synthetic shards, {size / 1e6:g} MB ...", flush=True)
    write_shards(source, args.files, shard)
    (source / "config.json").unlink()
    manifest = manifest_from_dir(source, model="bench/synthetic", revision="bench")
    total = manifest.total_bytes
    ideal = total * 8 / (args.mbit * 1e6)
    print(f"set: {total} bytes in {len(manifest.files)} files; one link-time = {ideal:.1f} s\n")

    rows: list[dict[str, Any]] = []
    print(f"{'N':>3} {'mode':<7} {'seconds':>8} {'efficiency':>10}  status", flush=True)
    for n in args.hosts:
        eff: dict[str, float] = {}
        for mode in args.runs:
            started = time.monotonic()
            result = run_one(mode, n, manifest, source, seed, hosts, args)
            e = efficiency(total, args.mbit, result.seconds)
            eff[mode] = e
            bad = [h.name for h in result.hosts if not h.ok]
            status = "ok" if result.ok else f"NOT OK: {bad} {result.seed_message}"
            print(f"{n:>3} {mode:<7} {result.seconds:>8.2f} {e:>10.3f}  {status}"
                  f"  (wall {time.monotonic() - started:.1f} s)", flush=True)  # fmt: skip
            rows.append({"hosts": n, "mode": mode, "seconds": result.seconds, "efficiency": e,
                         "ok": result.ok, "bytes": total, "mbit": args.mbit})  # fmt: skip
        if "chain" in eff and "fanout" in eff and eff["fanout"] > 0:
            print(f"{n:>3} chain/fanout = {eff['chain'] / eff['fanout']:.2f}"
                  f"  (fan-out ideal 1/N = {1 / n:.3f})", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    cleanup()
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
