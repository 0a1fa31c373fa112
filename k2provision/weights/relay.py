#!/usr/bin/env python3
"""Pipelined weight relay: moves a manifest's files along a chain of hosts at line rate.

This file is self-contained (standard library only, Python 3.9+). It is copied to every
host and run with the host's own ``python3``; k2provision imports it too, for the
verification helpers, but it never imports k2provision.

Commands
--------
On every receiving host, started first (one process per host; it exits after one complete
stream, or when no upstream comes within ``--accept-timeout`` / ``--relink-timeout``)::

    python3 relay.py serve --dest /models/Kimi-K2 [--listen 0.0.0.0:29517] [--name NAME]
                           [--manifest FILE] [--verify]

On the seed (the host that holds the files, or the controller)::

    python3 relay.py send --source DIR --manifest FILE|- --chain H1:P,H2:P,... [--fanout]
                          [--verify] [--max-rate BYTES_PER_S] [--chunk-size BYTES]

Local check only (no network)::

    python3 relay.py check --dest DIR --manifest FILE [--verify]

``send`` connects to the first host of ``--chain``; every host forwards the stream to the
next one while it is still receiving it, so all hosts finish in about size / link rate.
With ``--fanout`` the seed opens one stream per host instead (the baseline: N streams on
the seed's one link). ``--manifest -`` reads the manifest from standard input.

Output: one JSON object per line on stdout. Every line has ``event`` and ``host``; the
events are ``listening`` (address, port), ``plan``, ``progress`` (rx, tx, written, total,
rate in bytes/s), ``file`` (name, status, reason), ``skip`` / ``relink`` (a downstream
host dropped out and the chain was re-linked around it), ``refused`` (message) and, last,
``summary``: status (ok, incomplete, refused, cancelled), verified (count), skipped (files
already verified in place, nothing transferred), received, repaired (present but wrong,
sent again), failed (name, reason), missing, skipped_hosts, byte counters and, from the
seed, ``hosts``: the summary of every host of the chain. Exit codes: 0 ok, 1 incomplete,
2 usage, 3 refused (disk space, bad source), 4 cancelled (SIGTERM/SIGINT).

Protocol (TCP, one connection per link)
---------------------------------------
Every message is a frame: 1 byte type, 4 byte big-endian length, payload.

``H`` hello, down: JSON with the manifest, the rest of the chain (every host below the
receiver, in order), the chunk size, the timeouts and the verify flag. The receiver starts
checking its own files and, at the same time, links to the first reachable host of that chain.
``N`` need, up: the names this host or any host below it lacks (or holds wrong). A sender
streams exactly those files; a host that already has a file still forwards it.
``F`` file, down: JSON name, size, sha256, then ``D`` data frames carrying exactly size bytes.
``Z`` end of stream, down. ``R`` report, up: the summaries of this host and every host below.
``K`` keepalive, up, while a host waits on its own downstream or its disk.
``X`` error, up: the receiver refused the hello (bad manifest, wrong protocol).

Received bytes are forwarded as they arrive (every 128 KiB, long before the chunk is
complete) by a forwarding thread, while a writer thread writes the chunk to
``<dest>/.<name>.partial`` and a hashing thread computes its sha256. A file gets its final
name only when size, sha256 and (for ``*.safetensors``) the header check agree with the
manifest. ``<dest>/.k2-manifest.json`` records what was verified (with each file's mtime), so a
re-run checks sizes and mtimes instead of re-hashing; ``--verify`` re-hashes everything.

Faults: if a downstream host dies, the host above it links to the next host of the chain,
reports the dead one as skipped, forwards the rest of the stream, and afterwards sends
the files the new downstream still lacks from its own verified copies. Hosts below a
broken link drop their half-received file and wait (``--relink-timeout``) for a new upstream.
Free disk space is checked before any byte is written; a host without room says so (host,
free, needed) and only passes the stream on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

PROTOCOL = "k2relay/1"
MANIFEST_FORMAT = "k2provision.manifest/1"
STORED_MANIFEST = ".k2-manifest.json"
DEFAULT_PORT = 29517
DEFAULT_CHUNK = 8 << 20
MIN_CHUNK = 64 << 10
MAX_CHUNK = 64 << 20
FORWARD_SLICE = 128 << 10
DEFAULT_SOCKBUF = 8 << 20
DEFAULT_BUFFERS = 8
READ_BUFFER = 8 << 20
SAFETENSORS_MAX_HEADER = 100_000_000
MAX_CONTROL_FRAME = 64 << 20

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_CANCELLED = 4

FRAME = struct.Struct("!BI")
HDR = FRAME.size
T_HELLO = ord("H")
T_NEED = ord("N")
T_FILE = ord("F")
T_DATA = ord("D")
T_END = ord("Z")
T_REPORT = ord("R")
T_KEEPALIVE = ord("K")
T_ERROR = ord("X")

VERIFIED_STATES = ("skipped", "received", "repaired")

Json = dict[str, Any]


class RelayError(Exception):
    """A problem a person must read: one line naming the host, the value and the fix."""


class ProtocolError(RelayError):
    """The peer sent something this relay does not understand."""


class PeerClosed(ConnectionError):
    """The peer closed the connection in the middle of a message."""


class Cancelled(BaseException):
    """SIGTERM or SIGINT arrived."""


# ----------------------------------------------------------------------------- helpers


def human(n: float) -> str:
    """Bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def describe(exc: BaseException) -> str:
    """A short, log-safe description of an exception."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.__class__.__name__}: {exc.strerror}"
    text = str(exc)
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RelayError(f"address {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    value = int(port)
    if not 0 <= value <= 65535:
        raise RelayError(f"address {text!r}: port {value} is out of range")
    return host, value


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_name(name: str) -> None:
    """Refuse names that could escape the destination or collide with relay files."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        raise RelayError(f"file name {name!r} is not a relative path")
    if "\x00" in name:
        raise RelayError(f"file name {name!r} contains a NUL byte")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise RelayError(f"file name {name!r} has an empty, '.' or '..' component")
        if part.startswith(".k2-") or (part.startswith(".") and part.endswith(".partial")):
            raise RelayError(f"file name {name!r} collides with the relay's own files")


