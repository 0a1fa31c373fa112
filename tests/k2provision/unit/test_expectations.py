"""Plan -> what each host must offer, and verdicts on real captures (fixtures/hardware)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.core.catalog import GIB
from k2provision.core.expectations import (
    HARDWARE_CHECKS,
    PreflightOptions,
    evaluate_cluster,
    evaluate_host,
    expectations_for,
    host_facts,
    ib_devices_from_texts,
    image_id_mismatches,
    planned_ports,
)
from k2provision.core.records import Plan
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]
HW = ROOT / "tests" / "fixtures" / "hardware"
EXAMPLES = ROOT / "inventory" / "examples"


def read(name: str) -> str:
    return (HW / name).read_text()


def plan_of(path: Path) -> Plan:
    return build_plan(load_cluster(path))


@pytest.fixture(scope="module")
def prod() -> Plan:
    """16 x 8 H200, SGLang 4P12D; gpu-p01 runs prefill rank 0 and the router."""
    return plan_of(ROOT / "inventory" / "prod.ini")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """The lab's 2-prefill/2-decode SGLang cluster (k2_lab=true)."""
    path = tmp_path_factory.mktemp("inv") / "lab.ini"
    path.write_text(
        "[prefill]\nlab1 ansible_host=10.77.0.11\nlab2 ansible_host=10.77.0.12\n"
        "[decode]\nlab3 ansible_host=10.77.0.13\nlab4 ansible_host=10.77.0.14\n"
        "[all:vars]\nk2_engine=sglang\nk2_layout=pd\nk2_model_dir=/models/Kimi-K2-Instruct\n"
        "k2_context_length=32768\nk2_lab=true\n"
    )
    return plan_of(path)


def good_h200_texts(**overrides: str | None) -> dict[str, str | None]:
    """Real captures that satisfy an 8 x H200 plan except where a test overrides them.

    The GPU capture has one H200, so GPU-count problems are filtered by the tests that
    look at other checks (``only``)."""
    texts: dict[str, str | None] = {
        "nvidia_smi_xml": read("h200-x1/nvidia-smi-q-x.xml"),
        "nvidia_smi_topo": read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"),
        "ibstat": read("gpud-h100/ibstat.47.0.h100.all.active.2"),
        "df_avail": f"   Avail\n{2000 * GIB}\n",
        "du_model_dir": None,
        "ss": "",
        "clock": read("timedatectl/xen-api-6743-status-synced.txt"),
        "os_release": read("h100-x1/os-release.txt"),
        "uname": "6.8.0-49-generic\n",
        "fabric_manager": read("fabricmanager/is-active-active.txt"),
        "dcgm_diag": (HW.parent / "gpu_health" / "dcgmi-diag-r1-pass-dcgm4.json").read_text(),
        "containers": "",
    }
    texts.update(overrides)
    return texts


def lines(verdict: Any, kind: str = "refuse") -> list[str]:
    return list(verdict.as_dict()[kind])


# ---------------------------------------------------------------- expectations


def test_prod_host_expects_the_catalog_h200_and_the_image_driver(prod: Plan) -> None:
    exp = expectations_for(prod, "gpu-p01")
    assert exp.gpu_model == "h200"
    assert exp.product_pattern == r"\bH200\b"
    assert exp.gpus_per_node == 8
    assert exp.min_gpu_memory_mib == 143771
    # The sglang image needs 580.65, newer than the H200's own floor (550.54).
    assert (exp.min_driver, exp.driver_required_by) == ("580.65", "the sglang 0.5.23 image")
    assert exp.needs_fabric_manager
    # The inventory names the host's eight rails (k2_ib_devices): each must be Active.
    assert (exp.min_active_ib_ports, exp.ib_rate_gbps) == (8, 400.0)
    assert exp.ib_devices == tuple(f"mlx5_{i}" for i in range(8))
    assert exp.disk_bytes_needed == 959 * GIB
    assert exp.model_dir == "/models/Kimi-K2-Instruct"


def test_the_gpu_floor_counts_when_the_image_needs_less(tmp_path: Path) -> None:
    inv = tmp_path / "kt.ini"
    inv.write_text((EXAMPLES / "ktransformers.ini").read_text() + "k2_gpu=b200\n")
    exp = expectations_for(plan_of(inv), "kt-01")
    assert (exp.min_driver, exp.driver_required_by) == ("570.124", "the b200 GPU")


