"""Action k2.cluster.host_in_plan: this host's part of the plan, or a refusal naming the fix.

Every role that acts on a host starts with it: the one place that knows what "this host is in
the plan" means. It runs on the controller only and changes nothing.

Options: plan (required): the plan registered by k2.cluster.plan.
Returns: host: the host's part of the plan (name, address, local_ip, ib_devices, role, pool,
node_rank, gpus, processes, files, ports).
"""

from __future__ import annotations

from typing import Any

from k2provision.ansible.actions import ReadOnlyAction
from k2provision.ansible.plan_parts import NotInPlanError, host_part


class ActionModule(ReadOnlyAction):
    """Fail unless the plan has this host; return its part."""

    def act(self, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"host": host_part(args.get("plan"), str(task_vars["inventory_hostname"]))}
        except NotInPlanError as error:
            return {"failed": True, "msg": "\n".join(error.problems)}
