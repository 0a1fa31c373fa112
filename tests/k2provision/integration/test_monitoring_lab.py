"""Monitoring on the lab's PD cluster: the apply's monitoring phase starts the exporter
stand-ins on every host and leaves the monitoring files on the endpoint's host; Debian's
Prometheus, run on the controller with the scrape config and alert rules generated from the
plan, finds every planned target up (the stand-in servers' engine metrics, the real router's,
the exporters), draws the fleet overview from its query API, fires the endpoint-down alert
within its window when a decode server stops, and the fatal-XID alert when a DCGM stand-in
reports XID 79.
Runs in the lab-pd stream (it shares the PD cluster)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import pytest
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from k2provision.core.records import Plan
from k2provision.plan.alert_rules import ENDPOINT_DOWN_FOR, alert_rules
from k2provision.plan.assemble import build_plan
from k2provision.plan.images import LAB_IMAGE
from k2provision.plan.inventory import load_cluster
from k2provision.plan.monitoring import (
    DCGM_EXPORTER_PORT,
    prometheus_config,
    scrape_targets,
)
from tests.pd_lab import k2, remove_engine_containers
from tests.runners import on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]

INTERVAL_S = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def exporters_running(state: Any, plan: Plan) -> None:
    """The monitoring phase of the apply started the exporter stand-ins on every host (DCGM's
    on GPU hosts) and left the monitoring files on the endpoint's host."""
    for host in plan.hosts:
        running = on_host(state, host.name, "docker ps --format '{{.Names}}'").split()
        assert "k2-node-exporter" in running, (host.name, running)
        assert ("k2-dcgm-exporter" in running) == (host.gpus > 0), (host.name, running)
    files = on_host(state, plan.endpoint_host, "ls /etc/k2provision/monitoring").split()
    assert {"prometheus.yml", "alerts.yml", "dashboards"} <= set(files), files


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as r:
            return json.loads(r.read())["data"]

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets")["activeTargets"])

    def firing(self, alert: str) -> list[dict[str, str]]:
        return [
            a["labels"]
            for a in self.get("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == alert and a["state"] == "firing"
        ]


@pytest.fixture(scope="module")
def monitored(
    pd_cluster: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Plan, Prometheus, Path]]:
    state, inventory = pd_cluster
    runs = tmp_path_factory.mktemp("runs")
    applied = k2("apply", str(inventory), runs=runs)
    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    plan = build_plan(load_cluster(inventory))
    exporters_running(state, plan)
    work = tmp_path_factory.mktemp("prometheus")
    (work / "alerts.yml").write_text(yaml.safe_dump(alert_rules(), sort_keys=False))
    config = prometheus_config(
        plan,
        rule_files=("alerts.yml",),
        scrape_interval_s=INTERVAL_S,
        evaluation_interval_s=INTERVAL_S,
    )
    (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    checked = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"], cwd=work, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/install-lab-deps installs Debian's package"
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, "--config.file=prometheus.yml", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        cwd=work, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield state, plan, Prometheus(f"http://127.0.0.1:{port}"), inventory
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        remove_engine_containers(state)  # the exporters too (k2- containers)


def wait_for(what: str, check: Any, timeout: float) -> float:
    """Seconds until `check()` is truthy; fails after `timeout` naming `what`."""
    start = time.monotonic()
    last: Any = None
    while time.monotonic() - start < timeout:
        try:
            last = check()
        except OSError as e:  # Prometheus still starting
            last = e
        if last and not isinstance(last, OSError):
            return time.monotonic() - start
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last})")


def test_every_planned_target_is_up_with_its_labels(
    monitored: tuple[Any, Plan, Prometheus, Path],
) -> None:
    _, plan, prom, _ = monitored
    planned = {(t.job, t.address) for t in scrape_targets(plan)}
    assert {"engine", "router", "node", "dcgm"} <= {job for job, _ in planned}

    def all_up() -> bool:
        up = {(t["labels"]["job"], t["scrapeUrl"].split("/")[2]) for t in prom.targets()
              if t["health"] == "up"}  # fmt: skip
        return up == planned

    wait_for("every planned target up", all_up, 60)
    status = k2("status", str(monitored[3]))
    assert f"monitoring: exporters on every host; files on {plan.endpoint_host}" in status.stdout
    for t in prom.targets():
        assert {"instance", "pool", "role", "host", "rank"} <= set(t["labels"]), t
    router = next(t for t in prom.targets() if t["labels"]["job"] == "router")
    assert router["labels"]["instance"] == "router"
    # The real router's own metrics and the stand-ins' engine names are in the database:
    wait_for("smg_ and sglang: series", lambda: prom.get(
        "/api/v1/query", query="count(smg_worker_health) + count(sglang:token_usage)"
    )["result"], 30)  # fmt: skip


