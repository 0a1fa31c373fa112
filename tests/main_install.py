"""Pytest plugin: a virtual environment holding only the README's main install.

The product path (``k2provision apply`` and plain ``ansible-playbook``) must work with what
``pip install -e .`` brings, nothing from the test extra: the ``main_install`` fixture builds
such a venv once per session, so tests can run its ``ansible-playbook``.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def main_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ directory of a fresh venv with `pip install -e <repo>` and nothing else."""
    home = tmp_path_factory.mktemp("main-install") / "venv"
    venv.EnvBuilder(with_pip=True).create(home)
    out = subprocess.run(
        [str(home / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        env={"PATH": f"{home / 'bin'}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The test venv's own packages must not leak in: this venv is the product install alone.
    assert Path(sys.prefix) != home
    return home / "bin"
