"""The command line as a user runs it: a real subprocess, real files, exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]


def test_plan_prod_prints_the_4p12d_table() -> None:
    out = k2("plan", "inventory/prod.ini")
    assert out.returncode == 0, out.stderr
    assert "tp 32, dp 32 (attn), ep 32" in out.stdout
    assert "tp 96, dp 96 (attn), ep 96, +96 spare experts" in out.stdout
    assert "gpu-d12" in out.stdout
    assert "endpoint: http://10.10.0.11:8000" in out.stdout


def check_contract(doc: dict[str, Any]) -> None:
    """The JSON contract of `plan --format json` (docs/commands.md, issue contract)."""
    for key in ("engine", "layout", "model", "endpoint", "warnings", "hosts"):
        assert key in doc, key
    assert isinstance(doc["warnings"], list)
    for host in doc["hosts"]:
        assert set(host) >= {"name", "address", "role", "node_rank", "gpus", "processes", "files"}
        assert isinstance(host["node_rank"], int)
        assert isinstance(host["gpus"], int)
        for proc in host["processes"]:
            assert isinstance(proc["name"], str)
            assert all(isinstance(a, str) for a in proc["argv"])
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in proc["env"].items())
        assert all(isinstance(v, str) for v in host["files"].values())


def test_plan_json_follows_the_contract() -> None:
    out = k2("plan", "inventory/prod.ini", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    check_contract(doc)
    assert (doc["engine"], doc["layout"]) == ("sglang", "pd")
    assert len(doc["hosts"]) == 16
    assert doc["hosts"][0]["role"] == "prefill"
    assert doc["hosts"][4]["role"] == "decode"


def test_every_example_inventory_plans(tmp_path: Path) -> None:
    examples = sorted((ROOT / "inventory" / "examples").glob("*.ini"))
    assert len(examples) >= 5
    for inventory in examples:
        out = k2("plan", str(inventory), "--format", "json")
        assert out.returncode == 0, (inventory, out.stderr)
        check_contract(json.loads(out.stdout))


def test_no_shipped_inventory_plans_with_an_image_warning() -> None:
    """Every image a shipped inventory runs is pulled as published or built by apply: the
    plan names each and warns of none."""
    for inventory in [
        ROOT / "inventory" / "prod.ini",
        *(ROOT / "inventory" / "examples").glob("*.ini"),
    ]:
        out = k2("plan", str(inventory))
        assert out.returncode == 0, (inventory, out.stderr)
        warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
        assert not [w for w in warnings if "image" in w.lower()], (inventory, warnings)
        assert "image: " in out.stdout, inventory


def test_render_writes_every_file_per_host(tmp_path: Path) -> None:
    out = k2("render", "inventory/prod.ini", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    for host in plan["hosts"]:
        for path, content in host["files"].items():
            written = tmp_path / host["name"] / path.lstrip("/")
            assert written.read_text() == content
            if path.endswith(".sh"):
                assert os.access(written, os.X_OK)


def test_bad_inventory_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ini"
    bad.write_text("[prefill]\na\n[decode]\na\n[all:vars]\nk2_engine=sglang\nk2_layout=pd\n")
    out = k2("plan", str(bad))
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out.stderr
    assert "host a is in both [prefill] and [decode]" in lines[0]
    assert out.stdout == ""


def test_unfit_hardware_exits_2_naming_the_fix(tmp_path: Path) -> None:
    inv = tmp_path / "h100.ini"
    inv.write_text("[nodes]\nh1\n[all:vars]\nk2_engine=sglang\nk2_layout=tp\nk2_gpu=h100\n")
    out = k2("plan", str(inv))
    assert out.returncode == 2
    # No tp size loads the FP8 weights on H100s (TP 32 cuts 128-wide blocks), and PD's decode
    # reserve leaves no KV cache on an 80 GB GPU: the fix names what does fit.
    assert "fix: choose larger GPUs or another engine" in out.stderr
    assert "sglang tp fits" not in out.stderr


def test_site_tags_are_the_phases_plays_tags_in_order() -> None:
    import yaml

    from k2provision.commands.params import SITE_TAGS

    playbooks = ROOT / "playbooks"
    tags: list[str] = []
    for entry in yaml.safe_load((playbooks / "site.yml").read_text()):
        phase = playbooks / entry["ansible.builtin.import_playbook"]
        for play in yaml.safe_load(phase.read_text()):
            tags += [t for t in play.get("tags", []) if t != "always" and t not in tags]
    assert tuple(tags) == SITE_TAGS


def test_apply_refuses_a_tag_no_phase_carries(tmp_path: Path) -> None:
    out = k2("apply", "inventory/prod.ini", "--tags", "launch,lanch", runs=tmp_path / "runs")
    assert out.returncode == 2, out.stdout + out.stderr
    said = " ".join(out.stderr.split())
    assert "--tags lanch: no phase carries that tag" in said
    assert "preflight, prepare, ssh_mesh, weights, nccl, launch, front, verify, monitoring" in said
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("command", "option", "value", "said"),
    [
        ("apply", "--limit", "", "--limit '': names no host"),
        ("apply", "--limit", " , ", "--limit ' , ': names no host"),
        ("stop", "--limit", "", "--limit '': names no host"),
        ("weights", "--limit", "", "--limit '': names no host"),
        ("apply", "--tags", "", "--tags '': names no phase"),
        ("apply", "--tags", ",", "--tags ',': names no phase"),
    ],
)
def test_an_empty_limit_or_tags_is_refused_before_the_run(
    tmp_path: Path, command: str, option: str, value: str, said: str
) -> None:
    """An empty --limit would run on every host, an empty --tags every phase."""
    out = k2(command, "inventory/prod.ini", f"{option}={value}", runs=tmp_path / "runs")
    assert out.returncode == 2, out.stdout + out.stderr
    assert said in " ".join(out.stderr.split())
    assert "leave " + option + " out" in out.stderr
    assert not (tmp_path / "runs").exists()
