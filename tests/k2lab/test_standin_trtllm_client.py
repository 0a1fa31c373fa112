"""The stand-in of TensorRT-LLM's benchmark client (k2lab/standin_image/python/tensorrt_llm/
serve/scripts/benchmark_serving.py), run as `k2provision bench` runs it for a TensorRT-LLM
plan: its argv from the product's own `client_argv`, against the stand-in trtllm-serve on
loopback (a subprocess, the stand-in's python on PYTHONPATH), its result file read by the
product's own `parse_result`. No lab, no root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from k2lab.standin import standin_dir
from k2provision.ops.bench import (
    PERCENTILES,
    Client,
    RunSpec,
    client_argv,
    client_env,
    client_for,
    parse_result,
    workload,
)
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "inventory" / "examples" / "trtllm-tp-ep.ini"
STANDIN_PYTHON = standin_dir() / "python"
PROMPTS, INPUT_LEN, OUTPUT_LEN, CONCURRENCY = 16, 8, 8, 4
SERVE = "import sys; from k2standin.trtllm import serve_main; sys.exit(serve_main())"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(records: Path) -> dict[str, str]:
    """This environment without proxies or stand-in knobs, plus the bench client's settings
    and the stand-in's python; short token times keep the run fast."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.lower().endswith("_proxy") and not k.startswith(("K2_STANDIN_", "OMPI_"))
    }
    return {
        **base,
        **client_env(),
        "PYTHONPATH": str(STANDIN_PYTHON),
        "PYTHONDONTWRITEBYTECODE": "1",
        "K2_STANDIN_RECORD_DIR": str(records),
        "K2_STANDIN_TOKEN_SECONDS": "0.001",
    }


@dataclass(frozen=True)
class Server:
    url: str
    model: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The stand-in trtllm-serve on a free loopback port, healthy."""
    tmp = tmp_path_factory.mktemp("trtllm-serve")
    model = tmp / "models" / "Kimi-K2-Instruct"
    model.mkdir(parents=True)
    env = child_env(tmp / "records")
    port = free_port()
    argv = [sys.executable, "-c", SERVE, "serve", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--trust_remote_code", "--tool_parser", "kimi_k2"]
    log = tmp / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                pytest.fail(f"trtllm-serve exited {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"trtllm-serve not healthy within 10 s:\n{log.read_text()}")
            time.sleep(0.05)
        yield Server(url, model, env)
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True)
class Bench:
    client: Client
    spec: RunSpec
    argv: list[str]
    served: str


def bench(server: Server, out_dir: Path, base_url: str | None = None) -> Bench:
    """The client's argv for the example TensorRT-LLM plan, as ops/bench.py builds it."""
    plan = build_plan(load_cluster(INVENTORY))
    assert plan.engine == "trtllm"
    client = client_for(plan)
    assert client.command == ("-m", "tensorrt_llm.serve.scripts.benchmark_serving")
    out_dir.mkdir()
    spec = RunSpec(
        base_url=base_url or server.url,
        served_model_name=plan.served_model_name,
        tokenizer=str(server.model),
        workload=workload("custom", INPUT_LEN, OUTPUT_LEN),
        num_prompts=PROMPTS,
        concurrency=CONCURRENCY,
        out_dir=out_dir,
    )
    return Bench(client, spec, client_argv(client, sys.executable, spec), plan.served_model_name)


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_the_product_runs_the_stand_in_client_and_reads_its_result(
    server: Server, tmp_path: Path
) -> None:
    b = bench(server, tmp_path / "out")
    done = run(b.argv, server.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Serving Benchmark Result" in done.stdout
    result_file = b.spec.out_dir / b.client.result_name
    assert result_file.is_file(), sorted(p.name for p in b.spec.out_dir.iterdir())
    text = result_file.read_text()
    result = parse_result(b.client.result_format, text, PROMPTS, str(result_file))
    assert result.completed == PROMPTS
    assert result.failed == 0
    # Output tokens come from the stand-in server's usage chunks: one per asked token.
    assert result.input_tokens == PROMPTS * INPUT_LEN
    assert result.output_tokens == PROMPTS * OUTPUT_LEN
    assert result.duration_s > 0
    assert result.output_tps > 0
    assert result.total_tps > result.output_tps
    for figures in (result.ttft_ms, result.itl_ms, result.e2e_ms):
        assert 0 < figures.p50 <= figures.p90 <= figures.p99
    assert result.e2e_ms.p50 >= result.ttft_ms.p50

    doc = json.loads(text)
    metrics = [
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "itl", "e2el")
        for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))
    ]
    assert list(doc) == [
        "date",
        "backend",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput:",
        "output_throughput",
        "total_token_throughput",
        "user_throughput",
        "avg_decoded_tokens_per_iter",
        *metrics,
        "request_rate",
        "burstiness",
        "max_concurrency",
    ]
    assert doc["backend"] == "openai"
    assert doc["model_id"] == b.served
    assert doc["tokenizer_id"] == str(server.model)
    assert doc["num_prompts"] == PROMPTS
    assert doc["request_goodput:"] is None
    assert doc["request_rate"] == "inf"
    assert doc["max_concurrency"] == CONCURRENCY


def test_an_unknown_option_exits_2(server: Server, tmp_path: Path) -> None:
    b = bench(server, tmp_path / "out")
    done = run([*b.argv, "--no-such-option"], server.env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unrecognized arguments: --no-such-option" in done.stderr


def without(argv: list[str], option: str, values: int = 0) -> list[str]:
    at = argv.index(option)
    return argv[:at] + argv[at + 1 + values :]


def test_a_missing_model_exits_2(server: Server, tmp_path: Path) -> None:
    b = bench(server, tmp_path / "out")
    done = run(without(b.argv, "--model", 1), server.env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the following arguments are required: --model" in done.stderr


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda argv: without(argv, "--random-ids"), "`--random-ids`"),
        (
            lambda argv: [*without(argv, "--random-range-ratio", 1), "--random-range-ratio", "1"],
            "random_range_ratio must be < 1.0",
        ),
    ],
    ids=["random-without-random-ids", "range-ratio-1"],
)
def test_the_real_clients_refusals(
    server: Server, tmp_path: Path, change: Callable[[list[str]], list[str]], says: str
) -> None:
    """Against a live server, so a client that did not refuse would run and exit 0."""
    b = bench(server, tmp_path / "out")
    done = run(change(b.argv), server.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert says in done.stderr
    assert not (b.spec.out_dir / b.client.result_name).exists()


def test_a_server_that_does_not_answer_fails_the_test_request(
    server: Server, tmp_path: Path
) -> None:
    """The client really sends requests: with nothing on the port, its first one fails."""
    b = bench(server, tmp_path / "out", base_url=f"http://127.0.0.1:{free_port()}")
    done = run(b.argv, server.env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Initial test run failed" in done.stderr
    assert not (b.spec.out_dir / b.client.result_name).exists()
