"""Each test's CPU seconds, where scripts/test runs its stage in a CPU accounting group of its
own (cgroup v1 cpuacct or v2, named k2test.*): the group's usage before the test's setup and
after its teardown, so it counts every process the test starts, lab hosts and daemons
included. Recorded as the test's `cpu_s` property in the stage's JUnit XML, which
scripts/test-summary ranks. On a 2-core machine the run's length is its CPU, not its tests'
wall time (stages overlap), so this is where a cut shows. Outside such a group: nothing."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

GROUP_PREFIX = "k2test."
_START = pytest.StashKey[float]()


def _usage_file() -> tuple[Path, float] | None:
    """This process's accounting group's usage file and its unit in seconds, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if GROUP_PREFIX not in path:
            continue
        if "cpuacct" in controllers.split(","):
            return Path("/sys/fs/cgroup/cpuacct", path.lstrip("/"), "cpuacct.usage"), 1e-9
        if hierarchy == "0":
            return Path("/sys/fs/cgroup", path.lstrip("/"), "cpu.stat"), 1e-6
    return None


USAGE = _usage_file()


def group_cpu_s() -> float | None:
    """CPU seconds charged to this stage's group so far, or None outside one."""
    if USAGE is None:
        return None
    path, unit = USAGE
    try:
        text = path.read_text()
    except OSError:
        return None
    if path.name == "cpu.stat":
        fields = dict(line.split() for line in text.splitlines() if line)
        return int(fields["usage_usec"]) * unit
    return int(text) * unit


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    start = group_cpu_s()
    if start is not None:
        item.stash[_START] = start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # The teardown report copies item.user_properties, and the JUnit XML writes them.
    if call.when == "teardown" and _START in item.stash:
        end = group_cpu_s()
        if end is not None:
            item.user_properties.append(("cpu_s", f"{end - item.stash[_START]:.1f}"))
    return (yield)
