"""Helpers shared by the k2.cluster weight modules (they run on the hosts: standard library only).

The stored manifest format is the relay's (k2provision/weights/relay.py): ``.k2-manifest.json``
in the model directory lists the files it verified, and ``stamps`` holds each file's mtime (ns)
at verification. A file counts as present when its size, sha256 entry and mtime all still
match, which is the same fast check the relay makes before it decides what to transfer.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatchcase
from typing import Any

STORED_MANIFEST = ".k2-manifest.json"
MANIFEST_FORMAT = "k2provision.manifest/1"
READ_BUFFER = 8 << 20


def human(n: float) -> str:
    """Bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key putting model-2-of-61 before model-10-of-61."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def matches(name: str, patterns: list[str] | None) -> bool:
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def list_files(directory: str, patterns: list[str] | None) -> list[str]:
    """Relative names of the non-hidden regular files under ``directory``, naturally sorted."""
    names: list[str] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for fname in files:
            if fname.startswith("."):
                continue
            full = os.path.join(root, fname)
            if not os.path.isfile(full):
                continue
            name = os.path.relpath(full, directory).replace(os.sep, "/")
            if matches(name, patterns):
                names.append(name)
    return sorted(names, key=natural_key)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    buf = bytearray(READ_BUFFER)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def hash_files(paths: list[str], workers: int = 0) -> dict[str, str]:
    """sha256 of several files at once (threads: hashlib releases the GIL)."""
    if not paths:
        return {}
    n = workers or max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=min(n, len(paths))) as pool:
        digests = list(pool.map(sha256_file, paths))
    return {path: digests[i] for i, path in enumerate(paths)}


def final_path(dest: str, name: str) -> str:
    return os.path.join(dest, *name.split("/"))


def partial_path(dest: str, name: str) -> str:
    head, _, base = name.rpartition("/")
    return os.path.join(dest, *(head.split("/") if head else []), f".{base}.partial")


def stored_entries(dest: str) -> dict[str, tuple[int, str, int]]:
    """name -> (size, sha256, mtime_ns) of the files the relay verified in ``dest``."""
    try:
        with open(os.path.join(dest, STORED_MANIFEST), encoding="utf-8") as f:
            obj = json.load(f)
        stamps = obj.get("stamps", {})
        return {
            str(e["name"]): (int(e["size"]), str(e["sha256"]), int(stamps[e["name"]]))
            for e in obj["files"]
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def existing_parent(path: str) -> str:
    """``path`` or its nearest existing ancestor (where new files would take their space)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def local_state(dest: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``dest`` holds of ``files`` (manifest entries), by sizes and the stored manifest.

    present: verified earlier and untouched since; unverified: the right size but not (or no
    longer) recorded as verified, so the relay re-hashes it; wrong: not a file or the wrong
    size; missing. need_bytes is the most that may have to be written; reclaim_bytes what the
    relay frees first (wrong or unverified copies and half-written files it replaces).
    """
    stored = stored_entries(dest)
    present: list[str] = []
    unverified: list[str] = []
    wrong: list[dict[str, str]] = []
    missing: list[str] = []
    need = 0
    reclaim = 0
    for entry in files:
        name, size, sha = str(entry["name"]), int(entry["size"]), str(entry["sha256"])
        path = final_path(dest, name)
        partial = partial_path(dest, name)
        try:
            reclaim_partial = os.stat(partial).st_size
        except OSError:
            reclaim_partial = 0
        try:
            st = os.stat(path)
        except FileNotFoundError:
            missing.append(name)
            need += size
            reclaim += reclaim_partial
            continue
        except OSError as exc:
            wrong.append({"name": name, "reason": exc.strerror or exc.__class__.__name__})
            need += size
            continue
        if not os.path.isfile(path):
            wrong.append({"name": name, "reason": "not a regular file"})
            need += size
        elif st.st_size != size:
            wrong.append({"name": name, "reason": f"size {st.st_size}, manifest says {size}"})
            need += size
            reclaim += st.st_size + reclaim_partial
        elif stored.get(name) == (size, sha, st.st_mtime_ns):
            present.append(name)
        else:
            unverified.append(name)
            need += size
            reclaim += st.st_size + reclaim_partial
    where = existing_parent(dest)
    free = shutil.disk_usage(where).free
    total = sum(int(e["size"]) for e in files)
    return {
        "model_dir": dest,
        "dir_exists": os.path.isdir(dest),
        "files": len(files),
        "total_bytes": total,
        "present": present,
        "unverified": unverified,
        "wrong": wrong,
        "missing": missing,
        "complete": len(present) == len(files),
        "need_bytes": need,
        "reclaim_bytes": reclaim,
        "free_bytes": free,
        "free_at": where,
    }
