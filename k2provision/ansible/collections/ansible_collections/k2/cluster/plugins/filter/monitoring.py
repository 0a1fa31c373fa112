"""Filter of the k2_monitoring role (k2.cluster.monitoring_setup): what one host runs for the
fleet's monitoring, from the plan (k2provision/plan/monitoring.py)."""

from __future__ import annotations

from typing import Any

from k2provision.core.inventory import plain_value
from k2provision.core.records import Plan
from k2provision.plan import monitoring
from k2provision.plan.assemble import LAB_IMAGE


def monitoring_setup(
    plan: dict[str, Any], host: str, group: list[str] | None = None
) -> dict[str, Any]:
    """{server, server_host, exporters, files, prometheus_image, grafana_image,
    prometheus_port, grafana_port} for `host` (`group`: the inventory's [monitoring] hosts)."""
    # Ansible hands filters its own lazy containers: plain Python first.
    parsed = Plan.model_validate(plain_value(plan))
    server_host = monitoring.monitoring_host(parsed, [str(h) for h in plain_value(group or [])])
    lab_image = LAB_IMAGE if parsed.lab else None
    return {
        "server": str(host) == server_host,
        "server_host": server_host,
        "exporters": [
            e.model_dump(mode="json")
            for e in monitoring.exporters_of(parsed, str(host), lab_image=lab_image)
        ],
        "files": monitoring.monitoring_files(parsed) if str(host) == server_host else {},
        "prometheus_image": monitoring.PROMETHEUS_IMAGE,
        "grafana_image": monitoring.GRAFANA_IMAGE,
        "prometheus_port": monitoring.PROMETHEUS_PORT,
        "grafana_port": monitoring.GRAFANA_PORT,
    }


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {"monitoring_setup": monitoring_setup}