def is_safetensors(name: str) -> bool:
    return name.endswith(".safetensors")


def check_safetensors_header(prefix: bytes | bytearray | memoryview, size: int) -> str | None:
    """Why a safetensors file is inconsistent, or None when it is fine.

    ``prefix`` holds at least the first 8 + header-length bytes; ``size`` is the file size.
    The file must start with a little-endian u64 header length, then a JSON object; the
    largest ``data_offsets`` end plus 8 plus the header length must equal the file size.
    """
    if size < 8 or len(prefix) < 8:
        return f"{size} bytes is too short for a safetensors header"
    (length,) = struct.unpack_from("<Q", prefix, 0)
    if length == 0 or length > SAFETENSORS_MAX_HEADER:
        return f"header length {length} is out of range (1..{SAFETENSORS_MAX_HEADER})"
    if 8 + length > size:
        return f"header length {length} runs past the end of the {size}-byte file"
    if len(prefix) < 8 + length:
        return f"only {len(prefix)} bytes given, the header needs {8 + length}"
    try:
        header = json.loads(bytes(prefix[8 : 8 + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"header length {length}: the header is not valid UTF-8 JSON"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data_end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            return f"tensor {key[:80]!r} has bad data_offsets"
        data_end = max(data_end, offsets[1])
    if 8 + length + data_end != size:
        return (
            f"header length {length} + 8 + data end {data_end} = {8 + length + data_end}"
            f" != file size {size}"
        )
    return None


def check_safetensors_file(path: str, size: int | None = None) -> str | None:
    """check_safetensors_header on a file (reads only the header)."""
    try:
        with open(path, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            first = f.read(8)
            if len(first) == 8:
                (length,) = struct.unpack("<Q", first)
                if 0 < length <= SAFETENSORS_MAX_HEADER and 8 + length <= actual:
                    first += f.read(length)
    except OSError as exc:
        return f"cannot read header: {describe(exc)}"
    return check_safetensors_header(first, actual if size is None else size)


def sha256_file(path: str, bufsize: int = READ_BUFFER) -> str:
    """sha256 of a file, read in big blocks into one reused buffer."""
    digest = hashlib.sha256()
    buf = bytearray(bufsize)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def check_disk_space(dest: str, needed: int, host: str, reclaimable: int = 0) -> str | None:
    """A refusal message when ``dest`` lacks room for ``needed`` bytes, else None."""
    free = shutil.disk_usage(dest).free + reclaimable
    if free >= needed:
        return None
    return (
        f"{host}: not enough disk space in {dest}: {free} bytes free ({human(free)}),"
        f" {needed} bytes needed ({human(needed)}); free {needed - free} bytes there"
        f" or give the host another destination"
    )


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class FileMeta:
    name: str
    size: int
    sha256: str

    def to_json(self) -> Json:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class RelayManifest:
    model: str
    revision: str
    files: tuple[FileMeta, ...]

    def to_json(self) -> Json:
        return {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "revision": self.revision,
            "files": [f.to_json() for f in self.files],
        }

    def digest(self) -> str:
        body = json.dumps([f.to_json() for f in self.files], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def total(self, names: set[str] | None = None) -> int:
        return sum(f.size for f in self.files if names is None or f.name in names)


def parse_manifest(obj: Any) -> RelayManifest:
    """Validate a manifest mapping (the JSON that k2provision.weights.manifest writes)."""
    if not isinstance(obj, dict):
        raise RelayError("manifest is not a JSON object")
    raw = obj.get("files")
    if not isinstance(raw, list):
        raise RelayError("manifest has no 'files' list")
    files: list[FileMeta] = []
    seen: set[str] = set()
    for entry in raw:
        if not isinstance(entry, dict):
            raise RelayError("manifest file entry is not an object")
        name, size, sha = entry.get("name"), entry.get("size"), entry.get("sha256")
        if not isinstance(name, str):
            raise RelayError(f"manifest entry name {name!r} is not a string")
        check_name(name)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RelayError(f"manifest entry {name!r}: size {size!r} is not a byte count")
        if (
            not isinstance(sha, str)
            or len(sha) != 64
            or any(c not in "0123456789abcdef" for c in sha)
        ):
            raise RelayError(f"manifest entry {name!r}: sha256 {sha!r} is not 64 lowercase hex")
        if name in seen:
            raise RelayError(f"manifest lists {name!r} twice")
        seen.add(name)
        files.append(FileMeta(name, size, sha))
    return RelayManifest(str(obj.get("model", "")), str(obj.get("revision", "")), tuple(files))


def load_manifest_file(path: str) -> RelayManifest:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        return parse_manifest(json.loads(text))
    except (OSError, ValueError) as exc:
        raise RelayError(f"cannot read manifest {path}: {describe(exc)}") from None


# ----------------------------------------------------------------------------- output


class Emitter:
    """JSON-lines events on stdout, one lock, flushed per line."""

    def __init__(self, host: str, role: str, stream: IO[str]) -> None:
        self.host = host
        self.role = role
        self.stream = stream
        self.lock = threading.Lock()
        self.closed = False

    def __call__(self, event: str, **fields: Any) -> None:
        if self.closed:
            return  # the summary is always the last line
        self.closed = event == "summary"
        record: Json = {"event": event, "host": self.host, "role": self.role}
        record.update(fields)
        record["t"] = round(time.time(), 3)
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.stream.write(line)
            self.stream.flush()


class Counters:
    """Byte counters the progress thread reads (rx and written have one writer thread each)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rx = 0
        self.tx = 0
        self.written = 0
        self.total = 0
        self.file = ""

    def add(self, field: str, n: int) -> None:
        with self.lock:
            setattr(self, field, getattr(self, field) + n)


class ProgressThread:
    """Emits a ``progress`` event every interval while bytes move (and every 5 s when idle)."""

    def __init__(self, emit: Emitter, counters: Counters, interval: float) -> None:
        self.emit = emit
        self.counters = counters
        self.interval = interval
        self.rate = 0.0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> None:
        if self.interval > 0:
            self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join()
        self.report(final=True)

    def report(self, final: bool = False) -> None:
        c = self.counters
        self.emit(
            "progress",
            rx=c.rx,
            tx=c.tx,
            written=c.written,
            total=c.total,
            file=c.file,
            rate=round(self.rate, 1),
            final=final,
        )

    def _run(self) -> None:
        prev_t = time.monotonic()
        prev = (self.counters.rx, self.counters.tx)
        idle = 0.0
        while not self.stop_event.wait(self.interval):
            now = time.monotonic()
            cur = (self.counters.rx, self.counters.tx)
            moved = max(cur[0] - prev[0], cur[1] - prev[1])
            dt = max(now - prev_t, 1e-6)
            self.rate = moved / dt
            prev, prev_t = cur, now
            idle = 0.0 if moved else idle + dt
            if moved or idle >= 5.0:
                idle = 0.0
                self.report()


# ----------------------------------------------------------------------------- sockets


def tune_socket(sock: socket.socket, bufsize: int) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Conn:
    """A framed TCP connection."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._hdr = bytearray(HDR)
        self._send_lock = threading.Lock()

    def send_frame(self, ftype: int, payload: bytes = b"") -> None:
        with self._send_lock:
            self.sock.sendall(FRAME.pack(ftype, len(payload)) + payload)

    def send_json(self, ftype: int, obj: Any) -> None:
        self.send_frame(ftype, json.dumps(obj, separators=(",", ":")).encode("utf-8"))

    def recv_exact(self, view: memoryview) -> None:
        while len(view):
            n = self.sock.recv_into(view)
            if not n:
                raise PeerClosed(f"{self.peer} closed the connection")
            view = view[n:]

    def recv_header(self) -> tuple[int, int]:
        self.recv_exact(memoryview(self._hdr))
        ftype, length = FRAME.unpack(self._hdr)
        return int(ftype), int(length)

    def recv_payload(self, length: int) -> bytes:
        if length > MAX_CONTROL_FRAME:
            raise ProtocolError(f"{self.peer} sent a {length}-byte control frame")
        buf = bytearray(length)
        self.recv_exact(memoryview(buf))
        return bytes(buf)

    def recv_json(self, expect: int) -> Json:
        """The next frame of type ``expect`` as JSON, skipping keepalives."""
        while True:
            ftype, length = self.recv_header()
            payload = self.recv_payload(length)
            if ftype == T_KEEPALIVE:
                continue
            if ftype == T_ERROR:
                raise RelayError(payload.decode("utf-8", "replace"))
            if ftype != expect:
                raise ProtocolError(
                    f"{self.peer} sent frame {chr(ftype)!r}, wanted {chr(expect)!r}"
                )
            obj = json.loads(payload.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ProtocolError(f"{self.peer} sent a non-object {chr(ftype)!r} frame")
            return obj

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(addr: str, opts: Options, cancelled: threading.Event) -> Conn:
    """Connect to ``addr``, retrying refused connections until the connect timeout."""
    host, port = parse_address(addr)
    deadline = time.monotonic() + opts.connect_timeout
    while True:
        last: OSError | None = None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            infos = []
            last = exc
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            tune_socket(sock, opts.sockbuf)
            sock.settimeout(max(0.5, min(5.0, deadline - time.monotonic())))
            try:
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            sock.settimeout(opts.io_timeout)
            return Conn(sock, addr)
        if time.monotonic() >= deadline or cancelled.is_set():
            raise last or OSError(f"cannot resolve {host}")
        time.sleep(0.2)


class Keepalive:
    """Sends ``K`` frames on ``conn`` while the block runs (the peer waits on us)."""

    def __init__(self, conn: Conn, interval: float) -> None:
        self.conn = conn
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="keepalive", daemon=True)

    def __enter__(self) -> Keepalive:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.conn.send_frame(T_KEEPALIVE)
            except OSError:
                return


# ----------------------------------------------------------------------------- buffers


class Chunk:
    """One pooled buffer: frame header at [0:HDR], payload after it."""

    __slots__ = ("buf", "pool", "refs", "view")

    def __init__(self, size: int, pool: ChunkPool) -> None:
        self.buf = bytearray(HDR + size)
        self.view = memoryview(self.buf)
        self.pool = pool
        self.refs = 0

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

    def get(self, refs: int) -> Chunk:
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
        chunk.refs = refs
        return chunk


# ----------------------------------------------------------------------------- options


@dataclass
class Options:
    chunk: int = DEFAULT_CHUNK
    buffers: int = DEFAULT_BUFFERS
    sockbuf: int = DEFAULT_SOCKBUF
    io_timeout: float = 120.0
    connect_timeout: float = 20.0
    keepalive: float = 2.0
    hash_workers: int = 0
    verify: bool = False

    def workers(self) -> int:
        return self.hash_workers or max(1, min(8, os.cpu_count() or 1))


# ----------------------------------------------------------------------------- local files


class LocalStore:
    """The destination directory and its stored manifest of verified files."""

    def __init__(self, dest: str) -> None:
        self.dest = os.path.abspath(dest)
        self.lock = threading.Lock()
        self.model = ""
        self.revision = ""
        self.order: list[str] = []
        self.entries: dict[str, tuple[int, str, int]] = {}
        self._load()

    def final(self, name: str) -> str:
        return os.path.join(self.dest, *name.split("/"))

    def partial(self, name: str) -> str:
        head, _, base = name.rpartition("/")
        return os.path.join(self.dest, *(head.split("/") if head else []), f".{base}.partial")

    def _load(self) -> None:
        path = os.path.join(self.dest, STORED_MANIFEST)
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
            files = obj["files"]
            stamps = obj.get("stamps", {})
            for entry in files:
                name = str(entry["name"])
                self.entries[name] = (int(entry["size"]), str(entry["sha256"]), int(stamps[name]))
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}

    def adopt(self, manifest: RelayManifest) -> None:
        with self.lock:
            self.model, self.revision = manifest.model, manifest.revision
            self.order = [f.name for f in manifest.files]

    def record(self, meta: FileMeta, mtime_ns: int) -> None:
        with self.lock:
            self.entries[meta.name] = (meta.size, meta.sha256, mtime_ns)
            self._save()

    def forget(self, name: str) -> None:
        with self.lock:
            if self.entries.pop(name, None) is not None:
                self._save()

    def _save(self) -> None:
        names = [n for n in self.order if n in self.entries]
        names += sorted(n for n in self.entries if n not in set(self.order))
        body = {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "revision": self.revision,
            "files": [
                {"name": n, "size": self.entries[n][0], "sha256": self.entries[n][1]} for n in names
            ],
            "stamps": {n: self.entries[n][2] for n in names},
        }
        path = os.path.join(self.dest, STORED_MANIFEST)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(body, f, indent=1)
                f.write("\n")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def scan(
        self, manifest: RelayManifest, verify: bool, workers: int, emit: Emitter
    ) -> dict[str, str]:
        """name -> "present" | "missing" | "wrong: <reason>"; re-hashes only what it must."""
        states: dict[str, str] = {}
        to_hash: list[tuple[FileMeta, int]] = []
        for meta in manifest.files:
            path = self.final(meta.name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                states[meta.name] = "missing"
                continue
            except OSError as exc:
                states[meta.name] = f"wrong: {describe(exc)}"
                continue
            if not os.path.isfile(path):
                states[meta.name] = "wrong: not a regular file"
            elif st.st_size != meta.size:
                states[meta.name] = f"wrong: size {st.st_size}, manifest says {meta.size}"
            elif not verify and self.entries.get(meta.name) == (
                meta.size,
                meta.sha256,
                st.st_mtime_ns,
            ):
                states[meta.name] = "present"
            else:
                to_hash.append((meta, st.st_mtime_ns))
        if to_hash:
            emit("scan", files=len(to_hash), bytes=sum(m.size for m, _ in to_hash), verify=verify)

            def one(item: tuple[FileMeta, int]) -> tuple[str, str]:
                meta, mtime = item
                path = self.final(meta.name)
                try:
                    digest = sha256_file(path)
                except OSError as exc:
                    return meta.name, f"wrong: {describe(exc)}"
                if digest != meta.sha256:
                    return meta.name, "wrong: sha256 differs from the manifest"
                if is_safetensors(meta.name):
                    problem = check_safetensors_file(path, meta.size)
                    if problem:
                        return meta.name, f"wrong: safetensors {problem}"
                self.record(meta, mtime)
                return meta.name, "present"

            with ThreadPoolExecutor(max_workers=min(workers, len(to_hash))) as pool:
                for name, state in pool.map(one, to_hash):
                    states[name] = state
        for name, state in states.items():
            if state != "present":
                self.forget(name)
        return states


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


class FileJob:
    """One file being received: shared by the session, writer and hasher threads."""

    def __init__(self, meta: FileMeta, final: str, partial: str, existed: bool) -> None:
        self.meta = meta
        self.final = final
        self.partial = partial
        self.existed = existed
        self.hashed = threading.Event()
        self.done = threading.Event()
        self.digest = ""
        self.error = ""
        self.ok = False
        self.hasher: Any = None


class Hasher:
    """sha256 of the stream in its own thread (hashlib releases the GIL)."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="hasher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            kind = item[0]
            if kind == "stop":
                return
            job: FileJob = item[1]
            if kind == "begin":
                job.hasher = hashlib.sha256()
            elif kind == "data":
                chunk: Chunk = item[2]
                try:
                    job.hasher.update(chunk.view[HDR : HDR + item[3]])
                finally:
                    chunk.release()
            elif kind == "end":
                job.digest = job.hasher.hexdigest()
                job.hashed.set()
            elif kind == "discard":
                job.hashed.set()


class Writer:
    """Writes the stream to ``.<name>.partial``; verifies and renames at the end of a file."""

    def __init__(
        self, store: LocalStore, results: Results, counters: Counters, emit: Emitter
    ) -> None:
        self.store = store
        self.results = results
        self.counters = counters
        self.emit = emit
        self.q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        f: Any = None
        while True:
            item = self.q.get()
            kind = item[0]
            if kind == "stop":
                return
            job: FileJob = item[1]
            if kind == "begin":
                try:
                    os.makedirs(os.path.dirname(job.partial), exist_ok=True)
                    f = open(job.partial, "wb", buffering=0)  # noqa: SIM115 - lives across queue items
                except OSError as exc:
                    job.error = f"cannot create {job.partial}: {describe(exc)}"
                    f = None
            elif kind == "data":
                chunk: Chunk = item[2]
                n: int = item[3]
                try:
                    if f is not None and not job.error:
                        view = chunk.view[HDR : HDR + n]
                        while len(view):
                            view = view[f.write(view) :]
                        self.counters.written += n  # one writer (this thread)
                except OSError as exc:
                    job.error = f"write failed: {describe(exc)}"
                    f = self._drop(f, job)
                finally:
                    chunk.release()
            elif kind == "end":
                self._finish(job, f)
                f = None
            elif kind == "discard":
                self._drop(f, job)
                f = None
                job.done.set()

    @staticmethod
    def _drop(f: Any, job: FileJob) -> None:
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(OSError):
            os.unlink(job.partial)

    def _finish(self, job: FileJob, f: Any) -> None:
        meta = job.meta
        if f is not None:
            try:
                os.fsync(f.fileno())
                f.close()
            except OSError as exc:
                job.error = job.error or f"write failed: {describe(exc)}"
        job.hashed.wait()
        reason = job.error
        if not reason:
            try:
                size = os.stat(job.partial).st_size
            except OSError as exc:
                size = -1
                reason = f"partial file vanished: {describe(exc)}"
            if not reason and size != meta.size:
                reason = f"size {size} != manifest size {meta.size}"
            elif not reason and job.digest != meta.sha256:
                reason = f"sha256 {job.digest} != manifest sha256 {meta.sha256}"
            elif not reason and is_safetensors(meta.name):
                problem = check_safetensors_file(job.partial, meta.size)
                if problem:
                    reason = f"safetensors {problem}"
        if not reason:
            try:
                os.replace(job.partial, job.final)
                fsync_dir(os.path.dirname(job.final))
                self.store.record(meta, os.stat(job.final).st_mtime_ns)
            except OSError as exc:
                reason = f"cannot install {job.final}: {describe(exc)}"
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
        job.done.set()


# ----------------------------------------------------------------------------- forwarding


class Forwarder:
    """The downstream side of a relay (or one stream of the seed): link, forward, re-link.

    Items come through ``q``: ("file", meta, frame_bytes), ("data", chunk, start, end,
    last), ("end",) or ("abort",). A data item's chunk is released on its last slice.
    """

    def __init__(
        self,
        chain: list[str],
        hello: Json,
        files: tuple[FileMeta, ...],
        opts: Options,
        emit: Emitter,
        counters: Counters,
        local_source: Callable[[str], str | None],
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
        self.need: set[str] = set()
        self.below: list[Json] = []
        self.skipped: list[Json] = []
        self.reports: list[Json] = []
        self.q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.upcoming: set[str] = set()
        self.backlog: list[FileMeta] = []
        self.forwarding = False
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
                need = reply.get("need")
                if not isinstance(need, list) or not all(isinstance(n, str) for n in need):
                    raise ProtocolError(f"{addr} sent a malformed need list")
            except (OSError, RelayError, ValueError) as exc:
                if conn is not None:
                    conn.close()
                with self.lock:
                    self.pending = None
                if self.aborted.is_set():
                    return False
                self._skip(addr, f"cannot link: {describe(exc)}")
                continue
            below = [h for h in reply.get("hosts", []) if isinstance(h, dict)]
            gone = {h.get("host") for h in below if h.get("state") == "skipped"}
            self.candidates = [c for c in self.candidates if c not in gone]
            with self.lock:
                self.pending = None
                self.conn = conn
            self.current = addr
            self.need = set(need)
            self.below = below
            self.emit("link", downstream=addr, need_files=len(need))
            return True
        self.conn = None
        self.current = ""
        self.need = set()
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
        self.q.put(("abort",))

    def _run(self) -> None:
        while True:
            item = self.q.get()
            kind = item[0]
            if kind == "data":
                chunk: Chunk = item[1]
                start, end = item[2], item[3]
                if self.forwarding:
                    self._send(chunk.view[start:end], end - start - (HDR if start == 0 else 0))
                if item[4]:
                    chunk.release()
            elif kind == "file":
                meta: FileMeta = item[1]
                self.upcoming.discard(meta.name)
                self.forwarding = self.conn is not None and meta.name in self.need
                if self.forwarding:
                    self._send(item[2], 0)
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
            self.forwarding = False
            if not self.aborted.is_set():
                self._lost(exc)
            return
        self.tx += payload
        self.counters.add("tx", payload)

    def _lost(self, exc: BaseException) -> None:
        addr = self.current
        if self.conn is not None:
            self.conn.close()
        with self.lock:
            self.conn = None
        self._skip(addr, f"connection lost: {describe(exc)}")
        if self.link():
            self.backlog = [
                m for m in self.files if m.name in self.need and m.name not in self.upcoming
            ]
            self.emit("relink", downstream=self.current, backlog=[m.name for m in self.backlog])

    def _send_from_disk(self, conn: Conn, meta: FileMeta, path: str, buf: bytearray) -> None:
        """Send one file from the local verified copy. Local read trouble never breaks the
        framing: missing bytes go out as zeros and the receiver's sha256 check fails."""
        try:
            src = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
        except OSError as exc:
            self.emit("backlog_unavailable", name=meta.name, reason=describe(exc))
            return
        try:
            conn.send_json(T_FILE, meta.to_json())
            view = memoryview(buf)
            chunk = len(buf) - HDR
            remaining = meta.size
            short = False
            while remaining:
                n = min(chunk, remaining)
                FRAME.pack_into(buf, 0, T_DATA, n)
                got = 0
                with contextlib.suppress(OSError):
                    while got < n:
                        k = src.readinto(view[HDR + got : HDR + n])
                        if not k:
                            break
                        got += k
                if got < n:
                    view[HDR + got : HDR + n] = bytes(n - got)
                    if not short:
                        self.emit("backlog_short", name=meta.name, path=path)
                    short = True
                conn.sock.sendall(view[: HDR + n])
                remaining -= n
                self.tx += n
                self.counters.add("tx", n)
        finally:
            src.close()

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


# ----------------------------------------------------------------------------- receiving


class Receiver:
    """``serve``: wait for an upstream, receive, forward, verify; repeat after a broken link."""

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
        try:
            while not complete:
                lsock.settimeout(wait)
                try:
                    sock, peer = lsock.accept()
                except socket.timeout:  # noqa: UP041 - not yet TimeoutError on Python 3.9
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
                    self.emit("ignored", peer=str(peer[0]), reason=describe(exc))
                    conn.close()
                    continue
                self.sessions += 1
                complete = self.session(conn, hello)
                wait = self.args.relink_timeout
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

    def session(self, conn: Conn, hello: Json) -> bool:
        """One upstream connection. True when the stream ended properly."""
        try:
            if hello.get("proto") != PROTOCOL:
                raise RelayError(f"protocol {hello.get('proto')!r}, this relay speaks {PROTOCOL}")
            manifest = parse_manifest(hello.get("manifest"))
            chain = [str(a) for a in hello.get("chain", [])]
            chunk = int(hello.get("chunk", DEFAULT_CHUNK))
            if not MIN_CHUNK <= chunk <= MAX_CHUNK:
                raise RelayError(f"chunk size {chunk} is out of range")
            if self.expected is not None and self.expected.digest() != manifest.digest():
                raise RelayError(
                    f"{self.emit.host}: the manifest sent differs from {self.args.manifest}"
                )
        except (RelayError, TypeError, ValueError) as exc:
            self.emit("error", reason=describe(exc))
            with contextlib.suppress(OSError):
                conn.send_frame(T_ERROR, describe(exc).encode("utf-8"))
            conn.close()
            return False
        if not self.args.name and hello.get("you"):
            self.emit.host = str(hello["you"])
        self.manifest = manifest
        self.store.adopt(manifest)
        verify = bool(hello.get("verify")) or self.opts.verify
        scan: dict[str, Any] = {}

        def do_scan() -> None:
            try:
                scan["states"] = self.store.scan(manifest, verify, self.opts.workers(), self.emit)
            except (OSError, RelayError) as exc:
                scan["error"] = describe(exc)

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
        states: dict[str, str] = scan.get("states", {})
        own: list[FileMeta] = []
        wrong: list[FileMeta] = []
        for meta in manifest.files:
            st = states.get(meta.name, "missing")
            if st == "present":
                if self.results.state.get(meta.name) not in VERIFIED_STATES:
                    self.results.set(meta.name, "skipped")
                continue
            own.append(meta)
            if st.startswith("wrong"):
                wrong.append(meta)
                self.results.was_wrong.add(meta.name)
                self.emit("file", name=meta.name, status="wrong", reason=st[7:])
            if self.results.state.get(meta.name) in VERIFIED_STATES:
                self.results.set(meta.name, "missing")
        self.refusal = ""
        if "error" in scan:
            self.refusal = f"{self.emit.host}: cannot check {self.store.dest}: {scan['error']}"
        else:
            reclaim = 0
            for meta in own:
                for path in (self.store.final(meta.name), self.store.partial(meta.name)):
                    with contextlib.suppress(OSError):
                        reclaim += os.stat(path).st_size
            problem = check_disk_space(
                self.store.dest, manifest.total({m.name for m in own}), self.emit.host, reclaim
            )
            self.refusal = problem or ""
        if self.refusal:
            self.emit("refused", message=self.refusal)
            own = []
        else:
            for meta in own:
                for path in (self.store.final(meta.name), self.store.partial(meta.name)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        own_names = {m.name for m in own}
        wanted = own_names | fwd.need
        plan = [m for m in manifest.files if m.name in wanted]
        with self.counters.lock:
            self.counters.total = sum(m.size for m in plan)
        self.emit(
            "plan",
            need=[m.name for m in own],
            need_bytes=manifest.total(own_names),
            stream_files=len(plan),
            stream_bytes=self.counters.total,
            downstream=fwd.current,
        )
        try:
            conn.send_json(
                T_NEED,
                {
                    "need": [m.name for m in plan],
                    "host": self.emit.host,
                    "hosts": fwd.link_report(),
                },
            )
        except OSError as exc:
            self.emit("upstream_lost", reason=describe(exc))
            fwd.abort()
            self._merge_skips(fwd)
            conn.close()
            return False

        pool = ChunkPool(chunk, max(2, self.args.buffers), self.opts.io_timeout)
        writer = Writer(self.store, self.results, self.counters, self.emit)
        hasher = Hasher()
        fwd.start([m.name for m in plan])
        by_name = {m.name: m for m in manifest.files}
        job: FileJob | None = None
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
                found = by_name.get(str(info.get("name"))) if isinstance(info, dict) else None
                if found is None or found.to_json() != info:
                    raise ProtocolError(f"file frame {payload[:200]!r} does not match the manifest")
                meta = found
                want = meta.name in own_names
                job = None
                if want:
                    job = FileJob(
                        meta,
                        self.store.final(meta.name),
                        self.store.partial(meta.name),
                        meta.name in self.results.was_wrong,
                    )
                    self.jobs[meta.name] = job
                    writer.q.put(("begin", job))
                    hasher.q.put(("begin", job))
                fwd.q.put(("file", meta, FRAME.pack(T_FILE, length) + payload))
                with self.counters.lock:
                    self.counters.file = meta.name
                self._receive_file(conn, meta, job, pool, fwd, writer, hasher)
                if job is not None:
                    writer.q.put(("end", job))
                    hasher.q.put(("end", job))
                    job = None
        except (OSError, RelayError, ValueError) as exc:
            self.emit("upstream_lost", reason=describe(exc))
            fwd.abort()
            if job is not None:
                writer.q.put(("discard", job))
                hasher.q.put(("discard", job))
                self.jobs.pop(job.meta.name, None)
            writer.q.put(("stop",))
            hasher.q.put(("stop",))
            writer.thread.join()
            fwd.join()
            self._merge_skips(fwd)
            conn.close()
            return False
        fwd.q.put(("end",))
        writer.q.put(("stop",))
        hasher.q.put(("stop",))
        with Keepalive(conn, self.opts.keepalive):
            writer.thread.join()
            fwd.join()
        self._merge_skips(fwd)
        report = dict(self.summary(), host=self.emit.host)
        with contextlib.suppress(OSError):
            conn.send_json(T_REPORT, {"hosts": [report, *fwd.skipped, *fwd.reports]})
        conn.close()
        return True

    def _merge_skips(self, fwd: Forwarder) -> None:
        self.skipped_hosts.extend(s for s in fwd.skipped if s not in self.skipped_hosts)

    def _receive_file(
        self,
        conn: Conn,
        meta: FileMeta,
        job: FileJob | None,
        pool: ChunkPool,
        fwd: Forwarder,
        writer: Writer,
        hasher: Hasher,
    ) -> None:
        remaining = meta.size
        refs = 3 if job is not None else 1
        counters = self.counters
        while remaining:
            ftype, n = conn.recv_header()
            if ftype != T_DATA or n == 0 or n > remaining or n > pool.size:
                raise ProtocolError(f"bad data frame {chr(ftype)!r} of {n} bytes in {meta.name}")
            chunk = pool.get(refs)
            view = chunk.view
            FRAME.pack_into(chunk.buf, 0, T_DATA, n)
            end = HDR + n
            off = HDR
            sent = 0
            # A broken upstream leaves this chunk referenced; the session's pool dies with it.
            while off < end:
                k = conn.sock.recv_into(view[off:end])
                if not k:
                    raise PeerClosed(f"{conn.peer} closed the connection inside {meta.name}")
                off += k
                counters.rx += k  # one writer (this thread): no lock
                if off - sent >= FORWARD_SLICE and off < end:
                    fwd.q.put(("data", chunk, sent, off, False))
                    sent = off
            fwd.q.put(("data", chunk, sent, end, True))
            if job is not None:
                writer.q.put(("data", job, chunk, n))
                hasher.q.put(("data", job, chunk, n))
            remaining -= n


# ----------------------------------------------------------------------------- sending


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
    """``send``: read the files once and stream them down one chain (or N fan-out streams)."""

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
            path = os.path.join(self.source, *meta.name.split("/"))
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
            self.emit("refused", message=str(exc))
            self.emit("summary", **self._summary("refused", [], [], str(exc), 0))
            return EXIT_REFUSED
        problems = self.preflight(manifest)
        if problems:
            message = "; ".join(problems)
            self.emit("refused", message=message)
            self.emit("summary", **self._summary("refused", [], [], message, 0))
            return EXIT_REFUSED
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
                c, hello, manifest.files, self.opts, self.emit, self.counters, self._source_path
            )
            for c in chains
        ]
        linkers = [threading.Thread(target=f.link, daemon=True) for f in forwarders]
        for t in linkers:
            t.start()
        for t in linkers:
            t.join()
        wanted: set[str] = set()
        for f in forwarders:
            wanted |= f.need
        plan = [m for m in manifest.files if m.name in wanted]
        with self.counters.lock:
            self.counters.total = sum(m.size for m in plan)
        self.emit(
            "plan",
            stream_files=len(plan),
            stream_bytes=self.counters.total,
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
        summary = self._summary(status, hosts, skipped, message, sum(f.tx for f in forwarders))
        summary["files_sent"] = [m.name for m in plan]
        summary["source_mismatch"] = mismatched
        self.emit("summary", **summary)
        return EXIT_OK if status == "ok" else EXIT_INCOMPLETE

    def _summary(
        self, status: str, hosts: list[Json], skipped: list[Json], message: str, sent: int
    ) -> Json:
        return {
            "status": status,
            "hosts": hosts,
            "skipped_hosts": skipped,
            "bytes_sent": sent,
            "seconds": round(time.monotonic() - self.started, 3),
            "message": message,
        }

    def _source_path(self, name: str) -> str | None:
        return os.path.join(self.source, *name.split("/"))

    def _stream(self, plan: list[FileMeta], forwarders: list[Forwarder]) -> list[str]:
        """Read each planned file once; feed every forwarder and the hasher. -> mismatches."""
        for f in forwarders:
            f.start([m.name for m in plan])
        pool = ChunkPool(self.opts.chunk, max(2, self.args.buffers) + 2 * len(forwarders), 3600.0)
        hasher = Hasher()
        limit = RateLimit(float(self.args.max_rate or 0))
        jobs: list[FileJob] = []
        refs = len(forwarders) + 1
        for meta in plan:
            path = self._source_path(meta.name) or ""
            job = FileJob(meta, path, path, False)
            jobs.append(job)
            hasher.q.put(("begin", job))
            body = json.dumps(meta.to_json(), separators=(",", ":")).encode("utf-8")
            frame = FRAME.pack(T_FILE, len(body)) + body
            for f in forwarders:
                f.q.put(("file", meta, frame))
            with self.counters.lock:
                self.counters.file = meta.name
            remaining = meta.size
            try:
                src: Any = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
            except OSError as exc:
                self.emit("error", name=meta.name, reason=f"cannot read source: {describe(exc)}")
                src = None
            while remaining:
                n = min(self.opts.chunk, remaining)
                chunk = pool.get(refs)
                FRAME.pack_into(chunk.buf, 0, T_DATA, n)
                got = 0
                try:
                    while src is not None and got < n:
                        k = src.readinto(chunk.view[HDR + got : HDR + n])
                        if not k:
                            break
                        got += k
                except OSError as exc:
                    self.emit(
                        "error", name=meta.name, reason=f"cannot read source: {describe(exc)}"
                    )
                    src.close()
                    src = None
                if got < n:
                    # The source shrank or failed under us: pad so every stream stays framed;
                    # receivers then fail the sha256 check and report the file.
                    chunk.view[HDR + got : HDR + n] = bytes(n - got)
                limit.take(n)
                for f in forwarders:
                    f.q.put(("data", chunk, 0, HDR + n, True))
                hasher.q.put(("data", job, chunk, n))
                remaining -= n
            if src is not None:
                src.close()
            hasher.q.put(("end", job))
        for f in forwarders:
            f.q.put(("end",))
        hasher.q.put(("stop",))
        mismatched: list[str] = []
        for job in jobs:
            job.hashed.wait()
            if job.digest != job.meta.sha256:
                mismatched.append(job.meta.name)
        return mismatched


# ----------------------------------------------------------------------------- check


def run_check(args: argparse.Namespace, opts: Options, emit: Emitter) -> int:
    try:
        manifest = load_manifest_file(args.manifest)
    except RelayError as exc:
        emit("summary", status="refused", message=str(exc))
        return EXIT_REFUSED
    store = LocalStore(args.dest)
    store.adopt(manifest)
    states = store.scan(manifest, opts.verify, opts.workers(), emit)
    names = [m.name for m in manifest.files]
    ok = [n for n in names if states.get(n) == "present"]
    emit(
        "summary",
        status="ok" if len(ok) == len(names) else "incomplete",
        dest=store.dest,
        files=len(names),
        verified=len(ok),
        missing=[n for n in names if states.get(n) == "missing"],
        failed=[
            {"name": n, "reason": states[n][7:]} for n in names if states[n].startswith("wrong")
        ],
    )
    return EXIT_OK if len(ok) == len(names) else EXIT_INCOMPLETE


# ----------------------------------------------------------------------------- CLI


def parse_events(text: str) -> list[dict[str, Any]]:
    """The JSON-lines events in a relay's output (other lines and broken JSON skipped)."""
    events: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "event" in data:
            events.append(data)
    return events


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay.py", description=__doc__.split("\n")[0] if __doc__ else ""
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--name", default="", help="this host's name in events (default: its address)"
        )
        p.add_argument("--verify", action="store_true", help="re-hash every file already present")
        p.add_argument(
            "--io-timeout", type=float, default=120.0, help="seconds a peer may stay silent"
        )
        p.add_argument(
            "--connect-timeout", type=float, default=20.0, help="seconds to retry a connect"
        )
        p.add_argument("--sockbuf", type=int, default=DEFAULT_SOCKBUF, help="socket buffer bytes")
        p.add_argument("--buffers", type=int, default=DEFAULT_BUFFERS, help="chunks in flight")
        p.add_argument("--hash-workers", type=int, default=0, help="threads re-hashing local files")
        p.add_argument(
            "--progress-interval", type=float, default=1.0, help="seconds between events"
        )

    serve = sub.add_parser("serve", help="receive, forward and verify (every receiving host)")
    serve.add_argument(
        "--listen", default=f"0.0.0.0:{DEFAULT_PORT}", help="HOST:PORT (port 0: any)"
    )
    serve.add_argument("--dest", required=True, help="directory for the weights")
    serve.add_argument("--manifest", default="", help="refuse a stream whose manifest differs")
    serve.add_argument(
        "--accept-timeout", type=float, default=3600.0, help="wait for the first upstream"
    )
    serve.add_argument(
        "--relink-timeout", type=float, default=60.0, help="wait after a broken upstream"
    )
    common(serve)

    send = sub.add_parser("send", help="stream the files down the chain (the seed)")
    send.add_argument("--source", required=True, help="directory holding the files")
    send.add_argument("--manifest", required=True, help="manifest JSON file, or - for stdin")
    send.add_argument("--chain", required=True, help="HOST:PORT,HOST:PORT,... in chain order")
    send.add_argument("--fanout", action="store_true", help="one direct stream per host instead")
    send.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK, help="bytes per data frame")
    send.add_argument("--max-rate", type=float, default=0.0, help="cap in bytes/s (0: none)")
    common(send)

    check = sub.add_parser("check", help="verify a destination against a manifest, no network")
    check.add_argument("--dest", required=True)
    check.add_argument("--manifest", required=True)
    common(check)
    return parser


def _cancel(signum: int, frame: Any) -> None:
    raise Cancelled()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chunk = int(getattr(args, "chunk_size", DEFAULT_CHUNK))
    if not MIN_CHUNK <= chunk <= MAX_CHUNK:
        print(f"relay.py: --chunk-size must be {MIN_CHUNK}..{MAX_CHUNK}", file=sys.stderr)
        return EXIT_USAGE
    opts = Options(
        chunk=chunk,
        buffers=max(2, args.buffers),
        sockbuf=args.sockbuf,
        io_timeout=args.io_timeout,
        connect_timeout=args.connect_timeout,
        keepalive=max(0.2, min(2.0, args.io_timeout / 4)),
        hash_workers=args.hash_workers,
        verify=args.verify,
    )
    emit = Emitter(
        args.name or ("seed" if args.command == "send" else args.command), args.command, sys.stdout
    )
    signal.signal(signal.SIGTERM, _cancel)
    signal.signal(signal.SIGINT, _cancel)
    if args.command == "check":
        return run_check(args, opts, emit)
    if args.command == "send":
        seed = Seed(args, opts, emit)
        try:
            return seed.run()
        except Cancelled:
            emit(
                "summary",
                **seed._summary("cancelled", [], [], "cancelled by signal", seed.counters.tx),
            )
            return EXIT_CANCELLED
    try:
        os.makedirs(args.dest, exist_ok=True)
        receiver = Receiver(args, opts, emit)
    except (OSError, RelayError) as exc:
        emit("summary", status="refused", message=f"{emit.host}: {describe(exc)}", dest=args.dest)
        return EXIT_REFUSED
    try:
        return receiver.run()
    except Cancelled:
        receiver.message = "cancelled by signal"
        return receiver.finish("cancelled")


if __name__ == "__main__":
    sys.exit(main())
