"""The lab registry's configuration and the reading of its access log (no root, no registry:
the lines below are in the form docker-registry 2.8 writes them)."""

from __future__ import annotations

from pathlib import Path

from k2lab import registry
from k2lab.config import LabConfig

LOG = """\
time="2026-11-29T10:11:20Z" level=warning msg="No HTTP secret provided - generated random secret."
10.76.0.11 - - [29/Nov/2026:10:11:22 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "containers/5.23.1"
10.76.0.11 - - [29/Nov/2026:10:11:22 +0000] "GET /v2/k2/standin/manifests/pulled HTTP/1.1" 200 1054 "" "containers/5.23.1"
10.76.0.11 - - [29/Nov/2026:10:11:22 +0000] "GET /v2/k2/standin/blobs/sha256:aa HTTP/1.1" 200 503 "" "containers/5.23.1"
10.76.0.11 - - [29/Nov/2026:10:11:23 +0000] "GET /v2/k2/standin/blobs/sha256:bb HTTP/1.1" 200 81293337 "" "containers/5.23.1"
10.76.0.12 - - [29/Nov/2026:10:11:24 +0000] "HEAD /v2/k2/standin/blobs/sha256:aa HTTP/1.1" 200 0 "" "containers/5.23.1"
10.76.0.13 - - [29/Nov/2026:10:11:24 +0000] "GET /v2/k2/other/blobs/sha256:cc HTTP/1.1" 200 9 "" "containers/5.23.1"
10.76.0.14 - - [29/Nov/2026:10:11:25 +0000] "GET /v2/k2/standin/blobs/sha256:dd HTTP/1.1" 404 9 "" "containers/5.23.1"
"""  # noqa: E501


def cfg(tmp_path: Path) -> LabConfig:
    return LabConfig(lab_dir=tmp_path, name="k2labt", subnet="10.76.0.0/24")


def test_a_pull_is_counted_by_its_blob_downloads_and_their_client(tmp_path: Path) -> None:
    lab = cfg(tmp_path)
    registry.log_file(lab).parent.mkdir(parents=True)
    registry.log_file(lab).write_text(LOG)
    assert len(registry.fetches(lab)) == 7
    pulled = registry.pulls(lab, "k2/standin")
    assert [(f.client, f.path) for f in pulled] == [
        ("10.76.0.11", "/v2/k2/standin/blobs/sha256:aa"),
        ("10.76.0.11", "/v2/k2/standin/blobs/sha256:bb"),
    ]  # a HEAD, another repository and a 404 are no downloads


def test_no_log_yet_is_no_pull(tmp_path: Path) -> None:
    assert registry.pulls(cfg(tmp_path), "k2/standin") == []


def test_it_serves_plain_http_on_the_bridge_address_from_the_instance_dir(tmp_path: Path) -> None:
    lab = cfg(tmp_path)
    text = registry.config_text(lab)
    assert f"addr: {lab.controller_ip}:5000" in text
    assert f"rootdirectory: {tmp_path}/instances/k2labt/registry/data" in text
    assert lab.registry == "10.76.0.1:5000"
