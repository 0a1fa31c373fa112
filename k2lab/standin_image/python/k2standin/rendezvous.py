"""Multi-node rendezvous over TCP, standing in for the engines' process-group setup.

The leader (SGLang node rank 0 on --dist-init-addr, vLLM's data-parallel head on
--data-parallel-address:--data-parallel-rpc-port) listens; every other node connects, says
which ranks it holds and a fingerprint of the settings all nodes must share, and then
exchanges a heartbeat line every couple of seconds. The leader is ready once the ranks
0..total-1 are covered exactly once. As with NCCL, a node that goes away breaks the group:
both sides exit non-zero so the launch role recreates them.

An engine may also refuse a member for what it is (`admit`): vLLM's head refuses headless
ranks unless it balances load internally. Such a refusal stops the leader too, as the engine's
start-up fails.

Wire format: one JSON object per line.
  member -> leader: {"ranks": [first, end], "fingerprint": {...}, ...}  (end exclusive; more
                    keys as the engine's handshake carries them, e.g. "headless")
  leader -> member: {"ok": true} | {"ok": false, "error": "..."}
  then member -> leader {"ping": n}, leader -> member {"pong": n}.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from k2standin.common import Runtime, StartError, env_seconds, log
from k2standin.httpserve import ModelServer

HEARTBEAT_S = 2.0
PEER_TIMEOUT_ENV = "K2_STANDIN_PEER_TIMEOUT"
JOIN_TIMEOUT_ENV = "K2_STANDIN_JOIN_TIMEOUT"


def _send(sock: socket.socket, doc: dict[str, Any]) -> None:
    sock.sendall(json.dumps(doc).encode() + b"\n")


def _recv(reader: Any) -> dict[str, Any] | None:
    line = reader.readline()
    if not line:
        return None
    doc = json.loads(line)
    return doc if isinstance(doc, dict) else None


@dataclass
class Joined:
    first: int
    end: int
    host: str


class Leader:
    """Rank 0's side: accepts members until ranks 0..total-1 are all present."""

    def __init__(
        self,
        rt: Runtime,
        what: str,
        host: str,
        port: int,
        total: int,
        own: tuple[int, int],
        fingerprint: dict[str, Any],
        on_complete: Callable[[], None],
        admit: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        self.rt = rt
        self.admit = admit
        self.what = what
        self.total = total
        self.fingerprint = fingerprint
        self.on_complete = on_complete
        self.members: list[Joined] = [Joined(own[0], own[1], host)]
        self.lock = threading.Lock()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.peer_timeout = env_seconds(PEER_TIMEOUT_ENV, 15.0)
        threading.Thread(target=self._accept_loop, daemon=True).start()
        if self.complete():
            on_complete()

    def covered(self) -> set[int]:
        return {r for m in self.members for r in range(m.first, m.end)}

    def complete(self) -> bool:
        return self.covered() == set(range(self.total))

    def joined(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"ranks": [m.first, m.end], "host": m.host} for m in self.members]

    def missing(self) -> list[int]:
        with self.lock:
            return sorted(set(range(self.total)) - self.covered())

    def _accept_loop(self) -> None:
        while not self.rt.stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr[0]), daemon=True).start()

    def _admit(self, hello: dict[str, Any], peer: str) -> tuple[Joined | None, str | None]:
        ranks = hello.get("ranks")
        if (
            not isinstance(ranks, list)
            or len(ranks) != 2
            or not all(isinstance(r, int) for r in ranks)
            or not 0 <= ranks[0] < ranks[1] <= self.total
        ):
            return None, f"{self.what} {ranks} is outside 0..{self.total - 1}"
        theirs = hello.get("fingerprint")
        if theirs != self.fingerprint:
            diff = sorted(
                k
                for k in set(self.fingerprint) | set(theirs or {})
                if (theirs or {}).get(k) != self.fingerprint.get(k)
            )
            detail = ", ".join(
                f"{k}: {(theirs or {}).get(k)!r} here, {self.fingerprint.get(k)!r} on rank 0"
                for k in diff
            )
            return None, f"settings differ from rank 0's ({detail})"
        refusal = self.admit(hello) if self.admit is not None else None
        if refusal is not None:
            self.rt.fatal(refusal)  # the engine's start-up fails on the leader as well
            return None, refusal
        host = peer
        with self.lock:
            taken = self.covered() & set(range(ranks[0], ranks[1]))
            if taken:
                holder = next(m for m in self.members if set(range(m.first, m.end)) & taken)
                return None, (
                    f"{self.what} {sorted(taken)} already joined from {holder.host}"
                    " (two nodes claim the same rank)"
                )
            member = Joined(ranks[0], ranks[1], host)
            self.members.append(member)
            done = self.complete()
        log(self.rt.entry, f"{self.what} {ranks[0]}..{ranks[1] - 1} joined from {host}")
        if done:
            log(self.rt.entry, f"all {self.total} {self.what}s joined")
            self.on_complete()
        return member, None

    def _serve(self, conn: socket.socket, peer: str) -> None:
        with conn:
            conn.settimeout(self.peer_timeout)
            reader = conn.makefile("rb")
            try:
                hello = _recv(reader)
            except (OSError, ValueError):
                return
            if hello is None:
                return
            member, problem = self._admit(hello, peer)
            if member is None:
                log(self.rt.entry, f"refused a node from {peer}: {problem}")
                with contextlib.suppress(OSError):
                    _send(conn, {"ok": False, "error": problem})
                return
            _send(conn, {"ok": True, "total": self.total})
            while not self.rt.stop.is_set():
                try:
                    msg = _recv(reader)
                    if msg is None:
                        raise ConnectionError("connection closed")
                    _send(conn, {"pong": msg.get("ping")})
                except (OSError, ValueError) as exc:
                    if not self.rt.stop.is_set():
                        self.rt.fatal(
                            f"{self.what} {member.first} ({member.host}) went away ({exc}): "
                            "the process group is broken"
                        )
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def join(
    rt: Runtime,
    what: str,
    leader: tuple[str, int],
    ranks: tuple[int, int],
    fingerprint: dict[str, Any],
    hello: dict[str, Any] | None = None,
) -> str | None:
    """Join the leader (retrying until K2_STANDIN_JOIN_TIMEOUT); then heartbeat from a thread.

    Returns an error message when the leader refuses or never answers; None once joined.
    """
    deadline = time.monotonic() + env_seconds(JOIN_TIMEOUT_ENV, 1800.0)
    peer_timeout = env_seconds(PEER_TIMEOUT_ENV, 15.0)
    attempt = 0
    last_error = ""
    while not rt.stop.is_set():
        attempt += 1
        try:
            sock = socket.create_connection(leader, timeout=5)
        except OSError as exc:
            last_error = str(exc)
            if attempt == 1 or attempt % 10 == 0:
                log(rt.entry, f"waiting for rank 0 at {leader[0]}:{leader[1]} ({exc})")
            if time.monotonic() > deadline:
                return f"rank 0 at {leader[0]}:{leader[1]} never answered: {last_error}"
            rt.sleep(1.0)
            continue
        sock.settimeout(peer_timeout)
        reader = sock.makefile("rb")
        try:
            _send(sock, {**(hello or {}), "ranks": list(ranks), "fingerprint": fingerprint})
            reply = _recv(reader)
        except (OSError, ValueError) as exc:
            sock.close()
            last_error = str(exc)
            rt.sleep(1.0)
            continue
        if reply is None or not reply.get("ok"):
            sock.close()
            problem = reply.get("error") if reply else "connection closed"
            return f"rank 0 at {leader[0]}:{leader[1]} refused {what} {ranks[0]}: {problem}"
        log(rt.entry, f"joined rank 0 at {leader[0]}:{leader[1]} as {what} {ranks[0]}")
        threading.Thread(target=_heartbeat, args=(rt, sock, reader, leader), daemon=True).start()
        return None
    return None


