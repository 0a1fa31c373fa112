"""The image broadcast benchmark's own pieces, without root, podman or a registry: its podman
command lines stay on their own store, the registry's access log is read right, and a run
whose image is not on every host gives no figure."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from benchmarks import images_broadcast as ib
from benchmarks.outcome import Outcome

IMAGE = "02da583fdfda14f32645abe336fde1ce00d2c632a206109e840b74a1b1beddb1"
LAYER = "sha256:06a0266dd086d83e7fe5876f84b97c489ad97e0a97c9353cea08656df7321f45"


def test_podman_runs_on_its_own_store_inside_the_namespace() -> None:
    argv = ib.podman_argv(Path("/s/h1"), "load", "-i", "/a.tar", netns="k2ib-h1")
    assert argv[:2] == ["nsenter", "--net=/run/netns/k2ib-h1"]
    flags = dict(zip(argv[3:15:2], argv[4:15:2], strict=True))
    assert flags == {"--root": "/s/h1/root", "--runroot": "/s/h1/run", "--tmpdir": "/s/h1/libpod",
                     "--storage-driver": "vfs", "--cgroup-manager": "cgroupfs",
                     "--events-backend": "file"}  # fmt: skip
    assert argv[-3:] == ["load", "-i", "/a.tar"]
    assert ib.podman_argv(Path("/s"), "images")[0] == "podman"


def test_the_registry_config_names_its_root_and_address() -> None:
    text = ib.registry_config(Path("/s/registry"), "10.93.0.1:29528")
    assert "version: 0.1\n" in text
    assert "    rootdirectory: /s/registry\n" in text
    assert "  addr: 10.93.0.1:29528\n" in text


def test_a_blob_sent_whole_is_read_from_the_access_log() -> None:
    line = (
        f'10.93.0.12 - - [29/Nov/2026:10:13:12 +0000] "GET /v2/bench/image/blobs/{LAYER}'
        ' HTTP/1.1" 200 268459655 "" "containers/5.23.1 (github.com/containers/image)"'
    )
    assert ib.blob_sent(line) == ("10.93.0.12", LAYER, 268459655)
    assert ib.blob_sent(line.replace('" 200 ', '" 404 ')) is None
    assert ib.blob_sent(line.replace("/blobs/", "/manifests/")) is None
    assert ib.blob_sent('time="..." level=info msg="response completed"') is None


def test_a_failed_load_says_why_the_docker_archive_did_not_load() -> None:
    stderr = ("Error: payload does not match any of the supported image formats:\n"
              " * oci: no index.json\n * docker-archive: writing blob: no space left on device\n"
              " * dir: open a.tar/manifest.json: not a directory\n")  # fmt: skip
    assert ib.last_line(stderr) == "* docker-archive: writing blob: no space left on device"
    assert ib.last_line("Trying to pull ...\nError: connection refused\n") == (
        "Error: connection refused"
    )
    assert ib.last_line("") == ""


def test_every_host_must_hold_the_source_image() -> None:
    good = [ib.HostImage(f"h{i}", f"10.93.0.{10 + i}", image_id=IMAGE) for i in (1, 2)]
    assert ib.verdict(IMAGE, good) == ""
    bad = [
        *good,
        ib.HostImage("h3", "10.93.0.13", image_id="ffff" + IMAGE[4:]),
        ib.HostImage("h4", "10.93.0.14", error="podman load -i exited 125: no space"),
        ib.HostImage("h5", "10.93.0.15"),
        ib.HostImage("h6", "10.93.0.16"),
    ]
    why = ib.verdict(IMAGE, bad)
    assert why.startswith("4 of 6 hosts without the image (")
    assert f"h3: image ffff{IMAGE[4:12]} is not {IMAGE[:12]}" in why
    assert "h4: podman load -i exited 125: no space" in why
    assert "h5: image missing" in why
    assert why.endswith("; 1 more)")


def timing(seconds: float, why: str = "") -> ib.Timing:
    return ib.Timing(seconds, transfer=seconds - 2.0, alone=1.0, busy=0.5, own=0.25,
                     load_average=1.0, why=why)  # fmt: skip


def test_a_run_without_the_image_everywhere_prints_no_figure_and_no_row() -> None:
    out = io.StringIO()
    outcome = Outcome(out=out)
    chain = ib.report(4, "chain", 100.0, 100_000_000, timing(10.0, "1 of 4 hosts ..."), outcome)
    pull = ib.report(4, "pull", 100.0, 100_000_000, timing(32.0), outcome)
    text = out.getvalue()
    assert text.splitlines()[0] == "NOT OK: N=4 chain: 1 of 4 hosts ..."
    assert "efficiency" not in chain
    # 100 MB at 100 Mbit/s is 8 s of link: 8 / 32.
    assert pull["efficiency"] == pytest.approx(0.25)
    assert "  30.00   2.00      0.250" in text
    assert "load tail 2.00 s (one host's whole pull alone 1.00 s); CPU busy 50%" in text
    assert ib.markdown_table([chain, pull]) == []
    assert outcome.finish() == 1


def test_an_ok_pair_gives_one_table_row_with_the_ratio() -> None:
    outcome = Outcome(out=io.StringIO())
    rows = [ib.report(4, "chain", 100.0, 100_000_000, timing(10.0), outcome),
            ib.report(4, "pull", 100.0, 100_000_000, timing(32.0), outcome)]  # fmt: skip
    assert (
        ib.markdown_table(rows)[-1]
        == "| 4 | 100.0 | 100.0 | 10.00 | 32.00 | 0.800 | 0.250 | 3.20x |"
    )
    assert outcome.finish() == 0


def test_the_scratch_holds_three_copies_per_host_and_the_seeds() -> None:
    size = 256_000_000
    assert ib.scratch_bytes(size, 16) >= 3 * 17 * size
    assert ib.scratch_bytes(size, 16) > ib.scratch_bytes(size, 8)


def test_a_process_cpu_is_read_from_its_stat() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    stat = f"42 (docker registry) S 1 42 42 0 -1 4194560 100 0 0 0 {3 * tick} {tick} 0 0 20 0 9"
    assert ib.proc_cpu(stat) == pytest.approx(4.0)
    assert ib.proc_cpu(Path(f"/proc/{os.getpid()}/stat").read_text()) > 0
