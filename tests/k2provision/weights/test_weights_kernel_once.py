"""Every weights helper is defined once in the tree: in the kernel (module_utils/k2_weights)."""

from __future__ import annotations

import ast
import subprocess
from collections import defaultdict
from pathlib import Path

from k2provision.weights import kernel

ROOT = Path(__file__).resolve().parents[3]
KERNEL_DIR = Path(kernel.common.__file__).resolve().parent


def tree_files() -> list[Path]:
    """Every Python file git tracks or would track (untracked, not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file()]


def definitions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def body_shape(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    """The body without its docstring, as an AST dump (names of locals included)."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


def kernel_helpers() -> dict[str, Path]:
    """Public top-level functions and classes of the kernel's helper modules."""
    helpers: dict[str, Path] = {}
    for path in sorted(KERNEL_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                helpers[node.name] = path
    return helpers


def test_each_kernel_helper_is_defined_exactly_once_in_the_tree() -> None:
    helpers = kernel_helpers()
    for expected in (
        "human",
        "describe_error",
        "parse_address",
        "check_name",
        "natural_key",
        "list_files",
        "sha256_file",
        "hash_files",
        "check_safetensors_header",
        "check_safetensors_file",
        "safetensors_header",
        "shard_blocks",
        "read_manifest",
        "stored_entries",
        "local_state",
        "LocalStore",
        "parse_events",
    ):
        assert expected in helpers, expected
    where: dict[str, list[str]] = defaultdict(list)
    shapes: dict[str, list[str]] = defaultdict(list)
    for path in tree_files():
        for node in definitions(path):
            rel = f"{path.relative_to(ROOT)}:{node.lineno}"
            if node.name in helpers:
                where[node.name].append(rel)
            if len(node.body) >= 3:
                shapes[body_shape(node)].append(f"{rel} {node.name}")
    twice = {name: places for name, places in where.items() if len(places) != 1}
    assert not twice, f"defined more than once: {twice}"
    copies = {
        key: places
        for key, places in shapes.items()
        if len(places) > 1 and any(str(KERNEL_DIR.relative_to(ROOT)) in p for p in places)
    }
    assert not copies, f"the same body under several names: {list(copies.values())}"


def test_the_old_copies_are_gone() -> None:
    """The package keeps no second home for the relay or the synthetic writer."""
    weights = ROOT / "k2provision" / "weights"
    assert not (weights / "relay.py").exists()
    assert not (weights / "synthetic.py").exists()
    assert not (weights / "broadcast.py").exists()  # the harness lives with the tests
    assert not (KERNEL_DIR.parent / "k2_weights.py").exists()