def _heartbeat(rt: Runtime, sock: socket.socket, reader: Any, leader: tuple[str, int]) -> None:
    n = 0
    with sock:
        while not rt.sleep(HEARTBEAT_S):
            n += 1
            try:
                _send(sock, {"ping": n})
                if _recv(reader) is None:
                    raise ConnectionError("connection closed")
            except (OSError, ValueError) as exc:
                if not rt.stop.is_set():
                    rt.fatal(
                        f"lost rank 0 at {leader[0]}:{leader[1]} ({exc}): "
                        "the process group is broken"
                    )
                return


def start_leader(
    rt: Runtime,
    option: str,
    address: tuple[str, int],
    total: int,
    fingerprint: dict[str, Any],
    ms: ModelServer,
    own: tuple[int, int] = (0, 1),
    what: str = "node rank",
    admit: Callable[[dict[str, Any]], str | None] | None = None,
) -> Leader:
    """Listen for the other nodes on `address`; `ms` turns ready once all joined."""
    try:
        leader = Leader(
            rt, what, address[0], address[1], total, own, fingerprint, ms.set_ready, admit
        )
    except OSError as exc:
        raise StartError(
            f"{option} {address[0]}:{address[1]}: cannot listen there "
            f"({exc.strerror or exc}); it must be an address of this node"
        ) from exc
    ms.info_hooks.append(lambda: {"joined": leader.joined(), "missing_ranks": leader.missing()})
    return leader
