"""What the k2.cluster plugins share: one host's part of a registered plan. Pure.

A role learns its host's part of the plan here and nowhere else (action
``k2.cluster.host_in_plan``, filter ``k2.cluster.host_plan``); a host the plan leaves out gets
the one line that says so, with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k2provision.errors import K2Error

__all__ = ["NotInPlanError", "host_part", "not_in_plan"]


class NotInPlanError(K2Error):
    """The host is in the play but in none of the plan's pools."""


def not_in_plan(host: str) -> str:
    """The line for a host the plan leaves out."""
    return (
        f"{host} is in no pool of the plan; fix: put it in [nodes], [prefill], [decode] or "
        "[router], or leave it out with --limit"
    )


def host_part(plan: object, host: str) -> dict[str, Any]:
    """The entry of ``host`` in a plan as k2.cluster.plan registers it (plain data)."""
    if not isinstance(plan, Mapping) or not plan.get("hosts"):
        raise NotInPlanError(
            [
                f"{host}: the role got no plan ({type(plan).__name__}), expected the plan "
                "k2.cluster.plan registers; fix: pass k2_planned.plan, as playbooks/*.yml do"
            ]
        )
    for entry in plan["hosts"]:
        if entry["name"] == host:
            return dict(entry)
    raise NotInPlanError([not_in_plan(host)])
