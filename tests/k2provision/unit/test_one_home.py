"""One home each: the questions asked of a host (the collection's module_utils/host_questions.py:
their commands, their readers, the certificate policy of an https question), fetching a hub
manifest (weights/manifest.py) and the mpirun mesh's ssh configurations (templates/ssh_mesh/).
A second implementation of a host question anywhere in the product (the package, its
collection, the roles and playbooks) fails here."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "k2provision"
REGISTRY = (
    PACKAGE
    / "ansible/collections/ansible_collections/k2/cluster/plugins/module_utils"
    / "host_questions.py"
)
ROLE_INSPECT = ROOT / "roles" / "k2_launch" / "tasks" / "stage.yml"
SKIPPED_DIRS = {".venv", ".git", ".lab", "node_modules", "__pycache__"}


def product_sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]


def ansible_sources() -> list[Path]:
    return [
        p
        for top in ("roles", "playbooks")
        for p in sorted((ROOT / top).rglob("*"))
        if p.suffix in {".yml", ".yaml", ".j2", ".sh"} and p.is_file() and "molecule" not in p.parts
    ]


def holders(text: str, files: list[Path]) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in files if text in p.read_text())


def code_strings(source: str) -> list[str]:
    """The string literals a module's code uses (f-strings' literal parts included), not its
    docstrings or comments: what it could build a command or read an answer with."""
    tree = ast.parse(source)
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]
    # An argv written as a list: ["docker", "container", "inspect", name] reads as its words.
    strings += [
        " ".join(
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.List | ast.Tuple)
    ]
    return strings


def builders(pattern: str, files: list[Path]) -> list[str]:
    """The files whose code strings match `pattern`."""
    found = re.compile(pattern)
    return sorted(
        str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
        for p in files
        if any(found.search(text) for text in code_strings(p.read_text()))
    )


REGISTRY_ONLY = {
    "a container's state": r"docker container inspect(?! failed)",
    "docker's inspect answer": r"^(RestartCount|StartedAt|ExitCode)$",
    "a container's log": r"docker logs",
    "an exec'd process's log file": r"(^| )tail $",
    "an exec'd process's liveness": r"kill -0",
    "a command in a process's container": r"docker exec $",
    "a health gate's URL, asked on the host": r"urlopen\(url",
    "the marked sections of an answer": r"^@@k2( |$)",
    "GPU memory": r"memory\.used",
}
"""What only the registry builds or reads, by what it is a question of."""

ELSEWHERE = {
    # The weights relay's own pid file on the host (the relay, not a planned process).
    "an exec'd process's liveness": [
        "k2provision/ansible/collections/ansible_collections/k2/cluster/plugins/action/"
        "weights_wait.py"
    ],
}
"""Matches that are no host question of the registry's kind, and why."""


def test_no_https_question_skips_the_certificate_check() -> None:
    """The registry's one certificate policy (HTTP_PROBE) checks every certificate; nothing
    in the product turns a check off."""
    unchecked = r"_create_unverified_context|CERT_NONE|check_hostname = False|verify=False"
    assert builders(unchecked, product_sources()) == []
    assert "load_verify_locations" in REGISTRY.read_text()


@pytest.mark.parametrize("what", sorted(REGISTRY_ONLY))
def test_only_the_registry_builds_a_host_question_or_reads_its_answer(what: str) -> None:
    found = builders(REGISTRY_ONLY[what], product_sources())
    assert found == sorted([str(REGISTRY.relative_to(ROOT)), *ELSEWHERE.get(what, [])])


ROLE_ASKERS = {
    "[docker, container, inspect": [],
    "container inspect": [],
    # The weights relay's own pid, and on lab hosts the front's daemons' pid files: not
    # planned processes.
    "kill -0": ["roles/k2_front_tier/tasks/main.yml", "roles/k2_weights/tasks/stop.yml"],
    "--query-gpu": [],
    "urlopen": [],
}
"""What no role or playbook asks a host its own way (they ask k2.cluster.host_ask)."""


@pytest.mark.parametrize("text", sorted(ROLE_ASKERS))
def test_no_role_or_playbook_asks_a_host_question_its_own_way(text: str) -> None:
    assert holders(text, ansible_sources()) == ROLE_ASKERS[text]


def test_the_guard_finds_a_second_implementation(tmp_path: Path) -> None:
    copy = tmp_path / "probe.py"
    copy.write_text(
        '"""Not this: docker container inspect X."""\n'
        "# nor this: kill -0\n"
        'state = run(f"docker container inspect {name}")\n'
        'alive = run(["docker", "exec", c, "sh", "-c", "kill -0 $(cat p)"])\n'
    )
    argv = tmp_path / "argv.py"
    argv.write_text('found = run(["docker", "container", "inspect", name])\n')
    assert builders(REGISTRY_ONLY["a container's state"], [copy]) == [str(copy)]
    assert builders(REGISTRY_ONLY["an exec'd process's liveness"], [copy]) == [str(copy)]
    assert builders(REGISTRY_ONLY["GPU memory"], [copy]) == []
    assert builders(REGISTRY_ONLY["a container's state"], [argv]) == [str(argv)]


def test_one_module_asks_the_hub_for_a_manifest() -> None:
    sources = [*product_sources(), *(ROOT / "k2lab").rglob("*.py")]
    assert holders(".model_info(", sources) == ["k2provision/weights/manifest.py"]
    assert holders("from huggingface_hub import HfApi", sources) == [
        "k2provision/weights/manifest.py"
    ]


@pytest.mark.parametrize("name", ["sshd_config", "ssh_config"])
def test_one_template_of_each_mesh_ssh_configuration(name: str) -> None:
    found = []
    for directory, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".venv"))
        here = Path(directory).relative_to(ROOT)
        found += [str(here / f) for f in sorted(files) if f.startswith(name) and f.endswith(".j2")]
    assert found == [f"k2provision/templates/ssh_mesh/{name}.j2"]
