"""An engine is one module behind one interface, and the registry (engines/__init__.py) is the
one list of engines: nothing outside engines/ names an engine or one of their layouts, in the
Python of the package or in the YAML and Jinja of the roles, playbooks and templates, except
where ALLOWED says why.

Names are found in the text an engine name can hide in: in Python every string literal but
docstrings, and every identifier (``cluster.engine == "vllm"``, ``"k2_sglang_port"``,
``t.trtllm_max_batch_size``), an engine's name anywhere inside it; in YAML and Jinja every
line but comments. Layout names are found as whole string literals.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from k2provision.engines import REGISTRY
from k2provision.engines.base import layout_names

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "k2provision"
# The YAML and Jinja the product ships: roles, playbooks, the package's templates and its
# Ansible collection. Role tests (molecule/) run real layouts and may name them.
TEXT_TREES = ("roles", "playbooks", "k2provision/templates", "k2provision/ansible")
TEXT_SUFFIXES = (".yml", ".yaml", ".j2", ".in")

# Where an engine's name legitimately appears outside engines/: (file, the literal, identifier
# or line as found) -> why.
_TUNABLES = (
    "engine tunables: Tunables (core/records.py) is the inventory contract's one model of k2_ "
    "variables, validated in core, which may not import the engines; its fields keep the "
    "order of the README's generated tunables table. Each engine declares the ones it reads "
    "(OWN_TUNABLES)"
)
_ROUTER = (
    "the fleet and PD router's own package, sglang-router, pinned apart from every engine and "
    "run in front of several engines' fleets"
)
ALLOWED: dict[tuple[str, str], str] = {
    ("k2provision/core/catalog.py", "vllm-project/recipes models/moonshotai"): (
        "the model catalog cites the vLLM recipes repository as the source of model facts"
    ),
    ("k2provision/core/catalog.py", "sglang-router"): _ROUTER,
    ("k2provision/core/catalog.py", "sglang_router.launch_router"): _ROUTER,
    ("k2provision/plan/monitoring.py", "sglang-router"): (
        "the router's process name, whose metrics the router job scrapes: " + _ROUTER
    ),
    ("k2provision/ops/bench.py", "vllm-1000-512"): (
        "a bench workload named after the published vLLM recipe it reproduces (seed 003)"
    ),
    ("k2provision/ops/bench.py", "vllm-8000-1000"): (
        "a bench workload named after the published vLLM recipe it reproduces (seed 003)"
    ),
    **{
        ("k2provision/core/records.py", name): _TUNABLES
        for name in (
            "sglang_port",
            "vllm_port",
            "trtllm_port",
            "vllm_max_num_batched_tokens",
            "vllm_max_num_seqs",
            "vllm_all2all_backend",
            "vllm_redundant_experts",
            "trtllm_max_batch_size",
            "trtllm_max_num_tokens",
            "trtllm_kv_cache_dtype",
            "ktransformers_cache_lens",
            "ktransformers_gpu_experts",
            "ktransformers_cpuinfer",
            "vllm_decode_context_parallel_size",
            "KV cache dtype for SGLang and vLLM (auto: the engine's default, BF16 for these "
            "checkpoints); TensorRT-LLM keeps trtllm_kv_cache_dtype",
        )
    },
    (
        "roles/k2_nccl_check/tasks/preflight.yml",
        "(containers/trtllm), and run it on a plan of two hosts or more",
    ): "a fix hint naming the containers/trtllm recipe as an image with all_reduce_perf",
}


def _pattern() -> re.Pattern[str]:
    return re.compile("|".join(re.escape(name) for name in REGISTRY))


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of `tree` (module, class, function and attribute
    docstrings: a bare string expression)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def _identifiers(node: ast.AST) -> list[str]:
    """The names a node spells: variables, attributes, parameters, keywords, definitions."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.arg | ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.alias):
        return [node.asname or node.name]
    return []


