"""Preflight refusals, driven by real captures (tests/fixtures/hardware/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k2provision.core.expectations import host_facts
from k2provision.core.facts import (
    GpuInventory,
    HostFacts,
    parse_clock_sync,
    parse_df_bytes,
    parse_ibstat,
    parse_listening_ports,
    parse_nvidia_smi_topo,
    parse_nvidia_smi_xml,
    parse_os_release,
    parse_service_state,
)
from k2provision.core.preflight import (
    Expectations,
    Problem,
    check_cluster,
    check_gpu_health,
    check_host,
    check_same_driver,
    derive_ib_devices,
)
from k2provision.core.versions import version_at_least, version_tuple

HW = Path(__file__).resolve().parents[2] / "fixtures" / "hardware"
GIB = 1024**3
RAIL_NICS = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")


def read(name: str) -> str:
    return (HW / name).read_text()


def gpus(name: str) -> GpuInventory:
    return parse_nvidia_smi_xml(read(f"{name}/nvidia-smi-q-x.xml"))


def h200(**overrides: Any) -> Expectations:
    """What a plan for one single-GPU H200 host with the sglang image asks for."""
    fields: dict[str, Any] = {
        "gpu_model": "h200",
        "product_pattern": r"\bH200\b",
        "gpus_per_node": 1,
        "min_gpu_memory_mib": 140000,
        "min_driver": "570.0",
        "driver_required_by": "the sglang image",
        "require_clock_sync": False,
        "os_ids": (),
    }
    fields.update(overrides)
    return Expectations(**fields)


def checks(problems: list[Problem]) -> list[str]:
    return [p.check for p in problems]


def only(problems: list[Problem], check: str) -> Problem:
    (problem,) = [p for p in problems if p.check == check]
    return problem


def assert_readable(problem: Problem) -> None:
    """One line naming host, value, expectation and fix."""
    line = problem.line()
    assert "\n" not in line
    assert line.startswith(f"{problem.host}: ")
    assert problem.value in line
    assert problem.expected in line
    assert line.endswith(f"; fix: {problem.fix}")
    assert problem.fix
    assert str(problem) == line


# ---------------------------------------------------------------- a fit host


def test_the_real_h200_host_passes() -> None:
    facts = HostFacts(
        host="gpu-01",
        gpus=gpus("h200-x1"),
        topology=parse_nvidia_smi_topo(read("h200-x1/nvidia-smi-topo-m.txt")),
    )
    assert check_host(facts, h200()) == []


# ---------------------------------------------------------------- GPU, driver


def test_h100_capture_is_refused_for_an_h200_plan() -> None:
    problems = check_host(HostFacts(host="gpu-07", gpus=gpus("h100-x1")), h200())
    assert checks(problems) == ["gpu_model", "gpu_memory"]
    model = only(problems, "gpu_model")
    assert model.value == "NVIDIA H100 80GB HBM3"
    assert model.expected == "h200"
    assert "k2_gpu" in model.fix
    memory = only(problems, "gpu_memory")
    assert memory.line().startswith("gpu-07: GPU 0 has 81559 MiB, less than the 140000 MiB")
    for problem in problems:
        assert_readable(problem)


def test_single_gpu_host_is_refused_for_an_eight_gpu_plan() -> None:
    problems = check_host(
        HostFacts(host="gpu-02", gpus=gpus("h200-x1"), fabric_manager="active"),
        h200(gpus_per_node=8),
    )
    problem = only(problems, "gpu_count")
    assert (problem.value, problem.expected) == ("1", "8")
    assert problem.line().startswith("gpu-02: 1 GPU visible to the driver, 8 expected per node")
    assert_readable(problem)


def test_old_driver_is_refused_with_the_fix() -> None:
    problems = check_host(HostFacts(host="gpu-07", gpus=gpus("h200-x1-old-driver")), h200())
    assert [p.line() for p in problems] == [
        "gpu-07: driver 535.104.05 is older than 570.0 required by the sglang image; fix: "
        "upgrade the driver (role nvidia_driver, k2_nvidia_driver_branch) or pin an older image "
        "(k2_image)"
    ]
    assert_readable(problems[0])


@pytest.mark.parametrize(
    ("have", "need", "ok"),
    [
        ("570.10", "570.9", True),
        ("570.9", "570.10", False),
        ("570", "570.0", True),
        ("570.0", "570", True),
        ("580.159.04", "580.65", True),
        ("580.65.06", "580.159", False),
        ("535.104.05", "570.0", False),
        ("1000.1", "999.999.999", True),
    ],
)
def test_versions_compare_numerically(have: str, need: str, ok: bool) -> None:
    assert version_at_least(have, need) is ok


def test_driver_check_compares_numerically_not_as_text() -> None:
    inv = gpus("h200-x1")
    newer = HostFacts(host="a", gpus=inv.model_copy(update={"driver_version": "570.10"}))
    older = HostFacts(host="b", gpus=inv.model_copy(update={"driver_version": "570.9"}))
    assert check_host(newer, h200(min_driver="570.9")) == []
    assert checks(check_host(older, h200(min_driver="570.10"))) == ["driver"]


def test_versions_that_are_not_numbers_are_refused() -> None:
    assert version_tuple("580.159.04") == (580, 159, 4)
    with pytest.raises(ValueError, match="not a dotted numeric version"):
        version_tuple("580.x")
    with pytest.raises(ValueError, match="min_driver"):
        h200(min_driver="latest")
    odd = gpus("h200-x1").model_copy(update={"driver_version": "N/A"})
    problem = only(check_host(HostFacts(host="gpu-03", gpus=odd), h200()), "driver")
    assert "cannot be compared" in problem.line()


def test_missing_gpu_facts_are_a_problem_not_a_pass() -> None:
    problems = check_host(HostFacts(host="gpu-09"), h200())
    assert checks(problems) == ["gpu_facts"]
    assert problems[0].value == "not collected"
    assert "nvidia-smi -q -x" in problems[0].line()
    assert_readable(problems[0])


def test_persistence_mode_is_checked_when_asked() -> None:
    inv = gpus("h200-x1")
    off = inv.model_copy(
        update={"gpus": (inv.gpus[0].model_copy(update={"persistence_mode": False}),)}
    )
    facts = HostFacts(host="gpu-04", gpus=off)
    assert check_host(facts, h200()) == []
    problem = only(check_host(facts, h200(require_persistence_mode=True)), "persistence_mode")
    assert_readable(problem)


# ---------------------------------------------------------------- fabric manager


def test_fabric_manager_is_derived_from_the_board() -> None:
    assert h200(gpus_per_node=8).needs_fabric_manager is True
    assert h200(gpus_per_node=1).needs_fabric_manager is False
    assert h200(gpus_per_node=8, fabric_manager=False).needs_fabric_manager is False


@pytest.mark.parametrize("state", ["inactive", "failed"])
def test_stopped_fabric_manager_is_refused(state: str) -> None:
    facts = HostFacts(
        host="gpu-05",
        gpus=gpus("h200-x1"),
        fabric_manager=parse_service_state(read(f"fabricmanager/is-active-{state}.txt")),
    )
    problem = only(check_host(facts, h200(fabric_manager=True)), "fabric_manager")
    assert problem.line().startswith(f"gpu-05: nvidia-fabricmanager is {state}, expected active")
    assert "580.159.04" in problem.fix  # the version it must match: the driver's
    assert_readable(problem)


def test_running_fabric_manager_passes_and_unknown_state_is_refused() -> None:
    running = HostFacts(
        host="gpu-05",
        gpus=gpus("h200-x1"),
        fabric_manager=parse_service_state(read("fabricmanager/is-active-active.txt")),
    )
    assert check_host(running, h200(fabric_manager=True)) == []
    unknown = running.model_copy(update={"fabric_manager": None})
    problem = only(check_host(unknown, h200(fabric_manager=True)), "fabric_manager")
    assert problem.value == "not collected"
    assert_readable(problem)


def test_fabric_registration_stuck_in_progress_is_refused() -> None:
    inv = gpus("h200-x1")
    stuck = inv.model_copy(
        update={"gpus": (inv.gpus[0].model_copy(update={"fabric_state": "In Progress"}),)}
    )
    problem = only(check_host(HostFacts(host="gpu-06", gpus=stuck), h200()), "fabric_state")
    assert problem.value == "In Progress/N/A"
    assert "802" in problem.message
    assert_readable(problem)


# ---------------------------------------------------------------- RDMA ports


def test_down_rail_ports_are_refused_by_name() -> None:
    facts = HostFacts(
        host="gpu-08",
        gpus=gpus("h200-x1"),
        ib_ports=parse_ibstat(read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1")),
    )
    problems = check_host(facts, h200(ib_devices=RAIL_NICS, ib_rate_gbps=400))
    assert checks(problems) == ["ib_port", "ib_port"]
    lines = [p.line() for p in problems]
    assert lines[0].startswith(
        "gpu-08: RDMA port mlx5_5/1 Down (Disabled), expected Active at 400 Gb/s; fix: "
    )
    assert lines[1].startswith(
        "gpu-08: RDMA port mlx5_11/1 Down (Polling), expected Active at 400 Gb/s; fix: "
    )
    assert "k2_ib_devices" in problems[1].fix
    for problem in problems:
        assert_readable(problem)


def test_all_rail_ports_active_pass_despite_down_management_ports() -> None:
    facts = HostFacts(
        host="gpu-08",
        gpus=gpus("h200-x1"),
        ib_ports=parse_ibstat(read("gpud-h100/ibstat.47.0.h100.some.down.0")),
    )
    assert check_host(facts, h200(ib_devices=RAIL_NICS, ib_rate_gbps=400)) == []
    assert check_host(facts, h200(min_active_ib_ports=8, ib_rate_gbps=400)) == []


def test_too_few_active_ports_by_count() -> None:
    facts = HostFacts(
        host="gpu-08",
        gpus=gpus("h200-x1"),
        ib_ports=parse_ibstat(read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1")),
    )
    problem = only(check_host(facts, h200(min_active_ib_ports=8, ib_rate_gbps=400)), "ib_ports")
    assert problem.value == "6 Active at 400 Gb/s"
    assert problem.expected == "8 Active at 400 Gb/s"
    assert "mlx5_11/1 Down (Polling)" in problem.message
    assert "mlx5_1/1 100 Gb/s" in problem.message
    assert_readable(problem)


def test_slow_and_absent_devices() -> None:
    facts = HostFacts(
        host="gpu-08",
        gpus=gpus("h200-x1"),
        ib_ports=parse_ibstat(read("gpud-h100/ibstat.47.0.h100.some.down.0")),
    )
    problems = check_host(facts, h200(ib_devices=("mlx5_1", "mlx5_12"), ib_rate_gbps=400))
    slow, absent = problems
    assert (slow.check, slow.value, slow.expected) == ("ib_rate", "100 Gb/s", "400 Gb/s")
    assert absent.check == "ib_port"
    assert absent.value == "absent"
    assert "mlx5_12" in absent.message
    for problem in problems:
        assert_readable(problem)


def test_uncollected_ports_are_refused_only_when_the_plan_needs_rdma() -> None:
    facts = HostFacts(host="gpu-08", gpus=gpus("h200-x1"))
    assert check_host(facts, h200()) == []
    problem = only(check_host(facts, h200(ib_devices=RAIL_NICS)), "ib_ports")
    assert problem.value == "not collected"
    assert_readable(problem)


# ---------------------------------------------------------------- disk, ports, clock, OS


def test_disk_too_small_for_the_weights() -> None:
    facts = HostFacts(
        host="gpu-07",
        gpus=gpus("h100-x1"),
        model_dir_free_bytes=parse_df_bytes(read("h100-x1/df-B1.txt")),
    )
    exp = h200(
        gpu_model="h100",
        product_pattern=r"\bH100\b",
        min_gpu_memory_mib=80000,
        model_dir="/models/Kimi-K2-Instruct",
        disk_bytes_needed=959 * GIB,
    )
    (problem,) = check_host(facts, exp)
    assert problem.check == "disk"
    assert problem.line().startswith(
        "gpu-07: 64.0 GiB free at /models/Kimi-K2-Instruct, 959.0 GiB needed for the weights; "
    )
    assert "k2_model_dir" in problem.fix
    assert_readable(problem)
    assert check_host(facts, exp.model_copy(update={"disk_bytes_needed": 60 * GIB})) == []


def test_busy_ports_are_named_with_their_setting() -> None:
    facts = HostFacts(
        host="gpu-01",
        gpus=gpus("h200-x1"),
        listening=parse_listening_ports(read("dev-host/ss-Hltn.txt")),
    )
    wanted = {"k2_sglang_port": 30000, "k2_bootstrap_port": 8998, "k2_api_port": 8000}
    problems = check_host(facts, h200(ports_free=wanted))
    assert checks(problems) == ["port", "port"]
    busy = "gpu-01: port 30000 (k2_sglang_port) is taken by a listener on 0.0.0.0:30000"
    assert problems[0].line().startswith(busy)
    assert "set k2_bootstrap_port to a free port" in problems[1].fix
    assert all("8000" not in p.line() for p in problems)
    for problem in problems:
        assert_readable(problem)


def test_unsynchronized_clock_is_refused() -> None:
    base = HostFacts(host="gpu-01", gpus=gpus("h200-x1"))
    exp = h200(require_clock_sync=True)
    unsynced = base.model_copy(
        update={"clock": parse_clock_sync(read("dev-host/chronyc-tracking-unsynced.txt"))}
    )
    problem = only(check_host(unsynced, exp), "clock")
    assert "Not synchronised" in problem.line()
    assert_readable(problem)
    synced = base.model_copy(
        update={"clock": parse_clock_sync(read("timedatectl/xen-api-6743-status-synced.txt"))}
    )
    assert check_host(synced, exp) == []
    assert checks(check_host(base, exp)) == ["clock"]  # not collected


def test_operating_system() -> None:
    facts = HostFacts(
        host="gpu-01",
        gpus=gpus("h100-x1"),
        os=parse_os_release(read("h100-x1/os-release.txt")),
    )
    exp = h200(gpu_model="h100", product_pattern=r"\bH100\b", min_gpu_memory_mib=80000)
    assert check_host(facts, exp.model_copy(update={"os_ids": ("ubuntu", "debian")})) == []
    assert check_host(facts, exp.model_copy(update={"os_ids": ("debian",)})) == []  # ID_LIKE
    problem = only(check_host(facts, exp.model_copy(update={"os_ids": ("rhel",)})), "os")
    assert problem.line().startswith("gpu-01: OS is Ubuntu 24.04.3 LTS, expected one of rhel")
    assert_readable(problem)


# ---------------------------------------------------------------- across hosts


def test_mismatched_drivers_name_the_odd_host() -> None:
    hosts = [
        HostFacts(host="gpu-01", gpus=gpus("h200-x1")),
        HostFacts(host="gpu-02", gpus=gpus("h200-x1-old-driver")),
        HostFacts(host="gpu-03", gpus=gpus("h100-x1")),
    ]
    (problem,) = check_same_driver(hosts)
    assert (problem.host, problem.value, problem.expected) == ("gpu-02", "535.104.05", "580.159.04")
    assert problem.line().startswith(
        "gpu-02: driver 535.104.05 differs from 580.159.04 on gpu-01, gpu-03"
    )
    assert "install driver 580.159.04" in problem.fix
    assert_readable(problem)


def test_same_driver_everywhere_passes_and_a_tie_keeps_the_newest() -> None:
    same = [
        HostFacts(host="gpu-01", gpus=gpus("h200-x1")),
        HostFacts(host="gpu-03", gpus=gpus("h100-x1")),
        HostFacts(host="gpu-04"),  # not collected: reported by check_host, not here
    ]
    assert check_same_driver(same) == []
    tie = [
        HostFacts(host="gpu-01", gpus=gpus("h200-x1-old-driver")),
        HostFacts(host="gpu-02", gpus=gpus("h200-x1")),
    ]
    assert [(p.host, p.expected) for p in check_same_driver(tie)] == [("gpu-01", "580.159.04")]


def test_cluster_check_collects_host_and_cross_host_problems() -> None:
    hosts = [
        HostFacts(host="gpu-01", gpus=gpus("h200-x1")),
        HostFacts(host="gpu-02", gpus=gpus("h200-x1-old-driver")),
        HostFacts(host="gpu-03", gpus=gpus("h100-x1")),
    ]
    problems = check_cluster(hosts, h200())
    assert [(p.host, p.check) for p in problems] == [
        ("gpu-02", "driver"),
        ("gpu-03", "gpu_model"),
        ("gpu-03", "gpu_memory"),
        ("gpu-02", "driver_mismatch"),
    ]
    for problem in problems:
        assert_readable(problem)


# ---------------------------------------------------------------- k2_ib_devices from topology


def test_ib_devices_derived_from_hgx_topology() -> None:
    topo = parse_nvidia_smi_topo(read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"))
    assert derive_ib_devices(topo) == [f"mlx5_{i}" for i in range(8)]
    without_0 = derive_ib_devices(topo, usable={f"mlx5_{i}" for i in range(1, 8)})
    assert without_0 == [f"mlx5_{i}" for i in range(1, 8)]
    only_socket_1 = derive_ib_devices(topo, usable={"mlx5_6", "mlx5_4"})
    assert only_socket_1 == ["mlx5_4", "mlx5_6"]  # GPU 0 sees both at SYS, in NIC order


def test_ib_devices_of_a_host_without_nics() -> None:
    topo = parse_nvidia_smi_topo(read("h100-x1/nvidia-smi-topo-m.txt"))
    assert derive_ib_devices(topo) == []


# ---------------------------------------------------------------- GPU health gate

GPU_HEALTH = HW.parent / "gpu_health"


def test_a_fatal_xid_refuses_the_host_an_application_xid_does_not() -> None:
    facts, unreadable = host_facts(
        "gpu-d01", {"kernel_xids": (GPU_HEALTH / "kernel-log-xid.txt").read_text()}
    )
    assert unreadable == []
    problem = only(check_gpu_health(facts, h200(instance="decode")), "gpu_xid")
    assert_readable(problem)
    assert "XID 79 on GPU 0000:bb:00 (GPU has fallen off the bus)" in problem.value
    assert problem.fix.startswith("drain gpu-d01 (it would break the decode instance); reboot")
    # What clears it is what the gate reads: XIDs since the driver's last load.
    assert "a GPU reset alone does not clear this" in problem.fix
    assert "since the NVIDIA driver loaded" in problem.expected
    app_only = "[1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception\n"
    clean, _ = host_facts("gpu-d02", {"kernel_xids": app_only})
    assert clean.xids is not None
    assert len(clean.xids) == 1
    assert check_gpu_health(clean, h200()) == []


def test_a_fatal_xid_before_the_driver_reloaded_passes_the_gate() -> None:
    reloaded = (GPU_HEALTH / "kernel-log-xid-driver-reloaded.txt").read_text()
    facts, unreadable = host_facts("gpu-d01", {"kernel_xids": reloaded})
    assert unreadable == []
    assert facts.xids is not None
    assert [e.xid for e in facts.xids] == [13]
    assert check_gpu_health(facts, h200()) == []


def test_ecc_and_row_remaps_from_nvidia_smi() -> None:
    xml = (
        read("h200-x1/nvidia-smi-q-x.xml")
        .replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<", 1)
        .replace("<dram_uncorrectable>0<", "<dram_uncorrectable>2<", 1)
    )
    problems = check_gpu_health(HostFacts(host="g1", gpus=parse_nvidia_smi_xml(xml)), h200())
    assert checks(problems) == ["gpu_ecc", "gpu_row_remap"]
    assert "2 uncorrectable ECC error(s)" in problems[0].value
    assert "row remap pending" in problems[1].value
    failed = xml.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<", 1)
    (remap,) = [
        p
        for p in check_gpu_health(HostFacts(host="g1", gpus=parse_nvidia_smi_xml(failed)), h200())
        if p.check == "gpu_row_remap"
    ]
    assert "replace the GPU" in remap.fix


def test_a_failed_dcgm_diag_refuses_and_an_unreadable_one_is_named() -> None:
    facts, _ = host_facts("g1", {"dcgm_diag": (GPU_HEALTH / "dcgmi-diag-r1-fail.json").read_text()})
    problem = only(check_host(facts, h200()), "gpu_diag")
    assert "`Page Retirement/Row Remap` failed on GPU 1" in problem.value
    passed, _ = host_facts(
        "g1", {"dcgm_diag": (GPU_HEALTH / "dcgmi-diag-r1-pass.json").read_text()}
    )
    assert check_gpu_health(passed, h200()) == []
    _, unreadable = host_facts("g1", {"dcgm_diag": "Error: unable to connect to host engine"})
    assert checks(unreadable) == ["unreadable_dcgm_diag"]


def test_a_failed_dcgm_4_diag_refuses_and_one_without_results_is_unreadable() -> None:
    fail4 = (GPU_HEALTH / "dcgmi-diag-r1-fail-dcgm4.json").read_text()
    facts, unreadable = host_facts("g1", {"dcgm_diag": fail4})
    assert unreadable == []
    problem = only(check_host(facts, h200()), "gpu_diag")
    assert_readable(problem)
    assert problem.value.startswith("DCGM diag `software` failed on GPU 1: GPU 1 had uncorrectable")
    passed, _ = host_facts(
        "g1", {"dcgm_diag": (GPU_HEALTH / "dcgmi-diag-r1-pass-dcgm4.json").read_text()}
    )
    assert check_gpu_health(passed, h200()) == []
    empty = '{"DCGM Diagnostic": {"runtime_error": "Host engine not reachable"}}'
    nothing, unreadable = host_facts("g1", {"dcgm_diag": empty})
    assert nothing.gpu_diag is None
    (problem,) = unreadable
    assert problem.check == "unreadable_dcgm_diag"
    assert "Host engine not reachable" in problem.message
    assert "systemctl enable --now nvidia-dcgm" in problem.fix


def test_a_gpu_host_without_dcgm_is_refused_naming_host_and_fix() -> None:
    gpus = parse_nvidia_smi_xml(read("h200-x1/nvidia-smi-q-x.xml"))
    missing = HostFacts(host="gpu-d03", gpus=gpus)
    problem = only(check_gpu_health(missing, h200(require_dcgm=True)), "dcgm")
    assert_readable(problem)
    assert problem.line().startswith("gpu-d03: DCGM's diagnostic was not collected (`dcgmi diag")
    assert "datacenter-gpu-manager-4-cuda13" in problem.fix
    assert "systemctl enable --now nvidia-dcgm" in problem.fix
    # No driver answering yet: the GPU inventory check says so, not DCGM.
    assert check_gpu_health(HostFacts(host="gpu-d03"), h200(require_dcgm=True)) == []
    assert check_gpu_health(missing, h200()) == []


def test_all_links_inactive_after_the_header_refuses_the_host() -> None:
    text = (GPU_HEALTH / "nvidia-smi-nvlink-s-hgx-h100-gpu5-all-inactive.txt").read_text()
    facts, _ = host_facts("gpu-p01", {"nvlink": text})
    problem = only(check_host(facts, h200(instance="prefill")), "gpu_nvlink")
    assert problem.value.startswith("GPU 5 has no active NVLink")


def test_a_down_nvlink_refuses_the_host_naming_gpu_and_link() -> None:
    down = (GPU_HEALTH / "nvidia-smi-nvlink-s-hgx-h100-link-down.txt").read_text()
    facts, unreadable = host_facts("gpu-p01", {"nvlink": down})
    assert unreadable == []
    problem = only(check_host(facts, h200(instance="prefill")), "gpu_nvlink")
    assert_readable(problem)
    assert problem.value == "GPU 3 NVLink 7 is down (nvidia-smi nvlink -s: <inactive>)"
    assert problem.fix.startswith("drain gpu-p01 (it would break the prefill instance); check")
    assert "`nvidia-smi -r -i 3`" in problem.fix
    up, _ = host_facts(
        "gpu-p01", {"nvlink": (GPU_HEALTH / "nvidia-smi-nvlink-s-hgx-h100.txt").read_text()}
    )
    assert up.nvlink is not None
    assert len(up.nvlink) == 144
    assert check_gpu_health(up, h200()) == []
    # A GPU without NVLink (the single-GPU VMs) lists no link: nothing to refuse.
    single, _ = host_facts("g1", {"nvlink": ""})
    assert single.nvlink == ()