def test_single_host_plans_need_no_rdma_ports() -> None:
    plan = plan_of(EXAMPLES / "ktransformers.ini")
    assert expectations_for(plan, "kt-01").min_active_ib_ports == 0


def with_ib_devices(plan: Plan, host: str, devices: tuple[str, ...]) -> Plan:
    """The plan with `devices` as `host`'s RDMA devices, as k2_ib_devices would put them."""
    hosts = tuple(
        h.model_copy(update={"ib_devices": devices}) if h.name == host else h for h in plan.hosts
    )
    return plan.model_copy(update={"hosts": hosts})


def test_the_plan_carries_each_hosts_addresses_and_rdma_devices(tmp_path: Path) -> None:
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[nodes]\nn1 ansible_host=10.9.0.1 k2_local_ip=192.168.7.1 k2_ib_devices=mlx5_0,mlx5_3\n"
        "n2 ansible_host=10.9.0.2 k2_ib_devices='[\"mlx5_1\"]'\n"
        "[all:vars]\nk2_engine=sglang\nk2_layout=tp\nk2_context_length=32768\n"
    )
    plan = plan_of(inv)
    n1, n2 = plan.host("n1"), plan.host("n2")
    assert (n1.address, n1.local_ip, n1.ib_devices) == (
        "10.9.0.1",
        "192.168.7.1",
        ("mlx5_0", "mlx5_3"),
    )
    assert (n2.address, n2.local_ip, n2.ib_devices) == ("10.9.0.2", "10.9.0.2", ("mlx5_1",))
    assert expectations_for(plan, "n1").ib_devices == ("mlx5_0", "mlx5_3")


def test_named_ib_devices_and_explicit_numbers_win(prod: Plan) -> None:
    options = PreflightOptions(min_active_ib_ports=2, ib_rate_gbps=200, disk_gib=10)
    plan = with_ib_devices(prod, "gpu-d01", ("mlx5_0", "mlx5_3"))
    exp = expectations_for(plan, "gpu-d01", options)
    assert exp.ib_devices == ("mlx5_0", "mlx5_3")
    assert (exp.min_active_ib_ports, exp.ib_rate_gbps) == (2, 200)
    assert exp.disk_bytes_needed == 10 * GIB


def test_weights_already_in_place_need_no_room(prod: Plan) -> None:
    exp = expectations_for(prod, "gpu-p01", model_dir_used_bytes=900 * GIB)
    assert exp.disk_bytes_needed == 59 * GIB
    assert expectations_for(prod, "gpu-p01", model_dir_used_bytes=960 * GIB).disk_bytes_needed == 0


def test_ports_are_those_each_host_binds(prod: Plan) -> None:
    assert planned_ports(prod, "gpu-p01") == {
        "k2_sglang_port": 30000,
        "k2_bootstrap_port": 8998,
        "k2_dist_port": 5757,
        "k2_api_port": 8000,
        "k2_router_metrics_port": 29000,
    }
    assert planned_ports(prod, "gpu-p02") == {}  # prefill rank 1 serves no port of its own
    assert planned_ports(prod, "gpu-d01") == {"k2_sglang_port": 30000, "k2_dist_port": 5757}


@pytest.mark.parametrize(
    ("inventory", "host", "ports"),
    [
        ("trtllm-tp-ep.ini", "node-01", {"k2_api_port": 8000, "k2_ssh_port": 2233}),
        ("trtllm-tp-ep.ini", "node-02", {"k2_ssh_port": 2233}),
        ("vllm-tp-pp.ini", "node-01", {"k2_ray_port": 6379, "k2_api_port": 8000}),
        ("vllm-dp-ep.ini", "node-01", {"k2_api_port": 8000, "k2_dp_rpc_port": 13345}),
        ("ktransformers.ini", "kt-01", {"k2_api_port": 8000}),
    ],
)
def test_ports_of_every_engine(inventory: str, host: str, ports: dict[str, int]) -> None:
    assert planned_ports(plan_of(EXAMPLES / inventory), host) == ports


