"""Module payloads kept between ansible-playbook runs (the callback k2.cluster.module_cache).

Ansible builds each module's payload (AnsiballZ: the module and every module_utils file it
imports, found by parsing their sources) once per run, in the run's private temporary
directory, and deletes it when the run ends. A run of the site playbook uses 15 to 30 modules,
about 0.12 CPU s each to build (benchmarks/module_cache.py), every run again. The
callback points the run's payload cache at a directory that outlives the run, named by a digest
of everything a payload is built from: ansible-core's and Python's versions and the path, size
and modification time of every file in every directory the run loads modules and module_utils
from. Any change to that code gives a new digest, so a new, empty directory; an unchanged tree
reuses the payloads. Ansible's own lock and atomic rename keep concurrent runs safe.

``K2_MODULE_CACHE_DIR`` names the directory that holds the digests' directories (default
``$XDG_CACHE_HOME/k2provision/ansiballz``, else ``~/.cache/k2provision/ansiballz``); ``off``
turns the cache off. Anything that fails here leaves the run with Ansible's own per-run cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

CACHE_ENV = "K2_MODULE_CACHE_DIR"
OFF = "off"
# Ansible's name for the payload cache inside the run's temporary directory
# (ansible/executor/module_common.py, _find_module_utils: lookup_path).
RUN_CACHE_NAME = "ansiballz_cache"
# Digest directories kept beside the current one (the most recently used), and the age below
# which none is removed (another run may still read it).
KEEP = 4
MIN_AGE_S = 24 * 3600.0


def cache_root(environ: Mapping[str, str]) -> Path | None:
    """Where the digests' directories live, or None when the cache is off."""
    chosen = environ.get(CACHE_ENV, "")
    if chosen == OFF:
        return None
    if chosen:
        return Path(chosen)
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "k2provision" / "ansiballz"


def module_dirs(
    ansible_dir: Path,
    collection_paths: Iterable[str],
    configured: Iterable[str],
    role_paths: Iterable[str],
) -> list[Path]:
    """Every directory a run may load a module or a module_utils file from: ansible-core's,
    each collection's (plugins/modules, plugins/module_utils), the configured library and
    module_utils paths, and each role's library and module_utils."""
    dirs = [ansible_dir / "modules", ansible_dir / "module_utils"]
    for root in collection_paths:
        for plugins in sorted(Path(root).glob("ansible_collections/*/*/plugins")):
            dirs += [plugins / "modules", plugins / "module_utils"]
    dirs += [Path(p) for p in configured]
    for roles in role_paths:
        for role in sorted(Path(roles).glob("*")):
            dirs += [role / "library", role / "module_utils"]
    return dirs


def tree_digest(dirs: Iterable[Path], versions: Iterable[str]) -> str:
    """A digest of the versions and of the path, size and modification time of every file
    under `dirs` (a directory that does not exist adds nothing)."""
    digest = hashlib.sha256()
    for version in versions:
        digest.update(f"v {version}\n".encode())
    for top in dirs:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def runtime_versions(ansible_version: str) -> list[str]:
    """What the payloads depend on besides the sources: ansible-core's and Python's versions."""
    return [f"ansible-core {ansible_version}", f"python {platform.python_version()}"]


def prune(root: Path, current: Path, *, keep: int = KEEP, now: float | None = None) -> None:
    """Remove digest directories beyond the `keep` most recently used, when older than a day."""
    now = time.time() if now is None else now
    others = []
    for entry in root.iterdir():
        if entry == current or not entry.is_dir() or entry.is_symlink():
            continue
        try:
            others.append((entry.stat().st_mtime, entry))
        except OSError:
            continue
    others.sort(reverse=True)
    for mtime, entry in others[keep:]:
        if now - mtime > MIN_AGE_S:
            shutil.rmtree(entry, ignore_errors=True)


def link_run_cache(run_tmp: Path, root: Path, digest: str) -> Path | None:
    """Point the run's payload cache (`run_tmp`/ansiballz_cache) at `root`/`digest`; returns
    that directory, or None when the run already has a cache of its own or a step fails."""
    link = run_tmp / RUN_CACHE_NAME
    if os.path.lexists(link):
        return None
    target = root / digest
    try:
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.utime(target)  # most recently used, for prune
        link.symlink_to(target, target_is_directory=True)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        prune(root, target)
    return target
