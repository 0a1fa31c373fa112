"""The roles' own argument specs (roles/*/meta/argument_specs.yml), read as the one list of
role variables an inventory may set, and the one statement of what each accepts.

Values are judged by Ansible's own ArgumentSpecValidator, the code that checks them when the
role runs, so an inventory refused here would have failed there, only later.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
ENTRY_POINT = "main"
# The parts of an option that say what it accepts; `default` and `required` are the role's
# business (a default may be a template, a required plan is set by the playbook).
_CHECKED_KEYS = ("type", "elements", "choices", "options")
_TYPE_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "path": "a path",
    "list": "a list",
    "dict": "a mapping",
    "raw": "any value",
}


@cache
def specs() -> dict[str, dict[str, dict[str, Any]]]:
    """role -> option name -> option spec, for every role shipped (empty without roles/)."""
    if not ROLES_DIR.is_dir():
        return {}
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for spec_file in sorted(ROLES_DIR.glob("k2_*/meta/argument_specs.yml")):
        data = yaml.safe_load(spec_file.read_text()) or {}
        entry = (data.get("argument_specs") or {}).get(ENTRY_POINT) or {}
        found[spec_file.parents[1].name] = dict(entry.get("options") or {})
    return found


def option_names() -> tuple[str, ...]:
    """Every role option of every role."""
    return tuple(name for options in specs().values() for name in options)


def options(role: str) -> tuple[str, ...]:
    """The option names of one role."""
    return tuple(specs().get(role, {}))


@cache
def role_of(variable: str) -> str | None:
    """The role whose prefix `k2_<role>_` a variable carries (the longest such role)."""
    owners = [role for role in specs() if variable.startswith(f"{role}_")]
    return max(owners, key=len) if owners else None


def option(variable: str) -> dict[str, Any] | None:
    """The spec of a role variable (None when no role declares it)."""
    role = role_of(variable)
    return specs().get(role, {}).get(variable) if role else None


def default(variable: str) -> Any:
    """A role variable's declared default (None when it has none)."""
    spec = option(variable) or {}
    return spec.get("default")


def _checked(spec: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in spec.items() if k in _CHECKED_KEYS}
    if isinstance(out.get("options"), dict):
        out["options"] = {k: _checked(v or {}) for k, v in out["options"].items()}
    return out


def is_template(value: Any) -> bool:
    """True when Ansible would template the value at run time (then only the run can judge)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(is_template(k) or is_template(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(is_template(v) for v in value)
    return False


def expectation(spec: dict[str, Any]) -> str:
    """What an option accepts, in words."""
    if spec.get("choices"):
        return "one of " + ", ".join(str(c) for c in spec["choices"])
    words = _TYPE_WORDS.get(str(spec.get("type", "str")), f"a {spec.get('type')}")
    if spec.get("elements"):
        words += f" of {_TYPE_WORDS.get(str(spec['elements']), spec['elements'])} items"
    return words


def _validation(variable: str, value: Any) -> Any:
    """Ansible's argument validation of `value` for a role variable (its ValidationResult), or
    None where there is nothing to check: not a role option, or a template (only the run can
    say)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = option(variable)
    if spec is None or is_template(value):
        return None
    return ArgumentSpecValidator({variable: _checked(spec)}).validate({variable: value})


def value_problem(variable: str, value: Any) -> str | None:
    """Why Ansible's argument validation would refuse `value` for a role variable, or None."""
    result = _validation(variable, value)
    if result is None or not result.error_messages:
        return None
    spec = option(variable)
    assert spec is not None  # validated above
    return expectation(spec)


def validated(variable: str, value: Any) -> Any:
    """`value` as the role receives it after Ansible's argument validation converts it
    ("false" to False, "22,2222" to [22, 2222]); None when it is a template (only the run
    can say) or validation refuses it (value_problem's line)."""
    result = _validation(variable, value)
    if result is None or result.error_messages:
        return None
    return result.validated_parameters.get(variable)


PLAYBOOKS_DIR = ROLES_DIR.parent / "playbooks"
# Role options that carry the value of a checked variable (a cluster variable, through the
# plan, or another role's option): an inventory value would skip that variable's check (an
# unchecked drain timeout would reach `docker stop --time`), so the inventory sets the
# variable instead.
MIRRORED: dict[str, str] = {
    "k2_rollout_drain_timeout": "k2_drain_timeout",
    "k2_nccl_check_gpus_per_host": "k2_gpus_per_node",
    "k2_container_runtime_images": "k2_image (and k2_router_image)",
    "k2_preflight_driver_managed": "k2_nvidia_driver_manage",
}


@cache
def playbook_set() -> dict[str, str]:
    """Role options a playbook under playbooks/ sets itself (a role's or a play's or a task's
    `vars:`), each with the playbook: the inventory's value of one is never used, as those vars
    take precedence over the inventory's."""
    names = set(option_names())
    found: dict[str, str] = {}

    def walk(node: Any, playbook: str) -> None:
        if isinstance(node, dict):
            given = node.get("vars")
            if isinstance(given, dict):
                for name in given:
                    if name in names:
                        found.setdefault(str(name), playbook)
            for value in node.values():
                walk(value, playbook)
        elif isinstance(node, list):
            for value in node:
                walk(value, playbook)

    for path in sorted(PLAYBOOKS_DIR.glob("*.yml")) if PLAYBOOKS_DIR.is_dir() else ():
        walk(yaml.safe_load(path.read_text()), f"playbooks/{path.name}")
    return found


def internal_problem(variable: str) -> str | None:
    """Why an inventory may not set a role option (None when it may): the playbook sets it
    from the plan, or it mirrors a cluster variable; the words name what to set instead."""
    if variable in MIRRORED:
        source = MIRRORED[variable]
        return (
            f"is the role's copy of {source}, which the playbooks hand it; expected it unset "
            f"in the inventory (a value here would skip the checks of {source}); fix: remove "
            f"it and set {source}"
        )
    if variable in playbook_set():
        return (
            f"is the playbooks' to set ({playbook_set()[variable]} sets it from the plan); "
            "expected it unset in the inventory, where it would be ignored or disagree with "
            "the plan; fix: remove it (the cluster variables the plan is made of decide it)"
        )
    return None
