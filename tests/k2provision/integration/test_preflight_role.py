"""Role k2_preflight refuses wrong hardware, judged from real captures of wrong hardware.

The role runs for real (ansible-playbook, the plan computed by k2.cluster.plan from an inventory
of two 8 x H200 hosts) against localhost with connection=local; instead of collecting, each host
judges command outputs captured on real machines (k2_preflight_facts_override, the role's
variable for tests and offline audits; see tests/fixtures/hardware/SOURCES.md):

- wrong GPU: the H100 capture against the plan's H200s,
- an RDMA port Down: the RoCE host whose mlx5_5 is Down/Disabled,
- an old driver: the H200 capture on the R535 driver,
- the fabric manager stopped: `systemctl is-active` answering inactive,

and the play must fail with one line per problem naming the host, the value, the expected value
and the fix. The captures are of single-GPU machines, so a GPU-count line comes with each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks import PlaybookRun, run_playbook

ROOT = Path(__file__).resolve().parents[3]
HW = ROOT / "tests" / "fixtures" / "hardware"
GIB = 1024**3
GPU_COUNT = (
    "{host}: 1 GPU visible to the driver, 8 expected per node; fix: check `nvidia-smi -L` and "
    "the kernel log for GPUs that fell off the bus, or set k2_gpus_per_node to what the host has"
)


def read(name: str) -> str:
    return (HW / name).read_text()


def texts(**overrides: str | None) -> dict[str, str | None]:
    """Captures of a host that meets the plan apart from the overrides (and its GPU count)."""
    base: dict[str, str | None] = {
        "nvidia_smi_xml": read("h200-x1/nvidia-smi-q-x.xml"),
        "nvidia_smi_topo": read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"),
        "ibstat": read("gpud-h100/ibstat.47.0.h100.all.active.2"),
        "df_avail": f"Avail\n{2000 * GIB}\n",
        "ss": "",
        "clock": read("timedatectl/xen-api-6743-status-synced.txt"),
        "os_release": read("h100-x1/os-release.txt"),
        "uname": "6.8.0-49-generic\n",
        "fabric_manager": read("fabricmanager/is-active-active.txt"),
        "dcgm_diag": (HW.parent / "gpu_health" / "dcgmi-diag-r1-pass-dcgm4.json").read_text(),
        "containers": "",
    }
    base.update(overrides)
    return base


def run_preflight(
    tmp_path: Path,
    facts: dict[str, dict[str, str | None]],
    ib_devices: str = "mlx5_0,mlx5_5",
    **role_vars: Any,
) -> PlaybookRun:
    """Plan + role k2_preflight on two local hosts whose inventory names `ib_devices`."""
    inventory = tmp_path / "h200.ini"
    inventory.write_text(
        "[nodes]\n"
        "gpu-01 ansible_host=192.0.2.1 ansible_connection=local\n"
        "gpu-02 ansible_host=192.0.2.2 ansible_connection=local\n"
        "[all:vars]\n"
        f"ansible_python_interpreter={sys.executable}\n"
        "k2_engine=sglang\nk2_layout=tp\nk2_gpu=h200\nk2_context_length=32768\n"
        "k2_model_dir=/models/Kimi-K2-Instruct\n"
        f"k2_ib_devices={ib_devices}\n"
    )
    (tmp_path / "captures.json").write_text(json.dumps({"captured": facts}))
    playbook = [
        {"ansible.builtin.import_playbook": str(ROOT / "playbooks" / "plan.yml")},
        {
            "name": "Preflight on captured outputs",
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [str(tmp_path / "captures.json")],
            "roles": [
                {
                    "role": "k2_preflight",
                    "vars": {
                        "k2_preflight_plan": "{{ k2_planned.plan }}",
                        "k2_preflight_facts_override": "{{ captured[inventory_hostname] }}",
                        **role_vars,
                    },
                }
            ],
        },
    ]
    return run_playbook(playbook, inventory, tmp_path)


def refusal_lines(report: PlaybookRun, host: str) -> list[str]:
    result = report.task("This host can run its part of the plan")[host]
    assert result.get("failed"), result
    return str(result["msg"]).splitlines()


@pytest.fixture(scope="module")
def wrong_hardware(tmp_path_factory: pytest.TempPathFactory) -> PlaybookRun:
    """gpu-01: an H100, an RDMA port Down, the fabric manager stopped; gpu-02: an old driver."""
    facts = {
        "gpu-01": texts(
            nvidia_smi_xml=read("h100-x1/nvidia-smi-q-x.xml"),
            ibstat=read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1"),
            fabric_manager=read("fabricmanager/is-active-inactive.txt"),
        ),
        "gpu-02": texts(nvidia_smi_xml=read("h200-x1-old-driver/nvidia-smi-q-x.xml")),
    }
    return run_preflight(tmp_path_factory.mktemp("strict"), facts)


def test_wrong_hardware_fails_the_play(wrong_hardware: PlaybookRun) -> None:
    assert wrong_hardware.rc != 0
    assert wrong_hardware.stats["gpu-01"]["failures"] == 1
    assert wrong_hardware.stats["gpu-02"]["failures"] == 1


def test_wrong_gpu_h100_against_an_h200_plan(wrong_hardware: PlaybookRun) -> None:
    lines = refusal_lines(wrong_hardware, "gpu-01")
    assert (
        "gpu-01: GPU model is NVIDIA H100 80GB HBM3 on 1 of 1 GPUs, expected h200 (product name "
        "matching '\\\\bH200\\\\b'); fix: use h200 hosts, or set k2_gpu to the model this host has "
        "(the plan's memory arithmetic depends on it)"
    ) in lines
    assert (
        "gpu-01: GPU 0 has 81559 MiB, less than the 143771 MiB the plan assumes; fix: use GPUs "
        "with at least 143771 MiB (k2_gpu names the model), or a layout with more GPUs per model "
        "replica"
    ) in lines


def test_rdma_port_down(wrong_hardware: PlaybookRun) -> None:
    lines = refusal_lines(wrong_hardware, "gpu-01")
    assert (
        "gpu-01: RDMA port mlx5_5/1 Down (Disabled), expected Active at 400 Gb/s; fix: check the "
        "cable and the switch port of mlx5_5 (`ibstat mlx5_5`: Polling sees no peer, Disabled is "
        "switched off), or drop it from k2_ib_devices"
    ) in lines


def test_fabric_manager_stopped(wrong_hardware: PlaybookRun) -> None:
    lines = refusal_lines(wrong_hardware, "gpu-01")
    assert (
        "gpu-01: nvidia-fabricmanager is inactive, expected active on an NVSwitch system (8 GPUs "
        "per node); fix: install nvidia-fabricmanager at exactly 580.159.04 and `systemctl enable "
        "--now nvidia-fabricmanager` (role nvidia_driver installs and holds both)"
    ) in lines


def test_old_driver_and_the_driver_mismatch(wrong_hardware: PlaybookRun) -> None:
    lines = refusal_lines(wrong_hardware, "gpu-02")
    assert (
        "gpu-02: driver 535.104.05 is older than 580.65 required by the sglang 0.5.23 image; fix: "
        "upgrade the driver (role nvidia_driver, k2_nvidia_driver_branch) or pin an older image "
        "(k2_image)"
    ) in lines
    assert any(
        line.startswith("gpu-02: driver 535.104.05 differs from 580.159.04 on gpu-01")
        for line in lines
    ), lines
    assert all(line.startswith("gpu-02: ") for line in lines)


def test_each_line_names_value_expectation_and_fix(
    wrong_hardware: PlaybookRun,
) -> None:
    for host in ("gpu-01", "gpu-02"):
        for line in refusal_lines(wrong_hardware, host):
            assert line.startswith(f"{host}: ")
            assert "; fix: " in line


def test_what_the_prepare_phase_installs_is_left_to_it(tmp_path: Path) -> None:
    """With role k2_nvidia_driver managing the driver, an old driver and a stopped fabric
    manager are reported for it to fix, not refused; the wrong GPU still is."""
    facts = {
        "gpu-01": texts(
            nvidia_smi_xml=read("h200-x1-old-driver/nvidia-smi-q-x.xml"),
            fabric_manager=read("fabricmanager/is-active-failed.txt"),
        ),
        "gpu-02": texts(nvidia_smi_xml=read("h100-x1/nvidia-smi-q-x.xml")),
    }
    report = run_preflight(tmp_path, facts, k2_preflight_driver_managed=True)
    assert report.rc != 0
    refused = refusal_lines(report, "gpu-01")
    assert refused == [GPU_COUNT.format(host="gpu-01")]
    notes = report.task("what the prepare phase is left to fix")["gpu-01"]["msg"]
    deferred = [n for n in notes if n.startswith("left to the prepare phase: ")]
    assert any("driver 535.104.05 is older than 580.65" in n for n in deferred), notes
    assert any("nvidia-fabricmanager is failed" in n for n in deferred), notes
    assert any("GPU model is NVIDIA H100" in line for line in refusal_lines(report, "gpu-02"))


def test_a_fatal_xid_and_a_failed_dcgm_diag_refuse_the_host_naming_its_instance(
    tmp_path: Path,
) -> None:
    gpu_health = ROOT / "tests" / "fixtures" / "gpu_health"
    report = run_preflight(
        tmp_path,
        {
            "gpu-01": texts(
                kernel_xids=(gpu_health / "kernel-log-xid.txt").read_text(),
                dcgm_diag=(gpu_health / "dcgmi-diag-r1-fail.json").read_text(),
            ),
            "gpu-02": texts(dcgm_diag=(gpu_health / "dcgmi-diag-r1-pass.json").read_text()),
        },
        ib_devices="mlx5_0",
    )
    assert report.rc != 0
    lines = refusal_lines(report, "gpu-01")
    xid = [line for line in lines if "XID 79" in line]
    assert len(xid) == 1
    assert "GPU has fallen off the bus" in xid[0]
    assert "drain gpu-01 (it would break the nodes instance)" in xid[0]
    assert any("DCGM diag `Page Retirement/Row Remap` failed on GPU 1" in x for x in lines)
    assert not any("XID 13" in x for x in lines)  # an application's XID refuses nothing
    assert refusal_lines(report, "gpu-02") == [GPU_COUNT.format(host="gpu-02")]


def test_a_gpu_host_without_dcgm_is_refused_unless_the_role_is_told_not_to(
    tmp_path: Path,
) -> None:
    facts = {"gpu-01": texts(dcgm_diag=None), "gpu-02": texts()}
    (tmp_path / "strict").mkdir()
    (tmp_path / "relaxed").mkdir()
    report = run_preflight(tmp_path / "strict", facts, ib_devices="mlx5_0")
    (dcgm,) = [line for line in refusal_lines(report, "gpu-01") if "DCGM" in line]
    assert dcgm.startswith("gpu-01: DCGM's diagnostic was not collected (`dcgmi diag -r LEVEL -j`")
    assert "systemctl enable --now nvidia-dcgm" in dcgm
    assert refusal_lines(report, "gpu-02") == [GPU_COUNT.format(host="gpu-02")]
    relaxed = run_preflight(
        tmp_path / "relaxed", facts, ib_devices="mlx5_0", k2_preflight_require_dcgm=False
    )
    assert refusal_lines(relaxed, "gpu-01") == [GPU_COUNT.format(host="gpu-01")]


def test_a_host_that_meets_the_plan_is_refused_for_nothing_else(tmp_path: Path) -> None:
    """Good captures on both hosts: the single-GPU capture's count is the only line left (no
    capture of an 8-GPU H200 board is available), on each host."""
    report = run_preflight(tmp_path, {"gpu-01": texts(), "gpu-02": texts()}, ib_devices="mlx5_0")
    assert report.rc != 0
    for host in ("gpu-01", "gpu-02"):
        assert refusal_lines(report, host) == [GPU_COUNT.format(host=host)]


def test_the_role_reads_this_machine_for_real(tmp_path: Path) -> None:
    """Without captures the role runs the registry's commands on the host (here, this machine
    over connection=local, as a lab host: no GPU facts) and judges what they print."""
    inventory = tmp_path / "here.ini"
    inventory.write_text(
        "[nodes]\nhere ansible_host=127.0.0.1 ansible_connection=local\n[all:vars]\n"
        f"ansible_python_interpreter={sys.executable}\n"
        "k2_engine=ktransformers\nk2_layout=single\nk2_context_length=32768\nk2_lab=true\n"
        f"k2_model_dir={tmp_path}/models/K2\n"
    )
    playbook = [
        {"ansible.builtin.import_playbook": str(ROOT / "playbooks" / "plan.yml")},
        {
            "name": "Preflight on this machine",
            "hosts": "all",
            "gather_facts": False,
            "roles": [
                {"role": "k2_preflight", "vars": {"k2_preflight_plan": "{{ k2_planned.plan }}"}}
            ],
        },
    ]
    report = run_playbook(playbook, inventory, tmp_path, "--check")
    read = report.task(
        "Collect | Read the host (GPUs, RDMA ports, disk, ports, clock, OS, containers)"
    )
    assert read["here"]["read"] == [
        "df -B1 --output=avail <k2_model_dir>",
        "du -s -B1 <k2_model_dir>",
        "ss -Hltn",
        "timedatectl show",
        "chronyc tracking",
        "cat /etc/os-release",
        "uname -r",
        "journalctl -k -b | grep -F -e 'NVRM: Xid' -e 'NVRM: loading NVIDIA UNIX'",
        "docker ps --format '{{.Names}}'",
    ]
    texts = read["here"]["texts"]
    assert texts["nvidia_smi_xml"] is None  # a lab host: no hardware facts read
    assert texts["os_release"] == Path("/etc/os-release").read_text()
    assert texts["du_model_dir"] == ""  # the model dir does not exist yet
    assert texts["kernel_xids"] == ""  # this machine's kernel log has no XID
    assert texts["dcgm_diag"] is None  # a hardware fact
    assert read["here"]["changed"] is False
    summary = report.task("what the prepare phase is left to fix")["here"]["msg"][0]
    assert summary.startswith("here: ")
    assert f"free at {tmp_path}/models/K2 (1.0 GiB needed)" in summary
