"""``serve``: wait for an upstream, receive, forward and verify; again after a broken link."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any

from ..common import Json, RelayError, describe_error, format_address, parse_address
from ..manifest import FileMeta, RelayManifest, load_manifest_file, read_manifest
from ..names import resume_path
from ..store import LocalStore, check_disk_space, load_resume_point
from .forwarder import Forwarder
from .output import Counters, Emitter, ProgressThread, StageClock
from .pipeline import ChunkPool, FileJob, Hasher, Writer
from .protocol import (
    DEFAULT_CHUNK,
    FRAME,
    HDR,
    MAX_CHUNK,
    MIN_CHUNK,
    PROTOCOL,
    T_DATA,
    T_END,
    T_ERROR,
    T_FILE,
    T_HELLO,
    T_KEEPALIVE,
    T_NEED,
    T_REPORT,
    Conn,
    Keepalive,
    Options,
    PeerClosed,
    ProtocolError,
    tune_socket,
)

VERIFIED_STATES = ("skipped", "received", "repaired")
EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_CANCELLED = 4
SLICE_MIN = 64 << 10  # forward at least this much at once...
SLICE_MAX = 4 << 20  # ... and at most this much, or what came in 10 ms
SLICE_WAIT = 0.01


class Lowat:
    """The socket's receive low-water mark: a slow stream wakes the receiving thread once per
    slice instead of once per packet (SO_RCVLOWAT, where the platform has it)."""

    OPTION = getattr(socket, "SO_RCVLOWAT", None)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.value = 1

    def set(self, value: int) -> None:
        if value != self.value and self.OPTION is not None:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, self.OPTION, value)
            except OSError:
                self.OPTION = None
                return
            self.value = value


class Lanes:
    """The parallel streams (lanes) of one broadcast session at this host: each lane is its own
    connection carrying its own share of the files. They share one scan and one disk check,
    and each waits for the others before it reports, so every report is the host's result."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.cond = threading.Condition()
        self.scan_started = False
        self.scanned = threading.Event()
        self.scan: dict[str, Any] = {}
        self.refusal: str | None = None
        self.done: dict[int, bool] = {}
        self.streamed: set[int] = set()
        self.running = 0
        self.last = time.monotonic()

    def scan_once(self, scan: Any) -> dict[str, Any]:
        with self.cond:
            first = not self.scan_started
            self.scan_started = True
        if first:
            self.scan = scan()
            self.scanned.set()
        self.scanned.wait()
        return self.scan

    def started(self) -> None:
        with self.cond:
            self.running += 1

    def ended(self, lane: int, ok: bool) -> None:
        with self.cond:
            self.done[lane] = ok or self.done.get(lane, False)
            self.running -= 1
            self.last = time.monotonic()
            self.cond.notify_all()

    def complete(self) -> bool:
        with self.cond:
            return len(self.done) == self.count and all(self.done.values())

    def idle_for(self) -> float:
        with self.cond:
            return 0.0 if self.running else time.monotonic() - self.last

    def all_streamed(self, lane: int, timeout: float) -> None:
        """Wait (bounded) until every lane has received all its files, before reporting."""
        with self.cond:
            self.streamed.add(lane)
            self.cond.notify_all()
            self.cond.wait_for(lambda: len(self.streamed) >= self.count, timeout)