def test_ports_of_running_containers_are_theirs(prod: Plan) -> None:
    """A converged host: the engine holds its ports, which is no reason to refuse it."""
    assert planned_ports(prod, "gpu-p01", running_containers=("k2-sglang", "k2-router")) == {}
    assert planned_ports(prod, "gpu-p01", running_containers=("k2-router",)) == {
        "k2_sglang_port": 30000,
        "k2_bootstrap_port": 8998,
        "k2_dist_port": 5757,
    }
    trtllm = plan_of(EXAMPLES / "trtllm-tp-ep.ini")
    assert planned_ports(trtllm, "node-02", running_containers=("k2-trtllm",)) == {}


# ---------------------------------------------------------------- verdicts on real captures


def test_a_good_host_passes_apart_from_its_single_gpu(prod: Plan) -> None:
    # The capture's host has other RDMA devices than prod.ini names: as if it named none.
    plan = with_ib_devices(prod, "gpu-p01", ())
    verdict = evaluate_host(plan, "gpu-p01", good_h200_texts(), PreflightOptions())
    assert [p.check for p in verdict.refuse] == ["gpu_count"]
    assert verdict.defer == ()
    assert verdict.summary.startswith("gpu-p01: Ubuntu 24.04.3 LTS; kernel 6.8.0-49-generic; ")
    assert "1 x NVIDIA H200, driver 580.159.04" in verdict.summary


def test_a_gpu_host_without_dcgm_is_refused_and_a_lab_host_is_not(prod: Plan, lab: Plan) -> None:
    plan = with_ib_devices(prod, "gpu-p01", ())
    verdict = evaluate_host(plan, "gpu-p01", good_h200_texts(dcgm_diag=None), PreflightOptions())
    assert [p.check for p in verdict.refuse] == ["gpu_count", "dcgm"]
    (line,) = [x for x in lines(verdict) if "DCGM" in x]
    assert line.startswith("gpu-p01: DCGM's diagnostic was not collected")
    assert "fix: install DCGM 4" in line
    no_engine = "Error: unable to establish a connection to the specified host: localhost\n"
    verdict = evaluate_host(
        plan, "gpu-p01", good_h200_texts(dcgm_diag=no_engine), PreflightOptions()
    )
    assert [p.check for p in verdict.refuse] == ["unreadable_dcgm_diag", "gpu_count", "dcgm"]
    relaxed = PreflightOptions(require_dcgm=False)
    verdict = evaluate_host(plan, "gpu-p01", good_h200_texts(dcgm_diag=None), relaxed)
    assert [p.check for p in verdict.refuse] == ["gpu_count"]
    assert "dcgm" in evaluate_host(lab, "lab1", {}, PreflightOptions(hardware=False)).skipped


def test_wrong_gpu_h100_capture_against_an_h200_plan(prod: Plan) -> None:
    texts = good_h200_texts(nvidia_smi_xml=read("h100-x1/nvidia-smi-q-x.xml"))
    refused = lines(evaluate_host(prod, "gpu-p01", texts, PreflightOptions()))
    assert (
        "gpu-p01: GPU model is NVIDIA H100 80GB HBM3 on 1 of 1 GPUs, expected h200 (product name "
        "matching '\\\\bH200\\\\b'); fix: use h200 hosts, or set k2_gpu to the model this host "
        "has (the plan's memory arithmetic depends on it)"
    ) in refused
    assert any(line.startswith("gpu-p01: GPU 0 has 81559 MiB, less than") for line in refused)


def test_old_driver_is_refused_unless_the_prepare_phase_installs_one(prod: Plan) -> None:
    texts = good_h200_texts(nvidia_smi_xml=read("h200-x1-old-driver/nvidia-smi-q-x.xml"))
    strict = evaluate_host(prod, "gpu-p01", texts, PreflightOptions())
    expected = (
        "gpu-p01: driver 535.104.05 is older than 580.65 required by the sglang 0.5.23 image; "
        "fix: upgrade the driver (role nvidia_driver, k2_nvidia_driver_branch) or pin an older "
        "image (k2_image)"
    )
    assert expected in lines(strict)
    managed = evaluate_host(prod, "gpu-p01", texts, PreflightOptions(driver_managed=True))
    assert expected in lines(managed, "defer")
    assert expected not in lines(managed)


