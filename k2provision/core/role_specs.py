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


def value_problem(variable: str, value: Any) -> str | None:
    """Why Ansible's argument validation would refuse `value` for a role variable, or None."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = option(variable)
    if spec is None or is_template(value):
        return None
    validator = ArgumentSpecValidator({variable: _checked(spec)})
    if validator.validate({variable: value}).error_messages:
        return expectation(spec)
    return None


def validated(variable: str, value: Any) -> Any:
    """`value` as the role receives it after Ansible's argument validation converts it
    ("false" to False, "22,2222" to [22, 2222]); None when it is a template (only the run
    can say) or validation refuses it (value_problem's line)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    spec = option(variable)
    if spec is None or is_template(value):
        return None
    result = ArgumentSpecValidator({variable: _checked(spec)}).validate({variable: value})
    if result.error_messages:
        return None
    return result.validated_parameters.get(variable)
