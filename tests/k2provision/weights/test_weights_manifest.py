"""Manifests, the safetensors header check and the relay script's own constraints (pure)."""

from __future__ import annotations

import ast
import hashlib
import json
import struct
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.relay_harness import write_shard
from k2provision.weights import kernel
from k2provision.weights.manifest import (
    Manifest,
    ManifestError,
    StoredManifest,
    fetch_hub_manifest,
    hub_token,
    load_manifest,
    manifest_from_dir,
    manifest_from_hub_info,
    natural_key,
    safetensors_header_ok,
    save_manifest,
)
from k2provision.weights.relay_app import relay_app

SHA = "a" * 64


def shard_bytes(data: int = 1000) -> bytes:
    return kernel.synthetic.safetensors_header(data) + bytes(data)


# ----------------------------------------------------------------------------- header check


def test_valid_header_passes_as_bytes_and_as_file(tmp_path: Path) -> None:
    raw = shard_bytes()
    assert kernel.safetensors.check_safetensors_header(raw, len(raw)) is None
    assert safetensors_header_ok(raw, len(raw))
    prefix = raw[: 8 + struct.unpack("<Q", raw[:8])[0]]
    assert safetensors_header_ok(prefix, len(raw))  # a prefix is enough
    path = write_shard(tmp_path / "a.safetensors", 50_000)
    assert path.stat().st_size == 50_000
    assert safetensors_header_ok(path)
    assert safetensors_header_ok(str(path), 50_000)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: struct.pack("<Q", struct.unpack("<Q", b[:8])[0] + 8) + b[8:], "header length"),
        (lambda b: struct.pack("<Q", 0) + b[8:], "out of range"),
        (lambda b: struct.pack("<Q", 1 << 40) + b[8:], "out of range"),
        (lambda b: b[:-1], "!= file size"),
        (lambda b: b + b"x", "!= file size"),
        (lambda b: b[:5], "too short"),
    ],
)
def test_inconsistent_headers_are_refused(mutate: Any, reason: str) -> None:
    raw = mutate(shard_bytes())
    problem = kernel.safetensors.check_safetensors_header(raw, len(raw))
    assert problem is not None
    assert reason in problem
    assert not safetensors_header_ok(raw, len(raw))


def test_header_json_and_offsets_are_checked() -> None:
    body = b'{"t": {"dtype": "U8", "shape": [4], "data_offsets": [4, 2]}}'
    raw = struct.pack("<Q", len(body)) + body + bytes(4)
    assert "bad data_offsets" in (kernel.safetensors.check_safetensors_header(raw, len(raw)) or "")
    body = b"[1, 2, 3]"
    raw = struct.pack("<Q", len(body)) + body
    assert "not a JSON object" in (kernel.safetensors.check_safetensors_header(raw, len(raw)) or "")


# ----------------------------------------------------------------------------- manifests


def test_manifest_from_dir_hashes_in_natural_order_and_skips_hidden(tmp_path: Path) -> None:
    for i in (10, 2, 1):
        write_shard(tmp_path / f"model-{i}-of-10.safetensors", 4096 + i, seed=i)
    (tmp_path / ".k2-manifest.json").write_text("{}")
    (tmp_path / ".model-3-of-10.safetensors.partial").write_bytes(b"half")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_text("{}")
    m = manifest_from_dir(tmp_path, model="m", revision="r", workers=2)
    assert m.names == (
        "model-1-of-10.safetensors",
        "model-2-of-10.safetensors",
        "model-10-of-10.safetensors",
        "sub/tokenizer.json",
    )
    for f in m.files:
        data = (tmp_path / f.name).read_bytes()
        assert f.size == len(data)
        assert f.sha256 == hashlib.sha256(data).hexdigest()
    assert len(m.shards) == 3
    only = manifest_from_dir(tmp_path, model="m", revision="r", patterns=["*.safetensors"])
    assert only.names == m.names[:3]


