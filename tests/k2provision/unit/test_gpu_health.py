"""GPU health parsers against captured and documented tool outputs: kernel-log XIDs, nvidia-smi
XML ECC and row-remap state, dcgmi diag JSON, and the per-host verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from k2provision.core.gpu_health import (
    FATAL_XIDS,
    NO_LINK,
    down_links,
    host_gpu_health,
    parse_dcgm_diag,
    parse_memory_health,
    parse_nvlink_status,
    parse_xids,
    xids_since_driver_load,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GPU = FIXTURES / "gpu_health"
H100_XML = (FIXTURES / "hardware" / "h100-x1" / "nvidia-smi-q-x.xml").read_text()


def test_xid_lines_are_read_and_only_79_is_fatal() -> None:
    events = parse_xids((GPU / "kernel-log-xid.txt").read_text())
    assert [(e.pci, e.xid, e.fatal) for e in events] == [
        ("0000:18:00", 13, False),
        ("0000:18:00", 13, False),
        ("0000:bb:00", 79, True),
    ]
    assert "GPU has fallen off the bus" in str(events[2])


def test_the_fatal_list_keeps_application_xids_out() -> None:
    assert {13, 31, 43, 45}.isdisjoint(FATAL_XIDS)
    assert {48, 79, 94, 95}.issubset(FATAL_XIDS)


def test_healthy_captures_have_no_memory_problems() -> None:
    for case in ("h100-x1", "h200-x1", "h200-x1-old-driver"):
        xml = (FIXTURES / "hardware" / case / "nvidia-smi-q-x.xml").read_text()
        gpus = parse_memory_health(xml)
        assert len(gpus) == 1, case
        assert gpus[0].problems() == [], case


def test_uncorrectable_ecc_and_a_failed_remap_are_found() -> None:
    broken = (
        H100_XML.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<", 1)
        .replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<", 1)
        .replace("<dram_uncorrectable>0<", "<dram_uncorrectable>3<", 1)
    )
    (gpu,) = parse_memory_health(broken)
    assert (gpu.uncorrectable_ecc, gpu.remap_pending, gpu.remap_failure) == (3, True, True)
    assert len(gpu.problems()) == 3


def test_dcgm_diag_results_per_gpu() -> None:
    results = parse_dcgm_diag((GPU / "dcgmi-diag-r1-fail.json").read_text())
    failed = [r for r in results if r.failed]
    assert [(r.test, r.gpu) for r in failed] == [("Page Retirement/Row Remap", "1")]
    assert "row remapping failed" in failed[0].info
    assert not any(r.failed for r in parse_dcgm_diag((GPU / "dcgmi-diag-r1-pass.json").read_text()))


def test_the_host_verdict_names_every_problem() -> None:
    bad = host_gpu_health(
        "gpu-d01",
        kernel_log=(GPU / "kernel-log-xid.txt").read_text(),
        smi_xml=H100_XML,
        diag_json=(GPU / "dcgmi-diag-r1-fail.json").read_text(),
    )
    assert not bad.ok
    assert len(bad.problems) == 2
    assert bad.problems[0].startswith("XID 79 on GPU 0000:bb:00 (GPU has fallen off the bus)")
    assert bad.problems[1].startswith("DCGM diag Page Retirement/Row Remap failed on GPU 1")
    good = host_gpu_health(
        "gpu-d02",
        kernel_log="[1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception",
        smi_xml=H100_XML,
        diag_json=(GPU / "dcgmi-diag-r1-pass.json").read_text(),
    )
    assert good.ok


def test_nvlink_state_per_gpu_and_link() -> None:
    healthy = parse_nvlink_status((GPU / "nvidia-smi-nvlink-s-hgx-h100.txt").read_text())
    assert len(healthy) == 8 * 18
    assert all(link.up for link in healthy)
    down = parse_nvlink_status((GPU / "nvidia-smi-nvlink-s-hgx-h100-link-down.txt").read_text())
    assert [(link.gpu, link.link, link.state) for link in down if not link.up] == [
        (3, 7, "<inactive>")
    ]
    # Only a rate says a link works; a GPU without NVLink lists no link.
    (odd,) = parse_nvlink_status("GPU 0: NVIDIA H100 (UUID: GPU-a)\n\t Link 0: N/A\n")
    assert not odd.up
    assert parse_nvlink_status("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n") == ()


def test_a_down_nvlink_is_a_problem_of_the_host() -> None:
    text = (GPU / "nvidia-smi-nvlink-s-hgx-h100-link-down.txt").read_text()
    verdict = host_gpu_health("gpu-01", nvlink_status=text)
    assert verdict.problems == ("GPU 3 NVLink 7 is down (nvidia-smi nvlink -s: <inactive>)",)
    up = (GPU / "nvidia-smi-nvlink-s-hgx-h100.txt").read_text()
    assert host_gpu_health("gpu-01", nvlink_status=up).ok


def test_a_gpu_with_no_active_link_is_down_only_beside_other_gpus() -> None:
    message = "NVML: Unable to retrieve NVLink information as all links are inActive"
    header = "GPU {n}: NVIDIA H100 80GB HBM3 (UUID: GPU-{n}) " + message + "\n"
    up = (GPU / "nvidia-smi-nvlink-s-hgx-h100.txt").read_text()
    eight = up.replace(up[up.index("GPU 5:") : up.index("GPU 6:")], header.format(n=5))
    assert host_gpu_health("gpu-01", nvlink_status=eight).problems == (
        f"GPU 5 has no active NVLink (nvidia-smi nvlink -s: {message})",
    )
    # A lone GPU without NVLink (a one-GPU VM) has nothing to lose.
    assert host_gpu_health("vm-01", nvlink_status=header.format(n=0)).ok


def test_xids_count_from_the_driver_s_last_load() -> None:
    log = (GPU / "kernel-log-xid-driver-reloaded.txt").read_text()
    assert [e.xid for e in parse_xids(log)] == [79, 13]
    # The XID 79 came before the driver was reloaded: only the XID 13 after it counts.
    assert [(e.pci, e.xid) for e in xids_since_driver_load(log)] == [("0000:18:00", 13)]
    assert host_gpu_health("gpu-d01", kernel_log=log).ok
    # A log whose only load line precedes the XID (this boot's first load) keeps it.
    once = (GPU / "kernel-log-xid.txt").read_text()
    assert [e.xid for e in xids_since_driver_load(once)] == [13, 13, 79]
    assert not host_gpu_health("gpu-d01", kernel_log=once).ok
    # Without any load line (a log that starts after it) every XID counts.
    (fatal,) = xids_since_driver_load("[9.0] NVRM: Xid (PCI:0000:bb:00): 79, pid=1, off the bus\n")
    assert fatal.fatal


def test_dcgm_4_results_per_gpu() -> None:
    results = parse_dcgm_diag((GPU / "dcgmi-diag-r1-fail-dcgm4.json").read_text())
    assert [(r.test, r.gpu, r.status) for r in results] == [
        ("software", "0", "Pass"),
        ("software", "1", "Fail"),
    ]
    assert results[1].info == "GPU 1 had uncorrectable memory errors and row remapping failed."
    passed = parse_dcgm_diag((GPU / "dcgmi-diag-r1-pass-dcgm4.json").read_text())
    assert len(passed) == 2
    assert not any(r.failed for r in passed)
    bad = host_gpu_health("gpu-d01", diag_json=(GPU / "dcgmi-diag-r1-fail-dcgm4.json").read_text())
    assert bad.problems == (
        "DCGM diag software failed on GPU 1: GPU 1 had uncorrectable memory errors and row "
        "remapping failed.",
    )


def test_a_dcgm_4_failure_tied_to_no_gpu_fails_through_the_test_summary() -> None:
    doc = (GPU / "dcgmi-diag-r1-pass-dcgm4.json").read_text()
    failed = doc.replace(
        '"test_summary" : {\n                     "status" : "Pass"',
        '"test_summary" : {\n                     "status" : "Fail", "info" : ["no CUDA context"]',
    )
    assert failed != doc
    (summary,) = [r for r in parse_dcgm_diag(failed) if r.failed]
    assert (summary.test, summary.gpu, summary.info) == ("software", "all", "no CUDA context")


@pytest.mark.parametrize(
    "text",
    [
        "Error: unable to establish a connection to the specified host: localhost",
        "{}",
        '{"DCGM GPU Diagnostic": {"version": "3.3.9"}}',
        '{"DCGM Diagnostic": {"test_categories": []}, "metadata": {"version": "4.4.2"}}',
        '{"DCGM Diagnostic": {"runtime_error": "Host engine not reachable", "version": "4.4.2"}}',
        '{"Some Future Root": {"test_categories": [{"tests": [{"name": "software"}]}]}}',
    ],
)
def test_a_dcgm_document_without_results_is_unreadable_not_passing(text: str) -> None:
    with pytest.raises(ValueError, match="dcgmi diag"):
        parse_dcgm_diag(text)


def test_all_links_inactive_on_the_line_after_the_gpu_header() -> None:
    text = (GPU / "nvidia-smi-nvlink-s-hgx-h100-gpu5-all-inactive.txt").read_text()
    message = "NVML: Unable to retrieve NVLink information as all links are inActive"
    (down,) = down_links(parse_nvlink_status(text))
    assert (down.gpu, down.link, down.state) == (5, NO_LINK, message)
    assert host_gpu_health("gpu-01", nvlink_status=text).problems == (
        f"GPU 5 has no active NVLink (nvidia-smi nvlink -s: {message})",
    )
