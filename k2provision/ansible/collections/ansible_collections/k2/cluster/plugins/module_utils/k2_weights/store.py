"""A model directory: the stored manifest of verified files, resume points, scans, free space.

``.k2-manifest.json`` in the model directory lists the files the relay verified, and
``stamps`` holds each file's mtime (ns) at verification. A file counts as present when its
size, sha256 entry and mtime all still match: the fast check both the relay and the
``weights_state`` module make before anything is transferred. A half-received file lives as
``.<name>.partial`` beside a resume point ``.k2-resume.<name>.json``: how many of its bytes
are on disk (fdatasync'd) and, where the host can save it, the sha256 state after them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .common import MANIFEST_FORMAT, STORED_MANIFEST, describe_error, human
from .hashing import sha256_file
from .manifest import FileMeta, RelayManifest
from .names import final_path, is_safetensors, partial_path, resume_path
from .safetensors import check_safetensors_file

Entries = dict[str, tuple[int, str, int]]


def stored_entries(dest: str) -> Entries:
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


def fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomically(path: str, body: Any) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it over ``path``."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# ----------------------------------------------------------------------------- resume points


@dataclass(frozen=True)
class ResumePoint:
    """``offset`` bytes of a partial file are on disk; ``state`` is the sha256 after them."""

    offset: int
    state: bytes | None


def save_resume_point(dest: str, meta: FileMeta, offset: int, state: bytes | None) -> None:
    partial = partial_path(dest, meta.name)
    try:
        ino = os.stat(partial).st_ino
    except OSError:
        return
    body = {
        "name": meta.name,
        "size": meta.size,
        "sha256": meta.sha256,
        "offset": offset,
        "state": state.hex() if state is not None else None,
        "ino": ino,
    }
    write_json_atomically(resume_path(dest, meta.name), body)


def load_resume_point(dest: str, meta: FileMeta) -> ResumePoint | None:
    """The resume point of ``meta``'s partial file when it still describes that file."""
    try:
        with open(resume_path(dest, meta.name), encoding="utf-8") as f:
            obj = json.load(f)
        offset = int(obj["offset"])
        st = os.stat(partial_path(dest, meta.name))
        if (
            obj.get("name") != meta.name
            or int(obj["size"]) != meta.size
            or obj.get("sha256") != meta.sha256
            or int(obj["ino"]) != st.st_ino
            or not 0 < offset < meta.size
            or st.st_size < offset
        ):
            return None
        state = bytes.fromhex(obj["state"]) if obj.get("state") else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return ResumePoint(offset, state)


def drop_resume_point(dest: str, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(resume_path(dest, name))


# ----------------------------------------------------------------------------- the store


class LocalStore:
    """The destination directory and its stored manifest of verified files."""

    def __init__(self, dest: str) -> None:
        self.dest = os.path.abspath(dest)
        self.lock = threading.Lock()
        self.model = ""
        self.revision = ""
        self.order: list[str] = []
        self.entries = stored_entries(self.dest)

    def final(self, name: str) -> str:
        return final_path(self.dest, name)

    def partial(self, name: str) -> str:
        return partial_path(self.dest, name)

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
        write_json_atomically(os.path.join(self.dest, STORED_MANIFEST), body)

    def scan(
        self,
        manifest: RelayManifest,
        verify: bool,
        workers: int,
        emit: Callable[..., None],
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
                states[meta.name] = f"wrong: {describe_error(exc)}"
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
                    return meta.name, f"wrong: {describe_error(exc)}"
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


# ----------------------------------------------------------------------------- free space


def existing_parent(path: str) -> str:
    """``path`` or its nearest existing ancestor (where new files would take their space)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


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


def local_state(dest: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``dest`` holds of ``files`` (manifest entries), by sizes and the stored manifest.

    present: verified earlier and untouched since; unverified: the right size but not (or no
    longer) recorded as verified, so the relay re-hashes it; wrong: not a file or the wrong
    size; missing (``resumable`` names those whose partial copy resumes, with its offset).
    need_bytes is the most that may have to be written; reclaim_bytes what the relay frees
    first (wrong or unverified copies and half-written files it replaces).
    """
    stored = stored_entries(dest)
    present: list[str] = []
    unverified: list[str] = []
    wrong: list[dict[str, str]] = []
    missing: list[str] = []
    resumable: list[dict[str, Any]] = []
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
            point = load_resume_point(dest, FileMeta(name, size, sha))
            if point is not None:
                resumable.append({"name": name, "offset": point.offset})
                need += size - point.offset
            else:
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
        "resumable": resumable,
        "complete": len(present) == len(files),
        "need_bytes": need,
        "reclaim_bytes": reclaim,
        "free_bytes": free,
        "free_at": where,
    }
