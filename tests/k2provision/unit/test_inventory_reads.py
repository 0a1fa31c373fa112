"""No role or playbook reads an inventory variable: what the roles need from the inventory
reaches them in the plan (k2_planned.plan, each role's k2_<role>_plan), validated once and
defaulted in one place (core/records.py).

An inventory variable is a name the inventory contract defines for the cluster, its hosts or
its tunables (core/variables.py CLUSTER_VARS, HOST_VARS, TUNABLE_VARS). A role's own variables
(k2_<role>_..., its argument spec's options, registered results) and the variables the
playbooks set (PLAYBOOK_VARS) are not inventory reads. Every Jinja expression under roles/ and
playbooks/ is parsed: templates, `{{ }}` in any YAML value, and the bare expressions of
when/that/until/failed_when/changed_when and debug's var. A read is a variable the expression
loads, an attribute or key it looks up (hostvars[h].k2_lab) or a string that names the variable
(lookup('vars', 'k2_lab'), map(attribute='k2_lab')); a name inside message text is none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from jinja2 import Environment, TemplateSyntaxError, nodes

from k2provision.core import role_specs
from k2provision.core.variables import CLUSTER_VARS, HOST_VARS, PLAYBOOK_VARS, TUNABLE_VARS

# Jinja's lexer warns of a regex's backslash in a string literal (an Ansible regex_replace).
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("roles", "playbooks")
INVENTORY_VARIABLES = frozenset((*CLUSTER_VARS, *HOST_VARS, *TUNABLE_VARS))
# Inventory variables a role or playbook may still read, each with why the plan cannot carry
# it (a host fact or a connection setting Ansible itself resolves). Every k2_ setting the
# roles need is in the plan today, so none is.
ALLOWED: dict[str, str] = {}
# Keys whose value Ansible evaluates as a bare Jinja expression, without {{ }}.
BARE_EXPRESSION_KEYS = frozenset({"when", "that", "until", "failed_when", "changed_when"})
DEBUG_MODULES = frozenset({"debug", "ansible.builtin.debug"})
_JINJA = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


@dataclass(frozen=True)
class Read:
    """One k2_ name an expression reads, and where."""

    path: str
    name: str
    how: str
    """`variable`, `attribute`, `key or name string`."""


def expression_reads(text: str, path: str) -> Iterator[Read]:
    """The k2_ names a Jinja template reads (a syntax error fails: an unread template could
    hide a read)."""
    tree = _JINJA.parse(text)
    names = list(tree.find_all(nodes.Name))
    own = {n.name for n in names if n.ctx in ("store", "param")}  # {% set %}, loop targets
    for name in sorted({n.name for n in names if n.ctx == "load"} - own):
        if name.startswith("k2_"):
            yield Read(path, name, "variable")
    for node in tree.find_all(nodes.Getattr):
        if node.attr in INVENTORY_VARIABLES:
            yield Read(path, node.attr, "attribute")
    for const in tree.find_all(nodes.Const):
        if isinstance(const.value, str) and const.value in INVENTORY_VARIABLES:
            yield Read(path, const.value, "key or name string")


def _yaml_reads(value: Any, path: str, key: Any = None, parent: Any = None) -> Iterator[Read]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _yaml_reads(v, path, k, key)
    elif isinstance(value, list):
        for item in value:
            yield from _yaml_reads(item, path, key, parent)
    elif isinstance(value, str):
        bare = key in BARE_EXPRESSION_KEYS or (key == "var" and parent in DEBUG_MODULES)
        if bare:
            yield from expression_reads("{{ " + value + " }}", path)
        elif "{{" in value or "{%" in value:
            yield from expression_reads(value, path)


def file_reads(path: Path) -> list[Read]:
    """Every k2_ name a role or playbook file reads (YAML or a Jinja template)."""
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    text = path.read_text()
    if path.suffix == ".j2":
        return list(expression_reads(text, where))
    return [r for document in yaml.safe_load_all(text) for r in _yaml_reads(document, where)]


SETTERS = frozenset({"set_fact", "ansible.builtin.set_fact", "vars"})


def _defined(value: Any, key: Any = None) -> Iterator[str]:
    if isinstance(value, dict):
        if key in SETTERS:
            yield from (str(k) for k in value)
        for k, v in value.items():
            if k in ("register", "loop_var", "index_var") and isinstance(v, str):
                yield v
            yield from _defined(v, k)
    elif isinstance(value, list):
        for item in value:
            yield from _defined(item, key)


def defined_names(paths: list[Path]) -> frozenset[str]:
    """The names the roles and playbooks give a value themselves: the roles' options (their
    argument specs), defaults and vars, registered results, set_fact and vars: keys, loop and
    index variables."""
    names = set(role_specs.option_names())
    for path in paths:
        if path.suffix == ".j2":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if path.parent.name in ("defaults", "vars") and isinstance(document, dict):
                names.update(str(k) for k in document)
            names.update(_defined(document))
    return frozenset(names)


def inventory_reads(reads: list[Read], defined: frozenset[str]) -> list[Read]:
    """The reads of inventory variables, and of k2_ names nothing in the tree gives a value
    (a setting read around the contract, straight from the inventory)."""
    return [
        r
        for r in reads
        if r.name in INVENTORY_VARIABLES
        or (r.how == "variable" and r.name not in PLAYBOOK_VARS and r.name not in defined)
    ]


def scanned_files() -> list[Path]:
    return sorted(
        p
        for top in SCANNED
        for p in (ROOT / top).rglob("*")
        if p.is_file() and p.suffix in (".yml", ".yaml", ".j2")
    )


def test_the_scan_covers_the_roles_and_playbooks() -> None:
    files = scanned_files()
    assert ROOT / "playbooks" / "site.yml" in files
    assert ROOT / "roles" / "k2_launch" / "tasks" / "guard.yml" in files
    assert any(p.suffix == ".j2" for p in files)
    # The roles do read plan parts and their own variables: the scan sees expressions.
    names = {r.name for p in files for r in file_reads(p)}
    assert {"k2_planned", "k2_launch_plan", "k2_rollout_drain_timeout"} <= names


def test_no_role_or_playbook_reads_an_inventory_variable() -> None:
    files = scanned_files()
    defined = defined_names(files)
    found = [r for p in files for r in inventory_reads(file_reads(p), defined)]
    unexpected = [r for r in found if r.name not in ALLOWED]
    assert unexpected == [], (
        "a role or playbook reads the inventory; fix: carry the value in the plan "
        "(core/records.py Plan, plan/assemble.py) and read it from k2_<role>_plan"
    )
    # An allowed name no longer read leaves the list.
    assert {r.name for r in found} == set(ALLOWED)


def test_the_tree_defines_what_its_roles_register_and_set() -> None:
    defined = defined_names(scanned_files())
    assert {
        "k2_launch_plan",  # an argument spec's option
        "_k2_launch_guarded",  # a role's vars/main.yml
        "k2_converge",  # registered by look.yml
        "k2_rollout",  # set_fact in look.yml
        "k2_ssh_mesh_verify_files",  # registered by a molecule scenario
    } <= defined
    # Nor does a role or playbook give an inventory variable a value of its own.
    assert defined.isdisjoint(INVENTORY_VARIABLES)


def test_the_allow_list_holds_inventory_variables_with_reasons() -> None:
    for name, reason in ALLOWED.items():
        assert name in INVENTORY_VARIABLES, name
        assert len(reason.split()) >= 4, name


def test_the_contract_tells_inventory_variables_from_role_and_playbook_variables() -> None:
    """The classification is exact only while no inventory variable looks like a role's or
    a playbook's."""
    assert {"k2_max_unavailable", "k2_drain_timeout", "k2_api_key_file", "k2_lab"} <= (
        INVENTORY_VARIABLES
    )
    assert [n for n in INVENTORY_VARIABLES if role_specs.role_of(n)] == []
    assert INVENTORY_VARIABLES.isdisjoint(PLAYBOOK_VARS)


