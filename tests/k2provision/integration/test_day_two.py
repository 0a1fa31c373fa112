"""Day two on one cluster of real lab hosts: `k2provision lab up 4` as a 2-prefill / 2-decode
SGLang PD cluster of stand-ins behind the real pinned router, applied once, then in order:
status (0, and its JSON), logs (`decode --tail 5`, --grep, --follow), faults status must name
(a drifted spec, an unreachable host, a removed container), restart --limit recovering the
removed container (status 0 again), verify with the tool call, and bench's presets writing
JSON and a PNG with sglang's own pinned client."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k2provision.ops.bench import LAB_NOTICE, SCHEMA_VERSION
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from k2provision.weights import kernel
from tests.pd_lab import (
    LAB_HF_TOKEN,
    k2,
    remove_engine_containers,
)
from tests.runners import BIN, ROOT, on_host

pytestmark = [pytest.mark.lab, pytest.mark.lab_pd]

TOOL_CALL = 'get_weather({"city": "Paris"}) [id functions.get_weather:0]'
CLIENT_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cluster(
    pd_cluster: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path, Path]]:
    """The session's PD cluster, converged by an apply (state, inventory, runs)."""
    state, inventory = pd_cluster
    runs = tmp_path_factory.mktemp("runs")
    applied = k2("apply", str(inventory), runs=runs)
    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    yield state, inventory, runs
    remove_engine_containers(state)


def newest_record(runs: Path) -> Path:
    return max(runs.iterdir(), key=lambda p: p.stat().st_mtime)