def test_the_fleet_overview_draws_from_the_lab(
    monitored: tuple[Any, Plan, Prometheus, Path], tmp_path: Path
) -> None:
    _, plan, prom, _ = monitored
    endpoint = plan.endpoint.rstrip("/")
    body = json.dumps({"model": plan.served_model_name, "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 8}).encode()  # fmt: skip
    for _ in range(20):
        request = urllib.request.Request(
            f"{endpoint}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200
        time.sleep(0.3)
    time.sleep(3 * INTERVAL_S)
    end = time.time()
    panels = [
        ("Endpoints up by job", "sum by (job) (up)"),
        ("Answered requests", "sum by (instance) (sglang:num_requests_total)"),
        ("Router requests/s", "sum(rate(smg_router_requests_total[30s]))"),
        ("KV cache usage (sglang:token_usage)", "max by (instance) (sglang:token_usage)"),
    ]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(11, 6))
    for ax, (title, query) in zip(axes.flat, panels, strict=True):
        data = prom.get("/api/v1/query_range", query=query, start=str(end - 120), end=str(end),
                        step=str(INTERVAL_S))["result"]  # fmt: skip
        assert data, (title, query)
        for series in data:
            xs = [float(t) - end for t, _ in series["values"]]
            ys = [float(v) for _, v in series["values"]]
            label = ",".join(f"{k}={v}" for k, v in series["metric"].items()) or query
            ax.plot(xs, ys, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("seconds", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("K2 fleet overview (lab PD cluster, Prometheus query API)")
    fig.tight_layout()
    # K2_MONITORING_PNG=docs/monitoring-fleet-overview.png keeps the picture (docs/monitoring.md's).
    target = Path(os.environ.get("K2_MONITORING_PNG") or tmp_path / "fleet.png")
    fig.savefig(target, dpi=80)
    assert target.read_bytes().startswith(b"\x89PNG")


def test_a_stopped_decode_server_fires_endpoint_down_in_its_window(
    monitored: tuple[Any, Plan, Prometheus, Path],
) -> None:
    state, plan, prom, _ = monitored
    decode = next(t for t in scrape_targets(plan) if t.job == "engine" and t.pool == "decode")
    on_host(state, decode.host, "docker stop -t 1 k2-sglang")
    window = int(ENDPOINT_DOWN_FOR.rstrip("s")) + 3 * INTERVAL_S + 10
    took = wait_for(
        "K2EndpointDown for the stopped decode server",
        lambda: [a for a in prom.firing("K2EndpointDown") if a["host"] == decode.host],
        window,
    )
    assert took >= int(ENDPOINT_DOWN_FOR.rstrip("s")) - INTERVAL_S  # it waited its `for`
    firing = prom.firing("K2EndpointDown")
    assert {a["host"] for a in firing} == {decode.host}
    assert firing[0]["instance"] == "decode"
    print(f"K2EndpointDown fired {took:.1f} s after the stop: {firing[0]}")


def test_a_fatal_xid_fires_its_alert(monitored: tuple[Any, Plan, Prometheus, Path]) -> None:
    state, plan, prom, _ = monitored
    host = next(h for h in plan.hosts if h.gpus)
    on_host(state, host.name, "docker rm -f k2-dcgm-exporter")
    on_host(
        state,
        host.name,
        f"docker run -d --name k2-dcgm-exporter --network host -e K2_LAB_XID=79 {LAB_IMAGE} "
        f"python3 -m k2standin.exporter dcgm {DCGM_EXPORTER_PORT}",
    )
    wait_for(
        "K2GpuFatalXid",
        lambda: [a for a in prom.firing("K2GpuFatalXid") if a["host"] == host.name],
        30,
    )
    assert {a["gpu"] for a in prom.firing("K2GpuFatalXid")} == {"0"}


XID_79 = (
    "Nov 26 03:00:00 lab kernel: NVRM: Xid (PCI:0000:bb:00): 79, pid='<unknown>', "
    "name=<unknown>, GPU has fallen off the bus."
)
# The lab fault: a kernel log with the driver's report of a GPU that fell off the bus.
FAKE_JOURNALCTL = f'#!/bin/sh\necho "{XID_79}"\n'


def test_a_fatal_xid_in_the_kernel_log_makes_preflight_refuse_that_host(
    monitored: tuple[Any, Plan, Prometheus, Path], tmp_path: Path
) -> None:
    state, plan, _, inventory = monitored
    host = next(h for h in plan.hosts if h.pool == "decode")
    on_host(state, host.name, f"cat > /usr/local/bin/journalctl <<'EOF'\n{FAKE_JOURNALCTL}EOF\n"
            "chmod 0755 /usr/local/bin/journalctl")  # fmt: skip
    try:
        out = k2("apply", str(inventory), "--tags", "preflight", runs=tmp_path)
        now = k2("status", str(inventory), "--format", "json", runs=tmp_path)
    finally:
        on_host(state, host.name, "rm -f /usr/local/bin/journalctl")
    assert out.returncode != 0, out.stdout[-3000:]
    text = " ".join((out.stdout + out.stderr).split())
    assert f"{host.name}: XID 79 on GPU 0000:bb:00 (GPU has fallen off the bus)" in text, text[
        -3000:
    ]
    assert f"drain {host.name} (it would break the decode instance)" in text
    others = [h.name for h in plan.hosts if h.name != host.name]
    assert not any(f"{name}: XID" in text for name in others)
    # status runs the same checks now, per host:
    hosts = {h["host"]: h for h in json.loads(now.stdout)["hosts"]}
    assert hosts[host.name]["gpu_health"][0].startswith("XID 79 on GPU 0000:bb:00")
    assert all(hosts[name]["gpu_health"] == [] for name in others)
