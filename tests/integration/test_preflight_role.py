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
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HW = ROOT / "tests" / "fixtures" / "hardware"
BIN = Path(sys.executable).parent
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
        "containers": "",
    }
    base.update(overrides)
    return base


def run_preflight(
    tmp_path: Path, facts: dict[str, dict[str, str | None]], **role_vars: Any
) -> tuple[int, dict[str, Any]]:
    """Plan + role k2_preflight on two local hosts; (exit code, the json callback's report)."""
    inventory = tmp_path / "h200.ini"
    inventory.write_text(
        "[nodes]\n"
        "gpu-01 ansible_host=127.0.0.1 ansible_connection=local\n"
        "gpu-02 ansible_host=127.0.0.2 ansible_connection=local\n"
        "[all:vars]\n"
        f"ansible_python_interpreter={sys.executable}\n"
        "k2_engine=sglang\nk2_layout=tp\nk2_gpu=h200\nk2_context_length=32768\n"
        "k2_model_dir=/models/Kimi-K2-Instruct\n"
        "k2_ib_devices=mlx5_0,mlx5_5\n"
    )
    (tmp_path / "captures.json").write_text(json.dumps({"captured": facts}))
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(
        json.dumps(
            [
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
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.strip().startswith("{"), done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def task_results(report: dict[str, Any], task: str) -> dict[str, dict[str, Any]]:
    """host -> result of the task whose name ends with `task`."""
    for play in report["plays"]:
        for entry in play["tasks"]:
            if entry["task"]["name"].endswith(task):
                return dict(entry["hosts"])
    raise AssertionError(f"no task {task!r} ran")


def refusal_lines(report: dict[str, Any], host: str) -> list[str]:
    result = task_results(report, "This host can run its part of the plan")[host]
    assert result.get("failed"), result
    return str(result["msg"]).splitlines()


@pytest.fixture(scope="module")
def wrong_hardware(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
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


def test_wrong_hardware_fails_the_play(wrong_hardware: tuple[int, dict[str, Any]]) -> None:
    rc, report = wrong_hardware
    assert rc != 0
    assert report["stats"]["gpu-01"]["failures"] == 1
    assert report["stats"]["gpu-02"]["failures"] == 1


def test_wrong_gpu_h100_against_an_h200_plan(wrong_hardware: tuple[int, dict[str, Any]]) -> None:
    lines = refusal_lines(wrong_hardware[1], "gpu-01")
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


def test_rdma_port_down(wrong_hardware: tuple[int, dict[str, Any]]) -> None:
    lines = refusal_lines(wrong_hardware[1], "gpu-01")
    assert (
        "gpu-01: RDMA port mlx5_5/1 Down (Disabled), expected Active at 400 Gb/s; fix: check the "
        "cable and the switch port of mlx5_5 (`ibstat mlx5_5`: Polling sees no peer, Disabled is "
        "switched off), or drop it from k2_ib_devices"
    ) in lines


def test_fabric_manager_stopped(wrong_hardware: tuple[int, dict[str, Any]]) -> None:
    lines = refusal_lines(wrong_hardware[1], "gpu-01")
    assert (
        "gpu-01: nvidia-fabricmanager is inactive, expected active on an NVSwitch system (8 GPUs "
        "per node); fix: install nvidia-fabricmanager at exactly 580.159.04 and `systemctl enable "
        "--now nvidia-fabricmanager` (role nvidia_driver installs and holds both)"
    ) in lines


def test_old_driver_and_the_driver_mismatch(wrong_hardware: tuple[int, dict[str, Any]]) -> None:
    lines = refusal_lines(wrong_hardware[1], "gpu-02")
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
    wrong_hardware: tuple[int, dict[str, Any]],
) -> None:
    for host in ("gpu-01", "gpu-02"):
        for line in refusal_lines(wrong_hardware[1], host):
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
    rc, report = run_preflight(tmp_path, facts, k2_preflight_driver_managed=True)
    assert rc != 0
    refused = refusal_lines(report, "gpu-01")
    assert refused == [GPU_COUNT.format(host="gpu-01")]
    notes = task_results(report, "what the prepare phase is left to fix")["gpu-01"]["msg"]
    deferred = [n for n in notes if n.startswith("left to the prepare phase: ")]
    assert any("driver 535.104.05 is older than 580.65" in n for n in deferred), notes
    assert any("nvidia-fabricmanager is failed" in n for n in deferred), notes
    assert any("GPU model is NVIDIA H100" in line for line in refusal_lines(report, "gpu-02"))


def test_a_host_that_meets_the_plan_is_refused_for_nothing_else(tmp_path: Path) -> None:
    """Good captures on both hosts: the single-GPU capture's count is the only line left (no
    capture of an 8-GPU H200 board is available), on each host."""
    rc, report = run_preflight(
        tmp_path, {"gpu-01": texts(), "gpu-02": texts()}, k2_preflight_ib_devices=["mlx5_0"]
    )
    assert rc != 0
    for host in ("gpu-01", "gpu-02"):
        assert refusal_lines(report, host) == [GPU_COUNT.format(host=host)]
