"""``send``: stream the files once down one chain (or N fan-out streams), from the source.

The data goes out with sendfile(2) straight from the source files' page cache; a pool of
threads hashes the same files (several at once) to prove the source matches the manifest.
A file that some host already holds in part is streamed from the lowest byte any host below
still needs (the ``need`` replies carry it).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

from ..common import Json, RelayError, describe_error, parse_address
from ..hashing import sha256_file
from ..manifest import FileMeta, RelayManifest, load_manifest_file
from ..names import final_path, is_safetensors
from ..safetensors import check_safetensors_file
from .forwarder import Forwarder, SharedFd, file_frame
from .output import Counters, Emitter, ProgressThread
from .protocol import FRAME, PROTOCOL, T_DATA, Options
from .receiver import EXIT_INCOMPLETE, EXIT_OK, EXIT_REFUSED

QUEUE_LIMIT = 64


class RateLimit:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.t0 = time.monotonic()
        self.sent = 0

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            time.sleep(ahead)


class Seed:
    """The host (or controller) that holds the files and starts the stream."""

    def __init__(self, args: argparse.Namespace, opts: Options, emit: Emitter) -> None:
        self.args = args
        self.opts = opts
        self.emit = emit
        self.source = os.path.abspath(args.source)
        self.counters = Counters()
        self.started = time.monotonic()

    def preflight(self, manifest: RelayManifest) -> list[str]:
        problems: list[str] = []
        for meta in manifest.files:
            path = final_path(self.source, meta.name)
            try:
                size = os.stat(path).st_size
            except OSError as exc:
                problems.append(f"{self.emit.host}: source {path}: {describe_error(exc)}")
                continue
            if size != meta.size:
                problems.append(
                    f"{self.emit.host}: source {path} is {size} bytes, manifest: {meta.size}"
                )
            elif is_safetensors(meta.name):
                problem = check_safetensors_file(path, size)
                if problem:
                    problems.append(f"{self.emit.host}: source {path}: safetensors {problem}")
        return problems

    def run(self) -> int:
        try:
            manifest = load_manifest_file(self.args.manifest)
            chain = [a.strip() for a in self.args.chain.split(",") if a.strip()]
            for addr in chain:
                parse_address(addr)
            if not chain:
                raise RelayError(f"{self.emit.host}: --chain names no host to send to")
        except RelayError as exc:
            return self._refuse(str(exc))
        problems = self.preflight(manifest)
        if problems:
            return self._refuse("; ".join(problems))
        hello: Json = {
            "proto": PROTOCOL,
            "session": uuid.uuid4().hex,
            "origin": self.emit.host,
            "manifest": manifest.to_json(),
            "chunk": self.opts.chunk,
            "verify": self.opts.verify,
            "io_timeout": self.opts.io_timeout,
            "connect_timeout": self.opts.connect_timeout,
        }
        lanes = 1 if self.args.fanout else max(1, min(self.args.streams, len(manifest.files)))
        shares = split_files(manifest.files, lanes)
        hellos = [hello]
        if lanes > 1:
            hellos = [
                dict(hello, lanes=lanes, lane=k, lane_files=[m.name for m in share])
                for k, share in enumerate(shares)
            ]
        chains = [[a] for a in chain] if self.args.fanout else [chain] * lanes
        forwarders = [
            Forwarder(
                c,
                hellos[min(i, len(hellos) - 1)],
                manifest.files,
                self.opts,
                self.emit,
                self.counters,
                lambda name: final_path(self.source, name),
                QUEUE_LIMIT,
            )
            for i, c in enumerate(chains)
        ]
        linkers = [threading.Thread(target=f.link, daemon=True) for f in forwarders]
        for t in linkers:
            t.start()
        for t in linkers:
            t.join()
        wanted: dict[str, int] = {}
        for f in forwarders:
            for name, offset in f.need.items():
                wanted[name] = min(offset, wanted.get(name, offset))
        plan = [(m, wanted[m.name]) for m in manifest.files if m.name in wanted]
        with self.counters.lock:
            self.counters.total = sum(m.size - offset for m, offset in plan)
        self.emit(
            "plan",
            stream_files=len(plan),
            stream_bytes=self.counters.total,
            resume={m.name: o for m, o in plan if o},
            streams=len(forwarders),
            lanes=lanes,
            downstream=[f.current for f in forwarders],
        )
        progress = ProgressThread(self.emit, self.counters, self.args.progress_interval)
        progress.start()
        if lanes > 1:  # each lane carries its own share of the files, on its own connections
            feeds = [([f], [(m, o) for m, o in plan if m in set(share)]) for f, share in
                     zip(forwarders, shares)]  # fmt: skip
        else:
            feeds = [(forwarders, plan)]
        mismatched = self._stream(plan, feeds)
        for f in forwarders:
            f.join()
        progress.stop()
        hosts, skipped = merge_reports(forwarders)
        bad = [h for h in hosts if h.get("status") != "ok"]
        status = "ok" if not bad and not mismatched and len(hosts) >= len(chain) else "incomplete"
        message = ""
        if mismatched:
            message = f"source files differ from the manifest: {', '.join(mismatched)}"
        elif bad:
            message = f"{len(bad)} of {len(chain)} hosts not ok"
        summary = self.summary(status, hosts, skipped, message, sum(f.tx for f in forwarders))
        summary["files_sent"] = [m.name for m, _ in plan]
        summary["source_mismatch"] = mismatched
        self.emit("summary", **summary)
        return EXIT_OK if status == "ok" else EXIT_INCOMPLETE

    def _refuse(self, message: str) -> int:
        self.emit("refused", message=message)
        self.emit("summary", **self.summary("refused", [], [], message, 0))
        return EXIT_REFUSED

    def summary(
        self, status: str, hosts: list[Json], skipped: list[Json], message: str, sent: int
    ) -> Json:
        return {
            "status": status,
            "hosts": hosts,
            "skipped_hosts": skipped,
            "bytes_sent": sent,
            "cpu": self.counters.cpu_report(),
            "seconds": round(time.monotonic() - self.started, 3),
            "message": message,
        }

    def _hash(self, meta: FileMeta) -> str:
        t0 = time.thread_time()
        try:
            return sha256_file(final_path(self.source, meta.name))
        except OSError as exc:
            return f"unreadable: {describe_error(exc)}"
        finally:
            self.counters.add_cpu("hash", time.thread_time() - t0)

    def _stream(
        self,
        plan: list[tuple[FileMeta, int]],
        feeds: list[tuple[list[Forwarder], list[tuple[FileMeta, int]]]],
    ) -> list[str]:
        """Queue each feed's files to its forwarders (one thread per feed); hash the sources
        meanwhile. -> the files whose source differs from the manifest."""
        for forwarders, files in feeds:
            for f in forwarders:
                f.start([m.name for m, _ in files])
        with ThreadPoolExecutor(max_workers=self.opts.workers()) as pool:
            digests: list[tuple[FileMeta, Future[str]]] = [
                (meta, pool.submit(self._hash, meta)) for meta, _ in plan
            ]
            rate = float(self.args.max_rate or 0) / len(feeds)  # --max-rate is for all lanes
            feeders = [
                threading.Thread(target=self._feed, args=(*feed, rate), name="feed", daemon=True)
                for feed in feeds
            ]
            for t in feeders:
                t.start()
            for t in feeders:
                t.join()
            return [meta.name for meta, digest in digests if digest.result() != meta.sha256]

    def _feed(
        self, forwarders: list[Forwarder], files: list[tuple[FileMeta, int]], rate: float
    ) -> None:
        t0 = time.thread_time()
        limit = RateLimit(rate)
        chunk = self.opts.chunk
        for meta, start in files:
            path = final_path(self.source, meta.name)
            try:
                shared = SharedFd(os.open(path, os.O_RDONLY), 1)
            except OSError as exc:
                self.emit(
                    "error", name=meta.name, reason=f"cannot read source: {describe_error(exc)}"
                )
                shared = SharedFd(os.open(os.devnull, os.O_RDONLY), 1)
            frame = file_frame(meta, start)
            for f in forwarders:
                f.q.put(("file", meta, frame, None))
            with self.counters.lock:
                self.counters.file = meta.name
            offset = start
            while offset < meta.size:
                n = min(chunk, meta.size - offset)
                limit.take(n)
                header = FRAME.pack(T_DATA, n)
                for f in forwarders:
                    f.q.put(("bytes", header))
                    f.q.put(("source", shared.hold(), offset, n))
                offset += n
            shared.release()
        for f in forwarders:
            f.q.put(("end",))
        self.counters.add_cpu("read", time.thread_time() - t0)


def split_files(files: tuple[FileMeta, ...], lanes: int) -> list[list[FileMeta]]:
    """Files shared out over ``lanes`` by size (the largest first, each to the lightest lane),
    each share kept in manifest order."""
    loads = [0] * lanes
    owner: dict[str, int] = {}
    for meta in sorted(files, key=lambda m: -m.size):
        k = loads.index(min(loads))
        owner[meta.name] = k
        loads[k] += meta.size
    return [[m for m in files if owner[m.name] == k] for k in range(lanes)]


def merge_reports(forwarders: list[Forwarder]) -> tuple[list[Json], list[Json]]:
    """Every host's report once (lanes report the same host; a host not ok in one lane is not
    ok), and the hosts skipped by any stream."""
    hosts: dict[str, Json] = {}
    skipped: dict[str, Json] = {}
    for f in forwarders:
        for s in f.skipped:
            skipped.setdefault(str(s.get("host")), s)
        for r in f.skipped + f.reports:
            key = str(r.get("host"))
            if key not in hosts or (r.get("status") != "ok" and hosts[key].get("status") == "ok"):
                hosts[key] = r
    return list(hosts.values()), list(skipped.values())
