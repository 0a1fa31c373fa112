"""The weights phase on real lab hosts: a synthetic Kimi-shaped set from the first host to the
other three along the relay chain, then the faults: a corrupted shard, a host killed in the
middle of the stream, a full disk, a no-op re-run, and a hub token that must never be written
down. Every run goes through the command a user types (the same function
``k2provision weights`` mounts) or plain ansible-playbook."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as lab_api
from tests.runners import k2, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
MODEL_DIR = "/models/k2-weights-test"
STATE_DIR = "/var/lib/k2provision/weights"
SHARDS = 3
SHARD_BYTES = 8 << 20
FAKE_TOKEN = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi"
BASE_VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_context_length": 32768,
    "k2_weights_source": "synthetic",
    "k2_weights_synthetic_shards": SHARDS,
    "k2_weights_synthetic_shard_bytes": SHARD_BYTES,
    "k2_weights_poll_interval": 1,
    "k2_weights_relink_timeout": 30,
    "k2_weights_checkpoint_bytes": 1 << 20,
}


def weights(
    inventory: Path, *args: str, runs: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The weights command, as a user runs it."""
    return k2(
        "weights", str(inventory), *args, runs=runs, timeout=600, COLUMNS="200", **(env or {})
    )


def newest_record(runs: Path) -> Path:
    return max(runs.iterdir(), key=lambda p: p.stat().st_mtime)


def record_of(runs: Path) -> dict[str, Any]:
    return dict(json.loads((newest_record(runs) / "weights.json").read_text()))


def changed_by_host(runs: Path) -> dict[str, int]:
    summary = json.loads((newest_record(runs) / "summary.json").read_text())
    return {h: int(c.get("changed", 0)) for h, c in summary["hosts"].items()}


def hosts_of(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in record["hosts"]}


def shard(i: int) -> str:
    return f"model-{i}-of-{SHARDS}.safetensors"


def copies_match_manifest(state: Any, manifest: dict[str, Any], model_dir: str) -> None:
    """Every host holds every file of the manifest, byte for byte (sha256sum there)."""
    expected = {f["name"]: f["sha256"] for f in manifest["files"]}
    for host in state.hosts:
        out = on_host(state, host.name, f"cd {model_dir} && sha256sum {' '.join(expected)}")
        found = {line.split()[1]: line.split()[0] for line in out.splitlines()}
        assert found == expected, host.name
        modes = on_host(state, host.name, f"stat -c '%a %n' {model_dir} {model_dir}/*")
        assert all(line.split()[0] in ("644", "755") for line in modes.splitlines()), modes


@pytest.fixture(scope="module")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """4 lab hosts (2 prefill, 2 decode), a synthetic source seeded at lab1 into its model dir."""
    inventory = tmp_path_factory.mktemp("weights-inv") / "weights.ini"
    state = lab_api.up(
        4,
        inventory=inventory,
        groups={"prefill": 2, "decode": 2},
        all_vars={**BASE_VARS, "k2_model_dir": MODEL_DIR},
    )
    for host in state.hosts:
        on_host(state, host.name, f"rm -rf {MODEL_DIR} {STATE_DIR}")
    yield state, inventory
    lab_api.shape(None)
    for host in state.hosts:
        lab_api.start_host(host.name)
    for host in state.hosts:
        on_host(state, host.name, f"rm -rf {MODEL_DIR}", check=False)


