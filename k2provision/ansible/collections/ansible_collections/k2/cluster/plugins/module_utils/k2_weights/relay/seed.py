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

from ..common import Json, RelayError, describe, parse_address
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
                problems.append(f"{self.emit.host}: source {path}: {describe(exc)}")
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
        chains = [[a] for a in chain] if self.args.fanout else [chain]
        forwarders = [
            Forwarder(
                c,
                hello,
                manifest.files,
                self.opts,
                self.emit,
                self.counters,
                lambda name: final_path(self.source, name),
                QUEUE_LIMIT,
            )
            for c in chains
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
            downstream=[f.current for f in forwarders],
        )
        progress = ProgressThread(self.emit, self.counters, self.args.progress_interval)
        progress.start()
        mismatched = self._stream(plan, forwarders)
        for f in forwarders:
            f.join()
        progress.stop()
        hosts: list[Json] = []
        skipped: list[Json] = []
        for f in forwarders:
            skipped += f.skipped
            hosts += f.skipped + f.reports
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
            return f"unreadable: {describe(exc)}"
        finally:
            self.counters.add_cpu("hash", time.thread_time() - t0)

    def _stream(self, plan: list[tuple[FileMeta, int]], forwarders: list[Forwarder]) -> list[str]:
        """Queue every planned file to every forwarder; hash the sources meanwhile."""
        for f in forwarders:
            f.start([m.name for m, _ in plan])
        limit = RateLimit(float(self.args.max_rate or 0))
        chunk = self.opts.chunk
        with ThreadPoolExecutor(max_workers=self.opts.workers()) as pool:
            digests: list[tuple[FileMeta, Future[str]]] = [
                (meta, pool.submit(self._hash, meta)) for meta, _ in plan
            ]
            t0 = time.thread_time()
            for meta, start in plan:
                path = final_path(self.source, meta.name)
                try:
                    shared = SharedFd(os.open(path, os.O_RDONLY), 1)
                except OSError as exc:
                    self.emit(
                        "error", name=meta.name, reason=f"cannot read source: {describe(exc)}"
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
            return [meta.name for meta, digest in digests if digest.result() != meta.sha256]
