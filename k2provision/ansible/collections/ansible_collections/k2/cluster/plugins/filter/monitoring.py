"""Filters of the k2_monitoring role: what one host runs for the fleet's monitoring, from the
plan (k2provision/plan/monitoring.py) (k2.cluster.monitoring_setup); every file it writes there,
for one k2.cluster.write_files call (monitoring_writes); the containers to (re)start after
one k2.cluster.host_ask call about them all (monitoring_starts). One call each per host keeps a
converged host's monitoring at two module runs, whatever the number of files."""

from __future__ import annotations

import posixpath
from typing import Any

import yaml

from k2provision.core.inventory import plain_value
from k2provision.core.records import Plan
from k2provision.plan import monitoring
from k2provision.plan.host_questions import container_states
from k2provision.plan.images import LAB_IMAGE


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


PROMETHEUS = "k2-prometheus"
GRAFANA = "k2-grafana"


def grafana_provisioning(prometheus_port: int) -> dict[str, str]:
    """Grafana's provisioning files (under its provisioning directory): the Prometheus data
    source on this host and the folder of the plan's dashboards."""
    datasources = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": "k2-prometheus",
                "type": "prometheus",
                "access": "proxy",
                "url": f"http://localhost:{prometheus_port}",
                "isDefault": True,
            }
        ],
    }
    dashboards = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "k2provision",
                "type": "file",
                "options": {"path": "/var/lib/grafana/dashboards"},
            }
        ],
    }

    # In to_nice_yaml's form (the role wrote them with it before): an upgrade rewrites nothing.
    def dump(value: dict[str, Any]) -> str:
        return yaml.safe_dump(value, indent=4, allow_unicode=True, default_flow_style=False)

    return {"datasources/k2.yml": dump(datasources), "dashboards/k2.yml": dump(dashboards)}


def exporter_files_dir(config_dir: str, container: str) -> str:
    """Where an exporter's files are written on its host (mounted read-only in its container)."""
    return posixpath.join(str(config_dir), "exporters", str(container))


def monitoring_writes(setup: dict[str, Any], config_dir: str) -> list[dict[str, Any]]:
    """Every file `setup` (monitoring_setup's) has this host write, as k2.cluster.write_files
    entries {path, content, mode} plus `restarts`: the containers that must restart to read it
    again. An exporter's files restart that exporter; the monitoring host's Prometheus config,
    rules and dashboards restart Prometheus and Grafana; Grafana's provisioning, Grafana."""
    setup = plain_value(setup)
    writes: list[dict[str, Any]] = []
    for exporter in setup["exporters"]:
        directory = exporter_files_dir(config_dir, exporter["name"])
        for path, content in sorted((exporter.get("files") or {}).items()):
            writes.append(
                {"path": posixpath.join(directory, posixpath.basename(path)), "content": content,
                 "mode": "0644", "restarts": [exporter["name"]]}
            )  # fmt: skip
    if setup["server"]:
        for name, content in sorted(setup["files"].items()):
            writes.append(
                {"path": posixpath.join(str(config_dir), name), "content": content,
                 "mode": "0644", "restarts": [PROMETHEUS, GRAFANA]}
            )  # fmt: skip
        for name, content in grafana_provisioning(int(setup["prometheus_port"])).items():
            writes.append(
                {"path": posixpath.join(str(config_dir), "grafana", name), "content": content,
                 "mode": "0644", "restarts": [GRAFANA]}
            )  # fmt: skip
    return writes


def monitoring_starts(
    containers: list[dict[str, Any]],
    answers: dict[str, Any],
    writes: list[dict[str, Any]],
    written: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The `containers` to (re)start: missing, stopped, running another image, or reading a
    file of `writes` that this run `written` (k2.cluster.write_files' list). `answers`:
    k2.cluster.host_ask's to container_questions of their names."""
    states = container_states(plain_value(answers))
    changed = set(plain_value(written or []))
    touched = {name for w in plain_value(writes) if w["path"] in changed for name in w["restarts"]}
    starts = []
    for container in plain_value(containers):
        state = states.get(container["name"])
        if (
            state is None
            or not state.found
            or not state.running
            or state.image != container["image"]
            or container["name"] in touched
        ):
            starts.append(container)
    return starts


class FilterModule:
    """Ansible's entry point for filter plugins."""

    def filters(self) -> dict[str, Any]:
        return {
            "monitoring_setup": monitoring_setup,
            "monitoring_writes": monitoring_writes,
            "monitoring_starts": monitoring_starts,
            "exporter_files_dir": exporter_files_dir,
        }
