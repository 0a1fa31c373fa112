"""The stand-in Ray cluster: the head keeps a node table over HTTP on its GCS port.

Workers (`ray start --address HEAD:PORT --block`) register with the head and send a
heartbeat every few seconds; `ray status`, `ray.nodes()` and the stand-in vLLM read the
table. Like Ray, the head writes `<ray dir>/ray_current_cluster` so processes in the same
container find it without an address.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2standin.httpserve import Api, Response, json_response, parse_json

RAY_DIR_ENV = "K2_STANDIN_RAY_DIR"
DEFAULT_RAY_DIR = "/tmp/ray"
NODE_TIMEOUT_S = 15.0
HEARTBEAT_S = 3.0


def ray_dir() -> Path:
    return Path(os.environ.get(RAY_DIR_ENV, DEFAULT_RAY_DIR))


def current_cluster_file() -> Path:
    return ray_dir() / "ray_current_cluster"


def resolve_address(address: str | None) -> str | None:
    """An explicit address, else RAY_ADDRESS, else the head started in this container."""
    if address in (None, "", "auto"):
        address = os.environ.get("RAY_ADDRESS") or None
    if address in (None, "", "auto"):
        try:
            address = current_cluster_file().read_text().strip() or None
        except OSError:
            address = None
    if address is not None and address.startswith("ray://"):
        address = address[len("ray://") :]
    return address


def fetch_nodes(address: str, timeout: float = 3.0) -> list[dict[str, Any]]:
    """The node table of the head at `address` (raises ConnectionError)."""
    url = f"http://{address}/api/nodes"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise ConnectionError(f"no Ray head answers at {address}: {exc}") from exc
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise ConnectionError(f"{address} answered, but not as a Ray head")
    return nodes


def post(address: str, path: str, doc: dict[str, Any], timeout: float = 3.0) -> int:
    """POST JSON to the head; the HTTP status (raises OSError when unreachable)."""
    request = urllib.request.Request(
        f"http://{address}{path}",
        data=json.dumps(doc).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def node_resources(ip: str, gpus: float, cpus: float, head: bool) -> dict[str, float]:
    resources = {"CPU": cpus, "GPU": gpus, f"node:{ip}": 1.0}
    if head:
        resources["node:__internal_head__"] = 1.0
    return resources


def new_node(ip: str, gpus: float, cpus: float, head: bool) -> dict[str, Any]:
    return {
        "NodeID": uuid.uuid4().hex + uuid.uuid4().hex[:24],
        "NodeManagerAddress": ip,
        "NodeManagerHostname": socket.gethostname(),
        "Resources": node_resources(ip, gpus, cpus, head),
        "IsHead": head,
    }


@dataclass
class _Entry:
    node: dict[str, Any]
    last_seen: float
    head: bool


class Head:
    """The head's node table and its HTTP routes."""

    def __init__(self, me: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, _Entry] = {me["NodeID"]: _Entry(me, time.monotonic(), True)}
        self.api = Api("ray-head")
        self.api.get["/api/nodes"] = self.nodes
        self.api.get["/api/version"] = lambda: json_response(200, {"ray": "stand-in"})
        self.api.post["/api/register"] = self.register
        self.api.post["/api/heartbeat"] = self.heartbeat

    def _alive(self, entry: _Entry, now: float) -> bool:
        return entry.head or now - entry.last_seen < NODE_TIMEOUT_S

    def snapshot(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            return [
                {**e.node, "Alive": self._alive(e, now), "alive": self._alive(e, now)}
                for e in self.entries.values()
            ]

    def nodes(self) -> Response:
        return json_response(200, {"nodes": self.snapshot()})

    def register(self, body: bytes) -> Response:
        doc = parse_json(body)
        if isinstance(doc, Response):
            return doc
        node = doc.get("node")
        if not isinstance(node, dict) or "NodeID" not in node:
            return json_response(400, {"error": "node: expected a node record"})
        with self.lock:
            # A node that comes back on the same address replaces its dead predecessor.
            for entry in self.entries.values():
                if not entry.head and entry.node.get("NodeManagerAddress") == node.get(
                    "NodeManagerAddress"
                ):
                    entry.last_seen = -NODE_TIMEOUT_S * 2
            self.entries[str(node["NodeID"])] = _Entry(node, time.monotonic(), False)
        return json_response(200, {"ok": True})

    def heartbeat(self, body: bytes) -> Response:
        doc = parse_json(body)
        if isinstance(doc, Response):
            return doc
        with self.lock:
            entry = self.entries.get(str(doc.get("NodeID")))
            if entry is None:
                return json_response(404, {"error": "unknown node"})
            entry.last_seen = time.monotonic()
        return json_response(200, {"ok": True})


def alive_gpus(nodes: list[dict[str, Any]]) -> tuple[int, float]:
    alive = [n for n in nodes if n.get("Alive")]
    return len(alive), sum(float(n.get("Resources", {}).get("GPU", 0.0)) for n in alive)
