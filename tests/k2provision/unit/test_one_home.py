"""One home each: asking a host about its processes (ops/host_probe.py), fetching a hub manifest
(weights/manifest.py) and the mpirun mesh's ssh configurations (templates/ssh_mesh/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "k2provision"
HOST_PROBE = PACKAGE / "ops" / "host_probe.py"
SKIPPED_DIRS = {".venv", ".git", ".lab", "node_modules", "__pycache__"}


def product_sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]


def holders(text: str, files: list[Path]) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in files if text in p.read_text())


@pytest.mark.parametrize(
    "text",
    [
        "docker logs",  # a container's log
        "tail {count}",  # an exec'd process's log file
        "urlopen(sys.argv",  # a health gate's URL, asked on the host
        '"@@k2"',  # the marked sections of an answer
    ],
)
def test_only_the_host_probe_builds_what_a_host_is_asked(text: str) -> None:
    assert holders(text, product_sources()) == [str(HOST_PROBE.relative_to(ROOT))]


def test_only_the_host_probe_checks_whether_a_planned_process_lives() -> None:
    askers = [
        *(PACKAGE / "ops").glob("*.py"),
        *(PACKAGE / "commands").glob("*.py"),
        PACKAGE
        / "ansible/collections/ansible_collections/k2/cluster/plugins/action"
        / "launch_gate.py",
    ]
    assert holders("kill -0", askers) == [str(HOST_PROBE.relative_to(ROOT))]


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
