#!/usr/bin/env python3
"""Benchmark: what one relay hop costs per byte, unshaped (a script, not a test).

Moves one synthetic set down a chain seed -> h1 -> h2 on loopback, destinations on tmpfs
(/dev/shm), three ways in the same run, alternating, ``--repeat`` times each:

- **raw**: the transport alone. The seed sendfile(2)s the files, h1 forwards with a
  splice(2) loop (socket -> pipe -> socket, no copy through the process), h2 splices into
  /dev/null. No hashing, no writing: the ceiling of moving the bytes over these links.
- **relay**: relay.pyz as the product runs it: h1 receives, hashes, writes and forwards every
  byte (sendfile from the page cache it wrote), h2 receives, hashes and writes.
- **relay, no zero-copy**: the same with ``--no-zero-copy`` (forwarding through the process).
- **relay, S streams**: the same with ``--streams S`` (S lanes per hop, each its own
  connection with its share of the files, so S threads per stage).

and hashes the set with hashlib alone in one thread (the **hash limit**: one stream's files
are hashed one after another, so one core's sha256 rate bounds one stream).

Reported per hop: GB/s (10^9 bytes), CPU-seconds per GB (user + system) by stage from each
relay's own accounting (receive, hash, write, forward on h1; the seed's read and hash), the
process totals, and the ratios relay/raw and relay/hash-limit. From h1's measured cost it
projects the per-hop rate on a host with C free cores:

    rate(C, S) = min(C / (CPU-s per GB of the hop), S / (CPU-s per GB of its busiest stage))

since every stage of one stream runs in one thread (S streams: S threads). A run that is not
ok (a relay run that fails, a raw hop that exits non-zero or moves other than the set's bytes)
ends the benchmark with ``NOT OK`` and its reason, before any figure; it exits 1. Example::

    .venv/bin/python benchmarks/weights_cost.py --size-mb 1024 --files 4 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.outcome import NotOk
from benchmarks.outcome import run as run_main
from benchmarks.relay_harness import BroadcastResult, Target, broadcast, failure, write_shards
from k2provision.weights.manifest import Manifest, manifest_from_dir

GB = 1e9
STAGES = ("receive", "hash", "write", "forward")

# One raw hop, run as its own process: seed (sendfile files), fwd (splice in -> out) or
# sink (splice in -> /dev/null). Prints its byte count and CPU time as JSON at the end.
RAW = r"""
import fcntl, json, os, resource, socket, sys, time

role, port, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
PIPE = 1 << 20


def serve():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    print(json.dumps({"port": ls.getsockname()[1]}), flush=True)
    return ls.accept()[0]


def connect(p):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    for _ in range(200):
        try:
            s.connect(("127.0.0.1", p))
            return s
        except OSError:
            time.sleep(0.02)
    raise SystemExit("cannot connect")


moved = 0
if role == "seed":
    out = connect(port)
    for path in rest:
        with open(path, "rb") as f:
            size, off = os.fstat(f.fileno()).st_size, 0
            while off < size:
                off += os.sendfile(out.fileno(), f.fileno(), off, size - off)
            moved += size
    out.close()
else:
    inp = serve()
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, PIPE)  # F_SETPIPE_SZ
    except OSError:
        pass
    if role == "fwd":
        out = connect(int(rest[0]))
        dst = out.fileno()
    else:
        dst = os.open(os.devnull, os.O_WRONLY)
    while True:
        n = os.splice(inp.fileno(), w, PIPE)
        if not n:
            break
        moved += n
        while n:
            n -= os.splice(r, dst, n)
    if role == "fwd":
        out.close()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"bytes": moved, "user": u.ru_utime, "sys": u.ru_stime}), flush=True)
