"""Parsers of host facts, run on real command output (tests/fixtures/hardware/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.core.facts import (
    FactParseError,
    bound_ports,
    nearest_nics,
    nic_per_gpu,
    parse_clock_sync,
    parse_df_bytes,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_kernel_release,
    parse_listening_ports,
    parse_nvidia_smi_topo,
    parse_nvidia_smi_xml,
    parse_os_release,
    parse_service_state,
)

HW = Path(__file__).resolve().parents[2] / "fixtures" / "hardware"


def read(name: str) -> str:
    return (HW / name).read_text()


# ---------------------------------------------------------------- nvidia-smi -q -x


def test_h100_xml_reports_the_real_card() -> None:
    inv = parse_nvidia_smi_xml(read("h100-x1/nvidia-smi-q-x.xml"))
    assert inv.driver_version == "580.159.04"
    assert inv.cuda_version == "13.0"
    assert inv.count == 1
    gpu = inv.gpus[0]
    assert gpu.index == 0
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_total_mib == 81559
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.uuid == "GPU-11648d50-3f88-42c3-e4ec-bf3224a2a57e"
    assert gpu.architecture == "Hopper"
    assert gpu.persistence_mode is True
    assert gpu.ecc_current is True
    assert gpu.minor_number == 0
    # a single passthrough GPU is on no NVSwitch fabric: nvidia-smi says N/A
    assert gpu.fabric_state is None
    assert gpu.fabric_status is None


def test_h200_xml_reports_the_real_card() -> None:
    inv = parse_nvidia_smi_xml(read("h200-x1/nvidia-smi-q-x.xml"))
    assert inv.driver_version == "580.159.04"
    assert inv.products == ("NVIDIA H200",)
    assert inv.gpus[0].memory_total_mib == 143771
    assert inv.gpus[0].uuid == "GPU-2cc37887-837a-097f-54c5-c8977eb03b6b"
    assert inv.gpus[0].vbios_version == "96.00.A5.00.1A"


def test_old_driver_fixture_differs_only_in_the_driver() -> None:
    real = parse_nvidia_smi_xml(read("h200-x1/nvidia-smi-q-x.xml"))
    old = parse_nvidia_smi_xml(read("h200-x1-old-driver/nvidia-smi-q-x.xml"))
    assert old.driver_version == "535.104.05"
    assert old.gpus == real.gpus


def test_xml_with_entity_declarations_is_refused() -> None:
    text = read("h200-x1/nvidia-smi-q-x.xml").replace(
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
        '<!DOCTYPE nvidia_smi_log [<!ENTITY x "boom">]>',
    )
    with pytest.raises(FactParseError, match="entities"):
        parse_nvidia_smi_xml(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nvidia-smi: command not found", "not XML"),
        ("<?xml version='1.0'?><log/>", "root element is <log>"),
        ("<nvidia_smi_log><attached_gpus>1</attached_gpus></nvidia_smi_log>", "driver_version"),
    ],
)
def test_xml_that_is_not_nvidia_smi_output_is_refused(text: str, message: str) -> None:
    with pytest.raises(FactParseError, match=message):
        parse_nvidia_smi_xml(text)


def test_xml_whose_gpu_count_disagrees_with_attached_gpus_is_refused() -> None:
    text = read("h100-x1/nvidia-smi-q-x.xml").replace(
        "<attached_gpus>1</attached_gpus>", "<attached_gpus>8</attached_gpus>"
    )
    with pytest.raises(FactParseError, match="attached_gpus says 8 but 1"):
        parse_nvidia_smi_xml(text)


# ---------------------------------------------------------------- nvidia-smi topo -m


def test_single_gpu_topology_with_ansi_header() -> None:
    raw = read("h100-x1/nvidia-smi-topo-m.txt")
    assert "\x1b[4m" in raw  # the real capture carries the underline escape
    topo = parse_nvidia_smi_topo(raw)
    assert topo.labels == ("GPU0",)
    assert topo.nics == ()
    gpu = topo.gpus[0]
    assert (gpu.label, gpu.cpu_affinity, gpu.numa_node) == ("GPU0", "0-15", 0)
    assert gpu.gpu_numa_id is None
    assert topo.link("GPU0", "GPU0") == "X"
    assert nearest_nics(topo) == {0: []}


def test_hgx_topology_matrix_affinity_and_legend() -> None:
    topo = parse_nvidia_smi_topo(read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"))
    assert [g.index for g in topo.gpus] == list(range(8))
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(8)]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.gpus[4].cpu_affinity == "48-95,144-191"
    assert all(topo.nvlinks(a, b) == 18 for a in range(8) for b in range(8) if a != b)
    assert topo.nvlinks(3, 3) == 0
    assert topo.link("GPU0", "NIC4") == "SYS"
    assert topo.link("GPU5", "NIC5") == "PIX"
    assert topo.nic("mlx5_6").label == "NIC6"


def test_nearest_nic_per_gpu_on_hgx() -> None:
    topo = parse_nvidia_smi_topo(read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"))
    assert nearest_nics(topo) == {i: [f"mlx5_{i}"] for i in range(8)}
    assert nic_per_gpu(topo) == {i: f"mlx5_{i}" for i in range(8)}


def test_nearest_nics_falls_back_to_the_next_rank_when_the_local_nic_is_unusable() -> None:
    topo = parse_nvidia_smi_topo(read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"))
    usable = {f"mlx5_{i}" for i in range(8)} - {"mlx5_0"}
    nearest = nearest_nics(topo, usable)
    # GPU0 loses its PIX NIC; the NODE-level NICs of its own socket are next, not the SYS ones
    assert nearest[0] == ["mlx5_1", "mlx5_2", "mlx5_3"]
    assert nearest[1] == ["mlx5_1"]


def test_nic_per_gpu_spreads_equally_near_nics() -> None:
    topo = parse_nvidia_smi_topo(read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt"))
    chosen = nic_per_gpu(topo, usable={"mlx5_1", "mlx5_2"})
    assert chosen[1] == "mlx5_1"  # PIX
    assert chosen[2] == "mlx5_2"  # PIX
    assert chosen[0] == "mlx5_1"  # tie at NODE, first in NIC order
    assert chosen[3] == "mlx5_2"  # tie at NODE, mlx5_1 already carries two GPUs
    assert [chosen[i] for i in (4, 5, 6, 7)] == ["mlx5_1", "mlx5_2", "mlx5_1", "mlx5_2"]


def test_tab_separated_output_with_nics_parses_like_the_space_separated_one() -> None:
    spaced = read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt")
    lines = spaced.splitlines()
    end = lines.index("")  # the matrix: header and rows, up to the first blank line
    tabbed = "\n".join(
        ["\t" + "\t".join(lines[0].split())]
        + ["\t".join(line.split()) for line in lines[1:end]]
        + lines[end:]
    )
    assert "\tCPU\tAffinity" in tabbed
    assert parse_nvidia_smi_topo(tabbed) == parse_nvidia_smi_topo(spaced)


def test_older_layout_naming_nic_columns_directly() -> None:
    """Drivers before the NIC legend existed named the columns after the devices (a minimal
    sample of that layout, written for this test)."""
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tmlx5_1\tCPU Affinity\n"
        "GPU0\t X \tNV4\tPIX\tSYS\t0-23\n"
        "GPU1\tNV4\t X \tSYS\tPIX\t24-47\n"
        "mlx5_0\tPIX\tSYS\t X \tSYS\t\n"
        "mlx5_1\tSYS\tPIX\tSYS\t X \t\n"
        "\nLegend:\n"
    )
    topo = parse_nvidia_smi_topo(text)
    assert [n.name for n in topo.nics] == ["mlx5_0", "mlx5_1"]
    assert [g.cpu_affinity for g in topo.gpus] == ["0-23", "24-47"]
    assert topo.nvlinks(0, 1) == 4
    assert nearest_nics(topo) == {0: ["mlx5_0"], 1: ["mlx5_1"]}


def test_topology_without_header_or_with_a_short_row_is_refused() -> None:
    with pytest.raises(FactParseError, match="no header"):
        parse_nvidia_smi_topo("NVIDIA-SMI has failed because it couldn't communicate")
    lines = read("hgx-h100-sglang-30401/nvidia-smi-topo-m.txt").splitlines()
    lines[3] = lines[3].rsplit("NODE", 1)[0]
    with pytest.raises(FactParseError, match="row GPU2 has"):
        parse_nvidia_smi_topo("\n".join(lines))


# ---------------------------------------------------------------- ibstat / ibv_devinfo


def test_ibstat_all_active_h100() -> None:
    ports = parse_ibstat(read("gpud-h100/ibstat.47.0.h100.all.active.2"))
    assert [p.ca for p in ports] == [
        "mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9",
        "mlx5_bond_0",
    ]  # fmt: skip
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    assert len(ib) == 8
    assert all(p.active and p.rate_gbps == 400 and p.physical_state == "LinkUp" for p in ib)
    assert all(p.ca_type == "MT4129" and p.firmware == "28.41.1000" for p in ib)
    bond = ports[-1]
    assert (bond.link_layer, bond.rate_gbps, bond.ca_type) == ("Ethernet", 200, "MT41692")


def test_ibstat_with_down_ethernet_ports() -> None:
    ports = parse_ibstat(read("gpud-h100/ibstat.47.0.h100.some.down.0"))
    assert len(ports) == 12
    down = {p.name: (p.state, p.physical_state, p.rate_gbps, p.link_layer) for p in ports}
    down = {name: row for name, row in down.items() if row[0] != "Active"}
    assert down == {
        "mlx5_2/1": ("Down", "Disabled", 40, "Ethernet"),
        "mlx5_7/1": ("Down", "Disabled", 40, "Ethernet"),
        "mlx5_8/1": ("Down", "Disabled", 40, "Ethernet"),
    }
    active_ndr = sorted(p.ca for p in ports if p.active and p.rate_gbps == 400)
    assert active_ndr == sorted(f"mlx5_{i}" for i in (0, 3, 4, 5, 6, 9, 10, 11))


def test_ibstat_with_a_polling_port() -> None:
    text = read("gpud-h100/ibstat.47.0.h100.some.down.with.polling.1")
    ports = {p.ca: p for p in parse_ibstat(text)}
    assert (ports["mlx5_11"].state, ports["mlx5_11"].physical_state) == ("Down", "Polling")
    assert (ports["mlx5_5"].state, ports["mlx5_5"].physical_state) == ("Down", "Disabled")
    assert ports["mlx5_0"].link_layer == "Ethernet"  # RoCE rail NIC
    assert ports["mlx5_0"].rate_gbps == 400


def test_ibv_devinfo_active_and_down() -> None:
    ports = parse_ibv_devinfo(read("deepep-223/ibv_devinfo.txt"))
    assert [(p.name, p.state, p.link_layer) for p in ports] == [
        ("mlx5_0/1", "Active", "Ethernet"),
        ("mlx5_1/1", "Down", "Ethernet"),
        ("mlx5_2/1", "Active", "InfiniBand"),
    ]
    assert ports[2].ca_type == "MT4123"
    assert ports[0].rate_gbps is None  # the plain form prints no rate


def test_ibv_devinfo_two_port_hcas() -> None:
    ports = parse_ibv_devinfo(read("heioy-books/ibv_devinfo.txt"))
    assert [(p.name, p.state) for p in ports] == [
        ("mlx4_1/1", "Active"), ("mlx4_1/2", "Down"), ("mlx4_0/1", "Active"), ("mlx4_0/2", "Down"),
    ]  # fmt: skip


def test_ibv_devinfo_verbose_gives_rate_and_physical_state() -> None:
    (port,) = parse_ibv_devinfo(read("heioy-books/ibv_devinfo-d-mlx4_1-i-2-v.txt"))
    assert port.name == "mlx4_1/2"
    assert (port.state, port.physical_state) == ("Down", "Polling")
    assert port.rate_gbps == 10.0  # 4X lanes at 2.5 Gbps


def test_rdma_tools_that_print_nothing_useful_are_refused() -> None:
    with pytest.raises(FactParseError, match="ibstat"):
        parse_ibstat("ibpanic: [12] main: stat of IB device 'mlx5_8' failed")
    with pytest.raises(FactParseError, match="ibv_devinfo"):
        parse_ibv_devinfo("Failed to get IB devices list: Unknown error -38")
    assert parse_ibstat("") == ()


# ---------------------------------------------------------------- df, ss, clock, os, systemd


def test_df_full_and_avail_only() -> None:
    assert parse_df_bytes(read("h100-x1/df-B1.txt")) == 68702420992
    assert parse_df_bytes(read("dev-host/df-B1-output-avail.txt")) == 79074615296


def test_df_in_human_units_is_refused() -> None:
    with pytest.raises(FactParseError, match="-B1"):
        parse_df_bytes("Avail\n 64G\n")


def test_ss_listening_ports() -> None:
    sockets = parse_listening_ports(read("dev-host/ss-Hltn.txt"))
    assert [(s.address, s.port) for s in sockets] == [
        ("0.0.0.0", 30000), ("0.0.0.0", 8998), ("0.0.0.0", 2024), ("*", 5757),
    ]  # fmt: skip
    assert bound_ports(sockets) == {30000, 8998, 2024, 5757}
    assert 8000 not in bound_ports(sockets)


def test_ss_ipv6_and_header() -> None:
    text = (
        "State Recv-Q Send-Q Local Address:Port Peer Address:Port\nLISTEN 0 4096 [::]:22 [::]:*\n"
    )
    assert [(s.address, s.port) for s in parse_listening_ports(text)] == [("[::]", 22)]


@pytest.mark.parametrize(
    ("name", "synced", "source"),
    [
        ("timedatectl/xen-api-6743-status-synced.txt", True, "timedatectl"),
        ("timedatectl/cb1-188-status-unsynced.txt", False, "timedatectl"),
        ("dev-host/chronyc-tracking-unsynced.txt", False, "chrony"),
    ],
)
def test_clock_sync(name: str, synced: bool, source: str) -> None:
    clock = parse_clock_sync(read(name))
    assert clock.synchronized is synced
    assert clock.source == source


def test_clock_sync_from_timedatectl_show() -> None:
    assert parse_clock_sync("NTP=yes\nNTPSynchronized=yes\n").synchronized is True
    assert parse_clock_sync("NTP=no\nNTPSynchronized=no\n").synchronized is False
    with pytest.raises(FactParseError):
        parse_clock_sync("System has not been booted with systemd as init system (PID 1).")


def test_os_release_and_kernel() -> None:
    os = parse_os_release(read("h100-x1/os-release.txt"))
    assert (os.id, os.version_id, os.version_codename) == ("ubuntu", "24.04", "noble")
    assert os.pretty_name == "Ubuntu 24.04.3 LTS"
    assert os.id_like == ("debian",)
    assert parse_kernel_release(read("h100-x1/uname-a.txt")) == "6.18.44-fc-v657-gpu"
    assert parse_kernel_release("6.8.0-49-generic\n") == "6.8.0-49-generic"


def test_os_release_garbage_is_refused() -> None:
    with pytest.raises(FactParseError, match="no ID"):
        parse_os_release('NAME="Something"\n')
    with pytest.raises(FactParseError, match="line 1"):
        parse_os_release("cat: /etc/os-release: No such file or directory\n")


@pytest.mark.parametrize("state", ["active", "inactive", "failed"])
def test_fabric_manager_is_active(state: str) -> None:
    assert parse_service_state(read(f"fabricmanager/is-active-{state}.txt")) == state


def test_fabric_manager_status_output_and_garbage() -> None:
    status = (
        "● nvidia-fabricmanager.service - NVIDIA fabric manager service\n"
        "     Loaded: loaded (/lib/systemd/system/nvidia-fabricmanager.service; enabled)\n"
        "     Active: failed (Result: exit-code) since Tue 2025-01-07 10:00:00 UTC\n"
    )
    assert parse_service_state(status) == "failed"
    with pytest.raises(FactParseError, match="not a unit state"):
        parse_service_state("running\n")
