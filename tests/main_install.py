"""Pytest plugin: a virtual environment holding only the README's main install.

The product path (``k2provision apply`` and plain ``ansible-playbook``) must work with what
``pip install -e .`` brings, nothing from the test extra: the ``main_install`` fixture gives
such a venv's ``bin/``, so tests can run its ``ansible-playbook``.

The venv is built once per machine for each set of declared dependencies (its key digests
``pyproject.toml`` and the interpreter) under the test cache (``$K2_TEST_CACHE``, default
``~/.cache/k2provision``), by ``pip install -e <checkout>`` exactly as the README says. A
session from another checkout points the editable install at itself (``pip install --no-deps
-e``, seconds). Sessions hold the venv shared while they use it; re-pointing it takes it alone,
so a session never sees it point at another checkout mid-run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def _cache_dir() -> Path:
    base = os.environ.get("K2_TEST_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "k2provision"
    )
    return Path(base) / "main-install"


def _key() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def _pip(home: Path, *args: str) -> None:
    out = subprocess.run(
        [str(home / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": f"{home / 'bin'}:/usr/bin:/bin", **_PIP_ENV},
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _points_here(home: Path) -> bool:
    """Whether the venv is complete and its `k2provision` is this checkout's."""
    if not (home / ".complete").exists():
        return False
    out = subprocess.run(
        [str(home / "bin" / "python"), "-c", "import k2provision; print(k2provision.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", **_PIP_ENV},
    )
    return out.returncode == 0 and Path(out.stdout.strip()).is_relative_to(ROOT)


def _build_or_point(home: Path) -> None:
    if not (home / ".complete").exists():
        shutil.rmtree(home, ignore_errors=True)
        venv.EnvBuilder(with_pip=True).create(home)
        _pip(home, "-e", str(ROOT))
        (home / ".complete").write_text(f"pip install -e {ROOT}\n")
    else:
        _pip(home, "--no-deps", "-e", str(ROOT))
    assert _points_here(home)


@pytest.fixture(scope="session")
def main_install() -> Iterator[Path]:
    """The bin/ directory of a venv with `pip install -e <this checkout>` and nothing else."""
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    home = cache / _key()
    with open(cache / f"{home.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not _points_here(home):
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _points_here(home):
                _build_or_point(home)
            fcntl.flock(lock, fcntl.LOCK_SH)
        # The test venv's own packages must not be in it: it is the product install alone.
        assert Path(sys.prefix) != home
        site = next((home / "lib").glob("python3*/site-packages"))
        assert not (site / "pytest").exists(), f"{home}: holds pytest, not the main install alone"
        yield home / "bin"
