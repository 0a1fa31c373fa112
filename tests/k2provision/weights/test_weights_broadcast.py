"""The weight broadcast end to end: real relay processes, real TCP on loopback, real files."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.relay_harness import (
    RELAY_SCRIPT,
    Broadcast,
    BroadcastResult,
    RelayEvent,
    Target,
    broadcast,
    fanout,
    local_launcher,
    write_shards,
)
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils.k2_weights.relay.output import (  # noqa: E501
    Emitter,
)
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils.k2_weights.relay.receiver import (  # noqa: E501
    EXIT_INCOMPLETE,
)
from k2provision.weights import kernel
from k2provision.weights.manifest import (
    Manifest,
    ManifestError,
    load_stored_manifest,
    manifest_from_dir,
    manifest_from_hub_info,
)

SHARD = 1 << 20
OPTIONS: dict[str, Any] = {
    "io_timeout": 10.0,
    "connect_timeout": 3.0,
    "relink_timeout": 5.0,
    "accept_timeout": 30.0,
    "progress_interval": 0.1,
    "grace": 15.0,
    "chunk_size": 256 << 10,
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    src = tmp_path_factory.mktemp("source")
    write_shards(src, 4, SHARD, seed=7)
    return src, manifest_from_dir(src, model="test/k2-mini", revision="r1")


def targets(root: Path, n: int) -> list[Target]:
    return [
        Target(host="127.0.0.1", port=0, dest=str(root / f"h{i}"), name=f"h{i}")
        for i in range(1, n + 1)
    ]


def tree(dest: Path) -> dict[str, str]:
    """sha256 of every visible file under dest."""
    return {
        p.relative_to(dest).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(dest.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def expected(manifest: Manifest) -> dict[str, str]:
    return {f.name: f.sha256 for f in manifest.files}


def partials(dest: Path) -> list[Path]:
    return list(dest.rglob(".*.partial"))


def mtimes(dest: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in dest.iterdir() if not p.name.startswith(".")}


def converge(source: tuple[Path, Manifest], ts: list[Target]) -> BroadcastResult:
    src, manifest = source
    result = broadcast(manifest, src, ts, **OPTIONS)
    assert result.ok, result
    return result


def test_chain_of_four_delivers_every_file_verified_and_rerun_is_a_noop(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, manifest = source
    ts = targets(tmp_path, 4)
    events: list[RelayEvent] = []
    result = broadcast(manifest, src, ts, on_event=events.append, **OPTIONS)

    assert result.ok, result
    assert result.bytes_sent == manifest.total_bytes  # the seed sent the set once
    for t in ts:
        host = result.host(t.label)
        assert host.status == "ok"
        assert set(host.received) == set(manifest.names)
        assert host.verified == len(manifest.files)
        assert tree(Path(t.dest)) == expected(manifest)
        assert partials(Path(t.dest)) == []
        stored = load_stored_manifest(Path(t.dest))
        assert stored is not None
        assert stored.names == manifest.names
    assert result.host("h1").bytes_forwarded == manifest.total_bytes
    assert result.host("h4").bytes_forwarded == 0
    kinds = {(e.source, e.event) for e in events}
    assert ("h4", "progress") in kinds
    assert ("seed", "summary") in kinds
    assert all((f"h{i}", "summary") in kinds for i in range(1, 5))

    again = broadcast(manifest, src, ts, **OPTIONS)
    assert again.ok, again
    assert again.bytes_sent == 0
    assert again.files_sent == ()
    for h in again.hosts:
        assert set(h.skipped) == set(manifest.names)
        assert h.bytes_received == 0
        assert h.received == ()
        assert h.repaired == ()


def hub_style(src: Path, manifest: Manifest) -> Manifest:
    """The manifest the hub's metadata would give for the same files (LFS sha256 per shard)."""
    info = {
        "id": "test/k2-mini",
        "sha": "c" * 40,
        "siblings": [
            {"rfilename": f.name, "size": f.size}
            | ({"lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134}}
               if f.name.endswith(".safetensors") else {})
            for f in manifest.files
        ],
    }  # fmt: skip
    return manifest_from_hub_info(info, local_dir=src)


def test_corrupted_file_is_detected_and_sent_again_others_untouched(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, plain = source
    manifest = hub_style(src, plain)
    assert manifest.revision == "c" * 40
    assert manifest.files == plain.files
    ts = targets(tmp_path, 4)
    converge((src, manifest), ts)
    victim = Path(ts[1].dest) / "model-2-of-4.safetensors"
    with victim.open("r+b") as f:
        f.seek(SHARD // 2)
        byte = f.read(1)
        f.seek(SHARD // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = {t.label: mtimes(Path(t.dest)) for t in ts if t is not ts[1]}

    result = broadcast(manifest, src, ts, **OPTIONS)

    assert result.ok, result
    h2 = result.host("h2")
    assert h2.repaired == ("model-2-of-4.safetensors",)
    assert result.files_sent == ("model-2-of-4.safetensors",)
    assert result.bytes_sent == SHARD
    assert tree(Path(ts[1].dest)) == expected(manifest)
    for t in ts:
        if t is ts[1]:
            continue
        host = result.host(t.label)
        assert set(host.skipped) == set(manifest.names)
        assert host.bytes_written == 0
        assert mtimes(Path(t.dest)) == before[t.label]  # forwarded, never rewritten


def test_silent_corruption_needs_verify(source: tuple[Path, Manifest], tmp_path: Path) -> None:
    src, manifest = source
    ts = targets(tmp_path, 2)
    converge(source, ts)
    victim = Path(ts[0].dest) / "model-3-of-4.safetensors"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime

    fast = broadcast(manifest, src, ts, **OPTIONS)
    assert fast.bytes_sent == 0  # sizes + stored manifest: trusted, by design

    full = broadcast(manifest, src, ts, verify=True, **OPTIONS)
    assert full.ok, full
    assert full.host("h1").repaired == ("model-3-of-4.safetensors",)
    assert full.bytes_sent == SHARD
    assert tree(Path(ts[0].dest)) == expected(manifest)


def test_parallel_streams_share_the_files_and_deliver_everything(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """Three lanes per hop, each with its share of the files on its own connections: every
    host gets every file once, the counters add up, and a re-run moves nothing."""
    src, manifest = source
    ts = targets(tmp_path, 3)
    result = broadcast(manifest, src, ts, streams=3, **OPTIONS)
    assert result.ok, result
    assert result.bytes_sent == manifest.total_bytes
    assert len(result.hosts) == 3
    for t in ts:
        assert tree(Path(t.dest)) == expected(manifest)
        host = result.host(t.label)
        assert sorted(host.received) == sorted(manifest.names)
        assert host.bytes_written == manifest.total_bytes
    again = broadcast(manifest, src, ts, streams=3, **OPTIONS)
    assert again.ok
    assert again.bytes_sent == 0


@pytest.mark.parametrize(("victim", "streams"), [("h2", 1), ("h1", 1), ("h2", 2)])
def test_killed_receiver_is_skipped_and_completed_by_a_rerun(
    source: tuple[Path, Manifest], tmp_path: Path, victim: str, streams: int
) -> None:
    src, manifest = source
    ts = targets(tmp_path, 4)
    killed: list[int] = []
    index = int(victim[1]) - 1
    others = [t.label for t in ts if t.label != victim]

    with Broadcast(manifest, src, ts, max_rate=4e6, streams=streams, **OPTIONS) as run:

        def on_event(event: RelayEvent) -> None:
            if (
                not killed
                and event.source == victim
                and event.event == "progress"
                and event.data["rx"] >= 3 * SHARD // 2
            ):
                killed.append(event.data["rx"])
                run.kill(victim)

        run.on_event = on_event
        run.start()
        result = run.wait()

    assert killed, f"{victim} was never seen receiving"
    assert result.host(victim).status == "skipped"
    assert any(s.address == result.host(victim).address for s in result.skipped_hosts)
    for name in others:
        assert result.host(name).status == "ok", result.host(name)
        assert tree(Path(ts[int(name[1]) - 1].dest)) == expected(manifest)
    assert result.seed_status == "incomplete"

    dead = Path(ts[index].dest)
    have = tree(dead)
    for name, digest in have.items():  # nothing half-written under a final name
        assert digest == expected(manifest)[name]
    missing = [f for f in manifest.files if f.name not in have]
    assert missing, f"{victim} finished before it was killed"

    rerun = broadcast(manifest, src, ts, **OPTIONS)
    assert rerun.ok, rerun
    assert rerun.bytes_sent == sum(f.size for f in missing)
    assert set(rerun.host(victim).received) == {f.name for f in missing}
    assert tree(dead) == expected(manifest)
    assert partials(dead) == []
    for name in others:
        assert rerun.host(name).bytes_written == 0


def test_file_cut_mid_way_resumes_from_its_verified_prefix(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """A relay killed in the middle of a file leaves its synced prefix and hash state; the
    re-run streams only the bytes after that point, and the file still verifies."""
    src, manifest = source
    ts = targets(tmp_path, 2)
    resume = {**OPTIONS, "extra_args": ["--checkpoint", str(64 << 10)]}
    killed: list[int] = []
    with Broadcast(manifest, src, ts, max_rate=3e6, **resume) as run:

        def on_event(event: RelayEvent) -> None:
            # Mid-way through the third file, once h2 has synced a checkpoint of it (its
            # writer can lag what it has received on a loaded machine).
            if (
                not killed
                and event.source == "h2"
                and event.event == "progress"
                and event.data["rx"] >= 2 * SHARD + SHARD // 2
                and any(Path(ts[1].dest).glob(".k2-resume.*.json"))
            ):
                killed.append(event.data["rx"])
                run.kill("h2")

        run.on_event = on_event
        run.start()
        result = run.wait()
    assert killed
    assert result.host("h2").status == "skipped"
    dead = Path(ts[1].dest)
    missing = [f for f in manifest.files if f.name not in tree(dead)]
    cut = missing[0]
    points = list(dead.glob(".k2-resume.*.json"))
    assert [p.name for p in points] == [f".k2-resume.{cut.name}.json"]
    offset = json.loads(points[0].read_text())["offset"]
    assert 0 < offset < cut.size

    rerun = broadcast(manifest, src, ts, **resume)
    assert rerun.ok, rerun
    h2 = rerun.host("h2")
    assert h2.resumed == ({"name": cut.name, "offset": offset},)
    wanted = sum(f.size for f in missing) - offset
    assert rerun.bytes_sent == wanted  # only the missing bytes crossed the wire
    assert h2.bytes_received == wanted
    assert h2.bytes_written == wanted
    assert rerun.host("h1").bytes_written == 0
    assert tree(dead) == expected(manifest)
    assert partials(dead) == []
    assert list(dead.glob(".k2-resume.*")) == []


def leave_partial(dest: Path, source: Path, meta: Any, offset: int) -> None:
    """A partial copy of ``meta`` holding its first ``offset`` bytes, with the resume point a
    stopped relay leaves (a little more on disk than the resume point says, as after a stop)."""
    dest.mkdir(parents=True, exist_ok=True)
    data = (source / meta.name).read_bytes()
    Path(kernel.names.partial_path(str(dest), meta.name)).write_bytes(data[: offset + 4096])
    prefix = kernel.hashing.Sha256()
    prefix.update(data[:offset])
    kernel.store.save_resume_point(str(dest), meta, offset, prefix.state())


def test_hosts_resuming_one_file_from_different_offsets_finish_without_a_stall(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """After a stop, consecutive hosts hold the same file cut at different offsets (a host
    behind its downstream, one ahead of it). The stream starts at the lowest of them; a host
    whose own bytes begin inside a data frame forwards the frame from memory and writes its
    part, and must not then wait on its forwarder for bytes it never sends from disk: that
    stalled the chain for the whole I/O timeout, and the host below gave up on it."""
    src, manifest = source
    ts = targets(tmp_path, 3)
    meta = manifest.files[1]
    kib = 1 << 10
    offsets = {"h1": 128 * kib, "h2": 64 * kib, "h3": 640 * kib}  # frames of 256 KiB from 64
    for t in ts:
        leave_partial(Path(t.dest), src, meta, offsets[t.name])
    resume = {**OPTIONS, "extra_args": ["--checkpoint", str(64 * kib)]}
    rerun = broadcast(manifest, src, ts, **resume)
    assert rerun.ok, rerun
    assert rerun.seconds < OPTIONS["io_timeout"], rerun  # no host waited out a timeout
    assert rerun.bytes_sent == sum(f.size for f in manifest.files) - offsets["h2"]
    for t in ts:
        host = rerun.host(t.name)
        assert host.resumed == ({"name": meta.name, "offset": offsets[t.name]},)
        assert host.bytes_written == sum(f.size for f in manifest.files) - offsets[t.name]
        assert tree(Path(t.dest)) == expected(manifest)
        assert list(Path(t.dest).glob(".k2-resume.*")) == []


def test_verify_re_reads_a_resumed_prefix_and_catches_its_corruption(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """With --verify the prefix is hashed again from disk instead of trusting the saved state:
    a prefix changed on disk fails the file, and the next run sends it whole."""
    src, manifest = source
    name = manifest.files[1].name
    dest = tmp_path / "h1"
    dest.mkdir()
    meta = kernel.manifest.FileMeta(name, manifest.files[1].size, manifest.files[1].sha256)
    data = (src / name).read_bytes()
    offset = 256 << 10
    partial = Path(kernel.names.partial_path(str(dest), name))
    bad = data[: 128 << 10] + b"\0" * 64 + data[(128 << 10) + 64 : offset]  # past the header
    partial.write_bytes(bad)
    prefix = kernel.hashing.Sha256()
    prefix.update(data[:offset])  # the state as if the right bytes had been written
    kernel.store.save_resume_point(str(dest), meta, offset, prefix.state())
    ts = targets(tmp_path, 1)
    trusted = broadcast(manifest, src, ts, **OPTIONS)
    assert trusted.host("h1").resumed == ({"name": name, "offset": offset},)
    # Without --verify the saved state is trusted like the stored manifest's size and mtime:
    # the sha256 matches although bytes on disk changed. --verify is the full check.
    assert trusted.ok
    partial.write_bytes(bad)
    kernel.store.save_resume_point(str(dest), meta, offset, prefix.state())
    (dest / name).unlink()
    checked = broadcast(manifest, src, ts, verify=True, **OPTIONS)
    assert [f.name for f in checked.host("h1").failed] == [name]
    again = broadcast(manifest, src, ts, **OPTIONS)
    assert again.ok
    assert again.bytes_sent == meta.size
    assert tree(dest) == expected(manifest)


def test_fanout_baseline_delivers_to_every_host(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, manifest = source
    ts = targets(tmp_path, 3)
    result = fanout(manifest, src, ts, **OPTIONS)
    assert result.ok, result
    assert result.mode == "fanout"
    assert result.bytes_sent == 3 * manifest.total_bytes
    for t in ts:
        assert tree(Path(t.dest)) == expected(manifest)
        assert result.host(t.label).bytes_forwarded == 0


def _tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "k2-weights-test", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def test_host_without_room_refuses_and_still_relays(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, manifest = source
    small = tmp_path / "small"
    if not _tmpfs(small, "2m"):
        pytest.skip("needs root and tmpfs to build a 2 MiB filesystem")
    try:
        ts = targets(tmp_path, 3)
        ts[1] = Target(host="127.0.0.1", port=0, dest=str(small / "w"), name="h2")
        result = broadcast(manifest, src, ts, **OPTIONS)
        h2 = result.host("h2")
        assert h2.status == "refused"
        assert h2.address in h2.message
        assert "bytes free" in h2.message
        assert f"{manifest.total_bytes} bytes needed" in h2.message
        assert h2.bytes_written == 0
        assert list((small / "w").iterdir()) == []
        for name in ("h1", "h3"):  # h3 got everything through the refusing h2
            assert result.host(name).status == "ok"
        assert tree(Path(ts[2].dest)) == expected(manifest)
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_manifest_larger_than_free_space_is_refused_before_any_byte(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    huge = shutil.disk_usage(tmp_path).free + (1 << 40)
    try:
        with (src / "huge.bin").open("wb") as f:
            f.truncate(huge)  # sparse: no space used
    except OSError:
        pytest.skip("filesystem cannot hold a sparse file that large")
    manifest = Manifest(
        model="test/huge",
        revision="r1",
        files=({"name": "huge.bin", "size": huge, "sha256": "0" * 64},),  # type: ignore[arg-type]
    )
    ts = targets(tmp_path, 2)
    result = broadcast(manifest, src, ts, **OPTIONS)
    assert result.bytes_sent == 0
    for h in result.hosts:
        assert h.status == "refused"
        assert f"{huge} bytes needed" in h.message
        assert h.address in h.message
        assert h.bytes_written == 0
    free = shutil.disk_usage(tmp_path).free
    message = kernel.store.check_disk_space(str(tmp_path), free + (1 << 30), "hostX")
    assert message is not None
    assert message.startswith("hostX: not enough disk space")
    assert kernel.store.check_disk_space(str(tmp_path), 1, "hostX") is None


def test_shard_with_wrong_header_length_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_shards(src, 2, 64 << 10)
    bad = src / "model-2-of-2.safetensors"
    with bad.open("r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        f.write(struct.pack("<Q", length - 8))

    with pytest.raises(ManifestError, match="header length"):
        manifest_from_dir(src, model="t", revision="r")

    manifest = manifest_from_dir(src, model="t", revision="r", check_headers=False)
    ts = targets(tmp_path, 2)
    started = time.monotonic()
    result = broadcast(manifest, src, ts, **OPTIONS)
    assert result.seed_status == "refused"
    assert "model-2-of-2.safetensors" in result.seed_message
    assert "header length" in result.seed_message
    assert result.bytes_sent == 0
    for t in ts:
        assert not Path(t.dest).exists() or tree(Path(t.dest)) == {}
    assert time.monotonic() - started < OPTIONS["grace"]  # receivers stopped, not waited out


def test_receiving_side_checks_headers_even_when_sha256_matches(tmp_path: Path) -> None:
    write_shards(tmp_path / "s", 1, 64 << 10)
    raw = bytearray((tmp_path / "s" / "model-1-of-1.safetensors").read_bytes())
    (length,) = struct.unpack("<Q", raw[0:8])
    raw[0:8] = struct.pack("<Q", length + 8)
    assert kernel.safetensors.check_safetensors_header(raw, len(raw)) is not None
    dest = tmp_path / "dest"
    dest.mkdir()
    meta = kernel.manifest.FileMeta(
        "model-1-of-1.safetensors", len(raw), hashlib.sha256(raw).hexdigest()
    )
    (dest / meta.name).write_bytes(bytes(raw))
    store = kernel.store.LocalStore(str(dest))
    with open(os.devnull, "w") as sink:
        emit = Emitter("h", "serve", sink)
        states = store.scan(kernel.manifest.RelayManifest("t", "r", (meta,)), True, 1, emit)
    assert states[meta.name].startswith("wrong: safetensors header length")


def test_token_in_environment_never_reaches_relays_or_logs(
    source: tuple[Path, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, manifest = source
    token = "hf_k2SECRETtokenNEVERlogged0123456789"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", token)
    logs = tmp_path / "logs"
    ts = targets(tmp_path, 2)
    seen_env: list[bytes] = []

    with Broadcast(manifest, src, ts, log_dir=logs, **OPTIONS) as run:

        def on_event(event: RelayEvent) -> None:
            if event.event == "listening":
                with contextlib.suppress(OSError):
                    seen_env.append(Path(f"/proc/{event.data['pid']}/environ").read_bytes())

        run.on_event = on_event
        run.start()
        result = run.wait()

    assert result.ok, result
    assert len(seen_env) == 2
    assert all(b"PYTHONUNBUFFERED" in e for e in seen_env)
    assert not any(token.encode() in e for e in seen_env)
    assert token not in result.model_dump_json()
    files = [p for p in logs.rglob("*") if p.is_file()]
    files += [p for t in ts for p in Path(t.dest).rglob(".k2*")]
    assert len(files) >= 6
    for p in files:
        assert token not in p.read_text(errors="replace"), p


def _python39() -> str | None:
    """A Python 3.9 interpreter: K2_RELAY_FLOOR_PYTHON, python3.9 on PATH, or pyenv's."""
    found = [
        os.environ.get("K2_RELAY_FLOOR_PYTHON"),
        shutil.which("python3.9"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))),
        *sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3.9")),
    ]
    for candidate in found:
        if (
            candidate
            and subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        ):
            return candidate
    return None


def test_relay_runs_on_its_python_floor_39(source: tuple[Path, Manifest], tmp_path: Path) -> None:
    """Hosts bring their own python3; the relay's stated floor is 3.9, so it runs under 3.9
    here: a chain of two with zero-copy forwarding, then a resume of a cut file."""
    python = _python39()
    assert python is not None, (
        "the relay's stated floor is Python 3.9 and no 3.9 interpreter was found; fix: install"
        " one (pyenv install 3.9) or point K2_RELAY_FLOOR_PYTHON at it"
    )
    src, manifest = source
    launcher = local_launcher(python)
    ts = [
        Target(
            host="127.0.0.1", port=0, dest=str(tmp_path / f"h{i}"), name=f"h{i}", launcher=launcher
        )
        for i in (1, 2)
    ]
    result = broadcast(manifest, src, ts, seed_launcher=launcher, **OPTIONS)
    assert result.ok, result
    for t in ts:
        assert tree(Path(t.dest)) == expected(manifest)


def test_relay_cli_links_around_a_host_that_is_down(
    source: tuple[Path, Manifest], tmp_path: Path
) -> None:
    src, manifest = source
    script = str(RELAY_SCRIPT)
    procs = []
    ports = []
    for i in (1, 2):
        p = subprocess.Popen(
            [sys.executable, script, "serve", "--listen", "127.0.0.1:0",
             "--dest", str(tmp_path / f"h{i}"), "--accept-timeout", "20"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert p.stdout is not None
        ports.append(json.loads(p.stdout.readline())["port"])
        procs.append(p)
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: connections are refused
        chain = f"127.0.0.1:{ports[0]},127.0.0.1:{dead},127.0.0.1:{ports[1]}"
        (tmp_path / "m.json").write_text(manifest.model_dump_json())
        sent = subprocess.run(
            [sys.executable, script, "send", "--source", str(src), "--manifest",
             str(tmp_path / "m.json"), "--chain", chain, "--connect-timeout", "1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    for p in procs:
        p.wait(timeout=20)
    lines = [json.loads(line) for line in sent.stdout.splitlines()]
    summary = lines[-1]
    assert summary["event"] == "summary"
    statuses = {h["host"]: h["status"] for h in summary["hosts"]}
    assert statuses == {
        f"127.0.0.1:{ports[0]}": "ok",
        f"127.0.0.1:{dead}": "skipped",
        f"127.0.0.1:{ports[1]}": "ok",
    }
    assert sent.returncode == EXIT_INCOMPLETE
    assert [p.returncode for p in procs] == [0, 0]
    assert tree(tmp_path / "h2") == expected(manifest)