REGRESSIONS = """\
- name: Reads the inventory eight ways
  hosts: all
  tasks:
    - name: A bare condition
      ansible.builtin.debug:
        msg: "{{ k2_launch_plan.endpoint }}"
      when: k2_max_unavailable | int > 1
    - name: An assert
      ansible.builtin.assert:
        that:
          - k2_lab | bool
    - name: A template with its own default
      ansible.builtin.command:
        argv: [docker, stop, --time, "{{ k2_drain_timeout | default(300) }}"]
      changed_when: false
    - name: Another host's variable, by attribute and by key
      ansible.builtin.set_fact:
        seen: "{{ hostvars[item].k2_local_ip ~ hostvars[item]['k2_ib_devices'] }}"
      loop: "{{ groups['all'] | map('extract', hostvars) | map(attribute='k2_ssh_port') | list }}"
    - name: A lookup
      ansible.builtin.set_fact:
        ca: "{{ lookup('ansible.builtin.vars', 'k2_tls_ca_file') }}"
    - name: Debug's bare variable
      ansible.builtin.debug:
        var: k2_api_key_file
    - name: A setting the contract does not know
      ansible.builtin.set_fact:
        pause: "{{ k2_rollout_pause_s | default(5) }}"
"""
FINE = """\
- name: Reads the plan and its own variables only
  hosts: all
  tasks:
    - name: Plan parts, role variables, registered results and playbook variables
      ansible.builtin.debug:
        msg: >-
          {{ k2_rollout_plan.fleet.drain_timeout }} {{ k2_launch_gate_delay }}
          {{ __k2_launch_gate.k2_failure }} {{ k2_converge.phases }}
          {{ 'set k2_drain_timeout in the inventory' }}
      when: k2_planned.plan.lab and k2_restart_hosts is defined
    - name: Message text that names inventory variables, outside any expression
      ansible.builtin.fail:
        msg: "set k2_max_unavailable or k2_api_key_file; fix: see {{ k2_rollout_waves }}"
"""


