"""Filesystem helpers that never cross a mount: find, unmount, and remove lab directories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from k2lab.errors import LabError
from k2lab.proc import run


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, deepest first."""
    root = str(path.resolve()) if path.exists() else str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(path: Path) -> list[str]:
    """Lazily unmount everything at or below `path`; returns what was unmounted."""
    done = []
    for point in mounts_under(path):
        if run(["umount", "-l", point], check=False).returncode == 0:
            done.append(point)
    return done


def safe_rmtree(path: Path) -> None:
    """Remove a directory tree after unmounting anything inside it; never descends a mount."""
    if not path.exists():
        return
    unmount_under(path)
    left = mounts_under(path)
    if left:
        raise LabError(f"cannot remove {path}: still mounted at {', '.join(left)}")
    shutil.rmtree(path)


def fs_type(path: Path) -> str:
    """The filesystem type holding `path` (ext4, xfs, overlay, tmpfs, ...)."""
    target = path.resolve()
    while not target.exists():
        target = target.parent
    best, best_type = "", "unknown"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = _unescape(fields[4])
        sep = fields.index("-")
        kind = fields[sep + 1]
        inside = str(target) == point or str(target).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, kind
    return best_type


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a text file (creating parents) and set its mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_text(text)
    os.chmod(path, mode)
