"""bench on real lab hosts: sglang's own pinned benchmark client (from .venv-sglang) streams
from a 2-prefill / 2-decode SGLang PD cluster of stand-ins through the real pinned router,
with a word-level tokenizer made offline for the run. The numbers are the stand-in's; what is
tested is the plumbing: presets, the client's argv and result, bench.json, bench.png, the
lab notice."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k2provision.bench import LAB_NOTICE, SCHEMA_VERSION
from tests.integration.pd_lab import ROOT, k2, pd_cluster_up, remove_engine_containers

pytestmark = pytest.mark.lab

CLIENT_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tokenizer, made by the client's own Python, offline."""
    if not CLIENT_PYTHON.exists():
        pytest.fail(f"{CLIENT_PYTHON} is missing: run scripts/install-engine-parsers sglang")
    out = tmp_path_factory.mktemp("tokenizer")
    made = subprocess.run(
        [str(CLIENT_PYTHON), str(ROOT / "tests" / "bench_tokenizer.py"), str(out)],
        capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert (out / "tokenizer.json").is_file()
    return out


@pytest.fixture(scope="module")
def cluster(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """4 lab hosts as a converged 2-prefill / 2-decode PD cluster (inventory, runs)."""
    inventory = tmp_path_factory.mktemp("inv") / "pd.ini"
    runs = tmp_path_factory.mktemp("runs")
    state = pd_cluster_up(inventory)
    applied = k2("apply", str(inventory), runs=runs)
    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    yield inventory, runs
    remove_engine_containers(state)


def bench(inventory: Path, runs: Path, tokenizer: Path, *extra: str
          ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    out = k2("bench", str(inventory), "--num-prompts", "16", "--client-python",
             str(CLIENT_PYTHON), "--tokenizer", str(tokenizer), *extra, runs=runs)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    records = sorted(p for p in runs.iterdir() if p.name.endswith("-bench"))
    record = records[-1]
    doc = json.loads((record / "bench.json").read_text())
    return out, doc, record


def test_bench_lmsys_preset_writes_json_and_chart(
    cluster: tuple[Path, Path], tokenizer: Path
) -> None:
    inventory, runs = cluster
    out, doc, record = bench(inventory, runs, tokenizer, "--workload", "lmsys-2000-100")
    assert LAB_NOTICE in " ".join(out.stdout.split())
    assert "throughput (tok/s) and cost" in out.stdout
    # seed 002's figures for SGLang PD on this workload, per node, beside the measured ones
    assert "56,000" in out.stdout
    assert "24,000" in out.stdout
    assert (record / "bench.png").read_bytes()[:8] == PNG_SIGNATURE
    assert doc["schema"] == SCHEMA_VERSION
    assert doc["ok"] is True
    assert doc["problems"] == []
    assert doc["lab"] is True
    assert doc["notice"] == LAB_NOTICE
    assert (doc["engine"], doc["layout"]) == ("sglang", "pd")
    assert doc["workload"] == {"name": "lmsys-2000-100", "input_len": 2000, "output_len": 100,
                               "source": doc["workload"]["source"]}
    assert doc["client"]["kind"] == "sglang"
    assert doc["gpus"] > 0
    assert doc["nodes"] == 4
    [point] = doc["points"]
    assert point["concurrency"] is None
    assert point["completed"] == 16
    assert point["failed"] == 0
    assert point["output_tokens"] == 16 * 100
    assert point["input_tokens"] == 16 * 2000
    output = point["throughput"]["output"]
    assert output["per_node"] == pytest.approx(output["total"] / doc["nodes"])
    assert output["per_gpu"] == pytest.approx(output["total"] / doc["gpus"])
    assert output["published_per_node"] == 24_000
    assert point["throughput"]["input"]["published_per_node"] == 56_000
    assert point["cost_usd_per_1m"]["output"] == pytest.approx(
        doc["gpus"] * 2.3 / (output["total"] * 3600) * 1e6)
    for metric in ("ttft", "itl", "e2e"):
        q = point["latency_ms"][metric]
        assert 0 <= q["p50"] <= q["p90"] <= q["p99"], (metric, q)
    result = (record / "concurrency-all" / "result.jsonl").read_text()
    assert "server_info" not in result  # the record keeps no server arguments


def test_bench_concurrency_list_gives_one_point_each(
    cluster: tuple[Path, Path], tokenizer: Path
) -> None:
    inventory, runs = cluster
    _, doc, record = bench(inventory, runs, tokenizer, "--workload", "custom",
                           "--input-len", "64", "--output-len", "8", "--concurrency", "2,4")
    assert [p["concurrency"] for p in doc["points"]] == [2, 4]
    assert [p["output_tokens"] for p in doc["points"]] == [16 * 8, 16 * 8]
    assert doc["workload"]["name"] == "custom"
    for level in (2, 4):
        argv = next(p["argv"] for p in doc["points"] if p["concurrency"] == level)
        assert argv[argv.index("--max-concurrency") + 1] == str(level)
        assert (record / f"concurrency-{level}" / "client.log").is_file()
    assert (record / "bench.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_failing_client_is_exit_1_with_its_last_lines(
    cluster: tuple[Path, Path], tmp_path: Path
) -> None:
    inventory, runs = cluster
    out = k2("bench", str(inventory), "--num-prompts", "2", "--client-python",
             str(CLIENT_PYTHON), "--tokenizer", str(tmp_path / "no-tokenizer"), runs=runs)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the client failed; its last lines" in out.stderr
    assert "no-tokenizer" in out.stderr  # the client's own complaint, shown
    record = sorted(p for p in runs.iterdir() if p.name.endswith("-bench"))[-1]
    doc = json.loads((record / "bench.json").read_text())
    assert doc["ok"] is False
    assert doc["points"] == []
    assert "the client exited 1" in doc["problems"][0]
    assert json.loads((record / "summary.json").read_text())["rc"] == 1
