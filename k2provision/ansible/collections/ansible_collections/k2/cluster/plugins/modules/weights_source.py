"""Module k2.cluster.weights_source: the manifest of a weight source on the host that holds it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ..module_utils.k2_weights.common import MANIFEST_FORMAT
from ..module_utils.k2_weights.hashing import hash_files
from ..module_utils.k2_weights.names import final_path, list_files, natural_key
from ..module_utils.k2_weights.store import stored_entries
from ..module_utils.k2_weights.synthetic import synthetic_set, write_blocks

DOCUMENTATION = r"""
module: weights_source
short_description: Build the manifest of a weight source (a directory, or synthetic shards)
description:
  - With O(kind=dir), hashes every non-hidden file under O(path) that matches O(patterns)
    (several files at once); hashes already known (the relay's stored manifest in O(path), or
    the O(cache) file) are reused while size and mtime are unchanged. Reads only, except the
    cache file.
  - With O(kind=synthetic) (for labs and tests, never a real model), describes O(shards)
    valid safetensors shards of O(shard_bytes) each (random tensor data from a fixed seed)
    plus C(config.json) holding O(config); with O(generate=true) it writes whichever of them
    are missing or differ. The content is a function of the options, so the manifest is known
    before anything is written.
options:
  kind:
    description: Where the weights come from.
    type: str
    choices: [dir, synthetic]
    required: true
  path:
    description: The source directory.
    type: path
    required: true
  patterns:
    description: Glob patterns of the files to include (O(kind=dir)); empty means all.
    type: list
    elements: str
    default: []
  model:
    description: Model name recorded in the manifest.
    type: str
    default: ""
  revision:
    description: Revision recorded in the manifest.
    type: str
    default: ""
  cache:
    description: JSON file remembering hashes by size and mtime (O(kind=dir)); empty for none.
    type: path
    default: ""
  shards:
    description: Number of synthetic shards.
    type: int
    default: 4
  shard_bytes:
    description: Size of each synthetic shard.
    type: int
    default: 8388608
  seed:
    description: Seed of the synthetic tensor data.
    type: int
    default: 0
  config:
    description: Content of the synthetic C(config.json).
    type: dict
    default: {}
  generate:
    description: Write the synthetic files that are missing or differ.
    type: bool
    default: false
author: k2provision
"""

RETURN = r"""
manifest:
  description: format, model, revision and files (name, size, sha256) in transfer order.
  type: dict
written:
  description: Synthetic files written (or, in check mode, that would be).
  type: list
"""


def digest_of(blocks: Iterator[bytes]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for block in blocks:
        h.update(block)
        n += len(block)
    return h.hexdigest(), n


def synthetic(module: AnsibleModule) -> dict[str, Any]:
    p = module.params
    if p["shards"] < 1 or p["shard_bytes"] < 4096:
        module.fail_json(msg="synthetic weights need shards >= 1 and shard_bytes >= 4096")
    dest = p["path"]
    stored = stored_entries(dest)
    files: list[dict[str, Any]] = []
    written: list[str] = []
    for name, blocks in synthetic_set(p["shards"], p["shard_bytes"], p["seed"], p["config"]):
        sha, size = digest_of(blocks())
        files.append({"name": name, "size": size, "sha256": sha})
        path = final_path(dest, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_size == size:
            if stored.get(name) == (size, sha, st.st_mtime_ns):
                continue
            if hash_files([path])[path] == sha:
                continue
        written.append(name)
        if p["generate"] and not module.check_mode:
            write_blocks(path, blocks())
    revision = p["revision"] or f"synthetic-{p['seed']}-{p['shards']}x{p['shard_bytes']}"
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": p["model"],
        "revision": revision,
        "files": files,
    }
    return {"changed": bool(written) and p["generate"], "manifest": manifest, "written": written}


def from_dir(module: AnsibleModule) -> dict[str, Any]:
    p = module.params
    source = p["path"]
    if not os.path.isdir(source):
        module.fail_json(msg=f"weight source {source} is not a directory on this host")
    names = list_files(source, p["patterns"])
    if not names:
        module.fail_json(msg=f"weight source {source}: no files match {p['patterns'] or ['*']}")
    known: dict[str, tuple[int, int, str]] = {}
    cache_path = p["cache"]
    if cache_path:
        try:
            with open(cache_path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached.get("path") == source:
                known = {
                    str(k): (int(v[0]), int(v[1]), str(v[2])) for k, v in cached["files"].items()
                }
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            known = {}
    for name, (size, sha, mtime) in stored_entries(source).items():
        known.setdefault(name, (size, mtime, sha))
    stats = {n: os.stat(final_path(source, n)) for n in names}
    todo = [
        final_path(source, n)
        for n in names
        if known.get(n, (-1, -1, ""))[:2] != (stats[n].st_size, stats[n].st_mtime_ns)
    ]
    digests = hash_files(todo)
    files = []
    fresh: dict[str, list[Any]] = {}
    for n in names:
        path = final_path(source, n)
        sha = digests.get(path) or known[n][2]
        files.append({"name": n, "size": stats[n].st_size, "sha256": sha})
        fresh[n] = [stats[n].st_size, stats[n].st_mtime_ns, sha]
    if cache_path and todo and not module.check_mode:
        os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
        tmp = f"{cache_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"path": source, "files": fresh}, f)
        os.replace(tmp, cache_path)
    files.sort(key=lambda e: natural_key(str(e["name"])))
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": p["model"],
        "revision": p["revision"],
        "files": files,
    }
    return {"changed": False, "manifest": manifest, "hashed": len(todo)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "choices": ["dir", "synthetic"], "required": True},
            "path": {"type": "path", "required": True},
            "patterns": {"type": "list", "elements": "str", "default": []},
            "model": {"type": "str", "default": ""},
            "revision": {"type": "str", "default": ""},
            "cache": {"type": "path", "default": ""},
            "shards": {"type": "int", "default": 4},
            "shard_bytes": {"type": "int", "default": 8 << 20},
            "seed": {"type": "int", "default": 0},
            "config": {"type": "dict", "default": {}},
            "generate": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        kind = module.params["kind"]
        result = synthetic(module) if kind == "synthetic" else from_dir(module)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"weight source {module.params['path']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
