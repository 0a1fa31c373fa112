"""Action k2.cluster.plan: compute the deployment Plan inside Ansible, from its own inventory.

Runs on the controller only. It reads `groups` and `hostvars` as Ansible resolved them and calls
the same pure code as the k2provision CLI, so `ansible-playbook` and `k2provision apply` decide
identically. Fails, touching nothing, with one line per problem when the inventory is unfit.

Options: expected_digest (optional): fail unless the computed plan has this digest (the wrapper
passes the digest of the plan it showed, so what runs is what was previewed).
"""

from __future__ import annotations

from typing import Any

from k2provision.ansible.actions import ReadOnlyAction
from k2provision.core.host_state import read_state
from k2provision.core.inventory import INVENTORY_KEYS, plain_value
from k2provision.errors import K2Error
from k2provision.plan.assemble import build_plan, plan_digest
from k2provision.plan.inventory import cluster_from_groups


class ActionModule(ReadOnlyAction):
    """Return the plan and its digest (register it; run_once shares it with every host)."""

    def act(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
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
            source = str(sources[0])
            plan = build_plan(cluster_from_groups(source, groups, host_vars, read_state(source)))
        except K2Error as error:
            return {"failed": True, "msg": "\n".join(error.problems), "problems": error.problems}
        digest = plan_digest(plan)
        expected = args.get("expected_digest")
        if expected and expected != digest:
            return {
                "failed": True,
                "msg": f"the plan computed here ({digest[:12]}) differs from the plan the caller "
                f"previewed ({str(expected)[:12]}); fix: re-run so both read the same inventory",
            }
        return {"plan": plan.model_dump(mode="json"), "digest": digest}
