"""A private endpoint reached from the controller: an SSH port forward to the endpoint's host,
opened with the same ssh argv Ansible would use for it (connect.py: ProxyJump, ~/.ssh/config,
the agent), and requests that dial the forward's local port while naming, and checking the
certificate of, the endpoint's own host.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from k2provision.errors import K2Error
from k2provision.ops.connect import SshTarget, ssh_command, unreachable_reason

DIRECT_TIMEOUT_S = 3.0
FORWARD_TIMEOUT_S = 20.0

Address = tuple[str, int]


def endpoint_address(url: str) -> Address:
    """(host, port) of an endpoint URL, the scheme's port when it names none. Pure."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise K2Error([f"endpoint {url!r}: no host in it"])
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def reachable(address: Address, timeout: float = DIRECT_TIMEOUT_S) -> bool:
    """True when a TCP connection to `address` opens from here within `timeout`."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def forward_argv(target: SshTarget, local_port: int, remote: Address) -> list[str]:
    """`ssh -N -L 127.0.0.1:LOCAL:HOST:PORT` to the target, with Ansible's options for it;
    ssh exits at once when the forward cannot be set up."""
    base = ssh_command(target)
    host, port = remote
    bracketed = f"[{host}]" if ":" in host else host
    return [
        base[0],
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-L",
        f"127.0.0.1:{local_port}:{bracketed}:{port}",
        *base[1:],
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def port_forward(
    target: SshTarget, remote: Address, timeout: float = FORWARD_TIMEOUT_S
) -> Iterator[Address]:
    """A local address that reaches `remote` as `target` sees it, while the block runs;
    K2Error naming the host and the setting that failed when the forward does not open."""
    local = ("127.0.0.1", _free_port())
    argv = forward_argv(target, local[1], remote)
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + timeout
            while not reachable(local, timeout=1.0):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    err.seek(0)
                    stderr = err.read().decode(errors="replace")
                    reason = unreachable_reason(target, argv, stderr)
                    raise K2Error(
                        [
                            f"{target.name}: no SSH port forward to {remote[0]}:"
                            f"{remote[1]} ({reason})"
                        ]
                    )
                time.sleep(0.2)
            yield local
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@dataclass(frozen=True)
class Dial:
    """Where requests to the endpoint connect instead of its URL's host (a forward's local
    address); the URL's host still names the server (Host header, TLS name check)."""

    address: Address


def connection(
    url: str, timeout: float, context: ssl.SSLContext | None, dial: Dial | None
) -> http.client.HTTPConnection:
    """An HTTP(S) connection for `url` that connects to `dial` when given."""
    host, port = endpoint_address(url)
    conn: http.client.HTTPConnection
    if urlsplit(url).scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context or ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    if dial is not None:
        address = dial.address

        def dialled(_: Address, *args: Any, **kwargs: Any) -> socket.socket:
            return socket.create_connection(address, *args, **kwargs)

        conn._create_connection = dialled  # type: ignore[attr-defined]
    return conn