class Results:
    """Per-process fate of every manifest file, across sessions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.was_wrong: set[str] = set()

    def set(self, name: str, state: str, reason: str = "") -> None:
        with self.lock:
            self.state[name] = state
            if reason:
                self.reasons[name] = reason
            else:
                self.reasons.pop(name, None)


class Receiver:
    """One receiving host, across the sessions of one broadcast."""

    def __init__(self, args: argparse.Namespace, opts: Options, emit: Emitter) -> None:
        self.args = args
        self.opts = opts
        self.emit = emit
        self.store = LocalStore(args.dest)
        self.results = Results()
        self.counters = Counters()
        self.manifest: RelayManifest | None = None
        self.expected: RelayManifest | None = (
            load_manifest_file(args.manifest) if args.manifest else None
        )
        self.refusal = ""
        self.skipped_hosts: list[Json] = []
        self.jobs: dict[str, FileJob] = {}
        self.resumed: list[Json] = []
        self.sessions = 0
        self.started = time.monotonic()
        self.message = ""

    def run(self) -> int:
        host, port = parse_address(self.args.listen)
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, sockaddr = infos[0]
        lsock = socket.socket(family, kind, proto)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tune_socket(lsock, self.opts.sockbuf)
        lsock.bind(sockaddr)
        lsock.listen(16)
        bound = lsock.getsockname()[1]
        if not self.args.name:
            self.emit.host = format_address(host, bound)
        self.emit(
            "listening",
            address=format_address(host, bound),
            port=bound,
            dest=self.store.dest,
            pid=os.getpid(),
        )
        progress = ProgressThread(self.emit, self.counters, self.args.progress_interval)
        progress.start()
        wait = self.args.accept_timeout
        complete = False
        lanes: dict[str, Lanes] = {}
        try:
            while not complete:
                lsock.settimeout(0.5 if lanes else wait)
                try:
                    sock, peer = lsock.accept()
                except socket.timeout:
                    if any(g.complete() for g in lanes.values()):
                        complete = True
                        break
                    if lanes and min(g.idle_for() for g in lanes.values()) < wait:
                        continue
                    self.message = (
                        f"no upstream connected within {wait:g} s"
                        if self.sessions == 0
                        else f"upstream lost and none re-linked within {wait:g} s"
                    )
                    break
                sock.settimeout(self.opts.io_timeout)
                conn = Conn(sock, f"upstream {peer[0]}")
                try:
                    hello = conn.recv_json(T_HELLO)
                except (OSError, RelayError, ValueError) as exc:
                    self.emit("ignored", peer=str(peer[0]), reason=describe_error(exc))
                    conn.close()
                    continue
                self.sessions += 1
                wait = self.args.relink_timeout
                count = hello.get("lanes", 1)
                if not isinstance(count, int) or count <= 1:
                    complete = self.session(conn, hello)
                    continue
                group = lanes.setdefault(str(hello.get("session", "")), Lanes(count))
                group.started()
                threading.Thread(
                    target=self._lane, args=(conn, hello, group), name="lane", daemon=True
                ).start()
        finally:
            progress.stop()
            lsock.close()
        return self.finish()

    def summary(self, status: str | None = None) -> Json:
        files = self.manifest.files if self.manifest else ()
        state = self.results.state
        names = [f.name for f in files]
        verified = [n for n in names if state.get(n) in VERIFIED_STATES]
        missing = [n for n in names if state.get(n) not in VERIFIED_STATES]
        if status is None:
            if self.refusal:
                status = "refused"
            elif self.manifest is not None and not missing:
                status = "ok"
            else:
                status = "incomplete"
        return {
            "status": status,
            "dest": self.store.dest,
            "files": len(names),
            "verified": len(verified),
            "skipped": [n for n in names if state.get(n) == "skipped"],
            "received": [n for n in names if state.get(n) == "received"],
            "repaired": [n for n in names if state.get(n) == "repaired"],
            "resumed": self.resumed,
            "failed": [
                {"name": n, "reason": self.results.reasons.get(n, "")}
                for n in names
                if state.get(n) == "failed"
            ],
            "missing": missing,
            "skipped_hosts": self.skipped_hosts,
            "bytes_received": self.counters.rx,
            "bytes_written": self.counters.written,
            "bytes_forwarded": self.counters.tx,
            "cpu": self.counters.cpu_report(),
            "sessions": self.sessions,
            "seconds": round(time.monotonic() - self.started, 3),
            "message": self.refusal or self.message,
        }

    def finish(self, status: str | None = None) -> int:
        summary = self.summary(status)
        self.emit("summary", **summary)
        return {
            "ok": EXIT_OK,
            "refused": EXIT_REFUSED,
            "cancelled": EXIT_CANCELLED,
        }.get(summary["status"], EXIT_INCOMPLETE)

    def local_source(self, name: str) -> str | None:
        """A verified local copy to serve a re-linked downstream from (waits for the writer)."""
        job = self.jobs.get(name)
        if job is not None:
            job.done.wait()
            return job.final if job.ok else None
        if self.results.state.get(name) in VERIFIED_STATES:
            return self.store.final(name)
        return None

    # -- one upstream connection

    def _lane(self, conn: Conn, hello: Json, group: Lanes) -> None:
        lane = hello.get("lane", 0)
        lane = lane if isinstance(lane, int) else 0
        ok = False
        try:
            ok = self.session(conn, hello, group, lane)
        finally:
            group.ended(lane, ok)

    def _hello(self, conn: Conn, hello: Json) -> tuple[RelayManifest, list[str], int] | None:
        try:
            if hello.get("proto") != PROTOCOL:
                raise RelayError(f"protocol {hello.get('proto')!r}, this relay speaks {PROTOCOL}")
            manifest = read_manifest(hello.get("manifest"))
            chain = [str(a) for a in hello.get("chain", [])]
            chunk = int(hello.get("chunk", DEFAULT_CHUNK))
            if not MIN_CHUNK <= chunk <= MAX_CHUNK:
                raise RelayError(f"chunk size {chunk} is out of range")
            if self.expected is not None and self.expected.digest() != manifest.digest():
                raise RelayError(
                    f"{self.emit.host}: the manifest sent differs from {self.args.manifest}"
                )
        except (RelayError, TypeError, ValueError) as exc:
            self.emit("error", reason=describe_error(exc))
            with contextlib.suppress(OSError):
                conn.send_frame(T_ERROR, describe_error(exc).encode("utf-8"))
            conn.close()
            return None
        return manifest, chain, chunk

    def _own_files(
        self, manifest: RelayManifest, states: dict[str, str]
    ) -> tuple[list[FileMeta], dict[str, int]]:
        """The files this host must receive, and where each one's own bytes start."""
        own: list[FileMeta] = []
        starts: dict[str, int] = {}
        for meta in manifest.files:
            st = states.get(meta.name, "missing")
            if st == "present":
                if self.results.state.get(meta.name) not in VERIFIED_STATES:
                    self.results.set(meta.name, "skipped")
                continue
            own.append(meta)
            if st.startswith("wrong"):
                self.results.was_wrong.add(meta.name)
                self.emit("file", name=meta.name, status="wrong", reason=st[7:])
            if self.results.state.get(meta.name) in VERIFIED_STATES:
                self.results.set(meta.name, "missing")
            point = load_resume_point(self.store.dest, meta) if st == "missing" else None
            starts[meta.name] = point.offset if point else 0
        return own, starts

    def session(self, conn: Conn, hello: Json, group: Lanes | None = None, lane: int = 0) -> bool:
        """One upstream connection (one lane of it). True when the stream ended properly."""
        parsed = self._hello(conn, hello)
        if parsed is None:
            return False
        manifest, chain, chunk = parsed
        if not self.args.name and hello.get("you"):
            self.emit.host = str(hello["you"])
        self.manifest = manifest
        self.store.adopt(manifest)
        verify = bool(hello.get("verify")) or self.opts.verify
        scan: dict[str, Any] = {}

        def scan_all() -> dict[str, Any]:
            try:
                return {"states": self.store.scan(manifest, verify, self.opts.workers(), self.emit)}
            except (OSError, RelayError) as exc:
                return {"error": describe_error(exc)}

        def do_scan() -> None:
            scan.update(group.scan_once(scan_all) if group is not None else scan_all())

        scanner = threading.Thread(target=do_scan, name="scan", daemon=True)
        opts = self.opts
        with contextlib.suppress(TypeError, ValueError):
            opts = dataclasses.replace(
                opts,
                io_timeout=float(hello.get("io_timeout", opts.io_timeout)),
                connect_timeout=float(hello.get("connect_timeout", opts.connect_timeout)),
            )
        fwd = Forwarder(
            chain,
            {k: v for k, v in hello.items() if k not in ("you", "chain")},
            manifest.files,
            opts,
            self.emit,
            self.counters,
            self.local_source,
        )
        with Keepalive(conn, self.opts.keepalive):
            scanner.start()
            fwd.link()
            scanner.join()
        own, starts = self._own_files(manifest, scan.get("states", {}))
        if group is None or group.refusal is None:
            self.refusal = self._refusal(scan, own, starts)  # one disk check for all lanes
            if group is not None:
                group.refusal = self.refusal
        lane_files = hello.get("lane_files")
        if isinstance(lane_files, list):
            own = [m for m in own if m.name in set(lane_files)]
            starts = {m.name: starts[m.name] for m in own}
        if self.refusal:
            self.emit("refused", message=self.refusal)
            own, starts = [], {}
        else:
            for meta in own:
                paths = [self.store.final(meta.name)]
                if not starts[meta.name]:
                    paths += [
                        self.store.partial(meta.name),
                        resume_path(self.store.dest, meta.name),
                    ]
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        own_names = {m.name for m in own}
        wanted = dict(starts)
        for name, offset in fwd.need.items():
            wanted[name] = min(offset, wanted.get(name, offset))
        plan = [m for m in manifest.files if m.name in wanted]
        with self.counters.lock:
            lane_total = sum(m.size - wanted[m.name] for m in plan)
            self.counters.total = lane_total + (self.counters.total if group else 0)
        self.emit(
            "plan",
            need=[m.name for m in own],
            need_bytes=sum(m.size - starts[m.name] for m in own),
            resume={n: o for n, o in starts.items() if o},
            stream_files=len(plan),
            stream_bytes=self.counters.total,
            downstream=fwd.current,
        )
        try:
            conn.send_json(
                T_NEED,
                {
                    "need": {m.name: wanted[m.name] for m in plan},
                    "host": self.emit.host,
                    "hosts": fwd.link_report(),
                },
            )
        except OSError as exc:
            self.emit("upstream_lost", reason=describe_error(exc))
            fwd.abort()
            self._merge_skips(fwd)
            conn.close()
            return False
        return self._stream(
            conn, manifest, chunk, fwd, own_names, starts, verify, plan, group, lane
        )

    def _stream(
        self,
        conn: Conn,
        manifest: RelayManifest,
        chunk: int,
        fwd: Forwarder,
        own_names: set[str],
        starts: dict[str, int],
        verify: bool,
        plan: list[FileMeta],
        group: Lanes | None = None,
        lane: int = 0,
    ) -> bool:
        pool = ChunkPool(chunk, max(2, self.args.buffers), self.opts.io_timeout)
        writer = Writer(
            self.results,
            self.counters,
            self.emit,
            fwd.q.put,
            self.opts.checkpoint,
            self.opts.drop_cache,
            self.opts.io_timeout,
        )
        hasher = Hasher(self.counters, self.opts.checkpoint)
        fwd.start([m.name for m in plan])
        by_name = {m.name: m for m in manifest.files}
        job: FileJob | None = None
        session_jobs: list[FileJob] = []
        clock = StageClock(self.counters, "receive")
        clock.__enter__()
        try:
            while True:
                ftype, length = conn.recv_header()
                if ftype == T_KEEPALIVE:
                    conn.recv_payload(length)
                    continue
                if ftype == T_END:
                    conn.recv_payload(length)
                    break
                if ftype != T_FILE:
                    raise ProtocolError(f"unexpected frame {chr(ftype)!r} between files")
                payload = conn.recv_payload(length)
                info = json.loads(payload.decode("utf-8"))
                meta, offset = self._file_info(info, by_name, payload)
                job = None
                if meta.name in own_names:
                    start = starts.get(meta.name, 0)
                    if offset > start:
                        raise ProtocolError(
                            f"{meta.name}: the stream starts at byte {offset}, this host"
                            f" needs it from byte {start}"
                        )
                    point = load_resume_point(self.store.dest, meta) if start else None
                    if start and point is None:
                        raise ProtocolError(f"{meta.name}: its resume point vanished")
                    job = FileJob(
                        meta, self.store, meta.name in self.results.was_wrong, point, verify
                    )
                    if point is not None:
                        self.resumed.append({"name": meta.name, "offset": point.offset})
                        self.emit("resume", name=meta.name, offset=point.offset)
                    self.jobs[meta.name] = job
                    session_jobs.append(job)
                    writer.q.put(("begin", job))
                    hasher.begin(job)
                writer.q.put(("route", ("file", meta, FRAME.pack(T_FILE, length) + payload, job)))
                with self.counters.lock:
                    self.counters.file = meta.name
                self._receive_file(conn, meta, offset, job, pool, writer)
                if job is not None:
                    writer.q.put(("end", job))
                    job.hq.put(("end",))
                    job = None
        except (OSError, RelayError, ValueError) as exc:
            clock.__exit__()
            self.emit("upstream_lost", reason=describe_error(exc))
            fwd.abort()
            if job is not None:
                job.hq.put(("abort",))
                writer.q.put(("abort", job))
                self.jobs.pop(job.meta.name, None)
            writer.q.put(("stop",))
            writer.thread.join()
            fwd.join()
            for done in session_jobs:
                done.close_read()
            self._merge_skips(fwd)
            conn.close()
            return False
        clock.__exit__()
        writer.q.put(("route", ("end",)))
        writer.q.put(("stop",))
        with Keepalive(conn, self.opts.keepalive):
            writer.thread.join()
            fwd.join()
            if group is not None:
                group.all_streamed(lane, self.opts.io_timeout)
        for done in session_jobs:
            done.close_read()
        self._merge_skips(fwd)
        report = dict(self.summary(), host=self.emit.host)
        with contextlib.suppress(OSError):
            conn.send_json(T_REPORT, {"hosts": [report, *fwd.skipped, *fwd.reports]})
        conn.close()
        return True

    def _refusal(self, scan: dict[str, Any], own: list[FileMeta], starts: dict[str, int]) -> str:
        """Why this host cannot take its files (cannot scan, no room), or ""."""
        if "error" in scan:
            return f"{self.emit.host}: cannot check {self.store.dest}: {scan['error']}"
        reclaim = 0
        for meta in own:
            paths = [self.store.final(meta.name)]
            if not starts[meta.name]:
                paths.append(self.store.partial(meta.name))
            for path in paths:
                with contextlib.suppress(OSError):
                    reclaim += os.stat(path).st_size
        needed = sum(m.size - starts[m.name] for m in own)
        return check_disk_space(self.store.dest, needed, self.emit.host, reclaim) or ""

    @staticmethod
    def _file_info(info: Any, by_name: dict[str, FileMeta], payload: bytes) -> tuple[FileMeta, int]:
        if isinstance(info, dict):
            offset = info.pop("offset", 0)
            found = by_name.get(str(info.get("name")))
            if (
                found is not None
                and found.to_json() == info
                and isinstance(offset, int)
                and 0 <= offset <= found.size
            ):
                return found, offset
        raise ProtocolError(f"file frame {payload[:200]!r} does not match the manifest")

    def _merge_skips(self, fwd: Forwarder) -> None:
        self.skipped_hosts.extend(s for s in fwd.skipped if s not in self.skipped_hosts)

    def _receive_file(
        self,
        conn: Conn,
        meta: FileMeta,
        offset: int,
        job: FileJob | None,
        pool: ChunkPool,
        writer: Writer,
    ) -> None:
        """Data frames of one file, bytes ``offset`` to its end, each slice handed on as it
        arrives (a chain forwards long before a frame is complete)."""
        counters = self.counters
        sock = conn.sock
        put = writer.q.put
        lowat = Lowat(sock)
        start = job.start if job is not None else meta.size
        pos = offset
        while pos < meta.size:
            ftype, n = conn.recv_header()
            if ftype != T_DATA or n == 0 or n > meta.size - pos or n > pool.size:
                raise ProtocolError(f"bad data frame {chr(ftype)!r} of {n} bytes in {meta.name}")
            chunk = pool.get()
            view = chunk.view
            FRAME.pack_into(chunk.buf, 0, T_DATA, n)
            end = HDR + n
            off = HDR
            sent = 0
            last = time.monotonic()
            direct = job is not None and pos >= start  # written, then sent from the page cache
            # A broken upstream leaves this chunk referenced; the session's pool dies with it.
            while off < end:
                lowat.set(min(SLICE_MIN, end - off))
                k = sock.recv_into(view[off:end])
                if not k:
                    raise PeerClosed(f"{conn.peer} closed the connection inside {meta.name}")
                off += k
                counters.add("rx", k)  # several lanes may receive at once
                if off < end and off - sent >= SLICE_MIN:
                    now = time.monotonic()
                    if off - sent >= SLICE_MAX or now - last >= SLICE_WAIT:
                        last = now
                        self._slice(put, job, chunk, sent, off, pos, direct)
                        sent = off
            lowat.set(1)  # the next frame header is 5 bytes
            self._slice(put, job, chunk, sent, end, pos, direct)
            if job is not None and not direct and pos + n > start:
                # the frame crosses this host's resume point: its own part, written unforwarded
                a = HDR + start - pos
                put(("data", job, chunk.hold(), a, end, pos + a - HDR, None, False))
                job.hq.put(("data", chunk.hold(), a, end))
            chunk.release()
            pos += n

    @staticmethod
    def _slice(
        put: Any, job: FileJob | None, chunk: Any, a: int, b: int, pos: int, direct: bool
    ) -> None:
        if direct:
            assert job is not None
            header = bytes(chunk.view[:HDR]) if a == 0 else None
            a = max(a, HDR)
            put(("data", job, chunk.hold(), a, b, pos + a - HDR, header, True))
            job.hq.put(("data", chunk.hold(), a, b))  # hashed slice by slice, as it arrives
        else:
            put(("route", ("mem", chunk.hold(), a, b)))
