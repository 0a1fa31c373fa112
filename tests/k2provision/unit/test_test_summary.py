"""scripts/test's closing summary (scripts/test-summary): from each pytest stage's JUnit XML, a
table of the stages and the slowest tests of the run; from the streams' logs, the closing line
``pytest: N passed, N failed, N skipped`` and each failure's reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "test-summary"

UNIT_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.k2provision.unit.test_a" name="test_fast"
  file="tests/k2provision/unit/test_a.py" line="1" time="0.250"/>
<testcase classname="tests.k2provision.unit.test_a" name="test_slow[x]"
  file="tests/k2provision/unit/test_a.py" line="5" time="42.500"/>
<testcase classname="tests.k2provision.unit.test_a.TestGroup" name="test_broken"
  file="tests/k2provision/unit/test_a.py" line="9" time="1.000">
  <failure message="assert 1 == 2">boom</failure></testcase>
</testsuite></testsuites>
"""
LAB_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.k2lab.test_b" name="test_cluster"
  file="tests/k2lab/test_b.py" line="3" time="600.000"/>
<testcase classname="tests.k2lab.test_b" name="test_skipped"
  file="tests/k2lab/test_b.py" line="8" time="0.000"><skipped message="K2_LAB=0"/></testcase>
</testsuite></testsuites>
"""


def summary(logs: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(logs)], capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_the_stage_table_the_slowest_tests_and_the_closing_line(tmp_path: Path) -> None:
    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "unit.xml").write_text(UNIT_XML)
    (tmp_path / "junit" / "lab.xml").write_text(LAB_XML)
    (tmp_path / "lint+unit.log").write_text(
        "FAILED tests/k2provision/unit/test_a.py::TestGroup::test_broken - assert 1 == 2\n"
        "=================== 1 failed, 2 passed in 44.00s ===================\n"
    )
    (tmp_path / "lab.log").write_text("============ 1 passed, 1 skipped in 600.00s ============\n")
    lines = summary(tmp_path)

    stages = {
        line.split()[0]: line.split()[1:5] for line in lines if line.startswith(("unit ", "lab "))
    }
    assert stages == {"unit": ["3", "1", "0", "44"], "lab": ["2", "0", "1", "600"]}
    slowest = lines.index(next(line for line in lines if line.startswith(" seconds")))
    assert lines[slowest + 1].split() == ["600.0", "lab", "tests/k2lab/test_b.py::test_cluster"]
    assert lines[slowest + 2].split() == [
        "42.5",
        "unit",
        "tests/k2provision/unit/test_a.py::test_slow[x]",
    ]
    assert "tests/k2provision/unit/test_a.py::TestGroup::test_broken  [failed]" in "\n".join(lines)
    closing = lines.index("pytest: 3 passed, 1 failed, 1 skipped")
    assert lines[closing + 1].startswith("[lint+unit] FAILED tests/k2provision/unit/test_a.py::")


def test_a_stage_cut_short_is_named_and_the_rest_still_summed(tmp_path: Path) -> None:
    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "unit.xml").write_text(UNIT_XML)
    (tmp_path / "junit" / "lab-pd.xml").write_text(LAB_XML[:80])
    (tmp_path / "lint+unit.log").write_text("===== 2 passed, 1 failed in 44.00s =====\n")
    lines = summary(tmp_path)
    assert any(
        line.endswith("lab-pd.xml: not readable JUnit XML (the run was cut short?)")
        for line in lines
    )
    assert lines[-1] == "pytest: 2 passed, 1 failed, 0 skipped"


CPU_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.k2lab.test_c" name="test_light" file="tests/k2lab/test_c.py"
  line="1" time="300.000"><properties><property name="cpu_s" value="12.5"/></properties>
</testcase>
<testcase classname="tests.k2lab.test_c" name="test_heavy" file="tests/k2lab/test_c.py"
  line="5" time="100.000"><properties><property name="cpu_s" value="180.0"/></properties>
</testcase>
<testcase classname="tests.k2lab.test_c" name="test_unmeasured" file="tests/k2lab/test_c.py"
  line="9" time="1.000"/>
</testsuite></testsuites>
"""


def test_tests_are_ranked_by_their_cpu_where_it_was_measured(tmp_path: Path) -> None:
    """A test that waits long but computes little ranks below one that burns CPU: the CPU
    table orders by the cpu_s property, sums it, and leaves out tests without one."""
    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "lab.xml").write_text(CPU_XML)
    lines = summary(tmp_path)
    head = next(i for i, line in enumerate(lines) if "tests with the most CPU" in line)
    assert "192 CPU s over 2 tests" in lines[head]
    assert lines[head + 2].split() == ["180.0", "lab", "tests/k2lab/test_c.py::test_heavy"]
    assert lines[head + 3].split() == ["12.5", "lab", "tests/k2lab/test_c.py::test_light"]
    assert not any("test_unmeasured" in line for line in lines[head:])


def test_without_a_measured_test_there_is_no_cpu_table(tmp_path: Path) -> None:
    (tmp_path / "junit").mkdir()
    (tmp_path / "junit" / "lab.xml").write_text(LAB_XML)
    assert not any("most CPU" in line for line in summary(tmp_path))
