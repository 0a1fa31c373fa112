"""Formats, errors, and the byte and address formatting every weight tool shares."""

from __future__ import annotations

from typing import Any

MANIFEST_FORMAT = "k2provision.manifest/1"
STORED_MANIFEST = ".k2-manifest.json"
DEFAULT_PORT = 29517
READ_BUFFER = 8 << 20

Json = dict[str, Any]


class RelayError(Exception):
    """A problem a person must read: one line naming the host, the value and the fix."""


def human(n: float) -> str:
    """Bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_error(exc: BaseException) -> str:
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
    """(host, port) -> ``HOST:PORT``, brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
