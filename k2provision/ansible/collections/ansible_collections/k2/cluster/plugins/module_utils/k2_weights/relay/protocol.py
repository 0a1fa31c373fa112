"""The wire: frames, framed TCP connections, connecting with retries, keepalives, options.

Every message is a frame: 1 byte type, 4 byte big-endian length, payload.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..common import Json, RelayError, parse_address

PROTOCOL = "k2relay/2"
DEFAULT_CHUNK = 8 << 20
MIN_CHUNK = 64 << 10
MAX_CHUNK = 64 << 20
DEFAULT_SOCKBUF = 8 << 20
DEFAULT_BUFFERS = 8
DEFAULT_CHECKPOINT = 64 << 20
MAX_CONTROL_FRAME = 64 << 20

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

MSG_MORE = getattr(socket, "MSG_MORE", 0)


class ProtocolError(RelayError):
    """The peer sent something this relay does not understand."""


class PeerClosed(ConnectionError):
    """The peer closed the connection in the middle of a message."""


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
    checkpoint: int = DEFAULT_CHECKPOINT
    zero_copy: bool = True
    drop_cache: bool = True

    def workers(self) -> int:
        return self.hash_workers or max(1, min(8, os.cpu_count() or 1))


def tune_socket(sock: socket.socket, bufsize: int) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def send_file_range(sock: socket.socket, fd: int, offset: int, count: int, zero_copy: bool) -> int:
    """Send ``count`` bytes of file ``fd`` from ``offset``: sendfile(2) (no copy through this
    process) where the platform has it, else read and send. Honours the socket's timeout.
    Returns the bytes sent: fewer than ``count`` only when the file ends early."""
    timeout = sock.gettimeout()
    done = 0
    if zero_copy and hasattr(os, "sendfile"):
        out = sock.fileno()
        while done < count:
            try:
                sent = os.sendfile(out, fd, offset + done, min(count - done, 1 << 30))
            except BlockingIOError:
                sent = -1
            if sent == 0:
                return done
            if sent < 0:
                _, ready, _ = select.select([], [out], [], timeout)
                if not ready:
                    raise socket.timeout("send timed out")
                continue
            done += sent
        return done
    buf = bytearray(min(count, 8 << 20) or 1)
    view = memoryview(buf)
    while done < count:
        n = os.preadv(fd, [view[: min(count - done, len(buf))]], offset + done)
        if n <= 0:
            return done
        sock.sendall(view[:n])
        done += n
    return done


class Conn:
    """A framed TCP connection."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._hdr = bytearray(HDR)
        self.send_lock = threading.Lock()

    def send_frame(self, ftype: int, payload: bytes = b"") -> None:
        with self.send_lock:
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


def need_map(value: Any) -> dict[str, int]:
    """A ``need`` reply -> {name: first byte wanted}; raises ProtocolError when malformed."""
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        return {str(k): int(v) for k, v in value.items()}
    raise ProtocolError("malformed need list")
