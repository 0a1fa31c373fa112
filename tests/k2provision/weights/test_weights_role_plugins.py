"""The k2_weights role's plugins and the weights command's helpers, without hosts."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.relay_harness import write_shard
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.action import (
    weights_hub,
    weights_wait,
)
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter import (
    weights as filters,
)
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils.k2_weights.relay.cli import (  # noqa: E501
    main as relay_main,
)
from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.modules import (
    weights_source,
)
from k2provision.weights import kernel, progress
from k2provision.weights.manifest import ManifestError, manifest_from_dir

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"


def entries(directory: Path) -> list[dict[str, Any]]:
    m = manifest_from_dir(directory, model="m", revision="r")
    return [f.model_dump() for f in m.files]


def test_local_state_trusts_only_what_the_relay_recorded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in (1, 2, 3):
        write_shard(src / f"model-{i}-of-3.safetensors", 64 << 10, seed=i)
    files = entries(src)
    (tmp_path / "m.json").write_text(json.dumps({"files": files}))
    dest = tmp_path / "dest"
    dest.mkdir()
    for i in (1, 2):
        (dest / f"model-{i}-of-3.safetensors").write_bytes(
            (src / f"model-{i}-of-3.safetensors").read_bytes()
        )
    state = kernel.store.local_state(str(dest), files)
    assert state["present"] == []
    assert state["unverified"] == ["model-1-of-3.safetensors", "model-2-of-3.safetensors"]
    assert state["missing"] == ["model-3-of-3.safetensors"]
    assert not state["complete"]

    # The relay's own check records what it verified; from then on sizes and mtimes decide.
    assert relay_main(["check", "--dest", str(dest), "--manifest", str(tmp_path / "m.json")]) == 1
    state = kernel.store.local_state(str(dest), files)
    assert state["present"] == ["model-1-of-3.safetensors", "model-2-of-3.safetensors"]
    assert state["need_bytes"] == 64 << 10
    (dest / ".model-3-of-3.safetensors.partial").write_bytes(b"x" * 100)
    (dest / "model-2-of-3.safetensors").write_bytes(b"short")
    state = kernel.store.local_state(str(dest), files)
    assert [w["name"] for w in state["wrong"]] == ["model-2-of-3.safetensors"]
    assert state["reclaim_bytes"] == 5 + 100
    assert state["free_bytes"] > 0


def test_synthetic_set_is_valid_deterministic_and_seeded(tmp_path: Path) -> None:
    params = {"shards": 2, "shard_bytes": 100_000, "seed": 3, "config": {"hidden_size": 7168}}
    first = weights_source.synthetic(FakeModule(path=str(tmp_path / "a"), **params))
    again = weights_source.synthetic(FakeModule(path=str(tmp_path / "b"), **params))
    other = weights_source.synthetic(FakeModule(path=str(tmp_path / "c"), **{**params, "seed": 4}))
    files = first["manifest"]["files"]
    assert [f["name"] for f in files] == [
        "config.json",
        "model-1-of-2.safetensors",
        "model-2-of-2.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert files == again["manifest"]["files"]
    assert [f["sha256"] for f in other["manifest"]["files"][1:3]] != [
        f["sha256"] for f in files[1:3]
    ]
    for name, blocks in kernel.synthetic.synthetic_set(2, 100_000, 3, {"hidden_size": 7168}):
        data = b"".join(blocks())
        entry = next(f for f in files if f["name"] == name)
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"])
        if name == "config.json":
            assert json.loads(data) == {"hidden_size": 7168}
        elif name == "tokenizer.json":
            vocab = json.loads(data)["model"]["vocab"]
            assert len(vocab) == kernel.synthetic.TOKENIZER_WORDS
            assert sorted(vocab.values()) == list(range(len(vocab)))
        elif name == "tokenizer_config.json":
            assert json.loads(data)["tokenizer_class"] == "PreTrainedTokenizerFast"
        else:
            assert kernel.safetensors.check_safetensors_header(data, len(data)) is None


class FakeModule:
    def __init__(self, check_mode: bool = False, **params: Any) -> None:
        self.check_mode = check_mode
        self.params = {
            "patterns": [],
            "model": "m",
            "revision": "",
            "cache": "",
            "shards": 2,
            "shard_bytes": 65536,
            "seed": 0,
            "config": {"a": 1},
            "generate": False,
            **params,
        }

    def fail_json(self, **kwargs: Any) -> None:
        raise AssertionError(kwargs)


def test_synthetic_module_writes_once_and_repairs(tmp_path: Path) -> None:
    dest = tmp_path / "seed"
    first = weights_source.synthetic(FakeModule(path=str(dest)))
    assert first["changed"] is False
    assert not dest.exists()  # the manifest comes before any write
    wrote = weights_source.synthetic(FakeModule(path=str(dest), generate=True))
    assert wrote["changed"] is True
    assert wrote["manifest"] == first["manifest"]
    assert wrote["manifest"]["files"] == entries(dest)
    again = weights_source.synthetic(FakeModule(path=str(dest), generate=True))
    assert again["changed"] is False
    (dest / "model-2-of-2.safetensors").write_bytes(b"\0" * 65536)
    check = weights_source.synthetic(FakeModule(True, path=str(dest), generate=True))
    assert check["written"] == ["model-2-of-2.safetensors"]
    assert (dest / "model-2-of-2.safetensors").read_bytes() == b"\0" * 65536  # check mode
    weights_source.synthetic(FakeModule(path=str(dest), generate=True))
    assert entries(dest) == first["manifest"]["files"]


def test_dir_module_hashes_once_then_reuses_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_shard(src / "model-1-of-2.safetensors", 50_000, seed=1)
    write_shard(src / "model-2-of-2.safetensors", 50_000, seed=2)
    (src / "config.json").write_text("{}")
    (src / ".hidden").write_text("no")
    cache = tmp_path / "state" / "hashes.json"
    module = FakeModule(kind="dir", path=str(src), cache=str(cache), patterns=["*.safetensors"])
    first = weights_source.from_dir(module)
    assert first["hashed"] == 2
    assert first["manifest"]["files"] == [
        e for e in entries(src) if e["name"].endswith(".safetensors")
    ]
    second = weights_source.from_dir(module)
    assert second["hashed"] == 0
    assert second["manifest"] == first["manifest"]
    os.utime(src / "model-2-of-2.safetensors", ns=(1, 1))
    assert weights_source.from_dir(module)["hashed"] == 1


def test_targets_follow_the_inventory_with_the_seed_first() -> None:
    hosts = ["a", "b", "c", "d"]
    states = {"a": {"complete": True}, "b": {"complete": False}, "c": {}, "d": {"complete": True}}
    assert filters.weights_targets(hosts, states, "a", False, "a") == ["b", "c"]
    assert filters.weights_targets(hosts, states, "a", True, "a") == ["b", "c", "d"]
    assert filters.weights_targets(hosts, states, "", True, "c") == ["c", "a", "b", "d"]
    assert filters.weights_chain(["b", "c"], {"b": "10.0.0.2", "c": "fe80::1"}, 29517) == (
        "10.0.0.2:29517,[fe80::1]:29517"
    )


def test_host_results_name_what_went_wrong() -> None:
    state = {"files": 4, "present": ["a"], "missing": ["b"], "wrong": [], "unverified": ["c"]}
    lost = filters.weights_host_result(
        "lab3",
        "target",
        state,
        {"lost": True, "message": "lab3: lost during the transfer"},
        {"skipped_hosts": [{"host": "10.0.0.3:29517", "reason": "connection lost"}]},
        "10.0.0.3:29517",
    )
    assert lost["status"] == "lost"
    assert "skipped by the chain: connection lost" in lost["message"]
    line = filters.weights_failure(lost)
    assert line.startswith("lab3: weights not verified (lost)")
    assert "fix:" in line
    ok = filters.weights_host_result(
        "lab2",
        "target",
        state,
        {"summary": {"status": "ok", "verified": 4, "files": 4, "received": ["b"]}},
    )
    assert (ok["status"], ok["received"]) == ("ok", ["b"])
    predicted = filters.weights_host_result("lab2", "predicted", {**state, "need_bytes": 10})
    assert predicted["status"] == "would-change"
    assert predicted["need_bytes"] == 10
    untouched = filters.weights_host_result("lab4", "untouched", {"files": 1, "present": ["a"]})
    assert (untouched["status"], untouched["verified"]) == ("ok", 1)
    report = filters.weights_report([ok, lost])
    assert "lab3" in report[2]
    assert "1/4" not in report[1]


def test_synthetic_config_has_kimi_k2_numbers() -> None:
    config = filters.weights_synthetic_config("moonshotai/Kimi-K2-Instruct")
    assert config["hidden_size"] == 7168
    assert config["n_routed_experts"] == 384
    assert config["num_hidden_layers"] == 61
    assert config["model_type"] == "kimi_k2"
    json.dumps(config)


def test_relay_logs_are_parsed_to_the_last_summary() -> None:
    text = "\n".join(
        [
            json.dumps({"event": "listening", "port": 1}),
            json.dumps({"event": "progress", "rx": 5, "total": 10}),
            "{half a line",
            json.dumps({"event": "summary", "status": "ok", "received": ["x"]}),
            "K2RELAY-ALIVE=0",
        ]
    )
    events, alive = weights_wait.parse_log(text)
    assert [e["event"] for e in events] == ["listening", "progress", "summary"]
    assert alive is False
    assert filters.weights_last_summary(text)["status"] == "ok"
    assert filters.weights_last_summary("Traceback ...") == {}


class FakeApi:
    def __init__(self, info: Any = None, error: Exception | None = None) -> None:
        self.info = info
        self.error = error
        self.token: str | None = None

    def model_info(self, repo: str, **kwargs: Any) -> Any:
        self.token = kwargs.get("token")
        if self.error is not None:
            raise self.error
        return self.info


def test_hub_manifest_takes_lfs_sha256_and_lists_the_small_files() -> None:
    sha = "a" * 64
    info = SimpleNamespace(
        id="moonshotai/Kimi-K2-Instruct",
        sha="c" * 40,
        siblings=[
            SimpleNamespace(
                rfilename="model-10-of-61.safetensors", size=5, lfs={"sha256": sha, "size": 5}
            ),
            SimpleNamespace(
                rfilename="model-2-of-61.safetensors", size=7, lfs={"sha256": sha, "size": 7}
            ),
            SimpleNamespace(rfilename="config.json", size=900, lfs=None),
            SimpleNamespace(rfilename="README.md", size=10, lfs=None),
        ],
    )
    api = FakeApi(info)
    found = weights_hub.hub_manifest(
        "moonshotai/Kimi-K2-Instruct", "c" * 40, ["*.safetensors", "*.json"], TOKEN, api=api
    )
    assert api.token == TOKEN
    names = [f["name"] for f in found["manifest"]["files"]]
    assert names == ["model-2-of-61.safetensors", "model-10-of-61.safetensors"]
    assert found["plain"] == [{"name": "config.json", "size": 900}]
    assert found["revision"] == "c" * 40
    assert found["total_bytes"] == 912
    assert TOKEN not in json.dumps(found)


def test_hub_errors_never_carry_the_token() -> None:
    api = FakeApi(error=RuntimeError(f"401 for https://x?token={TOKEN}"))
    with pytest.raises(ManifestError) as caught:
        weights_hub.hub_manifest("r", "c" * 40, [], TOKEN, api=api)
    assert TOKEN not in str(caught.value.problems)
    assert "***" in caught.value.problems[0]


def test_progress_feed_and_views(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        {"host": "lab2", "event": "progress", "rx": 80, "total": 100, "rate": 10.0},
        {"host": "lab3", "event": "progress", "rx": 50, "total": 100, "rate": 10.0},
        {"host": "lab4", "event": "lost"},
        {"host": "seed", "event": "progress", "rx": 0, "tx": 90, "total": 100},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"host": "lab2", "ev')
    feed = progress.ProgressFeed(path)
    feed.poll_once()
    hosts = {h.name: h for h in feed.snapshot()}
    assert (hosts["lab2"].rx, hosts["lab3"].rx, hosts["lab4"].status) == (80, 50, "lost")
    assert hosts["seed"].rx == 90
    with path.open("a") as f:
        f.write('ent": "summary", "status": "ok"}\n')
    feed.poll_once()
    assert {h.name: h for h in feed.snapshot()}["lab2"].rx == 100
    progress.console.print(progress.progress_view(feed.snapshot(), "Distribute | Follow"))
    record = {
        "manifest": {"model": "m", "revision": "r", "files": [{"name": "a", "size": 3}]},
        "check_mode": False,
        "hosts": [
            {"host": "lab2", "status": "ok", "verified": 1, "files": 1, "received": ["a"]},
            {"host": "lab3", "status": "lost", "message": "gone", "files": 1},
        ],
    }
    table = progress.results_table(record)
    assert table.row_count == 2


@pytest.mark.parametrize(
    "plugin",
    [
        "lookup.weights_relay",
        "modules.weights_source",
        "modules.weights_state",
        "modules.weights_hub_download",
    ],
)
def test_plugin_documentation_is_yaml(plugin: str) -> None:
    """Ansible parses these blocks when it loads the plugin; broken YAML fails the play."""
    import importlib

    import yaml

    module = importlib.import_module(
        f"k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.{plugin}"
    )
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["short_description"]
    if hasattr(module, "RETURN"):
        assert isinstance(yaml.safe_load(module.RETURN), dict)
