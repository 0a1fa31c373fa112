"""sha256 of files and streams: big reads, several files at once, and a hash state that can be
saved to disk and taken up again (so an interrupted file resumes without re-reading its prefix).

hashlib cannot export its state. ``Sha256`` therefore drives OpenSSL's own SHA256_CTX through
ctypes (the libcrypto hashlib already uses; ctypes releases the GIL during each call, like
hashlib does for large buffers). It proves itself against hashlib once per process, state
save and restore included; where libcrypto cannot be loaded or the proof fails, it falls back
to hashlib and ``state()`` returns None (a resume then re-reads the prefix from disk).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .common import READ_BUFFER

_CTX_SIZE = 112  # SHA256_CTX: h[8], Nl, Nh, data[16] (32-bit words), num, md_len
_CTX_ALLOC = 256  # room to spare: the library never writes past its own struct
_LIBCRYPTO_NAMES = ("libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so")
_lib_lock = threading.RLock()
_lib_state: dict[str, Any] = {}


def _libcrypto() -> Any:
    """libcrypto with SHA256_Init/Update/Final, proven against hashlib; None when unusable."""
    with _lib_lock:
        if "lib" in _lib_state:
            return _lib_state["lib"]
        lib: Any = None
        for name in _LIBCRYPTO_NAMES:
            try:
                candidate = ctypes.CDLL(name)
                for fn in ("SHA256_Init", "SHA256_Update", "SHA256_Final"):
                    getattr(candidate, fn).restype = ctypes.c_int
                candidate.SHA256_Update.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                ]
                candidate.SHA256_Init.argtypes = [ctypes.c_void_p]
                candidate.SHA256_Final.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            except (OSError, AttributeError):
                continue
            lib = candidate
            break
        _lib_state["lib"] = lib
        if lib is not None and not _self_test():
            _lib_state["lib"] = None
        return _lib_state["lib"]


def _self_test() -> bool:
    data = bytearray(os.urandom(200_003))
    h = Sha256(force_hashlib=False)
    h.update(memoryview(data)[:70_000])
    state = h.state()
    if state is None:
        return False
    resumed = Sha256.from_state(state)
    resumed.update(memoryview(data)[70_000:])
    return resumed.hexdigest() == hashlib.sha256(data).hexdigest()


class Sha256:
    """A running sha256 whose state can be saved (``state()``) and resumed (``from_state``)."""

    def __init__(self, force_hashlib: bool = False) -> None:
        lib = None if force_hashlib else _libcrypto()
        self._lib: Any = lib
        self._fallback: Any = None
        self._ctx: Any = None
        self.length = 0
        if lib is None:
            self._fallback = hashlib.sha256()
        else:
            self._ctx = ctypes.create_string_buffer(_CTX_ALLOC)
            lib.SHA256_Init(self._ctx)

    @property
    def resumable(self) -> bool:
        return self._ctx is not None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        n = view.nbytes
        self.length += n
        if self._ctx is None:
            self._fallback.update(view)
            return
        if not n:
            return
        if view.readonly:
            buf: Any = (ctypes.c_char * n).from_buffer_copy(view)
        else:
            buf = (ctypes.c_char * n).from_buffer(view.cast("B"))
        self._lib.SHA256_Update(self._ctx, buf, n)

    def hexdigest(self) -> str:
        if self._ctx is None:
            return str(self._fallback.hexdigest())
        ctx = ctypes.create_string_buffer(self._ctx.raw, _CTX_ALLOC)
        out = ctypes.create_string_buffer(32)
        self._lib.SHA256_Final(out, ctx)
        return out.raw.hex()

    def state(self) -> bytes | None:
        """The saved state (length + the library's context), or None where it cannot be saved."""
        if self._ctx is None:
            return None
        return self.length.to_bytes(8, "big") + bytes(self._ctx.raw[:_CTX_SIZE])

    @classmethod
    def from_state(cls, state: bytes) -> Sha256:
        """A hash that continues from ``state``; raises ValueError when it cannot."""
        lib = _libcrypto()
        if lib is None or len(state) != 8 + _CTX_SIZE:
            raise ValueError("this host cannot resume a saved sha256 state")
        h = cls()
        ctypes.memmove(h._ctx, state[8:], _CTX_SIZE)
        h.length = int.from_bytes(state[:8], "big")
        return h


def sha256_file(path: str, bufsize: int = READ_BUFFER, start: int = 0, end: int | None = None,
                into: Sha256 | None = None) -> str:  # fmt: skip
    """sha256 of a file (or of bytes [start, end) fed into ``into``), in big reads into one
    reused buffer. Returns the hex digest of whatever hash it fed."""
    digest: Any = into if into is not None else hashlib.sha256()
    buf = bytearray(bufsize)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        if start:
            f.seek(start)
        left = -1 if end is None else end - start
        while left:
            want = bufsize if left < 0 else min(bufsize, left)
            n = f.readinto(view[:want])
            if not n:
                break
            digest.update(view[:n])
            if left > 0:
                left -= n
    return str(digest.hexdigest())


def hash_files(paths: Iterable[str], workers: int = 0) -> dict[str, str]:
    """sha256 of several files at once (threads: the hash releases the GIL on big buffers)."""
    items = list(paths)
    if not items:
        return {}
    n = workers or max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=min(n, len(items))) as pool:
        digests = list(pool.map(sha256_file, items))
    return {path: digests[i] for i, path in enumerate(items)}
