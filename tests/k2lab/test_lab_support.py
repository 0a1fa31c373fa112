"""The lab plugin's contract: without root a lab test fails (never passes by skipping);
K2_LAB=0 skips it with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LAB_TEST = """
import pytest

@pytest.mark.lab
def test_marked():
    pass

def test_fixture(lab):
    pass
"""
NOT_ROOT_PLUGIN = "import os\nos.geteuid = lambda: 1000\n"


def run_pytest(tmp_path: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_uses_lab.py").write_text(LAB_TEST)
    (tmp_path / "fake_not_root.py").write_text(NOT_ROOT_PLUGIN)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        **extra_env,
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "fake_not_root",
            "-p",
            "tests.lab_support",
            "-p",
            "no:cacheprovider",
            "-rfEs",
            "-o",
            "markers=lab: lab",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("k2_lab", ["", "1"])
def test_without_root_lab_tests_fail_with_the_reason(tmp_path: Path, k2_lab: str) -> None:
    out = run_pytest(tmp_path, {"K2_LAB": k2_lab})
    assert out.returncode != 0, out.stdout
    assert "lab tests need root" in out.stdout
    assert " passed" not in out.stdout
    assert "skipped" not in out.stdout


def test_k2_lab_0_skips_with_the_reason(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, {"K2_LAB": "0"})
    assert out.returncode == 0, out.stdout
    assert "2 skipped" in out.stdout
    assert "K2_LAB=0: lab tests disabled explicitly" in out.stdout
