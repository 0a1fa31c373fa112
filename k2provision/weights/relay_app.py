"""The relay as one file on the wire: a zipapp of the weights kernel package.

The sources live in the collection's module_utils (``k2_weights``, see its docstring for why);
``relay_app()`` zips that package with a ``__main__`` into ``relay-<digest>.pyz`` under the
user's cache directory and returns its path. The archive is reproducible (sorted entries,
fixed timestamps and modes), so the same sources give the same bytes and the role's copy
task stays unchanged on a re-run. Hosts run it as ``python3 relay.pyz serve|send|check``.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils import (
    k2_weights,
)

KERNEL_DIR = Path(k2_weights.__file__).resolve().parent
KERNEL_PACKAGE = "k2_weights"
MAIN = (
    b'"""k2provision weight relay (zipapp of the k2_weights package)."""\n'
    b"import sys\n\nfrom k2_weights.relay.cli import main\n\nsys.exit(main())\n"
)
SHEBANG = b"#!/usr/bin/env python3\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def kernel_sources() -> list[tuple[str, bytes]]:
    """(archive name, content) of every source file of the kernel package, sorted."""
    out: list[tuple[str, bytes]] = []
    for path in sorted(KERNEL_DIR.rglob("*.py")):
        rel = path.relative_to(KERNEL_DIR).as_posix()
        out.append((f"{KERNEL_PACKAGE}/{rel}", path.read_bytes()))
    return out


def relay_archive() -> bytes:
    """The zipapp's bytes: a shebang line, then a reproducible zip archive."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in [("__main__.py", MAIN), *kernel_sources()]:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return SHEBANG + buf.getvalue()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "k2provision" / "relay"


def relay_app(directory: Path | None = None) -> Path:
    """Build (once per content) and return the path of ``relay-<digest>.pyz``."""
    data = relay_archive()
    where = directory or cache_dir()
    path = where / f"relay-{hashlib.sha256(data).hexdigest()[:16]}.pyz"
    if path.is_file() and path.read_bytes() == data:
        return path
    where.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
