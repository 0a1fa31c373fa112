"""The package's shape: no import cycle anywhere, and the product never imports the lab.

The import graph is built from the source (ast), every import counted, at module level or
inside a function: a lazy import hides a cycle from the interpreter, not from a reader.
`from A import b` is an edge to A (its namespace is read; when A is a package its
``__init__`` runs first) and, when A.b is a module, an edge to A.b as well; `import A.b` is an
edge to A.b. A package importing its own submodules is no edge back to itself.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COLLECTION_PREFIX = "k2provision.ansible.collections."
PACKAGES = ("k2provision", "k2lab")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    """Every importable module of a package, by dotted name (the stand-in image's own Python,
    which runs inside the image, is no part of the package)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "standin_image" in path.parts:
            continue
        found[module_name(path)] = path
    return found


ALL: dict[str, Path] = {name: path for p in PACKAGES for name, path in modules(p).items()}


def resolve(name: str) -> str | None:
    """A dotted import target as one of ALL's modules (collection plugins are imported by
    Ansible as `ansible_collections.k2...`), or None when it is not ours."""
    for candidate in (name, COLLECTION_PREFIX + name):
        if candidate in ALL:
            return candidate
    return None


def imports(module: str, path: Path) -> Iterator[str]:
    """The modules of ours that `module` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = ".".join(base_parts[: len(base_parts) - drop] if drop else base_parts)
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            target = resolve(source)
            if target:
                yield target
            for alias in node.names:
                sub = resolve(f"{source}.{alias.name}")
                if sub:
                    yield sub


def graph() -> dict[str, set[str]]:
    return {name: {t for t in imports(name, path) if t != name} for name, path in ALL.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_the_package() -> None:
    edges = graph()
    assert "k2provision.plan.assemble" in edges
    assert "k2provision.engines.base" in edges["k2provision.plan.assemble"]
    assert "k2provision.engines.sglang" in edges["k2provision.engines"]
    assert "k2lab.core" in edges["k2lab"]
    assert "k2provision.plan.assemble" in edges["k2lab.demo"]


def test_the_cycle_finder_finds_what_the_package_used_to_have() -> None:
    # engines/__init__ defined Deployment and imported each engine, which imported it back.
    edges = {
        "k2provision.engines": {"k2provision.engines.sglang"},
        "k2provision.engines.sglang": {"k2provision.engines", "k2provision.core.records"},
        "k2provision.core.records": set(),
    }
    assert find_cycle(edges) == [
        "k2provision.engines",
        "k2provision.engines.sglang",
        "k2provision.engines",
    ]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_from_package_import_of_a_name_is_an_edge_to_the_package(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from k2provision.engines import REGISTRY\n"
        "from k2lab import core\n"
        "def later():\n    import k2provision.plan.assemble\n"
    )
    found = set(imports("k2provision.someone", source))
    assert found == {"k2provision.engines", "k2lab", "k2lab.core", "k2provision.plan.assemble"}


def test_no_import_cycle_in_the_packages() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_product_never_imports_the_lab() -> None:
    product = modules("k2provision")
    assert len(product) > 30
    imported = [(m, t) for m in product for t in imports(m, ALL[m]) if t.startswith("k2lab")]
    assert imported == []
    # Nor by name (importlib, entry points written in code): the name never appears.
    named = [m for m, path in product.items() if "k2lab" in path.read_text()]
    assert named == []


# The tests run the CLI and a command on a lab host one way, tests/runners.py's.
TEST_RUNNERS = ("k2", "on_host")


def runner_copies(source: str) -> list[str]:
    """Functions named like a test runner (k2, on_host) that `source` defines."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in TEST_RUNNERS
    ]


def test_the_runner_finder_finds_a_copy() -> None:
    source = "def k2(*args):\n    pass\nclass C:\n    def on_host(self):\n        pass\n"
    assert runner_copies(source) == ["k2", "on_host"]


def test_no_test_module_defines_its_own_cli_runner_or_on_host() -> None:
    tests = ROOT / "tests"
    home = tests / "runners.py"
    assert runner_copies(home.read_text()) == list(TEST_RUNNERS)
    copies = [
        (path.relative_to(ROOT).as_posix(), name)
        for path in sorted(tests.rglob("*.py"))
        if path != home
        for name in runner_copies(path.read_text())
    ]
    assert copies == []


# What each sub-package of k2provision may import (its __init__ docstring says the same).
MAY_IMPORT: dict[str, set[str]] = {
    "core": {"errors"},
    "engines": {"core", "errors"},
    "plan": {"core", "engines", "errors"},
    "ops": {"core", "engines", "plan", "errors"},
    "run": {"core", "engines", "plan", "ops", "errors"},
    "weights": {"core", "run", "ansible", "errors"},
    "ansible": {"core", "engines", "plan", "ops", "weights", "errors"},
    "commands": {"core", "engines", "plan", "ops", "run", "weights", "errors"},
}


HOST_KERNEL = "k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils"
"""The code that runs on the hosts too (the weights kernel, the registry of host questions):
standard library only, so every layer may import it, and it imports nothing of ours outside
itself."""


def sub_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "k2provision" and len(parts) > 2 else None


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in sorted(edges.items()):
        mine = sub_package(source)
        if mine is None:
            continue
        for target in sorted(targets):
            if target.startswith(HOST_KERNEL + ".") and not source.startswith(HOST_KERNEL):
                continue
            theirs = sub_package(target) or target.split(".")[-1]
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                found.append(f"{source} -> {target}")
    return found


def test_sub_packages_import_only_their_layers_below() -> None:
    assert set(MAY_IMPORT) == {
        p.name for p in (ROOT / "k2provision").iterdir() if (p / "__init__.py").exists()
    }
    assert layer_violations(graph()) == []


def test_the_host_kernel_imports_only_itself_and_the_standard_library() -> None:
    kernel = {name: path for name, path in ALL.items() if name.startswith(HOST_KERNEL + ".")}
    assert f"{HOST_KERNEL}.host_questions" in kernel
    outside = [
        f"{name} -> {target}"
        for name, path in kernel.items()
        for target in imports(name, path)
        if not target.startswith(HOST_KERNEL + ".")
    ]
    assert outside == []
    for name, path in kernel.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            tops = []
            if isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            elif isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            for top in tops:
                assert top in {"__future__", *sys.stdlib_module_names}, (name, top)


def test_the_layer_check_sees_an_upward_import() -> None:
    edges = {"k2provision.core.inventory": {"k2provision.plan.assemble"}}
    assert layer_violations(edges) == ["k2provision.core.inventory -> k2provision.plan.assemble"]


def test_each_sub_package_says_what_it_may_import() -> None:
    for name in MAY_IMPORT:
        init = ROOT / "k2provision" / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import:" in doc, name
