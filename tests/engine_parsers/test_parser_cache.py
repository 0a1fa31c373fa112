"""The check scripts/install-engine-parsers runs on a cached parser venv before it links it:
every pinned distribution installed, at its pinned version, with every file its RECORD names.
A venv that fails it is rebuilt. Run here on a made-up distribution (no parsers needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-engine-parsers"


def verify_program() -> str:
    """The script's VERIFY_PY, the Python it runs with the venv's interpreter."""
    text = SCRIPT.read_text()
    start = text.index("VERIFY_PY='\n") + len("VERIFY_PY='\n")
    return text[start : text.index("\n'\n", start)]


def fake_distribution(site: Path, version: str) -> Path:
    """A distribution `fakeparser` installed in `site` as pip leaves one; returns its module."""
    info = site / f"fakeparser-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakeparser\nVersion: {version}\n")
    module = site / "fakeparser" / "__init__.py"
    module.parent.mkdir()
    module.write_text("")
    (info / "RECORD").write_text(
        f"fakeparser/__init__.py,,\nfakeparser/__pycache__/__init__.cpython-311.pyc,,\n"
        f"fakeparser-{version}.dist-info/METADATA,,\nfakeparser-{version}.dist-info/RECORD,,\n"
    )
    return module


def verify(site: Path, *pins: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", verify_program(), *pins],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )


def test_a_complete_venv_at_its_pins_passes(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "1.2.3")
    done = verify(tmp_path, "fakeparser==1.2.3")
    assert (done.returncode, done.stdout) == (0, "")


def test_a_local_build_of_the_pinned_version_passes(tmp_path: Path) -> None:
    # torch's CPU wheel is 2.13.0+cpu for the pin torch==2.13.0
    fake_distribution(tmp_path, "1.2.3+cpu")
    assert verify(tmp_path, "fakeparser==1.2.3").returncode == 0


def test_another_version_fails_naming_both(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "1.2.4")
    done = verify(tmp_path, "fakeparser==1.2.3")
    assert done.returncode == 1
    assert "fakeparser is 1.2.4, not 1.2.3" in done.stdout


def test_a_missing_file_fails_naming_it(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "1.2.3").unlink()
    done = verify(tmp_path, "fakeparser==1.2.3")
    assert done.returncode == 1
    assert "fakeparser lacks 1 of its files, e.g. fakeparser/__init__.py" in done.stdout


def test_a_distribution_not_installed_fails(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "1.2.3")
    done = verify(tmp_path, "fakeparser==1.2.3", "notinstalledparser==1.0")
    assert done.returncode == 1
    assert "notinstalledparser is not installed" in done.stdout