def test_status_is_0_lists_every_planned_process_and_records_nothing_secret(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, runs = cluster
    out = k2("status", str(inventory), runs=runs)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    plan = build_plan(load_cluster(inventory))
    for host in plan.hosts:
        for process in host.processes:
            row = re.search(rf"│ {host.name} +│ {process.name} .*", out.stdout) or re.search(
                rf"│ +│ {process.name} .*", out.stdout
            )
            assert row, (host.name, process.name, out.stdout)
            assert "running" in row.group(0)
            assert "current" in row.group(0)
    assert "no nvidia-smi" in out.stdout  # the lab has no GPUs: said, not an error
    assert "endpoint http://" in out.stdout
    assert "router readiness: ready" in out.stdout
    record = newest_record(runs)
    assert json.loads((record / "summary.json").read_text())["rc"] == 0
    key_body = Path(state.private_key).read_text().splitlines()[1]
    for path in record.rglob("*"):
        if path.is_file():
            assert key_body not in path.read_text(errors="replace"), path


def test_status_json_is_the_documented_schema(cluster: tuple[Any, Path, Path]) -> None:
    _, inventory, runs = cluster
    out = k2("status", str(inventory), "--format", "json", runs=runs)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    plan = build_plan(load_cluster(inventory))
    assert doc["schema"] == 1
    assert doc["ok"] is True
    assert doc["problems"] == []
    assert [h["host"] for h in doc["hosts"]] == [h.name for h in plan.hosts]
    for entry, host in zip(doc["hosts"], plan.hosts, strict=True):
        assert entry["reachable"] is True
        assert entry["gpus"] is None
        assert [p["process"] for p in entry["processes"]] == [p.name for p in host.processes]
        assert {p["state"] for p in entry["processes"]} == {"running"}
        assert {p["spec"] for p in entry["processes"]} == {"current"}
    assert doc["endpoint"]["answers"] is True
    assert doc["endpoint"]["models"] == ["kimi-k2"]
    kinds = {w["kind"] for w in doc["endpoint"]["router"]["workers"]}
    assert kinds == {"prefill", "decode"}
    recorded = json.loads((Path(doc["record"]) / "status.json").read_text())
    assert recorded["hosts"] == doc["hosts"]


def test_logs_tail_and_grep(cluster: tuple[Any, Path, Path]) -> None:
    _, inventory, runs = cluster
    out = k2("logs", str(inventory), "decode", "--tail", "5", runs=runs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for label in ("lab3/sglang-decode | ", "lab4/sglang-decode | "):
        mine = [line for line in lines if line.startswith(label)]
        assert 1 <= len(mine) <= 5, (label, out.stdout)
    assert all(line.startswith(("lab3/", "lab4/")) for line in lines)
    grepped = k2("logs", str(inventory), "--tail", "50", "--grep", r"rank \d", runs=runs)
    assert grepped.returncode == 0, grepped.stderr
    assert grepped.stdout.strip()
    for line in grepped.stdout.splitlines():
        assert re.search(r"rank \d", line.split(" | ", 1)[1]), line


def remote_log_readers(state: Any, host: str) -> list[str]:
    ps = on_host(state, host, "ps -eo args")
    return [line for line in ps.splitlines() if re.match(r"^\S*podman logs", line)]


def test_follow_streams_and_ends_cleanly_on_ctrl_c(cluster: tuple[Any, Path, Path]) -> None:
    state, inventory, runs = cluster
    follower = subprocess.Popen(
        [str(BIN / "k2provision"), "logs", str(inventory), "decode", "--follow", "--tail", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "K2_RUNS_DIR": str(runs)},
    )
    try:
        assert follower.stdout is not None
        ready, _, _ = select.select([follower.stdout], [], [], 30)
        assert ready, "no line within 30 s"
        first = follower.stdout.readline()
        assert first.startswith(("lab3/sglang-decode | ", "lab4/sglang-decode | ")), first
        assert remote_log_readers(state, "lab3")
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=10)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 130, err  # 128 + SIGINT, as tail -f ends on Ctrl-C
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while remote_log_readers(state, "lab3") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert remote_log_readers(state, "lab3") == []


def test_drift_is_named(cluster: tuple[Any, Path, Path], tmp_path: Path) -> None:
    _, inventory, runs = cluster
    changed = tmp_path / "pd.ini"
    changed.write_text(
        inventory.read_text().replace("k2_context_length=32768", "k2_context_length=16384")
    )
    out = k2("status", str(changed), runs=runs)
    assert out.returncode == 1, out.stdout[-4000:]
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem: ")]
    assert {p.split()[1] for p in problems} == {"lab1:", "lab2:", "lab3:", "lab4:"}
    assert all("drift: container runs spec" in p for p in problems)


def test_an_unreachable_host_is_a_line_of_the_answer(
    cluster: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    _, inventory, runs = cluster
    closed = tmp_path / "pd.ini"  # lab4's SSH on a port nothing listens on
    closed.write_text(
        re.sub(
            r"^(lab4 ansible_host=\S+) ansible_port=\d+",
            r"\1 ansible_port=2",
            inventory.read_text(),
            flags=re.MULTILINE,
        )
    )
    assert closed.read_text() != inventory.read_text()
    out = k2("status", str(closed), "--format", "json", runs=runs)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    lab4 = next(h for h in doc["hosts"] if h["host"] == "lab4")
    assert lab4["reachable"] is False
    assert lab4["unreachable"]
    assert doc["problems"] == [f"lab4: unreachable: {lab4['unreachable']}"]
    assert "Traceback" not in out.stderr


def started_at(state: Any) -> dict[str, str]:
    """host/container -> the container's StartedAt, for every k2- container of the lab."""
    found = {}
    for host in state.hosts:
        out = on_host(
            state,
            host.name,
            "docker ps -aq --filter name=k2- "
            "| xargs -r docker inspect -f '{{.Name}} {{.State.StartedAt}}'",
        )
        for line in out.splitlines():
            name, started = line.split(" ", 1)
            found[f"{host.name}/{name.lstrip('/')}"] = started
    return found


def test_a_removed_container_is_named_and_restart_recovers_it(
    cluster: tuple[Any, Path, Path],
) -> None:
    state, inventory, runs = cluster
    before = started_at(state)
    on_host(state, "lab4", "docker rm -f k2-sglang")
    out = k2("status", str(inventory), runs=runs)
    assert out.returncode == 1, out.stdout[-4000:]
    assert "problem: lab4: sglang-decode (k2-sglang): container is missing" in out.stdout
    assert json.loads((newest_record(runs) / "summary.json").read_text())["rc"] == 1

    # No terminal, no --yes: the set is shown, nothing is touched.
    asked = k2("restart", str(inventory), "--limit", "lab4", runs=runs)
    assert asked.returncode == 2, asked.stdout[-3000:] + asked.stderr[-2000:]
    assert "pass --yes" in asked.stderr
    assert "lab4/k2-sglang" not in started_at(state)

    # lab4 is decode rank 1: its instance (lab3, lab4) restarts, said before it happens.
    done = k2("restart", str(inventory), "--limit", "lab4", "--yes", runs=runs)
    print(done.stdout)  # docs/day-two.md's example output comes from here
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "restart 2 process(es) on 2 host(s): lab3, lab4; lab3 added" in done.stdout
    widened = r"│ lab3 +│ sglang-decode +│ k2-sglang +│ same decode instance as lab4"
    assert re.search(widened, done.stdout), done.stdout
    assert "tool call: ok" in done.stdout  # the smoke test after the restart
    record = newest_record(runs)
    assert record.name.endswith("-restart")
    kept = json.loads((record / "restart.json").read_text())
    assert kept["named"] == ["lab4"]
    assert [(s["host"], s["process"]) for s in kept["steps"]] == [
        ("lab3", "sglang-decode"),
        ("lab4", "sglang-decode"),
    ]
    assert json.loads((record / "verify.json").read_text())["tool"]["ok"] is True
    after = started_at(state)
    assert set(after) == set(before)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {"lab3/k2-sglang", "lab4/k2-sglang"}  # prefill and router untouched

    restored = k2("status", str(inventory), runs=runs)
    assert restored.returncode == 0, restored.stdout[-4000:]


def test_restart_of_a_host_the_plan_lacks_is_refused(cluster: tuple[Any, Path, Path]) -> None:
    state, inventory, runs = cluster
    before = started_at(state)
    out = k2("restart", str(inventory), "--limit", "lab9", "--yes", runs=runs)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-2000:]
    assert "'lab9' (--limit, or k2_restart_hosts) is not a host or pool of the plan" in out.stderr
    assert started_at(state) == before


def test_verify_is_0_names_the_tool_call_and_records_both_answers(
    cluster: tuple[Any, Path, Path],
) -> None:
    _, inventory, runs = cluster
    before = set(runs.iterdir())
    out = k2("verify", str(inventory), runs=runs)
    print(out.stdout)  # docs/day-two.md's example output comes from here
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert f"tool call: ok {TOOL_CALL}" in out.stdout
    assert "chat: ok reply 'ready (stand-in)'" in out.stdout
    assert "verify succeeded" in out.stdout
    assert ": 0 changed," in out.stdout  # the smoke test alone: nothing launched or changed
    (record,) = set(runs.iterdir()) - before
    assert record.name.endswith("-verify")
    report = json.loads((record / "verify.json").read_text())
    assert report["thinking"] is False
    assert report["chat"]["ok"] is True
    assert report["tool"]["ok"] is True
    assert report["tool"]["tool_call"]["name"] == "get_weather"
    assert json.loads(report["tool"]["tool_call"]["arguments"]) == {"city": "Paris"}
    assert json.loads((record / "summary.json").read_text())["rc"] == 0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic weights' word-level tokenizer (k2_weights' synthetic set), here on the
    controller for its client, the parsers' sglang venv."""
    if not CLIENT_PYTHON.exists():
        pytest.fail(f"{CLIENT_PYTHON} is missing: run scripts/install-engine-parsers sglang")
    out = tmp_path_factory.mktemp("tokenizer")
    for name, data in kernel.synthetic.tokenizer_files():
        (out / name).write_bytes(data)
    return out