def test_fabric_manager_stopped(prod: Plan) -> None:
    texts = good_h200_texts(fabric_manager=read("fabricmanager/is-active-inactive.txt"))
    only = PreflightOptions(only=("fabric_manager",))
    (line,) = lines(evaluate_host(prod, "gpu-p01", texts, only))
    assert line.startswith(
        "gpu-p01: nvidia-fabricmanager is inactive, expected active on an NVSwitch system"
    )
    assert "install nvidia-fabricmanager at exactly 580.159.04" in line


def test_rdma_port_down(prod: Plan) -> None:
    texts = good_h200_texts(ibstat=read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1"))
    plan = with_ib_devices(prod, "gpu-p01", ("mlx5_0", "mlx5_5", "mlx5_11"))
    options = PreflightOptions(only=("ib_port",))
    refused = lines(evaluate_host(plan, "gpu-p01", texts, options))
    assert refused == [
        "gpu-p01: RDMA port mlx5_5/1 Down (Disabled), expected Active at 400 Gb/s; fix: check the "
        "cable and the switch port of mlx5_5 (`ibstat mlx5_5`: Polling sees no peer, Disabled is "
        "switched off), or drop it from k2_ib_devices",
        "gpu-p01: RDMA port mlx5_11/1 Down (Polling), expected Active at 400 Gb/s; fix: check the "
        "cable and the switch port of mlx5_11 (`ibstat mlx5_11`: Polling sees no peer, Disabled "
        "is switched off), or drop it from k2_ib_devices",
    ]


def test_no_driver_yet_defers_gpu_checks_to_the_prepare_phase(prod: Plan) -> None:
    texts = good_h200_texts(nvidia_smi_xml=None, fabric_manager=None)
    plan = with_ib_devices(prod, "gpu-p01", ())
    managed = evaluate_host(plan, "gpu-p01", texts, PreflightOptions(driver_managed=True))
    assert {p.check for p in managed.defer} == {"gpu_facts", "fabric_manager"}
    assert managed.refuse == ()
    strict = evaluate_host(plan, "gpu-p01", texts, PreflightOptions())
    assert {"gpu_facts", "fabric_manager"} <= {p.check for p in strict.refuse}


def test_taken_ports_and_full_disk_on_a_lab_host(lab: Plan) -> None:
    """The lab profile skips GPUs and RDMA but judges ports, disk, clock and OS for real."""
    texts = {
        "ss": read("dev-host/ss-Hltn.txt"),
        "df_avail": read("dev-host/df-B1-output-avail.txt"),
        "os_release": read("h100-x1/os-release.txt"),
    }
    verdict = evaluate_host(lab, "lab1", texts, PreflightOptions(hardware=False, disk_gib=1e6))
    checks = [p.check for p in verdict.refuse]
    assert checks == ["disk", "port", "port", "port"]
    assert set(verdict.skipped) == HARDWARE_CHECKS
    refused = lines(verdict)
    assert (
        "lab1: port 30000 (k2_sglang_port) is taken by a listener on 0.0.0.0:30000, expected "
        "port 30000 free; fix: stop what listens there (`ss -ltnp 'sport = :30000'`) or set "
        "k2_sglang_port to a free port"
    ) in refused
    assert any("port 5757 (k2_dist_port) is taken by a listener on *:5757" in x for x in refused)
    assert refused[0].startswith("lab1: ")
    assert "GiB needed for the weights" in refused[0]


def test_lab_host_with_room_and_free_ports_passes(lab: Plan) -> None:
    texts = {"ss": "", "df_avail": f"Avail\n{5 * GIB}\n", "os_release": "ID=debian\n"}
    verdict = evaluate_host(lab, "lab2", texts, PreflightOptions(hardware=False, disk_gib=1))
    assert verdict.refuse == ()
    assert verdict.summary.startswith("lab2: debian; 5.0 GiB free at /models/Kimi-K2-Instruct")


def test_clock_is_judged_when_read_and_required_only_when_asked(lab: Plan) -> None:
    base = {"ss": "", "df_avail": f"Avail\n{5 * GIB}\n", "os_release": "ID=debian\n"}
    lax = PreflightOptions(hardware=False, disk_gib=1, require_clock_sync=False)
    assert evaluate_host(lab, "lab2", base, lax).refuse == ()
    unsynced = {**base, "clock": read("dev-host/chronyc-tracking-unsynced.txt")}
    (problem,) = evaluate_host(lab, "lab2", unsynced, lax).refuse
    assert problem.line().startswith(
        "lab2: clock is not synchronized (chrony: Leap status: Not synchronised)"
    )
    strict = lax.model_copy(update={"require_clock_sync": True})
    (missing,) = evaluate_host(lab, "lab2", base, strict).refuse
    assert missing.check == "clock"
    assert missing.value == "not collected"


def test_output_that_does_not_parse_is_named(prod: Plan) -> None:
    texts = good_h200_texts(ibstat="no such thing\n", ibv_devinfo=None)
    verdict = evaluate_host(prod, "gpu-p01", texts, PreflightOptions())
    assert any(
        line.startswith("gpu-p01: cannot read the output of `ibstat`: ibstat: no CA")
        for line in lines(verdict)
    )


def test_host_facts_fall_back_to_ibv_devinfo() -> None:
    facts, problems = host_facts(
        "h", {"ibstat": None, "ibv_devinfo": read("deepep-223/ibv_devinfo.txt")}
    )
    assert problems == []
    assert facts.ib_ports is not None
    assert [p.ca for p in facts.ib_ports] == ["mlx5_0", "mlx5_1", "mlx5_2"]


def test_one_driver_on_every_host(prod: Plan) -> None:
    texts = {
        "gpu-p01": {"nvidia_smi_xml": read("h200-x1/nvidia-smi-q-x.xml")},
        "gpu-p02": {"nvidia_smi_xml": read("h200-x1-old-driver/nvidia-smi-q-x.xml")},
    }
    strict = evaluate_cluster(prod, texts, PreflightOptions())
    (line,) = lines(strict)
    assert line.startswith(
        "gpu-p02: driver 535.104.05 differs from 580.159.04 on gpu-p01; every host must run "
        "the same driver"
    )
    managed = evaluate_cluster(prod, texts, PreflightOptions(driver_managed=True))
    assert lines(managed) == []
    assert lines(managed, "defer") == [line]
    assert evaluate_cluster(prod, texts, PreflightOptions(hardware=False)).refuse == ()


def test_ib_devices_derived_from_topology() -> None:
    topo = read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt")
    assert ib_devices_from_texts({"nvidia_smi_topo": topo}) == [f"mlx5_{i}" for i in range(8)]
    # Only devices with an Active port count: this RoCE host has mlx5_5 Down.
    down = read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1")
    derived = ib_devices_from_texts({"nvidia_smi_topo": topo, "ibstat": down})
    assert derived == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_6", "mlx5_7"]
    # No topology read (nvidia-smi missing): nothing to derive, the RDMA role then refuses.
    assert ib_devices_from_texts({"nvidia_smi_topo": None, "ibstat": down}) == []


def test_identical_images_everywhere_pass() -> None:
    ids = {"lab1": {"img:1": "sha256:" + "a" * 64}, "lab2": {"img:1": "sha256:" + "a" * 64}}
    assert image_id_mismatches(ids) == []
    assert image_id_mismatches({"lab1": None, "lab2": {}}) == []


def test_the_odd_copy_of_an_image_is_named() -> None:
    good, odd = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    ids = {
        "gpu-01": {"lmsysorg/sglang:v0.5.23": good},
        "gpu-02": {"lmsysorg/sglang:v0.5.23": good},
        "gpu-03": {"lmsysorg/sglang:v0.5.23": odd},
    }
    assert image_id_mismatches(ids) == [
        "gpu-03: image lmsysorg/sglang:v0.5.23 is bbbbbbbbbbbb, expected aaaaaaaaaaaa as on "
        "gpu-01, gpu-02; fix: refer to the image by digest (name@sha256:...) or load one archive "
        "everywhere, remove the odd copy (`docker rmi lmsysorg/sglang:v0.5.23` there) and run "
        "prepare again"
    ]