def test_synthetic_source_reaches_every_host_verified(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    out = weights(inventory, runs=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    record = record_of(tmp_path)
    names = [f["name"] for f in record["manifest"]["files"]]
    assert names == [
        "config.json",
        *(shard(i) for i in range(1, SHARDS + 1)),
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads(on_host(state, "lab1", f"cat {MODEL_DIR}/config.json"))
    assert (config["hidden_size"], config["num_hidden_layers"], config["n_routed_experts"]) == (
        7168,
        61,
        384,
    )
    assert record["chain"] == ["lab2", "lab3", "lab4"]  # inventory order, the seed not in it
    hosts = hosts_of(record)
    assert set(hosts) == {"lab1", "lab2", "lab3", "lab4"}
    for name, host in hosts.items():
        assert host["status"] == "ok", host
        assert host["verified"] == len(names), host
        if name != "lab1":
            assert sorted(host["received"]) == sorted(names)
    assert "lab4" in out.stdout  # the final table
    assert f"{len(names)}/{len(names)}" in out.stdout  # verified, per host
    copies_match_manifest(state, record["manifest"], MODEL_DIR)
    assert changed_by_host(tmp_path)["lab4"] > 0


def test_rerun_is_a_fast_noop_with_zero_changes(cluster: tuple[Any, Path], tmp_path: Path) -> None:
    _, inventory = cluster
    started = time.monotonic()
    out = weights(inventory, runs=tmp_path)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout[-4000:]
    assert sum(changed_by_host(tmp_path).values()) == 0
    record = record_of(tmp_path)
    assert record["chain"] == []  # no relay started anywhere
    assert all(h["status"] == "ok" and not h["received"] for h in record["hosts"])
    print(f"no-op re-run took {took:.1f} s")


def test_check_mode_names_what_would_move_and_changes_nothing(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    on_host(state, "lab4", f"rm {MODEL_DIR}/{shard(2)}")
    out = weights(inventory, "--check", runs=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:]
    changed = changed_by_host(tmp_path)
    assert changed["lab4"] >= 1
    assert changed["lab2"] == changed["lab3"] == 0
    predicted = hosts_of(record_of(tmp_path))["lab4"]
    assert predicted["status"] == "would-change"
    assert predicted["need_bytes"] == SHARD_BYTES
    assert "would receive" in out.stdout
    assert shard(2) not in on_host(state, "lab4", f"ls {MODEL_DIR}")
    fix = weights(inventory, runs=tmp_path)
    assert fix.returncode == 0, fix.stdout[-4000:]
    assert hosts_of(record_of(tmp_path))["lab4"]["received"] == [shard(2)]


def test_corrupted_shard_is_detected_and_repaired(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    corrupt = f"printf XXXX | dd of={MODEL_DIR}/{shard(1)} bs=1 seek=4096 conv=notrunc 2>/dev/null"
    on_host(state, "lab3", corrupt)
    out = weights(inventory, runs=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:]
    hosts = hosts_of(record_of(tmp_path))
    assert hosts["lab3"]["repaired"] == [shard(1)]
    assert record_of(tmp_path)["chain"] == ["lab3"]
    changed = changed_by_host(tmp_path)
    assert changed["lab3"] >= 1
    assert changed["lab2"] == changed["lab4"] == 0
    copies_match_manifest(state, record_of(tmp_path)["manifest"], MODEL_DIR)

    # Corruption that keeps size and mtime passes the fast check; --verify re-hashes and finds it.
    on_host(
        state,
        "lab2",
        f"touch -r {MODEL_DIR}/{shard(3)} /tmp/k2w-stamp && {corrupt.replace(shard(1), shard(3))}"
        f" && touch -r /tmp/k2w-stamp {MODEL_DIR}/{shard(3)}",
    )
    fast = weights(inventory, runs=tmp_path)
    assert fast.returncode == 0
    assert sum(changed_by_host(tmp_path).values()) == 0
    full = weights(inventory, "--verify", runs=tmp_path)
    assert full.returncode == 0, full.stdout[-4000:]
    hosts = hosts_of(record_of(tmp_path))
    assert hosts["lab2"]["repaired"] == [shard(3)]
    assert not hosts["lab3"]["repaired"]
    assert not hosts["lab4"]["repaired"]
    copies_match_manifest(state, record_of(tmp_path)["manifest"], MODEL_DIR)


def wait_for_progress(runs: Path, host: str, at_least: int, timeout: float = 180) -> None:
    """Until the running command's progress file shows ``host`` past ``at_least`` bytes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = list(runs.iterdir()) if runs.exists() else []
        for rec in records:
            path = rec / "weights-progress.jsonl"
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                if (
                    data.get("host") == host
                    and data.get("event") == "progress"
                    and at_least <= int(data.get("rx") or 0) < int(data.get("total") or 0)
                ):
                    return
        time.sleep(0.2)
    raise AssertionError(f"{host} never got past {at_least} bytes")


def weights_with_fault(
    inventory: Path, runs: Path, mbit: int, fault: Callable[[], None]
) -> tuple[int, str]:
    """The weights command on links shaped to ``mbit``, with ``fault`` done while it runs."""
    lab_api.shape(mbit)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "k2provision.cli", "weights", str(inventory)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "K2_RUNS_DIR": str(runs), "COLUMNS": "200"},
        )
        try:
            fault()
            output, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        lab_api.shape(None)
    return proc.returncode, output


def test_host_killed_mid_transfer_rest_finish_and_rerun_completes_it(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    for host in ("lab2", "lab3", "lab4"):
        on_host(state, host, f"rm -rf {MODEL_DIR}")
    runs = tmp_path / "runs"

    def kill_host() -> None:
        wait_for_progress(runs, "lab3", 1 << 20)
        lab_api.stop_host("lab3")

    # About 3 MB/s per link: lab3's 24 MiB take about 8 s, so the stop lands well before its
    # end even when the progress events and the stop lag on a loaded machine (at 5 MB/s and
    # a stop after 2 MiB, lab3 once finished first).
    try:
        returncode, output = weights_with_fault(inventory, runs, 24, kill_host)
    finally:
        lab_api.start_host("lab3")
    assert returncode == 1, output[-4000:]
    assert "lab3" in output
    hosts = hosts_of(record_of(runs))
    assert hosts["lab2"]["status"] == "ok", hosts["lab2"]
    assert hosts["lab4"]["status"] == "ok", hosts["lab4"]
    assert hosts["lab3"]["status"] in ("lost", "skipped"), hosts["lab3"]
    listing = on_host(state, "lab3", f"ls -a {MODEL_DIR} 2>/dev/null || true")
    complete = {f["name"] for f in record_of(runs)["manifest"]["files"]}
    assert complete - set(listing.split()), "lab3 was meant to die before the end"

    rerun = weights(inventory, runs=runs)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    record = record_of(runs)
    assert record["chain"] == ["lab3"]
    assert hosts_of(record)["lab3"]["status"] == "ok"
    changed = changed_by_host(runs)
    assert changed["lab2"] == changed["lab4"] == 0
    copies_match_manifest(state, record["manifest"], MODEL_DIR)
    assert ".partial" not in on_host(state, "lab3", f"ls -a {MODEL_DIR}")


def test_relay_killed_mid_file_resumes_and_sends_only_the_missing_bytes(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    """Kill lab3's relay in the middle of a shard: the re-run streams that shard from lab3's
    last resume point (1 MiB checkpoints here) and the shards it never started, nothing else:
    the seed's and lab3's byte counters say so."""
    state, inventory = cluster
    for host in ("lab2", "lab3", "lab4"):
        on_host(state, host, f"rm -rf {MODEL_DIR}")
    runs = tmp_path / "runs"
    partial = f"{MODEL_DIR}/.{shard(2)}.partial"
    kill_mid_file = (  # on lab3 itself, so the kill lands 2-3 MiB into the second shard
        f"for i in $(seq 1200); do"
        f" [ $(stat -c %s {partial} 2>/dev/null || echo 0) -ge {2 << 20} ] && break; sleep 0.05;"
        f" done; kill -KILL $(cat {STATE_DIR}/serve.pid)"
    )

    def kill_relay() -> None:
        wait_for_progress(runs, "lab3", 1)
        on_host(state, "lab3", kill_mid_file)

    # about 3 MB/s per link: each 8 MiB shard takes about 3 s
    returncode, output = weights_with_fault(inventory, runs, 24, kill_relay)
    assert returncode == 1, output[-4000:]
    manifest = record_of(runs)["manifest"]
    sizes = {f["name"]: f["size"] for f in manifest["files"]}
    listing = on_host(state, "lab3", f"ls -A {MODEL_DIR}").split()
    missing = [n for n in sizes if n not in listing]
    points = [n for n in listing if n.startswith(".k2-resume.")]
    assert points == [f".k2-resume.{shard(2)}.json"], listing
    cut = shard(2)
    assert cut in missing
    point = json.loads(on_host(state, "lab3", f"cat {MODEL_DIR}/{points[0]}"))
    assert 0 < point["offset"] < sizes[cut]

    rerun = weights(inventory, runs=runs)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    record = record_of(runs)
    assert record["chain"] == ["lab3"]
    lab3 = hosts_of(record)["lab3"]
    assert lab3["resumed"] == [{"name": cut, "offset": point["offset"]}]
    wanted = sum(sizes[n] for n in missing) - point["offset"]
    assert record["seed_summary"]["bytes_sent"] == wanted
    assert lab3["bytes_on_wire"] == wanted
    assert lab3["bytes_received"] == wanted  # written
    copies_match_manifest(state, manifest, MODEL_DIR)
    assert ".k2-resume." not in on_host(state, "lab3", f"ls -A {MODEL_DIR}")


def test_full_disk_is_refused_before_anything_changes(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    full_dir = "/models/k2-weights-full"
    small = tmp_path / "full.ini"
    small.write_text(
        inventory.read_text().replace(f"k2_model_dir={MODEL_DIR}", f"k2_model_dir={full_dir}")
    )
    for host in state.hosts:
        on_host(state, host.name, f"rm -rf {full_dir}")
    on_host(state, "lab4", f"mkdir -p {full_dir} && mount -t tmpfs -o size=1m k2w-full {full_dir}")
    try:
        out = weights(small, runs=tmp_path)
        listing = {
            h.name: on_host(state, h.name, f"ls -A {full_dir} 2>&1 || true") for h in state.hosts
        }
    finally:
        on_host(state, "lab4", f"umount {full_dir}; rmdir {full_dir}", check=False)
    assert out.returncode == 1, out.stdout[-4000:]
    text = " ".join((out.stdout + out.stderr).split())
    assert "lab4: not enough disk space" in text
    assert "fix:" in text
    assert listing["lab4"].strip() == ""
    for name in ("lab1", "lab2", "lab3"):
        assert "No such file" in listing[name], (name, listing[name])  # not even the seed's set
    assert sum(changed_by_host(tmp_path).values()) == 0


def test_hub_token_never_reaches_records_or_output(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    _, inventory = cluster
    env = {"HF_TOKEN": FAKE_TOKEN}
    noop = weights(inventory, runs=tmp_path / "synthetic", env=env)
    assert noop.returncode == 0, noop.stdout[-4000:]

    hub = tmp_path / "hub.ini"
    hub.write_text(
        inventory.read_text()
        .replace("k2_weights_source=synthetic", "k2_weights_source=hub")
        .replace("[all:vars]", "[all:vars]\nk2_weights_revision=" + "c5e7b0d1" * 5)
    )
    failed = weights(hub, runs=tmp_path / "hub", env=env)
    assert failed.returncode == 1  # no hub here (or no client): it must fail, and say why
    assert "hub" in failed.stdout + failed.stderr
    in_var = tmp_path / "hub-var.ini"
    in_var.write_text(
        hub.read_text().replace("[all:vars]", f"[all:vars]\nk2_weights_hf_token={FAKE_TOKEN}")
    )
    failed_var = weights(in_var, runs=tmp_path / "hub-var")
    assert failed_var.returncode == 1

    for out in (noop, failed, failed_var):
        assert FAKE_TOKEN not in out.stdout + out.stderr
    leaks = [
        str(path)
        for path in tmp_path.rglob("*")
        if path.is_file() and path.suffix != ".ini" and FAKE_TOKEN.encode() in path.read_bytes()
    ]
    assert leaks == []
    assert any((tmp_path / "hub").rglob("job_events/*.json"))  # the records were written


def test_plain_ansible_playbook_does_the_same_work(
    cluster: tuple[Any, Path], tmp_path: Path
) -> None:
    state, inventory = cluster
    on_host(state, "lab2", f"rm -rf {MODEL_DIR}")
    out = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/site.yml",
            "--tags",
            "weights",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "lab2" in out.stdout
    assert "Hosts x verified files" in out.stdout
    manifest = json.loads(on_host(state, "lab1", f"cat {STATE_DIR}/manifest.json"))
    copies_match_manifest(state, manifest, MODEL_DIR)
    digest = hashlib.sha256(on_host(state, "lab2", f"cat {MODEL_DIR}/config.json").encode())
    assert digest.hexdigest() == next(
        f["sha256"] for f in manifest["files"] if f["name"] == "config.json"
    )