def test_manifest_round_trips_and_rejects_bad_data(tmp_path: Path) -> None:
    m = Manifest(model="m", revision="r", files=({"name": "a.bin", "size": 3, "sha256": SHA},))  # type: ignore[arg-type]
    path = save_manifest(m, tmp_path / "x" / "m.json")
    assert load_manifest(path) == m
    assert m.digest() == kernel.manifest.read_manifest(json.loads(path.read_text())).digest()
    data = json.loads(path.read_text())
    for bad, where in [
        ({**data, "extra": 1}, "extra"),
        ({**data, "files": [{"name": "../etc/passwd", "size": 1, "sha256": SHA}]}, "files.0.name"),
        ({**data, "files": [{"name": "a", "size": -1, "sha256": SHA}]}, "files.0.size"),
        ({**data, "files": [{"name": "a", "size": 1, "sha256": "XYZ"}]}, "files.0.sha256"),
        ({**data, "files": [data["files"][0], data["files"][0]]}, "twice"),
    ]:
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ManifestError, match=where.replace(".", r"\.")):
            load_manifest(tmp_path / "bad.json")


def test_stored_manifest_shape_matches_what_the_relay_writes(tmp_path: Path) -> None:
    store = kernel.store.LocalStore(str(tmp_path))
    meta = kernel.manifest.FileMeta("model-1-of-2.safetensors", 5, SHA)
    store.adopt(kernel.manifest.RelayManifest("m", "r", (meta,)))
    store.record(meta, 123)
    stored = StoredManifest.model_validate_json((tmp_path / ".k2-manifest.json").read_text())
    assert stored.names == ("model-1-of-2.safetensors",)
    assert stored.stamps == {"model-1-of-2.safetensors": 123}


def test_natural_key_sorts_shard_numbers() -> None:
    names = ["model-10-of-61.safetensors", "model-9-of-61.safetensors", "config.json"]
    assert sorted(names, key=natural_key) == [
        "config.json",
        "model-9-of-61.safetensors",
        "model-10-of-61.safetensors",
    ]


# ----------------------------------------------------------------------------- the hub


def hub_info(count: int, padded: bool) -> dict[str, Any]:
    """The shape of the hub API's model info with files_metadata=True (as recorded)."""
    siblings: list[dict[str, Any]] = [
        {"rfilename": ".gitattributes", "size": 1519, "blobId": "b" * 40},
        {"rfilename": "config.json", "size": 3421, "blobId": "c" * 40},
        {"rfilename": "model.safetensors.index.json", "size": 2_600_000, "blobId": "d" * 40},
    ]
    for i in range(1, count + 1):
        name = f"model-{i:05d}-of-{count:05d}" if padded else f"model-{i}-of-{count}"
        size = 15_000_000_000 + i
        siblings.append(
            {
                "rfilename": f"{name}.safetensors",
                "size": size,
                "blobId": f"{i:040x}",
                "lfs": {
                    "sha256": hashlib.sha256(name.encode()).hexdigest(),
                    "size": size,
                    "pointerSize": 135,
                },
            }
        )
    return {"id": "moonshotai/Kimi-K2-Instruct", "sha": "f" * 40, "siblings": siblings}


@pytest.mark.parametrize(("count", "padded"), [(61, False), (62, True)])
def test_hub_metadata_becomes_a_manifest_with_the_hub_sha256(count: int, padded: bool) -> None:
    info = hub_info(count, padded)
    m = manifest_from_hub_info(info, revision="main", allow_patterns=["*.safetensors"])
    assert len(m.files) == len(m.shards) == count
    assert m.revision == "f" * 40  # the resolved commit, not the branch
    assert m.model == "moonshotai/Kimi-K2-Instruct"
    first, last = m.files[0], m.files[-1]
    assert first.name.startswith("model-1-" if not padded else "model-00001-")
    assert last.name.startswith(f"model-{count}-" if not padded else f"model-{count:05d}-")
    lfs = {s["rfilename"]: s["lfs"] for s in info["siblings"] if "lfs" in s}
    assert all(f.sha256 == lfs[f.name]["sha256"] and f.size == lfs[f.name]["size"] for f in m.files)


def test_hub_files_without_lfs_need_a_local_copy(tmp_path: Path) -> None:
    info = hub_info(2, False)
    with pytest.raises(ManifestError, match=r"config\.json: not stored in LFS"):
        manifest_from_hub_info(info, allow_patterns=["*.safetensors", "config.json"])
    (tmp_path / "config.json").write_bytes(b"x" * 3421)
    m = manifest_from_hub_info(
        info, allow_patterns=["*.safetensors", "config.json"], local_dir=tmp_path
    )
    assert m.file("config.json").sha256 == hashlib.sha256(b"x" * 3421).hexdigest()
    (tmp_path / "config.json").write_bytes(b"short")
    with pytest.raises(ManifestError, match="the hub says 3421"):
        manifest_from_hub_info(info, allow_patterns=["config.json"], local_dir=tmp_path)


