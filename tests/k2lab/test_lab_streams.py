"""Every lab module names the scripts/test stream it runs in: its module-level ``pytestmark``
carries exactly one of the stream markers (lab_pd, lab_fleet, lab_other) beside ``lab``.

scripts/test selects each lab stream by marker (``-m "lab and lab_pd"``, ...), so a lab module
with no stream marker would run in no stream, and one with two would run twice."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAM_MARKERS = ("lab_pd", "lab_fleet", "lab_other")


def marks_in(node: ast.AST) -> set[str]:
    """The names of `pytest.mark.NAME` expressions in an AST node."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Attribute)
        and sub.value.attr == "mark"
    }


def stream_problem(source: str) -> str | None:
    """Why a test module's lab marking breaks the streams' selection, None when it does not
    (modules that mark nothing `lab` are not lab modules)."""
    tree = ast.parse(source)
    module_marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            module_marks |= marks_in(node.value)
    all_marks = marks_in(tree)
    if "lab" not in all_marks:
        return None
    if "lab" not in module_marks:
        return "marks tests `lab` one by one; mark the module: pytestmark = [pytest.mark.lab, ...]"
    streams = sorted(module_marks.intersection(STREAM_MARKERS))
    if len(streams) != 1:
        return (
            f"declares the streams {streams or 'none'}; expected exactly one of "
            f"{', '.join(STREAM_MARKERS)} in its pytestmark"
        )
    stray = sorted((all_marks - module_marks).intersection(STREAM_MARKERS))
    if stray:
        return f"marks single tests with {stray}; a stream is the whole module's"
    return None


def test_each_lab_module_declares_exactly_one_stream() -> None:
    problems = {}
    lab_modules = 0
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        source = path.read_text()
        if "lab" in marks_in(ast.parse(source)):
            lab_modules += 1
        problem = stream_problem(source)
        if problem:
            problems[str(path.relative_to(ROOT))] = problem
    assert problems == {}
    assert lab_modules >= 14  # the walk found the lab modules (15 when this was written)


def test_the_check_catches_a_missing_a_doubled_and_a_per_test_stream() -> None:
    head = "import pytest\n"
    assert stream_problem(head + "pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]\n") is None
    assert stream_problem(head + "pytestmark = pytest.mark.parsers\n") is None
    assert "none" in str(stream_problem(head + "pytestmark = pytest.mark.lab\n"))
    doubled = head + "pytestmark = [pytest.mark.lab, pytest.mark.lab_pd, pytest.mark.lab_fleet]\n"
    assert "['lab_fleet', 'lab_pd']" in str(stream_problem(doubled))
    per_test = head + "@pytest.mark.lab\ndef test_x():\n    pass\n"
    assert "one by one" in str(stream_problem(per_test))
    stray = (
        head
        + "pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]\n"
        + "@pytest.mark.lab_fleet\ndef test_x():\n    pass\n"
    )
    assert "whole module" in str(stream_problem(stray))


def test_the_stream_markers_are_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0] for line in config["markers"]}
    assert set(STREAM_MARKERS) <= registered
    assert "--strict-markers" in config["addopts"]