def python_hits(path: Path) -> list[tuple[int, str]]:
    """(line, text) for every string literal (not a docstring) and identifier in `path` that
    holds an engine's name."""
    pattern = _pattern()
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            texts = [node.value]
        else:
            texts = _identifiers(node)
        line = getattr(node, "lineno", 0)
        found += [(line, text) for text in texts if pattern.search(text)]
    return sorted(set(found))


_JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.S)


def text_hits(path: Path) -> list[tuple[int, str]]:
    """(line, stripped line) for every line of a YAML or Jinja file that holds an engine's
    name, comments (`# ...` lines, Jinja `{# ... #}`) left out."""
    pattern = _pattern()
    text = _JINJA_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        if pattern.search(stripped):
            found.append((number, stripped))
    return found


def product_hits() -> dict[tuple[str, str], list[int]]:
    """Every engine name outside engines/: (file, text) -> the lines it is on."""
    hits: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("k2provision/engines/"):
            continue
        for line, text in python_hits(path):
            hits.setdefault((rel, text), []).append(line)
    for tree in TEXT_TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if not path.is_file() or not path.name.endswith(TEXT_SUFFIXES):
                continue
            if "molecule" in path.relative_to(ROOT).parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            for line, text in text_hits(path):
                hits.setdefault((rel, text), []).append(line)
    return hits


def layout_literals(path: Path, names: set[str]) -> list[str]:
    """`line: literal` for every string literal in `path` that is a layout's whole name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


# ---------------------------------------------------------------- the finders find


def test_the_python_finder_sees_literals_comparisons_longer_strings_and_names(
    tmp_path: Path,
) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        '"""A docstring may say vllm."""\n'
        'if cluster.engine == "vllm":\n'
        "    port = t.sglang_port\n"
        'x = ("k2_trtllm_x", "tp")\n'
        "def f(ktransformers_threads: int) -> None:\n"
        '    """Nor here: sglang."""\n'
    )
    assert python_hits(source) == [
        (2, "vllm"),
        (3, "sglang_port"),
        (4, "k2_trtllm_x"),
        (5, "ktransformers_threads"),
    ]


def test_the_text_finder_sees_yaml_and_jinja_but_not_comments(tmp_path: Path) -> None:
    source = tmp_path / "main.yml"
    source.write_text(
        "# sglang-router's API, a comment\n"
        "k2_x: \"{{ plan.engine == 'trtllm' }}\"\n"
        "{# a Jinja comment naming vllm\n   over two lines #}\n"
        "cmd: trtllm-serve serve\n"
    )
    assert text_hits(source) == [
        (2, "k2_x: \"{{ plan.engine == 'trtllm' }}\""),
        (5, "cmd: trtllm-serve serve"),
    ]


# ---------------------------------------------------------------- the rules


def test_every_engine_module_declares_what_the_product_asks() -> None:
    assert len(REGISTRY) >= 4
    for name, engine in REGISTRY.items():
        assert engine.RELEASE.engine == name
        assert engine.LAYOUTS, name
        names = layout_names(engine.LAYOUTS)
        assert len(set(names)) == len(names), name
        assert set(engine.FLEET_LAYOUTS) <= set(names), name
        assert set(engine.DCP_LAYOUTS) <= set(names), name
        assert engine.BENCH_CLIENT.kind in REGISTRY, name


def test_nothing_outside_engines_names_an_engine_unless_allowed() -> None:
    unexplained = {
        f"{file}:{lines[0]}: {text}"
        for (file, text), lines in product_hits().items()
        if (file, text) not in ALLOWED
    }
    assert unexplained == set()


def test_every_allowance_is_still_needed_and_says_why() -> None:
    hits = product_hits()
    assert [key for key in ALLOWED if key not in hits] == []
    assert all(len(reason) > 10 for reason in ALLOWED.values())


def test_no_layout_name_outside_engines() -> None:
    names = {layout.name for engine in REGISTRY.values() for layout in engine.LAYOUTS}
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("k2provision/engines/"):
            continue
        if literals := layout_literals(path, names):
            found[rel] = literals
    assert found == {}
