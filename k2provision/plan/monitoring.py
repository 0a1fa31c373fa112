"""Prometheus' view of a plan: every metrics endpoint the plan makes, labelled, as a scrape config.

Pure. The engine says which of its listeners serve metrics (METRICS_PATH on the port settings
METRICS_PORTS); every host also runs a node exporter and every GPU host NVIDIA's DCGM
exporter, both pinned here like the engine images.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from k2provision.core.records import Plan, Record
from k2provision.engines import REGISTRY
from k2provision.engines.common import host_port
from k2provision.plan.alert_rules import alert_rules
from k2provision.plan.dashboards import dashboards
from k2provision.plan.dcgm_counters import DCGM_COUNTERS_PATH, dcgm_counters_csv

# prometheus/node_exporter: its default --web.listen-address is :9100.
NODE_EXPORTER_IMAGE = "quay.io/prometheus/node-exporter:v1.8.2"
NODE_EXPORTER_PORT = 9100
# NVIDIA/dcgm-exporter: its default --address is :9400; 3.3.x for DCGM 3.3 (Hopper drivers).
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"
DCGM_EXPORTER_PORT = 9400
EXPORTER_PATH = "/metrics"

Job = Literal["engine", "loads", "router", "node", "dcgm"]
JOBS: tuple[Job, ...] = ("engine", "loads", "router", "node", "dcgm")
ROUTER_SETTINGS = frozenset({"k2_router_metrics_port"})
# The fleet's and PD's router process: its metrics are on ROUTER_SETTINGS' port only.
ROUTER_PROCESS = "sglang-router"


class ScrapeTarget(Record):
    """One endpoint Prometheus scrapes, with the labels every series of it carries."""

    job: Job
    address: str
    """host:port, as Prometheus writes a target."""
    path: str
    instance: str
    """The serving instance: the pool (``nodes``, ``prefill``, ``decode``), a fleet's instance
    (``decode-2``) or ``router``."""
    pool: str
    role: str
    host: str
    rank: int
    scheme: Literal["http", "https"] = "http"
    """https where the target is the endpoint serving TLS (a single server's metrics on its
    API port)."""
    params: tuple[tuple[str, str], ...] = ()
    """The query parameters of the scrape (a route that serves Prometheus text on request)."""

    @property
    def labels(self) -> dict[str, str]:
        return {
            "instance": self.instance,
            "pool": self.pool,
            "role": self.role,
            "host": self.host,
            "rank": str(self.rank),
        }


def _spread_instance_head(plan: Plan, host: str) -> bool:
    """Whether `host` is the first host of an instance whose DP-attention ranks span several
    hosts: the one HTTP server that hears every rank's load (engines' rank_load)."""
    for pool in plan.pools:
        for instance in pool.members():
            if host in instance.hosts:
                return (
                    len(instance.hosts) > 1
                    and instance.parallel.dp_attention
                    and instance.hosts[0] == host
                )
    return False


def rank_load_targets(plan: Plan) -> tuple[ScrapeTarget, ...]:
    """The engine's rank-load route on the first host of each serving instance with DP
    attention, whatever its size (its HTTP server hears every rank there): what `status` asks
    to find a rank that is stuck while /health answers (ops/rank_liveness.py); () for an
    engine without the route. Plain http only (the probe's)."""
    engine = REGISTRY[plan.engine]
    rank_load = engine.METRICS.rank_load if engine.METRICS is not None else None
    if rank_load is None:
        return ()
    heads = {i.hosts[0] for pool in plan.pools for i in pool.members() if i.parallel.dp_attention}
    return tuple(
        t.model_copy(update={"job": "loads", "path": rank_load.path, "params": rank_load.params})
        for t in scrape_targets(plan)
        if t.job == "engine" and t.host in heads and t.scheme == "http"
    )


def scrape_targets(plan: Plan) -> tuple[ScrapeTarget, ...]:
    """Every endpoint of the plan that serves Prometheus metrics, in host order. An instance
    whose DP-attention ranks span several hosts is also scraped on its engine's rank_load
    route (job ``loads``), which covers every rank where /metrics covers the first host's. A
    drained host (FleetSettings.drained_hosts) runs no engine: only its exporters are scraped,
    so a drain raises no instance alert."""
    engine = REGISTRY[plan.engine]
    rank_load = engine.METRICS.rank_load if engine.METRICS is not None else None
    endpoint = urlsplit(plan.endpoint)
    tls_at = (plan.endpoint_host, endpoint.port) if endpoint.scheme == "https" else None
    found: list[ScrapeTarget] = []
    for host in plan.hosts:
        target = partial(
            ScrapeTarget,
            pool=host.pool,
            role=host.role,
            host=host.name,
            rank=host.node_rank,
        )

        if engine.METRICS_PATH is not None and host.name not in plan.fleet.drained_hosts:
            for binding in host.ports:
                if binding.setting not in engine.METRICS_PORTS:
                    continue
                router = binding.setting in ROUTER_SETTINGS
                if binding.process == ROUTER_PROCESS and not router:
                    continue  # the router's endpoint port (k2_api_port in a vLLM fleet)
                found.append(
                    target(
                        job="router" if router else "engine",
                        address=host_port(host.local_ip, binding.port),
                        path=engine.METRICS_PATH,
                        instance="router" if router else (host.instance or host.pool),
                        scheme="https" if (host.name, binding.port) == tls_at else "http",
                    )
                )
                if not router and rank_load and _spread_instance_head(plan, host.name):
                    found.append(
                        target(
                            job="loads",
                            address=host_port(host.local_ip, binding.port),
                            path=rank_load.path,
                            params=rank_load.params,
                            instance=host.instance or host.pool,
                        )
                    )
        exporters: list[tuple[Job, int]] = [("node", NODE_EXPORTER_PORT)]
        if host.gpus > 0:
            exporters.append(("dcgm", DCGM_EXPORTER_PORT))
        for job, port in exporters:
            found.append(
                target(
                    job=job,
                    address=host_port(host.local_ip, port),
                    path=EXPORTER_PATH,
                    instance=host.instance or host.pool,
                )
            )
    return tuple(found)


def prometheus_config(
    plan: Plan,
    *,
    rule_files: tuple[str, ...] = (),
    scrape_interval_s: int = 15,
    evaluation_interval_s: int = 15,
) -> dict[str, Any]:
    """prometheus.yml for the plan: one scrape job per kind of target, static targets with
    their labels (a target's own `instance` label replaces Prometheus' host:port one)."""
    targets = scrape_targets(plan)
    jobs: list[dict[str, Any]] = []
    for job in JOBS:
        mine = [t for t in targets if t.job == job]
        if not mine:
            continue
        kinds = {(t.path, t.scheme, t.params) for t in mine}
        for path, scheme, params in sorted(kinds):
            name = job if len(kinds) == 1 else f"{job}{path.replace('/', '_')}"
            config: dict[str, Any] = {
                "job_name": name if scheme == "http" or len(kinds) == 1 else f"{name}_https",
                "metrics_path": path,
            }
            if params:
                config["params"] = {key: [value] for key, value in params}
            if scheme == "https":
                # Whether the server answers its metrics, as the health gate asks: the target
                # is the host's local address, which the certificate need not name.
                config |= {"scheme": "https", "tls_config": {"insecure_skip_verify": True}}
            config["static_configs"] = [
                {"targets": [t.address], "labels": t.labels}
                for t in mine
                if (t.path, t.scheme, t.params) == (path, scheme, params)
            ]
            jobs.append(config)
    return {
        "global": {
            "scrape_interval": f"{scrape_interval_s}s",
            "evaluation_interval": f"{evaluation_interval_s}s",
            "external_labels": {"k2_model": plan.served_model_name},
        },
        "rule_files": list(rule_files),
        "scrape_configs": jobs,
    }


RULES_FILE = "alerts.yml"


def ib_devices_of(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Each host's RDMA devices as the plan names them (`k2_ib_devices`), hosts with some."""
    return {h.name: h.ib_devices for h in plan.hosts if h.ib_devices}


def monitoring_files(plan: Plan) -> dict[str, str]:
    """The monitoring host's files, by path relative to its config directory:
    prometheus.yml, the rules, and the Grafana dashboards under dashboards/."""
    config = prometheus_config(plan, rule_files=(RULES_FILE,))
    files = {
        "prometheus.yml": yaml.safe_dump(config, sort_keys=False),
        RULES_FILE: yaml.safe_dump(alert_rules(ib_devices=ib_devices_of(plan)), sort_keys=False),
    }
    for name, doc in dashboards().items():
        files[f"dashboards/{name}"] = json.dumps(doc, indent=2) + "\n"
    return files


PROMETHEUS_IMAGE = "quay.io/prometheus/prometheus:v2.53.2"
GRAFANA_IMAGE = "docker.io/grafana/grafana:11.2.0"
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000


class Exporter(Record):
    """One exporter container a host runs."""

    name: str
    image: str
    port: int
    options: tuple[str, ...]
    """docker run options before the image."""
    args: tuple[str, ...]
    """The exporter's arguments after the image."""
    files: dict[str, str] = {}
    """Files the exporter reads: path in its container -> content (the role writes each on the
    host and mounts it there, read-only)."""


def exporters_of(plan: Plan, host: str, *, lab_image: str | None = None) -> tuple[Exporter, ...]:
    """The exporter containers of `host`: a node exporter everywhere, DCGM's on GPU hosts.
    With `lab_image` (a lab plan), the lab image's stand-ins serve the same names."""
    gpus = plan.host(host).gpus > 0
    node_args = (f"--web.listen-address=:{NODE_EXPORTER_PORT}", "--path.rootfs=/host")
    dcgm_args = ("-a", f":{DCGM_EXPORTER_PORT}", "-f", DCGM_COUNTERS_PATH)
    node = Exporter(
        name="k2-node-exporter",
        image=NODE_EXPORTER_IMAGE,
        port=NODE_EXPORTER_PORT,
        options=("--pid", "host", "-v", "/:/host:ro,rslave"),
        args=node_args,
    )
    dcgm = Exporter(
        name="k2-dcgm-exporter",
        image=DCGM_EXPORTER_IMAGE,
        port=DCGM_EXPORTER_PORT,
        options=("--gpus", "all", "--cap-add", "SYS_ADMIN"),
        args=dcgm_args,
        files={DCGM_COUNTERS_PATH: dcgm_counters_csv()},
    )
    chosen = (node, dcgm) if gpus else (node,)
    if lab_image is None:
        return chosen
    kinds = {"k2-node-exporter": "node", "k2-dcgm-exporter": "dcgm"}
    return tuple(
        e.model_copy(
            update={
                "image": lab_image,
                "options": (),
                "files": {},
                "args": ("python3", "-m", "k2standin.exporter", kinds[e.name], str(e.port)),
            }
        )
        for e in chosen
    )


def server_host(endpoint_host: str, group: list[str]) -> str:
    """Where Prometheus and Grafana run: the inventory's first [monitoring] host, else the
    host that serves the endpoint (the PD router's host)."""
    return group[0] if group else endpoint_host


def monitoring_host(plan: Plan, group: list[str]) -> str:
    """server_host of a plan."""
    return server_host(plan.endpoint_host, group)


def where_line(plan: Plan, group: list[str]) -> str:
    """Where the monitoring phase runs Prometheus and Grafana, as status prints it."""
    host = plan.host(monitoring_host(plan, group))
    engine = REGISTRY[plan.engine]
    none = (
        f"; {engine.DISPLAY_NAME} metrics: none (its ranks are not scraped)"
        if engine.METRICS_PATH is None
        else ""
    )
    if plan.lab:
        return (
            f"monitoring: exporters on every host; files on {host.name} "
            f"(the lab runs no Prometheus or Grafana containers){none}"
        )
    return (
        f"monitoring: Prometheus http://{host_port(host.address, PROMETHEUS_PORT)}, "
        f"Grafana http://{host_port(host.address, GRAFANA_PORT)} (on {host.name}){none}"
    )