def test_hub_records_as_objects_work_too() -> None:
    lfs = SimpleNamespace(sha256=SHA, size=10, pointer_size=135)
    sib = SimpleNamespace(rfilename="model-1-of-1.safetensors", size=10, blob_id="b", lfs=lfs)
    info = SimpleNamespace(id="org/model", sha="e" * 40, siblings=[sib])
    m = manifest_from_hub_info(info)
    assert m.names == ("model-1-of-1.safetensors",)


class FakeHub:
    def __init__(self, info: Any = None, error: Exception | None = None) -> None:
        self.info = info
        self.error = error
        self.calls: list[dict[str, Any]] = []

    def model_info(self, repo: str, **kwargs: Any) -> Any:
        self.calls.append({"repo": repo, **kwargs})
        if self.error is not None:
            raise self.error
        return self.info


def test_fetch_hub_manifest_passes_the_token_but_never_shows_it() -> None:
    token = "hf_SECRETsecretSECRET0123"
    api = FakeHub(info=hub_info(3, False))
    m = fetch_hub_manifest(
        "moonshotai/Kimi-K2-Instruct",
        "main",
        token=token,
        allow_patterns=["*.safetensors"],
        api=api,
    )
    assert api.calls == [
        {
            "repo": "moonshotai/Kimi-K2-Instruct",
            "revision": "main",
            "files_metadata": True,
            "token": token,
        }
    ]
    assert token not in m.model_dump_json()
    failing = FakeHub(error=RuntimeError(f"401 Unauthorized for Authorization: Bearer {token}"))
    with pytest.raises(ManifestError) as err:
        fetch_hub_manifest("org/private", "main", token=token, api=failing)
    assert token not in str(err.value)
    assert "401 Unauthorized" in str(err.value)
    assert err.value.__suppress_context__  # the original exception (and its text) is dropped


def test_hub_token_comes_from_the_environment() -> None:
    assert hub_token({"HF_TOKEN": " hf_x "}) == "hf_x"
    assert hub_token({"HUGGING_FACE_HUB_TOKEN": "hf_y"}) == "hf_y"
    assert hub_token({}) is None


# ----------------------------------------------------------------------------- the kernel itself

KERNEL_DIR = Path(kernel.common.__file__).parent


def test_kernel_is_python39_stdlib_only() -> None:
    """Every file the relay and the modules carry to hosts parses as Python 3.9 and imports
    only the standard library or its own package."""
    files = sorted(KERNEL_DIR.rglob("*.py"))
    assert len(files) >= 15
    for path in files:
        source = path.read_text()
        tree = ast.parse(source, feature_version=(3, 9))
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
        imported.discard("__future__")
        outside = imported - set(sys.stdlib_module_names)
        assert not outside, (path, outside)
        has_annotations = any(
            isinstance(n, ast.AnnAssign | ast.FunctionDef) for n in ast.walk(tree)
        )
        if has_annotations:  # annotations stay strings: 3.10 syntax in them is fine on 3.9
            assert "from __future__ import annotations" in source, path


def test_relay_app_is_reproducible_and_carries_the_kernel(tmp_path: Path) -> None:
    first = relay_app(tmp_path / "a")
    second = relay_app(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
    assert "__main__.py" in names
    assert {
        f"k2_weights/{p.relative_to(KERNEL_DIR).as_posix()}" for p in KERNEL_DIR.rglob("*.py")
    } <= names


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "a/../b", "./a", "a//b", ".k2-manifest.json", ".x.partial"]
)
def test_relay_refuses_unsafe_names(name: str) -> None:
    with pytest.raises(kernel.common.RelayError):
        kernel.names.check_name(name)


def test_addresses_parse() -> None:
    assert kernel.common.parse_address("10.0.0.2:29517") == ("10.0.0.2", 29517)
    assert kernel.common.parse_address("[fd00::2]:7") == ("fd00::2", 7)
    assert kernel.common.format_address("fd00::2", 7) == "[fd00::2]:7"
    with pytest.raises(kernel.common.RelayError):
        kernel.common.parse_address("host-without-port")