def bench(
    inventory: Path, runs: Path, tokenizer: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
    out = k2(
        "bench",
        str(inventory),
        "--num-prompts",
        "16",
        "--client",
        "controller",
        "--client-python",
        str(CLIENT_PYTHON),
        "--tokenizer",
        str(tokenizer),
        *extra,
        runs=runs,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    records = sorted(p for p in runs.iterdir() if p.name.endswith("-bench"))
    record = records[-1]
    doc = json.loads((record / "bench.json").read_text())
    return out, doc, record


def test_bench_lmsys_preset_writes_json_and_chart(
    cluster: tuple[Any, Path, Path], tokenizer: Path
) -> None:
    _, inventory, runs = cluster
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
    assert doc["workload"] == {
        "name": "lmsys-2000-100",
        "input_len": 2000,
        "output_len": 100,
        "source": doc["workload"]["source"],
    }
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
        doc["gpus"] * 2.3 / (output["total"] * 3600) * 1e6
    )
    for metric in ("ttft", "itl", "e2e"):
        q = point["latency_ms"][metric]
        assert 0 <= q["p50"] <= q["p90"] <= q["p99"], (metric, q)
    result = (record / "concurrency-all" / "result.jsonl").read_text()
    assert "server_info" not in result  # the record keeps no server arguments


def test_bench_concurrency_list_gives_one_point_each(
    cluster: tuple[Any, Path, Path], tokenizer: Path
) -> None:
    _, inventory, runs = cluster
    _, doc, record = bench(
        inventory,
        runs,
        tokenizer,
        "--workload",
        "custom",
        "--input-len",
        "64",
        "--output-len",
        "8",
        "--concurrency",
        "2,4",
    )
    assert [p["concurrency"] for p in doc["points"]] == [2, 4]
    assert [p["output_tokens"] for p in doc["points"]] == [16 * 8, 16 * 8]
    assert doc["workload"]["name"] == "custom"
    for level in (2, 4):
        argv = next(p["argv"] for p in doc["points"] if p["concurrency"] == level)
        assert argv[argv.index("--max-concurrency") + 1] == str(level)
        assert (record / f"concurrency-{level}" / "client.log").is_file()
    assert (record / "bench.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_failing_client_is_exit_1_with_its_last_lines(
    cluster: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    _, inventory, runs = cluster
    out = k2(
        "bench",
        str(inventory),
        "--num-prompts",
        "2",
        "--client",
        "controller",
        "--client-python",
        str(CLIENT_PYTHON),
        "--tokenizer",
        str(tmp_path / "no-tokenizer"),
        runs=runs,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the client failed; its last lines" in out.stderr
    assert "no-tokenizer" in out.stderr  # the client's own complaint, shown
    record = sorted(p for p in runs.iterdir() if p.name.endswith("-bench"))[-1]
    doc = json.loads((record / "bench.json").read_text())
    assert doc["ok"] is False
    assert doc["points"] == []
    assert "the client exited 1" in doc["problems"][0]
    assert json.loads((record / "summary.json").read_text())["rc"] == 1


def test_no_record_of_the_day_holds_a_secret(cluster: tuple[Any, Path, Path]) -> None:
    """Last in the module: every record apply, status, logs, restart, verify and bench wrote
    on this cluster is free of the lab's private key and of the HF token in their environment."""
    state, _, runs = cluster
    kinds = {p.name.rsplit("-", 1)[-1] for p in runs.iterdir() if p.is_dir()}
    assert {"apply", "status", "restart", "verify", "bench"} <= kinds, kinds
    key_body = Path(state.private_key).read_text().splitlines()[1]
    files = [p for p in runs.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        assert LAB_HF_TOKEN not in text, path
        assert key_body not in text, path
