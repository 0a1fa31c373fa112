"""The monitoring the plan makes: scrape targets with their labels, a config, rules and
dashboards that Prometheus' own promtool accepts, and rule unit tests that fire."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter.monitoring import (  # noqa: E501
    monitoring_setup,
    monitoring_starts,
    monitoring_writes,
)
from k2provision.core.records import Plan
from k2provision.plan.alert_rules import alert_rules
from k2provision.plan.assemble import build_plan
from k2provision.plan.dashboards import dashboards, panel_queries
from k2provision.plan.dcgm_counters import DCGM_COUNTERS, DCGM_COUNTERS_PATH, dcgm_counters_csv
from k2provision.plan.inventory import load_cluster
from k2provision.plan.monitoring import (
    exporters_of,
    monitoring_files,
    prometheus_config,
    scrape_targets,
    where_line,
)
from tests.k2provision.access_support import GuardFiles
from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"
RULES_TEST = ROOT / "tests" / "fixtures" / "monitoring" / "alerts_test.yml"


def plan_of(case: str) -> Plan:
    return build_plan(load_cluster(GOLDEN / case / "inventory.ini"))


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: scripts/install-lab-deps installs Debian's prometheus"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, check=False)


def test_pd_targets_every_serving_rank_the_router_and_the_exporters() -> None:
    got = {
        (t.job, t.host, t.address, t.instance, t.role, t.rank)
        for t in scrape_targets(plan_of("sglang-pd-1p1d"))
    }
    assert got == {
        ("engine", "pd-p01", "192.168.30.11:30000", "prefill", "prefill", 0),
        ("engine", "pd-d01", "10.30.0.21:30000", "decode", "decode", 0),
        ("router", "pd-router", "10.30.0.5:29000", "router", "router", 0),
        ("node", "pd-p01", "192.168.30.11:9100", "prefill", "prefill", 0),
        ("node", "pd-d01", "10.30.0.21:9100", "decode", "decode", 0),
        ("node", "pd-router", "10.30.0.5:9100", "router", "router", 0),
        ("dcgm", "pd-p01", "192.168.30.11:9400", "prefill", "prefill", 0),
        ("dcgm", "pd-d01", "10.30.0.21:9400", "decode", "decode", 0),
    } | (
        {("dcgm", "pd-router", "10.30.0.5:9400", "router", "router", 0)}
        if plan_of("sglang-pd-1p1d").host("pd-router").gpus
        else set()
    )


def test_instances_on_several_hosts_are_scraped_for_every_ranks_load() -> None:
    """sglang 0.5.23 serves /metrics on an instance's first host only; every DP rank's load
    reaches that host, and /v1/loads serves it as Prometheus text: scraped there (job loads),
    once per instance, with the query that asks for that text."""
    plan = plan_of("sglang-pd-4p12d")
    loads = [t for t in scrape_targets(plan) if t.job == "loads"]
    assert [(t.host, t.address, t.instance, t.path) for t in loads] == [
        ("gpu-p01", "10.10.0.11:30000", "prefill", "/v1/loads"),
        ("gpu-d01", "10.10.0.21:30000", "decode", "/v1/loads"),
    ]
    (job,) = [j for j in prometheus_config(plan)["scrape_configs"] if j["job_name"] == "loads"]
    assert job["metrics_path"] == "/v1/loads"
    assert job["params"] == {"format": ["prometheus"], "include": ["core"]}
    assert [j["job_name"] for j in prometheus_config(plan)["scrape_configs"]][:2] == [
        "engine",
        "loads",
    ]
    fleet = [t for t in scrape_targets(plan_of("sglang-pd-fleet-32")) if t.job == "loads"]
    assert [t.instance for t in fleet] == ["prefill-1", "prefill-2", "decode-1", "decode-2"]
    # One host per instance, or no DP attention (TP's one scheduler batch is on rank 0):
    # /metrics covers every rank.
    for case in ("sglang-pd-1p1d", "sglang-tp", "vllm-dp16-ep"):
        assert not [t for t in scrape_targets(plan_of(case)) if t.job == "loads"], case
    warning = next(w for w in plan.warnings if w.startswith("metrics of the"))
    assert "[decode] (12 hosts each)" in warning
    assert "/v1/loads" in warning


def test_load_panels_and_rules_read_every_rank_where_it_is_scraped() -> None:
    queries: dict[str, str] = {}
    for _, title, expr in panel_queries():
        queries[title] = f"{queries.get(title, '')} {expr}"
    assert "sglang_num_running_reqs" in queries["Running and queued requests"]
    assert "sglang_num_waiting_reqs" in queries["Running and queued requests"]
    assert "sglang_token_usage" in queries["KV cache usage"]
    rules = {r["alert"]: r for g in alert_rules()["groups"] for r in g["rules"]}
    assert "sglang_token_usage" in rules["K2KvCacheFull"]["expr"]
    assert "sglang_num_waiting_reqs" in rules["K2QueueGrowing"]["expr"]
    assert "fullest rank" in rules["K2KvCacheFull"]["annotations"]["summary"]
    transfer = [t for t in queries if t.startswith(("KV transfer", "KV bootstrap"))]
    assert len(transfer) == 3
    assert all(t.endswith("(ranks on each instance's first host)") for t in transfer)


def test_an_engine_without_metrics_still_gets_its_exporters() -> None:
    plan = plan_of("trtllm-tp16-ep8")
    jobs = {t.job for t in scrape_targets(plan)}
    assert jobs == {"node", "dcgm"}
    assert len([t for t in scrape_targets(plan) if t.job == "node"]) == len(plan.hosts)


def test_vllm_scrapes_the_api_port_of_its_head() -> None:
    plan = plan_of("vllm-tp16")
    engine = [t for t in scrape_targets(plan) if t.job == "engine"]
    assert [(t.host, t.address.rsplit(":", 1)[1], t.path) for t in engine] == [
        (plan.pools[0].master, "8000", "/metrics")
    ]


def test_a_single_server_serving_tls_is_scraped_over_https(guard_files: GuardFiles) -> None:
    """With k2_tls_cert_file the API port's metrics are https: Prometheus asks them so (not
    checking the certificate, which need not name the local address); a router's own metrics
    port stays http."""
    cluster = load_cluster(GOLDEN / "vllm-tp16" / "inventory.ini")
    pair = {"tls_cert_file": guard_files.cert, "tls_key_file": guard_files.key}
    tls = cluster.tunables.model_copy(update=pair)
    plan = build_plan(cluster.model_copy(update={"tunables": tls}))
    (engine,) = [t for t in scrape_targets(plan) if t.job == "engine"]
    assert engine.scheme == "https"
    (job,) = [j for j in prometheus_config(plan)["scrape_configs"] if j["job_name"] == "engine"]
    assert job["scheme"] == "https"
    assert job["tls_config"] == {"insecure_skip_verify": True}
    plain = prometheus_config(plan_of("vllm-tp16"))["scrape_configs"]
    assert all("scheme" not in j for j in plain)
    pd = load_cluster(GOLDEN / "sglang-pd-1p1d" / "inventory.ini")
    pd_tls = pd.tunables.model_copy(update=pair)
    routed = build_plan(pd.model_copy(update={"tunables": pd_tls}))
    assert {t.scheme for t in scrape_targets(routed)} == {"http"}


def test_ktransformers_scrapes_its_sglang_server_with_metrics_on() -> None:
    plan = plan_of("ktransformers")
    engine = [t for t in scrape_targets(plan) if t.job == "engine"]
    assert [(t.host, t.address.rsplit(":", 1)[1], t.path) for t in engine] == [
        (plan.pools[0].master, "8000", "/metrics")
    ]
    (process,) = plan.host(plan.pools[0].master).processes
    assert "--enable-metrics" in process.argv


def test_ipv6_targets_are_bracketed() -> None:
    addresses = [t.address for t in scrape_targets(plan_of("sglang-pd-ipv6"))]
    assert addresses
    assert all(a.startswith("[") for a in addresses)


def test_config_and_rules_pass_promtool(tmp_path: Path) -> None:
    rules = alert_rules(ib_devices={"n1": ("mlx5_0",)})
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    config = prometheus_config(plan_of("sglang-pd-4p12d"), rule_files=("alerts.yml",))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 14 rules found" in checked.stdout + checked.stderr
    shutil.copy(RULES_TEST, tmp_path / "alerts_test.yml")
    tested = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_a_broken_rule_fails_promtool(tmp_path: Path) -> None:
    doc = alert_rules()
    doc["groups"][0]["rules"][0]["expr"] = "up{job= == 0"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc))
    assert promtool("check", "rules", "alerts.yml", cwd=tmp_path).returncode != 0


def test_dashboards_are_grafana_json_and_every_query_parses(tmp_path: Path) -> None:
    docs = dashboards()
    assert set(docs) == {"k2-fleet.json", "k2-instance.json", "k2-pd.json", "k2-gpu.json"}
    for name, doc in docs.items():
        again = json.loads(json.dumps(doc))
        assert again["uid"], name
        assert again["panels"], name
        assert len({p["id"] for p in again["panels"]}) == len(again["panels"]), name
    rules = [
        {"record": f"k2:panel_{i}", "expr": expr} for i, (_, _, expr) in enumerate(panel_queries())
    ]
    (tmp_path / "panels.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]})
    )
    checked = promtool("check", "rules", "panels.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_render_writes_the_monitoring_files_and_promtool_accepts_them(tmp_path: Path) -> None:
    out = tmp_path / "render"
    result = k2("render", str(GOLDEN / "sglang-pd-1p1d" / "inventory.ini"), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    monitoring = out / "monitoring"
    assert sorted(p.name for p in (monitoring / "dashboards").iterdir()) == [
        "k2-fleet.json", "k2-gpu.json", "k2-instance.json", "k2-pd.json",
    ]  # fmt: skip
    checked = promtool("check", "config", "prometheus.yml", cwd=monitoring)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_roles_filter_places_the_server_and_the_exporters() -> None:
    plan = plan_of("sglang-pd-1p1d")
    doc = plan.model_dump(mode="json")
    router = monitoring_setup(doc, "pd-router")
    assert router["server"] is True
    assert [e["name"] for e in router["exporters"]] == ["k2-node-exporter"]  # no GPUs
    assert set(router["files"]) >= {"prometheus.yml", "alerts.yml", "dashboards/k2-fleet.json"}
    decode = monitoring_setup(doc, "pd-d01")
    assert decode["server"] is False
    assert decode["files"] == {}
    assert [e["name"] for e in decode["exporters"]] == ["k2-node-exporter", "k2-dcgm-exporter"]
    assert decode["exporters"][1]["image"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter:")
    # A [monitoring] host wins over the endpoint's host:
    assert monitoring_setup(doc, "pd-d01", ["pd-d01"])["server"] is True


def test_each_host_writes_its_monitoring_files_in_one_list_naming_who_rereads_them() -> None:
    """The role writes a host's monitoring files in one k2.cluster.write_files call: the DCGM
    exporter's counters on a GPU host (restarting that exporter), and on the monitoring host the
    plan's files (restarting Prometheus and Grafana) and Grafana's provisioning (Grafana)."""
    doc = plan_of("sglang-pd-1p1d").model_dump(mode="json")
    conf = "/etc/k2provision/monitoring"
    decode = monitoring_writes(monitoring_setup(doc, "pd-d01"), conf)
    assert [(w["path"], w["restarts"]) for w in decode] == [
        (f"{conf}/exporters/k2-dcgm-exporter/{DCGM_COUNTERS_PATH.rsplit('/', 1)[1]}",
         ["k2-dcgm-exporter"]),
    ]  # fmt: skip
    assert decode[0]["content"] == dcgm_counters_csv()
    assert decode[0]["mode"] == "0644"
    setup = monitoring_setup(doc, "pd-router")
    server = {w["path"]: w for w in monitoring_writes(setup, conf)}
    for name, content in setup["files"].items():
        assert server[f"{conf}/{name}"]["content"] == content
        assert server[f"{conf}/{name}"]["restarts"] == ["k2-prometheus", "k2-grafana"]
    source = yaml.safe_load(server[f"{conf}/grafana/datasources/k2.yml"]["content"])
    assert source["datasources"][0]["url"] == f"http://localhost:{setup['prometheus_port']}"
    assert server[f"{conf}/grafana/dashboards/k2.yml"]["restarts"] == ["k2-grafana"]
    assert len(server) == len(setup["files"]) + 2  # the router's host has no GPU exporter


def test_a_monitoring_container_restarts_only_when_it_must() -> None:
    """Missing, stopped, on another image, or one of its files just written: (re)started.
    Running its image with its files as they were: left alone."""
    node = {"name": "k2-node-exporter", "image": "prom/node-exporter:v1"}
    dcgm = {"name": "k2-dcgm-exporter", "image": "dcgm:v4"}
    writes = [{"path": "/etc/m/exporters/k2-dcgm-exporter/c.csv", "restarts": ["k2-dcgm-exporter"]}]

    def answers(**states: dict[str, object]) -> dict[str, object]:
        return {f"container {name}": state for name, state in states.items()}

    running = {"found": True, "running": True, "image": "prom/node-exporter:v1"}
    dcgm_running = {"found": True, "running": True, "image": "dcgm:v4"}
    both = answers(**{"k2-node-exporter": running, "k2-dcgm-exporter": dcgm_running})

    def names(found: dict[str, object], written: list[str] | None = None) -> list[str]:
        return [c["name"] for c in monitoring_starts([node, dcgm], found, writes, written)]

    assert names(both) == []
    assert names(both, ["/etc/m/exporters/k2-dcgm-exporter/c.csv"]) == ["k2-dcgm-exporter"]
    assert names(both, ["/etc/m/prometheus.yml"]) == []
    assert names(answers(**{"k2-dcgm-exporter": dcgm_running})) == ["k2-node-exporter"]
    stopped = {**running, "running": False}
    assert names(answers(**{"k2-node-exporter": stopped, "k2-dcgm-exporter": dcgm_running})) == [
        "k2-node-exporter"
    ]
    other = {**running, "image": "prom/node-exporter:v0"}
    assert names(answers(**{"k2-node-exporter": other, "k2-dcgm-exporter": dcgm_running})) == [
        "k2-node-exporter"
    ]
    missing = {"found": False}
    assert names(answers(**{"k2-node-exporter": running, "k2-dcgm-exporter": missing})) == [
        "k2-dcgm-exporter"
    ]


def test_lab_exporters_are_the_stand_ins() -> None:
    plan = plan_of("sglang-pd-1p1d").model_copy(update={"lab": True})
    exporters = exporters_of(plan, "pd-p01", lab_image="localhost/k2-standin:lab")
    assert [e.args[-2:] for e in exporters] == [("node", "9100"), ("dcgm", "9400")]
    assert all(e.image == "localhost/k2-standin:lab" for e in exporters)
    assert all(e.files == {} for e in exporters)  # the stand-in exports its names as they are


def test_status_says_where_prometheus_and_grafana_are() -> None:
    plan = plan_of("sglang-pd-1p1d")
    assert where_line(plan, []) == (
        "monitoring: Prometheus http://10.30.0.5:9090, Grafana http://10.30.0.5:3000 (on pd-router)"
    )
    assert "http://10.30.0.21:9090" in where_line(plan, ["pd-d01"])
    assert "metrics: none" not in where_line(plan, [])
    trtllm = where_line(plan_of("trtllm-tp16-ep8"), [])
    assert trtllm.endswith("; TensorRT-LLM metrics: none (its ranks are not scraped)")


def _dcgm_names(expr: str) -> set[str]:
    return set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+", expr))


def test_the_dcgm_exporter_runs_with_exactly_the_fields_the_rules_and_dashboards_read() -> None:
    exprs = [r["expr"] for g in alert_rules()["groups"] for r in g["rules"]]
    exprs += [expr for _, _, expr in panel_queries()]
    used = set().union(*(_dcgm_names(e) for e in exprs))
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} <= used
    assert used == {field for field, _, _ in DCGM_COUNTERS}
    (dcgm,) = [e for e in exporters_of(plan_of("sglang-pd-1p1d"), "pd-d01") if "dcgm" in e.name]
    assert dcgm.args[dcgm.args.index("-f") + 1] == DCGM_COUNTERS_PATH
    assert dcgm.files == {DCGM_COUNTERS_PATH: dcgm_counters_csv()}
    rows = [line for line in dcgm_counters_csv().splitlines() if not line.startswith("#")]
    assert rows[0] == "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered."
    assert [row.split(", ")[0] for row in rows] == [field for field, _, _ in DCGM_COUNTERS]
    assert all(row.split(", ")[1] in ("gauge", "counter") for row in rows)


def test_the_ib_port_rule_watches_the_plans_rdma_devices_only() -> None:
    """Each host's k2_ib_devices, nothing else: a host's management NIC or unused HCA is not
    the cluster's; a plan that names no devices gets no IB rule."""
    plan = plan_of("sglang-pd-4p12d")
    rules = yaml.safe_load(monitoring_files(plan)["alerts.yml"])["groups"][0]["rules"]
    (ib,) = [r["expr"] for r in rules if r["alert"] == "K2IbPortDown"]
    hosts = [h for h in plan.hosts if h.ib_devices]
    assert hosts
    assert ib.count("node_infiniband_state_id{") == len({h.ib_devices for h in hosts})
    assert all(d in ib for h in hosts for d in h.ib_devices)
    assert "node_infiniband_state_id !=" not in ib
    bare = yaml.safe_load(monitoring_files(plan_of("sglang-tp"))["alerts.yml"])
    assert "K2IbPortDown" not in {r["alert"] for r in bare["groups"][0]["rules"]}
