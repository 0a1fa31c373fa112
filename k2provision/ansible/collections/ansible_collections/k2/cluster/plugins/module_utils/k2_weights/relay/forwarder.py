"""The downstream side of a relay (or one stream of the seed): link, forward, re-link.

Items come through ``q``, in stream order:

- ("file", meta, frame, job): a file begins (``job`` is this host's copy, or None);
- ("bytes", data): bytes to send as they are (a data frame's header);
- ("mem", chunk, start, end): bytes of a pooled chunk, released once sent;
- ("sendfile", job, offset, count): bytes this host just wrote, sent from its page cache;
- ("source", shared_fd, offset, count): bytes of a seed's source file;
- ("filedone", job), ("end",) or ("abort",).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..common import Json, RelayError, describe_error
from ..manifest import FileMeta
from .output import Counters, Emitter, StageClock
from .pipeline import Chunk, FileJob
from .protocol import (
    DEFAULT_CHUNK,
    FRAME,
    HDR,
    T_DATA,
    T_END,
    T_FILE,
    T_HELLO,
    T_NEED,
    T_REPORT,
    Conn,
    Options,
    connect,
    need_map,
    send_file_range,
)


class SharedFd:
    """A source file descriptor shared by several forwarders; closed by the last one."""

    def __init__(self, fd: int, refs: int) -> None:
        self.fd = fd
        self.refs = refs
        self.lock = threading.Lock()

    def hold(self) -> SharedFd:
        with self.lock:
            self.refs += 1
        return self

    def release(self) -> None:
        with self.lock:
            self.refs -= 1
            last = self.refs == 0
        if last:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def file_frame(meta: FileMeta, offset: int) -> bytes:
    """The ``F`` frame announcing ``meta``, its data starting at byte ``offset``."""
    body = dict(meta.to_json(), offset=offset)
    payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return FRAME.pack(T_FILE, len(payload)) + payload


class Forwarder:
    """Links to the first reachable host of its chain and forwards the stream to it."""

    def __init__(
        self,
        chain: list[str],
        hello: Json,
        files: tuple[FileMeta, ...],
        opts: Options,
        emit: Emitter,
        counters: Counters,
        local_source: Callable[[str], str | None],
        queue_limit: int = 0,
    ) -> None:
        self.candidates = list(chain)
        self.hello = hello
        self.files = files
        self.opts = opts
        self.emit = emit
        self.counters = counters
        self.local_source = local_source
        self.conn: Conn | None = None
        self.pending: Conn | None = None
        self.current = ""
        self.need: dict[str, int] = {}
        self.below: list[Json] = []
        self.skipped: list[Json] = []
        self.reports: list[Json] = []
        self.q: queue.Queue[tuple[Any, ...]] = queue.Queue(queue_limit)
        self.upcoming: set[str] = set()
        self.backlog: list[FileMeta] = []
        self.forwarding = False
        self.job: FileJob | None = None
        self.aborted = threading.Event()
        self.lock = threading.Lock()
        self.tx = 0
        self.thread: threading.Thread | None = None

    # -- linking

    def link(self) -> bool:
        """Link to the first reachable host of the remaining chain; False when none is."""
        while self.candidates and not self.aborted.is_set():
            addr = self.candidates.pop(0)
            hello = dict(self.hello)
            hello["you"] = addr
            hello["chain"] = list(self.candidates)
            conn: Conn | None = None
            try:
                conn = connect(addr, self.opts, self.aborted)
                with self.lock:
                    self.pending = conn
                if self.aborted.is_set():
                    raise RelayError("aborted")
                conn.send_json(T_HELLO, hello)
                reply = conn.recv_json(T_NEED)
                need = need_map(reply.get("need"))
            except (OSError, RelayError, ValueError) as exc:
                if conn is not None:
                    conn.close()
                with self.lock:
                    self.pending = None
                if self.aborted.is_set():
                    return False
                self._skip(addr, f"cannot link: {describe_error(exc)}")
                continue
            below = [h for h in reply.get("hosts", []) if isinstance(h, dict)]
            gone = {h.get("host") for h in below if h.get("state") == "skipped"}
            self.candidates = [c for c in self.candidates if c not in gone]
            with self.lock:
                self.pending = None
                self.conn = conn
            self.current = addr
            self.need = need
            self.below = below
            self.emit("link", downstream=addr, need_files=len(need))
            return True
        self.conn = None
        self.current = ""
        self.need = {}
        self.below = []
        return False

    def link_report(self) -> list[Json]:
        """What this relay's handshake reply tells upstream about the hosts below it."""
        out: list[Json] = [{"host": s["host"], "state": "skipped"} for s in self.skipped]
        if self.current:
            out.append({"host": self.current, "state": "linked"})
        return out + self.below

    def _skip(self, addr: str, reason: str) -> None:
        self.skipped.append({"host": addr, "status": "skipped", "reason": reason})
        self.emit("skip", skipped=addr, reason=reason)

    # -- the thread

    def start(self, plan: list[str]) -> None:
        self.upcoming = set(plan)
        self.thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()

    def abort(self) -> None:
        """Stop at once (the upstream is gone): drop the downstream so it resets too."""
        self.aborted.set()
        with self.lock:
            for conn in (self.conn, self.pending):
                if conn is not None:
                    conn.close()
        if self.job is not None:
            self.job.gate.close()
        self.q.put(("abort",))

    def _run(self) -> None:
        with StageClock(self.counters, "forward"):
            self._loop()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            kind = item[0]
            if kind == "mem":
                chunk: Chunk = item[1]
                try:
                    if self.forwarding:
                        start, end = item[2], item[3]
                        self._send(chunk.view[start:end], end - start - (HDR if start == 0 else 0))
                finally:
                    chunk.release()
            elif kind == "bytes":
                if self.forwarding:
                    self._send(item[1], 0)
            elif kind == "sendfile":
                job: FileJob = item[1]
                if self.forwarding:
                    self._send_range(job.fd_read, item[2], item[3])
                    job.gate.advance(item[2] + item[3])
            elif kind == "source":
                shared: SharedFd = item[1]
                try:
                    if self.forwarding:
                        self._send_range(shared.fd, item[2], item[3])
                finally:
                    shared.release()
            elif kind == "file":
                meta: FileMeta = item[1]
                self.upcoming.discard(meta.name)
                self.job = item[3]
                self.forwarding = self.conn is not None and meta.name in self.need
                if self.forwarding:
                    self._send(item[2], 0)
                elif self.job is not None:
                    self.job.gate.close()
            elif kind == "filedone":
                done: FileJob = item[1]
                done.gate.close()
                done.close_read()
                self.job = None
            elif kind == "end":
                self._finish()
                return
            elif kind == "abort":
                return

    def _send(self, data: bytes | memoryview, payload: int) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            conn.sock.sendall(data)
        except OSError as exc:
            self._broken(exc)
            return
        self.tx += payload
        self.counters.add("tx", payload)

    def _send_range(self, fd: int, offset: int, count: int) -> None:
        """Send a file range; a file that ends early is padded with zeros so the stream
        stays framed (the receiver's sha256 check then fails that file)."""
        conn = self.conn
        if conn is None:
            return
        try:
            done = send_file_range(conn.sock, fd, offset, count, self.opts.zero_copy)
            if done < count:
                self.emit("source_short", offset=offset + done, missing=count - done)
                conn.sock.sendall(bytes(count - done))
        except OSError as exc:
            self._broken(exc)
            return
        self.tx += count
        self.counters.add("tx", count)

    def _broken(self, exc: BaseException) -> None:
        self.forwarding = False
        if self.job is not None:
            self.job.gate.close()
        if not self.aborted.is_set():
            self._lost(exc)

    def _lost(self, exc: BaseException) -> None:
        addr = self.current
        if self.conn is not None:
            self.conn.close()
        with self.lock:
            self.conn = None
        self._skip(addr, f"connection lost: {describe_error(exc)}")
        if self.link():
            self.backlog = [
                m for m in self.files if m.name in self.need and m.name not in self.upcoming
            ]
            self.emit("relink", downstream=self.current, backlog=[m.name for m in self.backlog])

    def _send_from_disk(self, conn: Conn, meta: FileMeta, path: str, buf: bytearray) -> None:
        """Send one file from the local verified copy. Local read trouble never breaks the
        framing: missing bytes go out as zeros and the receiver's sha256 check fails."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            self.emit("backlog_unavailable", name=meta.name, reason=describe_error(exc))
            return
        try:
            conn.sock.sendall(file_frame(meta, 0))
            view = memoryview(buf)
            chunk = len(buf) - HDR
            offset = 0
            short = False
            while offset < meta.size:
                n = min(chunk, meta.size - offset)
                FRAME.pack_into(buf, 0, T_DATA, n)
                got = 0
                with contextlib.suppress(OSError):
                    while got < n:
                        k = os.preadv(fd, [view[HDR + got : HDR + n]], offset + got)
                        if not k:
                            break
                        got += k
                if got < n:
                    view[HDR + got : HDR + n] = bytes(n - got)
                    if not short:
                        self.emit("backlog_short", name=meta.name, path=path)
                    short = True
                conn.sock.sendall(view[: HDR + n])
                offset += n
                self.tx += n
                self.counters.add("tx", n)
        finally:
            os.close(fd)

    def _finish(self) -> None:
        buf: bytearray | None = None
        while self.conn is not None and not self.aborted.is_set():
            conn = self.conn
            try:
                while self.backlog:
                    meta = self.backlog[0]
                    path = self.local_source(meta.name)
                    if path is None:
                        self.emit("backlog_unavailable", name=meta.name, downstream=self.current)
                    else:
                        if buf is None:
                            buf = bytearray(HDR + int(self.hello.get("chunk", DEFAULT_CHUNK)))
                        self._send_from_disk(conn, meta, path, buf)
                    self.backlog.pop(0)
                conn.send_frame(T_END)
                report = conn.recv_json(T_REPORT)
                hosts = report.get("hosts", [])
                self.reports = [h for h in hosts if isinstance(h, dict)]
                conn.close()
                return
            except (OSError, RelayError, ValueError) as exc:
                if self.aborted.is_set():
                    return
                self.forwarding = False
                self._lost(exc)
                if self.conn is not None:
                    self.backlog = [m for m in self.files if m.name in self.need]
