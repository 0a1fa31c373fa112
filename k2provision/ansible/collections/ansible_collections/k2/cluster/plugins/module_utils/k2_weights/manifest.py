"""The manifest as the relay and the modules read it: files (name, size, sha256) in order.

k2provision's typed ``Manifest`` (k2provision/weights/manifest.py) writes the same JSON and
checks it through ``read_manifest`` here, so both sides accept exactly the same manifests.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from .common import MANIFEST_FORMAT, Json, RelayError, describe_error
from .names import check_name

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class FileMeta:
    name: str
    size: int
    sha256: str

    def to_json(self) -> Json:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


def manifest_digest(files: list[Json]) -> str:
    """sha256 over (name, size, sha256) of every file: equal digests, equal contents."""
    body = json.dumps(files, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


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
        return manifest_digest([f.to_json() for f in self.files])

    def total(self, names: set[str] | None = None) -> int:
        return sum(f.size for f in self.files if names is None or f.name in names)


def file_entry_problem(entry: Any) -> str | None:
    """Why one manifest file entry is unusable, or None."""
    if not isinstance(entry, dict):
        return "manifest file entry is not an object"
    name, size, sha = entry.get("name"), entry.get("size"), entry.get("sha256")
    if not isinstance(name, str):
        return f"manifest entry name {name!r} is not a string"
    try:
        check_name(name)
    except RelayError as exc:
        return str(exc)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"manifest entry {name!r}: size {size!r} is not a byte count"
    if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _HEX:
        return f"manifest entry {name!r}: sha256 {sha!r} is not 64 lowercase hex"
    return None


def read_manifest(obj: Any) -> RelayManifest:
    """Validate a manifest mapping (the JSON k2provision.weights.manifest writes)."""
    if not isinstance(obj, dict):
        raise RelayError("manifest is not a JSON object")
    raw = obj.get("files")
    if not isinstance(raw, list):
        raise RelayError("manifest has no 'files' list")
    files: list[FileMeta] = []
    seen: set[str] = set()
    for entry in raw:
        problem = file_entry_problem(entry)
        if problem:
            raise RelayError(problem)
        name = str(entry["name"])
        if name in seen:
            raise RelayError(f"manifest lists {name!r} twice")
        seen.add(name)
        files.append(FileMeta(name, int(entry["size"]), str(entry["sha256"])))
    return RelayManifest(str(obj.get("model", "")), str(obj.get("revision", "")), tuple(files))


def load_manifest_file(path: str) -> RelayManifest:
    """A manifest from a JSON file, or from standard input for ``-``."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        return read_manifest(json.loads(text))
    except (OSError, ValueError) as exc:
        raise RelayError(f"cannot read manifest {path}: {describe_error(exc)}") from None
