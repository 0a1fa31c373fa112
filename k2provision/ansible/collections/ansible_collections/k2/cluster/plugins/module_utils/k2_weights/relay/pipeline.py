"""The write/hash pipeline of a receiving relay.

The receiving thread reads each data frame into a pooled chunk and hands it on at once:

- to the file's **hasher** (one thread per file, so consecutive files hash in parallel; each
  update is one slice as it arrived, 64 KiB or more, large enough for the hash to run
  without the GIL);
- to the **writer** (one thread), which writes each slice at its offset in
  ``.<name>.partial`` and then routes the forwarding of that slice: ``sendfile`` straight from
  the page cache it just filled (no copy through this process), or, for a file this host does
  not keep, the bytes of the chunk. Routing through the writer keeps the stream in order.

Every ``checkpoint`` bytes the writer fdatasyncs the file, tells the kernel to drop the pages
already forwarded (``posix_fadvise(DONTNEED)``: a terabyte of weights must not evict the page
cache the engines need) and writes a resume point: the bytes on disk and the hash state at
that offset. A relay killed mid-file leaves both behind; the next run resumes there.
The chunk pool bounds memory and is the back-pressure: the writer waits while the forwarder
lags more than two checkpoints behind, so a slow downstream slows the upstream.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from typing import Any

from ..common import RelayError, describe_error
from ..hashing import Sha256, sha256_file
from ..manifest import FileMeta
from ..names import is_safetensors
from ..safetensors import check_safetensors_file
from ..store import (
    LocalStore,
    ResumePoint,
    drop_resume_point,
    fsync_dir,
    save_resume_point,
)
from .output import Counters, Emitter, StageClock
from .protocol import HDR

FADVISE = getattr(os, "posix_fadvise", None)
DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)


class Chunk:
    """One pooled buffer: frame header at [0:HDR], payload after it; reference counted."""

    __slots__ = ("buf", "pool", "refs", "view")

    def __init__(self, size: int, pool: ChunkPool) -> None:
        self.buf = bytearray(HDR + size)
        self.view = memoryview(self.buf)
        self.pool = pool
        self.refs = 0

    def hold(self) -> Chunk:
        with self.pool.lock:
            self.refs += 1
        return self

    def release(self) -> None:
        with self.pool.lock:
            self.refs -= 1
            done = self.refs == 0
        if done:
            self.pool.free.put(self)


class ChunkPool:
    """At most ``count`` chunks in flight: the bound on memory and the back-pressure."""

    def __init__(self, size: int, count: int, timeout: float) -> None:
        self.size = size
        self.count = count
        self.timeout = timeout
        self.made = 0
        self.lock = threading.Lock()
        self.free: queue.Queue[Chunk] = queue.Queue()

    def get(self) -> Chunk:
        """A free chunk with one reference (the caller's)."""
        try:
            chunk = self.free.get_nowait()
        except queue.Empty:
            with self.lock:
                grow = self.made < self.count
                if grow:
                    self.made += 1
            if grow:
                chunk = Chunk(self.size, self)
            else:
                try:
                    chunk = self.free.get(timeout=self.timeout)
                except queue.Empty:
                    raise RelayError("no buffer came back in time: a consumer stalled") from None
        chunk.refs = 1
        return chunk


class Gate:
    """How far the forwarder has sent a file; the writer waits on it (back-pressure)."""

    def __init__(self, start: int = 0) -> None:
        self.cond = threading.Condition()
        self.sent = start
        self.open = True

    def advance(self, offset: int) -> None:
        with self.cond:
            self.sent = max(self.sent, offset)
            self.cond.notify_all()

    def close(self) -> None:
        """The forwarder will not send this file (or lost its downstream): never wait."""
        with self.cond:
            self.open = False
            self.cond.notify_all()

    def wait_for(self, offset: int, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self.open or self.sent >= offset, timeout)

    def forwarded(self, written: int) -> int:
        with self.cond:
            return written if not self.open else min(written, self.sent)


class FileJob:
    """One file being received: shared by the receiving, writer, hasher and forwarder threads.

    ``start`` is where this host's own bytes begin (a resume point, else 0).
    """

    def __init__(
        self,
        meta: FileMeta,
        store: LocalStore,
        existed: bool,
        resume: ResumePoint | None,
        verify_prefix: bool,
    ) -> None:
        self.meta = meta
        self.store = store
        self.final = store.final(meta.name)
        self.partial = store.partial(meta.name)
        self.existed = existed
        self.resume = resume
        self.start = resume.offset if resume else 0
        self.verify_prefix = verify_prefix
        self.gate = Gate(self.start)
        self.fd_read = -1
        self._read_lock = threading.Lock()
        self.hashed = threading.Event()
        self.done = threading.Event()
        self.digest = ""
        self.error = ""
        self.ok = False
        self.lock = threading.Lock()
        self.durable = self.start
        self.states: list[tuple[int, bytes | None]] = []
        if resume is not None:
            self.states.append((resume.offset, resume.state))
        self.saved = self.start
        self.hq: queue.Queue[tuple[Any, ...]] = queue.Queue()

    def close_read(self) -> None:
        """Close the forwarder's read descriptor (once, whoever comes first)."""
        with self._read_lock:
            fd, self.fd_read = self.fd_read, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def note_state(self, offset: int, state: bytes | None) -> None:
        with self.lock:
            self.states.append((offset, state))
            del self.states[:-4]
        self.checkpoint()

    def note_durable(self, offset: int) -> None:
        with self.lock:
            self.durable = max(self.durable, offset)
        self.checkpoint()

    def checkpoint(self) -> None:
        """Save the newest hash state at or below the bytes on disk as the resume point."""
        with self.lock:
            usable = [s for s in self.states if s[0] <= self.durable and s[1] is not None]
            if not usable or usable[-1][0] <= self.saved or self.done.is_set():
                return
            offset, state = usable[-1]
            self.saved = offset
            save_resume_point(self.store.dest, self.meta, offset, state)


class Hasher:
    """sha256 of each file's own bytes, one thread per file (files hash in parallel)."""

    def __init__(self, counters: Counters, checkpoint: int) -> None:
        self.counters = counters
        self.checkpoint = checkpoint

    def begin(self, job: FileJob) -> None:
        threading.Thread(target=self._run, args=(job,), name="hasher", daemon=True).start()

    def _run(self, job: FileJob) -> None:
        with StageClock(self.counters, "hash"):
            self._hash(job)

    def _hash(self, job: FileJob) -> None:
        resume = job.resume
        h: Sha256 | None = None
        if resume is not None and resume.state is not None and not job.verify_prefix:
            with contextlib.suppress(ValueError):
                h = Sha256.from_state(resume.state)
        if h is None:
            h = Sha256()
            if job.start:  # no saved state (or --verify): the prefix is read back from disk
                try:
                    sha256_file(job.partial, start=0, end=job.start, into=h)
                except OSError as exc:
                    job.error = (
                        job.error or f"cannot re-read the partial file: {describe_error(exc)}"
                    )
        offset = job.start
        last = offset
        while True:
            item = job.hq.get()
            kind = item[0]
            if kind == "data":
                chunk, a, b = item[1], item[2], item[3]
                try:
                    h.update(chunk.view[a:b])
                finally:
                    chunk.release()
                offset += b - a
                if offset - last >= self.checkpoint:
                    last = offset
                    job.note_state(offset, h.state())
            elif kind == "end":
                job.digest = h.hexdigest()
                job.hashed.set()
                return
            else:  # "abort": keep the newest state for a resume
                job.note_state(offset, h.state())
                job.hashed.set()
                return


class Writer:
    """Writes each slice, routes its forwarding, flushes and checkpoints; finishes files."""

    def __init__(
        self,
        results: Any,
        counters: Counters,
        emit: Emitter,
        forward: Any,
        checkpoint: int,
        drop_cache: bool,
        io_timeout: float,
    ) -> None:
        self.results = results
        self.counters = counters
        self.emit = emit
        self.forward = forward
        self.checkpoint = checkpoint
        self.drop_cache = drop_cache
        self.io_timeout = io_timeout
        self.q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with StageClock(self.counters, "write"):
            self._loop()

    def _loop(self) -> None:
        fd = -1
        written = 0
        synced = 0
        dropped = 0
        while True:
            item = self.q.get()
            kind = item[0]
            if kind == "stop":
                return
            if kind == "route":  # forwarding only: pass the item on, in order
                self.forward(item[1])
                continue
            job: FileJob = item[1]
            if kind == "begin":
                fd, written = self._open(job), job.start
                synced = dropped = job.start
            elif kind == "data":
                chunk, a, b, offset, header, fwd = item[2:8]
                try:
                    if fd >= 0 and not job.error:
                        # back-pressure: never run more than two checkpoints ahead of the
                        # forwarder (the pages it still needs stay in the page cache)
                        job.gate.wait_for(offset - 2 * self.checkpoint, self.io_timeout)
                        view = chunk.view[a:b]
                        pos = offset
                        while len(view):
                            n = os.pwrite(fd, view, pos)
                            view = view[n:]
                            pos += n
                        self.counters.add("written", b - a)
                        written = offset + b - a
                except OSError as exc:
                    job.error = f"write failed: {describe_error(exc)}"
                if not fwd:
                    # bytes whose frame went on from memory (it began below this host's resume
                    # point): the forwarder never sends them from disk, so the back-pressure
                    # must not wait for it to (it would stall the chain for the I/O timeout)
                    chunk.release()
                    job.gate.advance(offset + b - a)
                elif fd >= 0 and not job.error:
                    chunk.release()
                    if header is not None:
                        self.forward(("bytes", header))
                    self.forward(("sendfile", job, offset, b - a))
                else:  # nothing trustworthy on disk: forward the received bytes themselves
                    self.forward(("mem", chunk, a - (HDR if header is not None else 0), b))
                if written - synced >= self.checkpoint and fd >= 0 and not job.error:
                    synced, dropped = self._flush(job, fd, written, dropped)
            elif kind == "end":
                self.forward(("filedone", job))
                self._finish(job, fd)
                fd = -1
            elif kind == "abort":  # the upstream is gone: keep what is on disk for a resume
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.fdatasync(fd)
                        job.note_durable(written)
                    job.hashed.wait(self.io_timeout)
                    job.note_durable(written)
                    os.close(fd)
                fd = -1
                job.done.set()
                job.close_read()

    def _open(self, job: FileJob) -> int:
        try:
            os.makedirs(os.path.dirname(job.partial), exist_ok=True)
            if job.start:
                fd = os.open(job.partial, os.O_WRONLY)
                os.ftruncate(fd, job.start)
            else:
                drop_resume_point(job.store.dest, job.meta.name)
                fd = os.open(job.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            job.fd_read = os.open(job.partial, os.O_RDONLY)  # the forwarder's sendfile source
            return fd
        except OSError as exc:
            job.error = f"cannot open {job.partial}: {describe_error(exc)}"
            return -1

    def _flush(self, job: FileJob, fd: int, written: int, dropped: int) -> tuple[int, int]:
        """fdatasync, resume point, and drop the pages the forwarder is done with."""
        try:
            os.fdatasync(fd)
        except OSError as exc:
            job.error = f"write failed: {describe_error(exc)}"
            return written, dropped
        job.note_durable(written)
        done = job.gate.forwarded(written)
        if self.drop_cache and FADVISE is not None and done > dropped:
            with contextlib.suppress(OSError):
                FADVISE(fd, dropped, done - dropped, DONTNEED)
            dropped = done
        return written, dropped

    def _finish(self, job: FileJob, fd: int) -> None:
        meta = job.meta
        if fd >= 0:
            try:
                os.fsync(fd)
                if self.drop_cache and FADVISE is not None:
                    job.gate.wait_for(meta.size, self.io_timeout)
                    with contextlib.suppress(OSError):
                        FADVISE(fd, 0, 0, DONTNEED)
                os.close(fd)
            except OSError as exc:
                job.error = job.error or f"write failed: {describe_error(exc)}"
        job.hashed.wait()
        reason = job.error
        if not reason:
            try:
                size = os.stat(job.partial).st_size
            except OSError as exc:
                size = -1
                reason = f"partial file vanished: {describe_error(exc)}"
            if not reason and size != meta.size:
                reason = f"size {size} != manifest size {meta.size}"
            elif not reason and job.digest != meta.sha256:
                reason = f"sha256 {job.digest} != manifest sha256 {meta.sha256}"
            elif not reason and is_safetensors(meta.name):
                problem = check_safetensors_file(job.partial, meta.size)
                if problem:
                    reason = f"safetensors {problem}"
        job.done.set()  # no resume point is written after this
        drop_resume_point(job.store.dest, meta.name)
        if not reason:
            try:
                os.replace(job.partial, job.final)
                fsync_dir(os.path.dirname(job.final))
                job.store.record(meta, os.stat(job.final).st_mtime_ns)
            except OSError as exc:
                reason = f"cannot install {job.final}: {describe_error(exc)}"
        if reason:
            with contextlib.suppress(OSError):
                os.unlink(job.partial)
            self.results.set(meta.name, "failed", reason)
            self.emit("file", name=meta.name, status="failed", reason=reason)
        else:
            state = "repaired" if job.existed else "received"
            self.results.set(meta.name, state)
            self.emit("file", name=meta.name, status=state, size=meta.size)
        job.ok = not reason
