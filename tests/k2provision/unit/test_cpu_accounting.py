"""tests/cpu_accounting.py: in a k2test.* CPU accounting group (what scripts/test makes per
stage), each test's JUnit case carries the CPU seconds its setup, call and teardown used,
its child processes included; outside such a group, none."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")

CASES = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.6\\n"
                    "while time.process_time() < end: pass"], check=True)

def test_sleeps():
    time.sleep(0.6)
"""


@pytest.fixture
def group() -> Iterator[Path]:
    """A k2test.* accounting group of this test's own (root, cgroup v1 cpuacct or v2)."""
    base = V1 if os.access(V1 / "cgroup.procs", os.W_OK) else V2
    if not os.access(base / "cgroup.procs", os.W_OK):
        pytest.skip("no writable CPU accounting group here (needs root)")
    path = base / f"k2test.selftest.{os.getpid()}"
    path.mkdir()
    yield path
    path.rmdir()


def cpu_by_test(junit: Path) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        value = next(
            (p.get("value") for p in case.iter("property") if p.get("name") == "cpu_s"), None
        )
        found[str(case.get("name"))] = value
    return found


def run_cases(tmp_path: Path, group: Path | None) -> dict[str, str | None]:
    (tmp_path / "test_cases.py").write_text(CASES)
    junit = tmp_path / "junit.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "tests.cpu_accounting", f"--junitxml={junit}", "--rootdir", str(tmp_path),
            "-c", os.devnull, str(tmp_path / "test_cases.py")]  # fmt: skip
    if group is not None:  # the child joins the group before pytest starts
        argv = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return cpu_by_test(junit)


def test_a_test_in_a_group_carries_its_cpu_child_processes_included(
    tmp_path: Path, group: Path
) -> None:
    cpu = run_cases(tmp_path, group)
    burnt, slept = float(cpu["test_burns_in_a_child"] or -1), float(cpu["test_sleeps"] or -1)
    assert burnt >= 0.5, cpu  # the child's 0.6 s of CPU is the test's
    assert 0 <= slept < 0.3, cpu  # a sleep is wall time, not CPU


def test_outside_a_group_no_test_carries_a_cpu_figure(tmp_path: Path) -> None:
    """A plain pytest run (a developer's): the accounting finds no k2test group. Under
    scripts/test this process is in one, so the cases run from the root group."""
    root = V1 if os.access(V1 / "cgroup.procs", os.W_OK) else V2
    writable = os.access(root / "cgroup.procs", os.W_OK)
    cpu = run_cases(tmp_path, root if writable else None)
    assert cpu == {"test_burns_in_a_child": None, "test_sleeps": None}
