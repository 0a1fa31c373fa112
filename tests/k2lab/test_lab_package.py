"""The lab as a package of its own: it works from the current directory, not from the
checkout that holds it, and a wheel carries everything it needs (the stand-in image's build
context, the `lab` command's entry point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k2lab.standin import content_hash, standin_dir

ROOT = Path(__file__).resolve().parents[2]
WHERE = (
    "import json, k2lab.config as c, k2lab.standin as s; "
    "print(json.dumps({'lab_dir': str(c.default_lab_dir()), "
    "'inventory': str(c.default_inventory_path()), 'standin': str(s.standin_dir()), "
    "'hash': s.content_hash()}))"
)


def python(code: str, cwd: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "K2_LAB_DIR"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    found: dict[str, str] = json.loads(out.stdout)
    return found


def test_the_lab_works_from_the_current_directory(tmp_path: Path) -> None:
    elsewhere = tmp_path / "another-clone"
    elsewhere.mkdir()
    where = python(WHERE, elsewhere)
    assert where["lab_dir"] == str(elsewhere / ".lab")
    assert where["inventory"] == str(elsewhere / "inventory" / "lab.ini")
    assert python(WHERE, elsewhere, K2_LAB_DIR=str(tmp_path / "x"))["lab_dir"] == str(
        tmp_path / "x"
    )
    assert list(elsewhere.iterdir()) == []  # asking where changes nothing


def git_files(*paths: str) -> list[str]:
    """The files of the working tree git knows or would add (tracked, untracked not ignored)."""
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of the working tree, built from a copy (a build leaves build/ behind)."""
    out_dir = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in git_files():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (found,) = out_dir.glob("k2provision-*.whl")
    return found


def test_a_wheel_carries_the_lab_and_its_stand_in_sources_and_client_pins(
    wheel: Path, tmp_path: Path
) -> None:
    tracked = git_files("k2lab/standin_image", "k2lab/standin_client")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert set(tracked) <= names
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "[k2provision.commands]\nlab = k2lab.cli:register" in z.read(entry_points).decode()
        mode = z.getinfo("k2lab/standin_image/bin/vllm").external_attr >> 16
        assert mode & 0o111

    # Installed from the wheel (not this checkout) and run from a directory of its own.
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    where = python(WHERE, work, PYTHONPATH=str(target))
    assert Path(where["standin"]) == target / "k2lab" / "standin_image"
    assert where["hash"] == content_hash(standin_dir())  # the same image key as the checkout's
    assert where["inventory"] == str(work / "inventory" / "lab.ini")
    help_out = subprocess.run(
        [sys.executable, "-m", "k2provision.cli", "lab", "--help"],
        cwd=work,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert help_out.returncode == 0, help_out.stderr
    assert "up" in help_out.stdout
    assert "status" in help_out.stdout
