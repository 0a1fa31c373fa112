"""The roles read alike: argument specs in step with defaults, the plan required and never
defaulted, one naming convention for registered variables, the host-in-plan check in one
plugin, and the platforms the scenarios test. That they read the plan, never the inventory:
test_inventory_reads.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from k2provision.core import role_specs

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.exists() else None


def options(role: str) -> dict[str, dict[str, Any]]:
    spec = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")
    return dict(spec["argument_specs"]["main"]["options"])


def defaults(role: str) -> dict[str, Any]:
    return dict(load(ROOT / "roles" / role / "defaults" / "main.yml") or {})


def role_files(role: str) -> list[Path]:
    """The role's own YAML (its molecule scenario is a playbook of tests, not the role)."""
    return sorted(p for p in (ROOT / "roles" / role).rglob("*.yml") if "molecule" not in p.parts)


def test_there_are_roles() -> None:
    assert len(ROLES) >= 10, ROLES


@pytest.mark.parametrize("role", ROLES)
def test_the_plan_is_required_and_has_no_default(role: str) -> None:
    plan = options(role)[f"{role}_plan"]
    assert plan == {
        "type": "dict",
        "required": True,
        "description": plan["description"],
    }
    assert f"{role}_plan" not in defaults(role)


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_are_in_step_with_defaults(role: str) -> None:
    specs = options(role)
    values = defaults(role)
    assert set(specs) - {f"{role}_plan"} == set(values)
    for name, option in specs.items():
        assert name.startswith(f"{role}_"), name
        assert option.get("required") or "default" in option, name
    for name, value in values.items():
        # A default must itself pass the spec the inventory's role variables are judged by.
        assert role_specs.value_problem(name, value) is None, name
        default = specs[name]["default"]
        if isinstance(value, str):
            assert " ".join(str(default).split()) == " ".join(value.split()), name
        else:
            assert default == value, name


@pytest.mark.parametrize("role", ROLES)
def test_platforms_are_the_tested_ones(role: str) -> None:
    meta = load(ROOT / "roles" / role / "meta" / "main.yml")
    assert meta["galaxy_info"]["platforms"] == [{"name": "Debian", "versions": ["bookworm"]}]


@pytest.mark.parametrize("role", ROLES)
def test_registered_variables_are_the_roles_double_underscored(role: str) -> None:
    registered = [
        (path.name, name)
        for path in role_files(role)
        for name in re.findall(r"^\s*register:\s*(\S+)", path.read_text(), re.MULTILINE)
    ]
    assert registered, role
    assert [r for r in registered if not r[1].startswith(f"__{role}_")] == []


@pytest.mark.parametrize("role", [r for r in ROLES if r != "k2_verify"])
def test_the_host_in_plan_check_is_the_shared_plugin(role: str) -> None:
    """k2_verify reads the plan's endpoint only (run once), no host's part."""
    texts = "\n".join(p.read_text() for p in role_files(role))
    assert "k2.cluster.host_in_plan:" in texts
    assert "is in no pool of the plan" not in texts
    assert not re.search(r"inventory_hostname in \(?\w+_plan\.hosts", texts)
