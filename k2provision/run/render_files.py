"""`render --out DIR`: a plan's files on the local disk, safely.

Each host's files go to DIR/<host>/<absolute path>, the plan to DIR/plan.json, and the
monitoring host's Prometheus config, rules and Grafana dashboards to DIR/monitoring/. A host name
becomes a directory name only when it is one plain path component; nothing is written outside
DIR. DIR must be new, empty, or a previous render (recognised by its manifest, which also names
the files a re-render no longer writes, removed then); `force` writes into any directory.
Every failure is one K2Error line, raised before the first file is written where it can be.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from k2provision.core import bounded_read
from k2provision.core.records import Plan
from k2provision.errors import K2Error
from k2provision.plan.monitoring import monitoring_files

PLAN_FILE = "plan.json"
MONITORING_DIR = "monitoring"
MANIFEST = ".k2provision-render.json"
# A file is written under this prefix beside its name, then renamed over it.
TEMPORARY_PREFIX = ".k2provision-new-"
# The most a render's manifest may hold (a list of relative paths).
MANIFEST_LIMIT = 16 * 1024 * 1024
_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]*$")


def unsafe_host_names(plan: Plan) -> list[str]:
    """Host names that cannot be one directory name under DIR."""
    reserved = {PLAN_FILE, MANIFEST, MONITORING_DIR}
    return [
        h.name
        for h in plan.hosts
        if not _SAFE_COMPONENT.match(h.name) or h.name in reserved or len(h.name) > 255
    ]


def planned_files(plan: Plan, out: Path) -> dict[Path, tuple[str, bool]]:
    """Every file of a render: path -> (content, executable)."""
    files: dict[Path, tuple[str, bool]] = {
        out / PLAN_FILE: (json.dumps(plan.model_dump(mode="json"), indent=2) + "\n", False)
    }
    for host in plan.hosts:
        for path, content in host.files.items():
            target = out / host.name / path.lstrip("/")
            if ".." in Path(path).parts:
                raise K2Error(
                    [
                        f"{host.name}: file {path} would be written outside {out}; fix: use a "
                        "normalised absolute k2_config_dir (no '..')"
                    ]
                )
            files[target] = (content, path.endswith(".sh"))
    for path, content in monitoring_files(plan).items():
        files[out / MONITORING_DIR / path] = (content, False)
    return files


def _previous_render(out: Path) -> list[str] | None:
    """The files a previous render wrote into `out` (None when `out` holds no render)."""
    if (out / MANIFEST).is_symlink():
        return None
    try:
        written = json.loads(bounded_read.read_text(out / MANIFEST, MANIFEST_LIMIT))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(written, list) or not all(isinstance(p, str) for p in written):
        return None
    return written


def _check_target(out: Path, force: bool) -> list[str] | None:
    """Refuse an --out that is a file, lies under one, or holds something else."""
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == out else f"lies under {parent}, which is a file"
            raise K2Error([f"--out {out} {where}; expected a directory; fix: choose another --out"])
        if parent.exists():
            break
    if not out.exists():
        return None
    previous = _previous_render(out)
    if previous is None and any(out.iterdir()) and not force:
        raise K2Error(
            [
                f"--out {out} is not empty and holds no earlier render; expected a new or empty "
                "directory, or a previous render; fix: choose another --out, or pass --force "
                "to write into it anyway"
            ]
        )
    return previous


def write_render(plan: Plan, out: Path, *, force: bool = False) -> int:
    """Materialise a plan's files under `out`; the number of files written."""
    unsafe = unsafe_host_names(plan)
    if unsafe:
        raise K2Error(
            [
                f"host {name!r}: its name cannot be a directory name under --out (a path "
                "separator, a leading dot, or a reserved name); fix: rename the host in the "
                "inventory (ansible_host keeps its address)"
                for name in unsafe
            ]
        )
    if out.is_symlink():
        raise K2Error(
            [f"--out {out} is a symbolic link (to {os.readlink(out)}); expected a directory "
             "that is no link, as render never follows one; fix: pass the directory itself"]
        )  # fmt: skip
    files = planned_files(plan, out)
    previous = _check_target(out, force) or []
    relative = sorted(str(path.relative_to(out)) for path in files)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in sorted(set(previous) - set(relative)):
            _remove_stale(out, stale)
        for path, (content, executable) in files.items():
            _write_no_follow(out, path, content, 0o755 if executable else 0o644)
        _write_no_follow(out, out / MANIFEST, json.dumps(relative, indent=1) + "\n", 0o644)
    except OSError as exc:
        where = exc.filename or out
        raise K2Error(
            [
                f"--out {out}: cannot write {where} ({exc.strerror or exc}); fix: choose a "
                "directory you can write, or free it"
            ]
        ) from None
    return len(files)


def _write_no_follow(out: Path, path: Path, content: str, mode: int) -> None:
    """Write `path` under `out` without following a link: a symbolic link an earlier render's
    directory was replaced by (which could point anywhere) is removed first, and each file is
    written new and renamed into place, so a symbolic or hard link left at its name is
    replaced, never written through; the render writes inside `out` and nothing outside it."""
    where = out
    for part in path.relative_to(out).parts[:-1]:
        where = where / part
        if where.is_symlink():
            where.unlink()
        if not where.exists():
            where.mkdir()
        elif not where.is_dir():
            raise K2Error(
                [f"--out {out}: {where} is not a directory, and {path} goes under it; fix: "
                 "remove it, or choose another --out"]
            )  # fmt: skip
    # A new file renamed over the old name: a symbolic link or a hard link left there (whose
    # other name may lie anywhere) loses this name and is never written through.
    fresh = path.with_name(f"{TEMPORARY_PREFIX}{path.name}")
    if fresh.is_symlink() or fresh.exists():
        fresh.unlink()
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(content)
        os.replace(fresh, path)
    except OSError:
        fresh.unlink(missing_ok=True)
        raise


def _remove_stale(out: Path, relative: str) -> None:
    """Remove one file of the previous render (and directories it leaves empty)."""
    path = out / relative
    root = out.resolve()
    if root not in path.resolve().parents or not path.is_file():
        return
    path.unlink()
    parent = path.parent
    while parent.resolve() != root and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