"""


def raw_chain(files: list[Path]) -> dict[str, Any]:
    """seed -> fwd -> sink with the raw hops; seconds from the seed's start to the sink's end."""
    py = sys.executable
    sink = subprocess.Popen(
        [py, "-c", RAW, "sink", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    sink_port = json.loads(sink.stdout.readline())["port"]
    fwd = subprocess.Popen(
        [py, "-c", RAW, "fwd", "0", str(sink_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert fwd.stdout is not None
    fwd_port = json.loads(fwd.stdout.readline())["port"]
    t0 = time.monotonic()
    seed = subprocess.run(
        [py, "-c", RAW, "seed", str(fwd_port), *map(str, files)],
        capture_output=True,
        text=True,
    )
    fwd_out, fwd_err = fwd.communicate(timeout=600)
    sink_out, sink_err = sink.communicate(timeout=600)
    seconds = time.monotonic() - t0
    total = sum(f.stat().st_size for f in files)
    hops: dict[str, tuple[int, str, str]] = {
        "seed": (seed.returncode, seed.stdout, seed.stderr),
        "h1": (fwd.returncode, fwd_out, fwd_err),
        "h2": (sink.returncode, sink_out, sink_err),
    }
    out: dict[str, Any] = {"seconds": seconds}
    for name, (code, stdout, stderr) in hops.items():
        if code != 0 or not stdout.strip():
            raise NotOk(f"raw chain: {name} exited {code}: {stderr.strip()[-300:]}")
        out[name] = json.loads(stdout.splitlines()[-1])
        if out[name]["bytes"] != total:
            raise NotOk(f"raw chain: {name} moved {out[name]['bytes']} of {total} bytes")
    return out


def hash_limit(files: list[Path]) -> dict[str, float]:
    """sha256 of the set in one thread: seconds and CPU seconds."""
    t0, c0 = time.monotonic(), time.thread_time()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    for path in files:
        h = hashlib.sha256()
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
    return {"seconds": time.monotonic() - t0, "cpu": time.thread_time() - c0}


def relay_chain(
    manifest: Manifest, source: Path, work: Path, extra: list[str], chunk: int, streams: int = 1
) -> BroadcastResult:
    targets = []
    for name in ("h1", "h2"):
        dest = work / name
        shutil.rmtree(dest, ignore_errors=True)
        targets.append(Target(host="127.0.0.1", port=0, dest=str(dest), name=name))
    result = broadcast(
        manifest,
        source,
        targets,
        chunk_size=chunk,
        progress_interval=5.0,
        extra_args=extra,
        streams=streams,
        io_timeout=60.0,
        connect_timeout=10.0,
        grace=30.0,
    )
    if not result.ok:
        way = " ".join([*extra, f"--streams {streams}"])
        raise NotOk(f"relay chain ({way}): {failure(result)}")
    for t in targets:
        shutil.rmtree(t.dest, ignore_errors=True)
    return result


def per_gb(seconds: float, total: int) -> float:
    return seconds / (total / GB)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=1024.0, help="set size, 10^6 bytes")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-mb", type=int, default=8)
    parser.add_argument("--streams", type=int, default=4, help="lanes of the parallel run")
    parser.add_argument("--workdir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)

    work = args.workdir / f"k2w-cost-{os.getpid()}"
    source = work / "source"
    total_wanted = int(args.size_mb * 1e6)
    try:
        print(f"writing {args.files} shards, {total_wanted / 1e6:g} MB, to {source}", flush=True)
        write_shards(source, args.files, total_wanted // args.files)
        (source / "config.json").unlink()
        manifest = manifest_from_dir(source, model="bench/synthetic", revision="bench")
        files = [source / f.name for f in manifest.files]
        total = manifest.total_bytes
        load0 = os.getloadavg()
        runs: dict[str, list[Any]] = {
            "raw": [],
            "relay": [],
            "relay_copy": [],
            "relay_streams": [],
            "hash": [],
        }
        for i in range(args.repeat):
            print(f"round {i + 1}/{args.repeat} ...", flush=True)
            runs["raw"].append(raw_chain(files))
            runs["relay"].append(relay_chain(manifest, source, work, [], args.chunk_mb << 20))
            runs["relay_copy"].append(
                relay_chain(manifest, source, work, ["--no-zero-copy"], args.chunk_mb << 20)
            )
            runs["relay_streams"].append(
                relay_chain(manifest, source, work, [], args.chunk_mb << 20, args.streams)
            )
            runs["hash"].append(hash_limit(files))
        load1 = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median_run(name: str, key: Any) -> Any:
        items = sorted(runs[name], key=key)
        return items[len(items) // 2]

    raw = median_run("raw", lambda r: r["seconds"])
    relay = median_run("relay", lambda r: r.seconds)
    copy = median_run("relay_copy", lambda r: r.seconds)
    lanes = median_run("relay_streams", lambda r: r.seconds)
    hashed = median_run("hash", lambda r: r["seconds"])
    rate = {
        "raw": total / raw["seconds"] / GB,
        "relay": total / relay.seconds / GB,
        "relay_copy": total / copy.seconds / GB,
        "relay_streams": total / lanes.seconds / GB,
        "hash": total / hashed["seconds"] / GB,
    }
    spread = {
        "raw": [round(total / r["seconds"] / GB, 2) for r in runs["raw"]],
        "relay": [round(total / r.seconds / GB, 2) for r in runs["relay"]],
    }
    h1 = relay.host("h1")
    h2 = relay.host("h2")

    def stages(cpu: dict[str, float]) -> dict[str, float]:
        out = {s: per_gb(cpu.get(s, 0.0), total) for s in STAGES}
        out["process"] = per_gb(cpu.get("process_user", 0.0) + cpu.get("process_sys", 0.0), total)
        return out

    c1, c2 = stages(h1.cpu), stages(h2.cpu)
    cs = stages(lanes.host("h1").cpu)
    seed_cpu = relay.seed_cpu
    raw_h1 = per_gb(raw["h1"]["user"] + raw["h1"]["sys"], total)
    busiest = max(STAGES, key=lambda s: c1[s])
    print()
    print(f"set: {total} bytes in {len(files)} files; {args.repeat} rounds, medians;"
          f" load average {load0[0]:.2f} before, {load1[0]:.2f} after;"
          f" {os.cpu_count()} cores")  # fmt: skip
    print(f"rates per round, GB/s: raw {spread['raw']}, relay {spread['relay']}")
    print()
    print("| path | GB/s per hop | relay / raw | relay / hash limit |")
    print("| --- | --- | --- | --- |")
    print(f"| raw transport (sendfile, splice) | {rate['raw']:.2f} | | |")
    print(f"| hashlib sha256, one thread | {rate['hash']:.2f} | | |")
    for name, label in (
        ("relay", "relay.pyz"),
        ("relay_copy", "relay.pyz --no-zero-copy"),
        ("relay_streams", f"relay.pyz, {args.streams} streams per hop"),
    ):
        print(f"| {label} | {rate[name]:.2f} | {rate[name] / rate['raw']:.2f}"
              f" | {rate[name] / rate['hash']:.2f} |")  # fmt: skip
    print()
    print("| CPU-s per GB | receive | hash | write | forward | process (user+sys) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, c in (("h1 (relaying hop)", c1), ("h2 (last hop)", c2)):
        print(f"| {label} | {c['receive']:.3f} | {c['hash']:.3f} | {c['write']:.3f}"
              f" | {c['forward']:.3f} | {c['process']:.3f} |")  # fmt: skip
    print(f"| h1, {args.streams} streams | {cs['receive']:.3f} | {cs['hash']:.3f}"
          f" | {cs['write']:.3f} | {cs['forward']:.3f} | {cs['process']:.3f} |")  # fmt: skip
    print(f"| h1 raw splice forwarder | | | | | {raw_h1:.3f} |")
    print(f"| seed | read {per_gb(seed_cpu.get('read', 0), total):.3f}"
          f" | {per_gb(seed_cpu.get('hash', 0), total):.3f} | |"
          f" {per_gb(seed_cpu.get('forward', 0), total):.3f}"
          f" | {stages(seed_cpu)['process']:.3f} |")  # fmt: skip
    hash_cpu = per_gb(hashed["cpu"], total)
    print(f"| hashlib alone | | {hash_cpu:.3f} | | | |")
    print()
    print("| free cores C | streams per hop S | projected GB/s per hop | bound by |")
    print("| --- | --- | --- | --- |")
    projections = {}
    for cores in (8, 32):
        for streams in (1, 8):
            by_cores = cores / c1["process"]
            by_threads = streams / c1[busiest]
            projections[f"{cores}x{streams}"] = min(by_cores, by_threads)
            bound = (
                f"{cores} cores at {c1['process']:.2f} CPU-s/GB"
                if by_cores < by_threads
                else f"{streams} {busiest} thread(s) at {c1[busiest]:.2f} CPU-s/GB"
            )
            print(f"| {cores} | {streams} | {min(by_cores, by_threads):.1f} | {bound} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "bytes": total,
                    "rates": rate,
                    "cpu_per_gb": {
                        "h1": c1,
                        "h2": c2,
                        "h1_streams": cs,
                        "raw_h1": raw_h1,
                        "hash": hash_cpu,
                    },
                    "projection": projections,
                    "load": [load0, load1],
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    if not hasattr(os, "splice"):
        sys.exit("this benchmark's raw baseline needs os.splice (Linux, Python 3.10+)")
    socket.setdefaulttimeout(None)
    sys.exit(run_main(main))
