"""What every role refuses before it touches a host, run for real with ansible-playbook on
localhost (connection=local; nothing gets past the first task):

- without its plan (``k2_<role>_plan`` has no default), the role's argument check fails naming
  the variable;
- with a plan that leaves the host out, the shared k2.cluster.host_in_plan check fails with
  the one line that names the host and the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.playbooks import PlaybookRun, run_playbook

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(
    p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()
)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> PlaybookRun:
    """One play: host r-<role> includes <role> without its plan; host outside runs k2_stop
    with a plan of other hosts."""
    tmp = tmp_path_factory.mktemp("contracts")
    inventory = tmp / "roles.ini"
    inventory.write_text(
        "[all]\n"
        + "".join(f"r-{role} role_under_test={role}\n" for role in ROLES)
        + "outside role_under_test=k2_stop\n"
        + f"[all:vars]\nansible_connection=local\nansible_python_interpreter={sys.executable}\n"
    )
    other_plan = {"hosts": [{"name": "gpu-01", "processes": []}]}
    playbook = [
        {
            "name": "Each role without its plan",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Include the role under test",
                    "ansible.builtin.include_role": {"name": "{{ role_under_test }}"},
                    "when": "inventory_hostname != 'outside'",
                },
                {
                    "name": "Stop on a host the plan leaves out",
                    "ansible.builtin.include_role": {"name": "k2_stop"},
                    "vars": {"k2_stop_plan": other_plan},
                    "when": "inventory_hostname == 'outside'",
                },
            ],
        }
    ]
    return run_playbook(playbook, inventory, tmp)


def test_every_role_has_a_spec() -> None:
    assert len(ROLES) >= 10, ROLES


@pytest.mark.parametrize("role", ROLES)
def test_a_role_without_its_plan_is_refused_by_its_argument_check(
    refusals: PlaybookRun, role: str
) -> None:
    result = refusals.result(f"r-{role}", "Validating arguments against arg spec 'main'")
    assert result["failed"], result
    assert result["argument_errors"] == [f"missing required arguments: {role}_plan"]
    assert refusals.stats[f"r-{role}"]["failures"] == 1
    assert refusals.stats[f"r-{role}"]["changed"] == 0


def test_a_host_the_plan_leaves_out_is_refused_with_the_fix(refusals: PlaybookRun) -> None:
    result = refusals.task("This host's part of the plan")["outside"]
    assert result["failed"], result
    assert result["msg"] == (
        "outside is in no pool of the plan; fix: put it in [nodes], [prefill], [decode] or "
        "[router], or leave it out with --limit"
    )
    assert refusals.stats["outside"]["changed"] == 0
