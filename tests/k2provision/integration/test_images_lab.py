"""The images phase on the PD cluster's real lab hosts, with a registry of the lab's own
(Debian's docker-registry on the bridge address, k2lab/registry.py) holding the image the
inventory names (k2_image), which no host's store has: `apply --tags prepare` pulls it once, on
the first host, and streams it from there to the other three (the weights' relay carrying its
`docker save` archive), each loading it and checking the image ID; the registry's access log
counts the pulls. The image is a real one of one 32 MB layer of random bytes (the phase moves
it; no container runs from it here, so it need not be the stand-in's 555 MB). Then a host
holding a corrupted copy of the archive (as a cut or damaged transfer leaves it) is repaired,
and a host that lost the image (a replaced host, a spare) gets it from a peer, not from the
registry, even in a run limited to the hosts that lack it."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k2lab import registry
from k2lab.config import LabConfig
from k2lab.hosts import stop_listener
from k2lab.images import import_image
from k2lab.images import remove_image as remove_from_store
from tests.pd_lab import k2
from tests.runners import newest_record, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]

REPOSITORY = "k2/images-test"
LOCAL = "localhost/k2-images-test:lab"
STREAM_DIR = "/var/lib/k2provision/images"
PULL_TASK = "Images | Pull the image once, on its first host"
LOAD_TASK = "Images | Load the verified archive"


def image_id(state: Any, host: str, image: str) -> str:
    out = on_host(state, host, f"docker image inspect --format '{{{{.Id}}}}' {image}", check=False)
    return out.strip()


def remove_image(state: Any, hosts: list[str], image: str) -> None:
    for host in hosts:
        on_host(state, host, f"docker image rm --force {image} >/dev/null 2>&1 || true")


@pytest.fixture(scope="module")
def images(
    pd_cluster: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path, LabConfig, str]]:
    """The PD cluster, its inventory pointed at the lab registry's copy of the stand-in
    (k2_image), the registry up and holding it, no host holding it."""
    state, inventory = pd_cluster
    cfg = LabConfig.default()
    layer = tmp_path_factory.mktemp("layer")
    (layer / "random.bin").write_bytes(os.urandom(32 << 20))
    with tarfile.open(layer / "rootfs.tar", "w") as tar:
        tar.add(layer / "random.bin", arcname="random.bin")
    import_image(cfg, LOCAL, layer / "rootfs.tar")
    started = registry.start_registry(cfg)
    try:
        image = registry.push(cfg, LOCAL, f"{REPOSITORY}:pulled")
        remove_from_store(cfg, LOCAL)  # in the registry only: no host sees it in the lab's store
        hosts = [h.name for h in state.hosts]
        remove_image(state, hosts, image)
        own = tmp_path_factory.mktemp("images") / "images.ini"
        own.write_text(inventory.read_text() + f"k2_image={image}\n")
        yield state, own, cfg, image
        remove_image(state, hosts, image)
    finally:
        stop_listener(started)


def changed_hosts(record: Path, task: str) -> set[str]:
    """The hosts a task changed something on, from the run's events (a run_once task delegated
    to another host is reported under the host it ran for, the play's first)."""
    found = set()
    for path in record.glob("artifacts/*/job_events/*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == task and res.get("changed"):
            found.add(str(data["host"]))
    return found


def summaries(record: Path) -> dict[str, dict[str, Any]]:
    """Each receiving host's last relay summary, from the run's images progress file."""
    out = {}
    for line in (record / "images-progress.jsonl").read_text().splitlines():
        data = json.loads(line)
        if data.get("event") == "summary":
            out[str(data["host"])] = data
    return out


def test_one_pull_then_host_to_host_every_copy_verified(
    images: tuple[Any, Path, LabConfig, str], tmp_path: Path
) -> None:
    state, inventory, cfg, image = images
    hosts = [h.name for h in state.hosts]

    check = k2("apply", str(inventory), "--tags", "prepare", "--check", runs=tmp_path)
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert f"{image}: pulled once on lab1, streamed to lab2, lab3, lab4" in check.stdout
    assert registry.pulls(cfg, REPOSITORY) == []  # --check pulls nothing
    assert image_id(state, "lab2", image) == ""

    out = k2("apply", str(inventory), "--tags", "prepare", runs=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    fetched = registry.pulls(cfg, REPOSITORY)
    assert fetched, "the registry served no blob"
    assert {f.client for f in fetched} == {state.hosts[0].address}  # one host pulled
    assert len({f.path for f in fetched}) == len(fetched)  # each layer once
    ids = {host: image_id(state, host, image) for host in hosts}
    assert len(set(ids.values())) == 1, ids
    assert len(ids["lab1"].removeprefix("sha256:")) == 64, ids
    record = newest_record(tmp_path)
    assert changed_hosts(record, PULL_TASK) == {"lab1"}
    assert changed_hosts(record, LOAD_TASK) == {"lab2", "lab3", "lab4"}
    arrived = summaries(record)
    assert {h: s["status"] for h, s in arrived.items()} == dict.fromkeys(hosts[1:], "ok")
    assert all(s["received"] == 1 for s in arrived.values())
    assert on_host(state, "lab3", f"ls -A {STREAM_DIR} | grep -v relay.pyz || true").strip() == ""


def test_a_corrupted_hop_is_repaired_and_a_host_that_lost_it_gets_it_from_a_peer(
    images: tuple[Any, Path, LabConfig, str], tmp_path: Path
) -> None:
    state, inventory, cfg, image = images
    source_id = image_id(state, "lab1", image)
    assert source_id, "runs after the first test, which pulled it"
    pulled = len(registry.pulls(cfg, REPOSITORY))
    size = int(on_host(state, "lab1", f"docker save {image} | wc -c").strip())
    remove_image(state, ["lab2", "lab3"], image)
    # lab2, the chain's first hop, holds an archive of the right size and wrong bytes.
    archive = f"{STREAM_DIR}/{source_id.removeprefix('sha256:')[:16]}/archive/image.tar"
    on_host(state, "lab2", f"mkdir -p $(dirname {archive}) && truncate -s {size} {archive}")

    # A run of the two alone, as for hosts added later: the peer is outside the run.
    out = k2("apply", str(inventory), "--tags", "prepare", "--limit", "lab2,lab3", runs=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert len(registry.pulls(cfg, REPOSITORY)) == pulled  # from a peer, not the registry
    record = newest_record(tmp_path)
    arrived = summaries(record)
    assert set(arrived) == {"lab2", "lab3"}
    assert arrived["lab2"]["status"] == "ok"
    assert arrived["lab2"]["repaired"] == 1
    assert arrived["lab3"]["status"] == "ok"
    assert arrived["lab3"]["received"] == 1
    assert changed_hosts(record, LOAD_TASK) == {"lab2", "lab3"}
    assert changed_hosts(record, PULL_TASK) == set()
    for host in ("lab2", "lab3", "lab4"):
        assert image_id(state, host, image) == source_id, host


def test_a_registry_that_refuses_is_named_with_the_fix_and_nothing_is_loaded(
    images: tuple[Any, Path, LabConfig, str], tmp_path: Path
) -> None:
    state, inventory, _cfg, image = images
    missing = image.replace(":pulled", ":never-pushed")
    wrong = inventory.with_name("missing.ini")
    wrong.write_text(inventory.read_text().replace(image, missing))
    out = k2("apply", str(wrong), "--tags", "prepare", runs=tmp_path)
    assert out.returncode != 0
    said = " ".join((out.stdout + out.stderr).split())
    assert f"lab1: docker pull {missing} failed" in said, said[-3000:]
    assert "the registry has no such image; fix: check the tag" in said
    assert changed_hosts(newest_record(tmp_path), LOAD_TASK) == set()
    for host in ("lab1", "lab2", "lab3", "lab4"):
        assert image_id(state, host, missing) == "", host
