"""Action k2.cluster.plan: compute the deployment Plan inside Ansible, from its own inventory.

Runs on the controller only. It reads `groups` and `hostvars` as Ansible resolved them and calls
the same pure code as the k2provision CLI, so `ansible-playbook` and `k2provision apply` decide
identically. Fails, touching nothing, with one line per problem when the inventory is unfit.

Options: expected_digest (optional): fail unless the computed plan has this digest (the wrapper
passes the digest of the plan it showed, so what runs is what was previewed).
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from k2provision.errors import K2Error
from k2provision.inventory import INVENTORY_KEYS, cluster_from_groups, plain_value
from k2provision.plan import build_plan, plan_digest


class ActionModule(ActionBase):  # type: ignore[misc]  # Ansible's base class is untyped
    """Return the plan and its digest (register it; run_once shares it with every host)."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        groups = {str(k): [str(h) for h in v] for k, v in task_vars["groups"].items()}
        hostvars = task_vars["hostvars"]
        host_vars: dict[str, dict[str, Any]] = {}
        for host in groups.get("all", []):
            hv = hostvars[host]
            host_vars[host] = {
                str(k): plain_value(hv[k])
                for k in hv
                if str(k).startswith("k2_") or str(k) in INVENTORY_KEYS
            }
        sources = task_vars.get("ansible_inventory_sources") or ["inventory"]
        try:
            plan = build_plan(cluster_from_groups(str(sources[0]), groups, host_vars))
        except K2Error as error:
            result.update(failed=True, msg="\n".join(error.problems), problems=error.problems)
            return result
        digest = plan_digest(plan)
        expected = self._task.args.get("expected_digest")
        if expected and expected != digest:
            result.update(
                failed=True,
                msg=f"the plan computed here ({digest[:12]}) differs from the plan the caller "
                f"previewed ({str(expected)[:12]}); fix: re-run so both read the same inventory",
            )
            return result
        result.update(changed=False, plan=plan.model_dump(mode="json"), digest=digest)
        return result