def test_the_scan_finds_each_way_a_file_can_read_the_inventory(tmp_path: Path) -> None:
    playbook = tmp_path / "regressions.yml"
    playbook.write_text(REGRESSIONS)
    template = tmp_path / "config.j2"
    template.write_text("{% set ok = k2_launch_plan.lab %}port {{ k2_api_port }}\n")
    defined = defined_names([*scanned_files(), playbook])
    found = {(r.name, r.how) for r in inventory_reads(file_reads(playbook), defined)}
    assert found == {
        ("k2_max_unavailable", "variable"),
        ("k2_lab", "variable"),
        ("k2_drain_timeout", "variable"),
        ("k2_local_ip", "attribute"),
        ("k2_ib_devices", "key or name string"),
        ("k2_ssh_port", "key or name string"),
        ("k2_tls_ca_file", "key or name string"),
        ("k2_api_key_file", "variable"),
        ("k2_rollout_pause_s", "variable"),
    }
    assert [(r.name, r.how) for r in inventory_reads(file_reads(template), defined)] == [
        ("k2_api_port", "variable")
    ]


def test_the_scan_leaves_plan_parts_role_variables_and_messages_alone(tmp_path: Path) -> None:
    playbook = tmp_path / "fine.yml"
    playbook.write_text(FINE)
    reads = file_reads(playbook)
    assert {"k2_rollout_plan", "k2_launch_gate_delay", "k2_planned"} <= {r.name for r in reads}
    assert inventory_reads(reads, defined_names([*scanned_files(), playbook])) == []


@pytest.mark.parametrize("text", ["{{ k2_lab", "{% if k2_lab %}"])
def test_a_template_the_scan_cannot_read_fails_it(tmp_path: Path, text: str) -> None:
    template = tmp_path / "broken.j2"
    template.write_text(text)
    with pytest.raises(TemplateSyntaxError):
        file_reads(template)
