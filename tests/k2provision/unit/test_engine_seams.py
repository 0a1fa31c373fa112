"""An engine is one module behind one interface: the registry holds exactly the engines the
inventory accepts, each with the layouts the inventory lists for it, and nothing outside
engines/ (and the name lists and catalog data of core/) names an engine.

Names are found in the source (ast): an engine name as a string literal anywhere, which is
also what a comparison such as `cluster.engine == "vllm"` needs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from k2provision.core.records import ENGINES, LAYOUTS
from k2provision.engines import REGISTRY

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "k2provision"
# The one list of engine names and layouts, and the catalog's releases and per-model support.
DATA = {"core/records.py", "core/catalog.py"}


def engine_names_in(path: Path) -> list[str]:
    """`line: literal` for every string literal in `path` that is an engine's name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in ENGINES
    ]


def outside_engines() -> dict[str, list[str]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("engines/") or rel in DATA:
            continue
        names = engine_names_in(path)
        if names:
            found[rel] = names
    return found


def test_the_registry_holds_every_engine_and_its_layouts() -> None:
    assert list(REGISTRY) == list(ENGINES)
    for name, engine in REGISTRY.items():
        assert LAYOUTS[name] == engine.LAYOUTS, name


def test_the_finder_sees_a_literal_and_a_comparison(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        'if cluster.engine == "vllm":\n    pass\nx = ("sglang", "tp")\ny = "vllm-x"\n'
    )
    assert engine_names_in(source) == ["1: 'vllm'", "3: 'sglang'"]


def test_nothing_outside_engines_names_an_engine() -> None:
    assert outside_engines() == {}
