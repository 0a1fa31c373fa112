"""bench's pure core (k2provision/ops/bench.py): presets, the pinned clients' argv (read back by
their real parsers), their result files (tests/fixtures/bench, written by the real clients
against the stand-in), per-node / per-GPU and cost arithmetic, the published figures; and
the stand-in's streams that the clients read (k2lab/standin_image/.../streaming.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k2provision.core.records import Plan
from k2provision.engines import ktransformers, sglang, vllm
from k2provision.errors import K2Error
from k2provision.ops.bench import (
    CONTAINER_DIR,
    LAB_NOTICE,
    NO_CLIENT_RC,
    PRESETS,
    RESULT_MARK,
    ClientResult,
    ClusterRun,
    Percentiles,
    RunSpec,
    client_argv,
    client_for,
    cluster_argv,
    cluster_run,
    cluster_script,
    concurrency_list,
    cost_per_million,
    document,
    parse_result,
    point,
    published_for,
    sanitized,
    scale_of,
    split_output,
    workload,
)
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.runners import ROOT, k2

FIXTURES = ROOT / "tests" / "fixtures" / "bench"
SGLANG_RESULT = sglang.BENCH_CLIENT.result_format
VLLM_RESULT = vllm.BENCH_CLIENT.result_format
sys.path.insert(0, str(ROOT / "k2lab" / "standin_image" / "python"))
from k2standin import streaming  # noqa: E402  (the stand-in image's own package)


def plan_of(name: str) -> Plan:
    path = ROOT / "inventory" / name
    return build_plan(load_cluster(path if path.exists() else ROOT / "inventory/examples" / name))


@pytest.fixture(scope="module")
def prod() -> Plan:
    return plan_of("prod.ini")


# ---------------------------------------------------------------- workloads and options


def test_presets_are_the_seeds_workloads() -> None:
    assert {n: (w.input_len, w.output_len) for n, w in PRESETS.items()} == {
        "lmsys-2000-100": (2000, 100),
        "vllm-1000-512": (1000, 512),
        "vllm-8000-1000": (8000, 1000),
    }
    assert workload("vllm-8000-1000", None, None) is PRESETS["vllm-8000-1000"]
    custom = workload("custom", 64, 8)
    assert (custom.name, custom.input_len, custom.output_len) == ("custom", 64, 8)


@pytest.mark.parametrize(
    ("name", "inp", "out", "named"),
    [
        ("custom", None, 8, "--input-len"),
        ("custom", 64, None, "--output-len"),
        ("custom", 0, 8, "--input-len 0"),
        ("lmsys-2000-100", 64, None, "--workload custom"),
        ("sharegpt", None, None, "lmsys-2000-100"),
    ],
)
def test_workload_refusals_name_the_option(
    name: str, inp: int | None, out: int | None, named: str
) -> None:
    with pytest.raises(K2Error) as caught:
        workload(name, inp, out)
    assert named in str(caught.value)


def test_concurrency_list() -> None:
    assert concurrency_list(None) == (None,)
    assert concurrency_list("2, 4,64") == (2, 4, 64)
    for bad in ("0", "2,x", "4,4", ""):
        with pytest.raises(K2Error):
            concurrency_list(bad)


# ---------------------------------------------------------------- clients


def test_client_per_engine() -> None:
    """Each engine's own client, from its own image."""
    assert client_for(plan_of("prod.ini")).backend == "sglang"
    kt = client_for(plan_of("ktransformers.ini"))
    assert (kt.kind, kt.backend, kt.module) == ("ktransformers", "sglang", "sglang.bench_serving")
    trt = client_for(plan_of("trtllm-tp-ep.ini"))
    assert (trt.kind, trt.backend) == ("trtllm", "openai")
    assert trt.module == "tensorrt_llm.serve.scripts.benchmark_serving"
    argv = client_argv(trt, "python3", spec(Path("/out")))
    assert argv[argv.index("--dataset-name") + 1 :][:2] == ["random", "--random-ids"]
    assert opt(argv, "--result-dir") == "/out"
    assert opt(argv, "--result-filename") == "result.json"
    assert opt(argv, "--model") == "kimi-k2"
    assert opt(argv, "--tokenizer") == "/tok"
    vllm = client_for(plan_of("vllm-tp.ini"))
    assert (vllm.kind, vllm.backend) == ("vllm", "openai")
    assert vllm.command[:2] == ("-m", "vllm.entrypoints.cli.main")


def spec(tmp: Path, concurrency: int | None = 8) -> RunSpec:
    return RunSpec(
        "http://10.0.0.1:8000/", "kimi-k2", "/tok", PRESETS["lmsys-2000-100"], 32, concurrency, tmp
    )


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_sglang_argv(prod: Plan, tmp_path: Path) -> None:
    argv = client_argv(client_for(prod), "/py", spec(tmp_path))
    assert argv[:3] == ["/py", "-m", "sglang.benchmark.serving"]
    assert opt(argv, "--dataset-name") == "random-ids"  # `random` would download ShareGPT
    assert opt(argv, "--random-range-ratio") == "1.0"  # exact lengths in sglang
    assert opt(argv, "--base-url") == "http://10.0.0.1:8000"
    assert opt(argv, "--max-concurrency") == "8"
    assert opt(argv, "--served-model-name") == "kimi-k2"
    assert opt(argv, "--output-file") == str(tmp_path / "result.jsonl")
    assert "--max-concurrency" not in client_argv(client_for(prod), "/py", spec(tmp_path, None))


def test_vllm_argv(tmp_path: Path) -> None:
    argv = client_argv(client_for(plan_of("vllm-tp.ini")), "/py", spec(tmp_path))
    assert argv[:5] == ["/py", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    assert opt(argv, "--random-range-ratio") == "0"  # exact lengths in vLLM
    assert opt(argv, "--metric-percentiles") == "50,90,99"
    assert opt(argv, "--percentile-metrics") == "ttft,itl,e2el"
    assert "--ignore-eos" in argv
    assert opt(argv, "--result-dir") == str(tmp_path)


CAPTURE = r"""
import json, sys
argv = json.loads(sys.argv[1])
def capture(args):
    plain = (str, int, float, bool, type(None))
    print("ARGS=" + json.dumps({k: v if isinstance(v, plain) else str(v)
                                for k, v in vars(args).items()}))
    sys.exit(0)
if argv[1] == "sglang.benchmark.serving":
    import sglang.benchmark.serving as client
    client.run_benchmark = capture
    sys.argv = [argv[1], *argv[2:]]
    client.cli_main()
elif argv[1] == "sglang.bench_serving":
    # sglang-kt builds its parser under `if __name__ == "__main__"`: run it as -m does,
    # with argparse answering the parsed arguments instead of the benchmark running.
    import argparse, runpy
    parse_args = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = lambda self, *a, **k: capture(parse_args(self, *a, **k))
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module("sglang.bench_serving", run_name="__main__")
else:
    import vllm.entrypoints.cli.benchmark.serve as client
    client.main = capture
    from vllm.entrypoints.cli.main import main
    sys.argv = ["vllm", *argv[2:]]
    main()
"""


def parsed_by_the_client(venv: str, argv: list[str]) -> dict[str, object]:
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run scripts/install-engine-parsers")
    out = subprocess.run(
        [str(python), "-W", "ignore", "-c", CAPTURE, json.dumps(argv[1:])],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"},
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("ARGS=")), None)
    assert line, out.stdout[-2000:] + out.stderr[-3000:]
    doc: dict[str, object] = json.loads(line[5:])
    return doc


@pytest.mark.parsers
def test_the_real_sglang_client_reads_the_argv(prod: Plan, tmp_path: Path) -> None:
    args = parsed_by_the_client(".venv-sglang", client_argv(client_for(prod), "py", spec(tmp_path)))
    assert args["backend"] == "sglang"
    assert (args["random_input_len"], args["random_output_len"]) == (2000, 100)
    assert args["random_range_ratio"] == 1.0
    assert (args["num_prompts"], args["max_concurrency"]) == (32, 8)
    assert (args["model"], args["served_model_name"], args["tokenizer"]) == (
        "/tok",
        "kimi-k2",
        "/tok",
    )
    assert args["disable_ignore_eos"] is False
    assert args["disable_stream"] is False


@pytest.mark.parsers
def test_the_real_sglang_kt_client_reads_the_argv(tmp_path: Path) -> None:
    """KTransformers' image carries sglang-kt, whose client is sglang.bench_serving."""
    argv = client_argv(client_for(plan_of("ktransformers.ini")), "py", spec(tmp_path))
    assert argv[1:3] == ["-m", "sglang.bench_serving"]
    args = parsed_by_the_client(".venv-sglang-kt", argv)
    assert (args["backend"], args["dataset_name"]) == ("sglang", "random-ids")
    assert (args["random_input_len"], args["random_output_len"]) == (2000, 100)
    assert args["random_range_ratio"] == 1.0
    assert (args["num_prompts"], args["max_concurrency"]) == (32, 8)
    assert (args["served_model_name"], args["tokenizer"]) == ("kimi-k2", "/tok")
    assert str(args["output_file"]).endswith("/result.jsonl")


@pytest.mark.parsers
def test_the_real_vllm_client_reads_the_argv(tmp_path: Path) -> None:
    argv = client_argv(client_for(plan_of("vllm-tp.ini")), "py", spec(tmp_path))
    args = parsed_by_the_client(".venv-vllm", argv)
    assert (args["backend"], args["endpoint"]) == ("openai", "/v1/completions")
    assert (args["random_input_len"], args["random_output_len"]) == (2000, 100)
    assert args["random_range_ratio"] == "0"
    assert (args["num_prompts"], args["max_concurrency"]) == (32, 8)
    assert args["ignore_eos"] is True
    assert args["metric_percentiles"] == "50,90,99"
    assert args["save_result"] is True


# ---------------------------------------------------------------- results


def test_parse_the_sglang_clients_result() -> None:
    text = (FIXTURES / "sglang-bench-serving.jsonl").read_text()
    result = parse_result(SGLANG_RESULT, text, 16, "fixture")
    assert (result.completed, result.failed) == (16, 0)
    assert (result.input_tokens, result.output_tokens) == (16 * 2000, 16 * 100)
    raw = json.loads(text.splitlines()[-1])
    assert result.ttft_ms == Percentiles(
        raw["median_ttft_ms"], raw["p90_ttft_ms"], raw["p99_ttft_ms"]
    )
    assert result.e2e_ms.p99 == raw["p99_e2e_latency_ms"]
    assert result.output_tps == pytest.approx(raw["output_throughput"])
    assert result.input_tps == pytest.approx(raw["input_throughput"])
    assert "server_info" in text
    kept = sanitized(SGLANG_RESULT, text)
    assert "server_info" not in kept
    assert json.loads(kept)["completed"] == 16


def test_parse_the_sglang_kt_clients_result_without_its_missing_p90() -> None:
    """sglang-kt 0.7.2's JSON line (bench_serving.py run_benchmark's keys) has the median and
    p99 of TTFT and ITL but no p90: those are None, not a refusal; the rest reads as sglang's."""
    fmt = ktransformers.BENCH_CLIENT.result_format
    doc = {
        "server_info": {"model_path": "/models/K2"},
        "duration": 4.0, "completed": 8, "total_input_tokens": 800, "total_output_tokens": 80,
        "median_e2e_latency_ms": 50.0, "p90_e2e_latency_ms": 60.0, "p99_e2e_latency_ms": 70.0,
        "median_ttft_ms": 5.0, "p99_ttft_ms": 9.0,
        "median_itl_ms": 1.0, "p95_itl_ms": 1.5, "p99_itl_ms": 2.0,
    }  # fmt: skip
    result = parse_result(fmt, json.dumps(doc) + "\n", 8, "fixture")
    assert result.ttft_ms == Percentiles(5.0, None, 9.0)
    assert result.itl_ms == Percentiles(1.0, None, 2.0)
    assert result.e2e_ms == Percentiles(50.0, 60.0, 70.0)
    assert (result.completed, result.failed) == (8, 0)
    assert "server_info" not in sanitized(fmt, json.dumps(doc))
    # sglang's own format still wants its p90: the same line is not one of its results.
    with pytest.raises(K2Error, match="p90_ttft_ms"):
        parse_result(SGLANG_RESULT, json.dumps(doc), 8, "fixture")


def test_parse_the_vllm_clients_result() -> None:
    text = (FIXTURES / "vllm-bench-serve.json").read_text()
    result = parse_result(VLLM_RESULT, text, 8, "fixture")
    raw = json.loads(text)
    assert (result.completed, result.failed) == (8, 0)
    assert (result.input_tokens, result.output_tokens) == (8 * 1000, 8 * 512)
    assert result.itl_ms == Percentiles(raw["p50_itl_ms"], raw["p90_itl_ms"], raw["p99_itl_ms"])
    assert result.e2e_ms.p90 == raw["p90_e2el_ms"]
    assert result.output_tps == pytest.approx(raw["output_throughput"])


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "empty"),
        ("{nope", "not JSON"),
        ('{"completed": 3}', "'duration'"),
        ('{"completed": "x"}', "'completed'"),
    ],
)
def test_a_bad_result_file_is_named(text: str, named: str) -> None:
    with pytest.raises(K2Error) as caught:
        parse_result(SGLANG_RESULT, text, 4, "runs/x/result.jsonl")
    assert "runs/x/result.jsonl" in str(caught.value)
    assert named in str(caught.value)


# ---------------------------------------------------------------- figures


def result(output_tps: float, input_tps: float) -> ClientResult:
    q = Percentiles(1.0, 2.0, 3.0)
    return ClientResult(
        completed=10,
        failed=0,
        duration_s=10.0,
        input_tokens=int(input_tps * 10),
        output_tokens=int(output_tps * 10),
        ttft_ms=q,
        itl_ms=q,
        e2e_ms=q,
    )


def test_seed_002_figures_reproduce_its_cost(prod: Plan) -> None:
    """The LMSYS run's own numbers through bench's arithmetic: 16 nodes, 128 GPUs, 384k
    output tok/s = 24k per node = 100 % of the published figure, ~$0.21 per 1M output."""
    scale = scale_of(prod)
    assert (scale.nodes, scale.gpus) == (16, 128)
    published = published_for(prod, "lmsys-2000-100")
    p = point(result(384_000, 896_000), 480, scale, 2.3, published)
    out, inp = p.throughput["output"], p.throughput["input"]
    assert out.per_node == pytest.approx(24_000)
    assert out.per_gpu == pytest.approx(3_000)
    assert out.published_percent == pytest.approx(100)
    assert inp.published_percent == pytest.approx(100)
    assert p.throughput["total"].published_percent is None
    assert p.cost_usd_per_1m["output"] == pytest.approx(0.213, abs=0.001)
    assert p.cost_usd_per_1m["input"] == pytest.approx(128 * 2.3 / (896_000 * 3600) * 1e6)


def test_published_figures_only_for_the_same_engine_layout_and_workload(prod: Plan) -> None:
    assert {p.metric for p in published_for(prod, "lmsys-2000-100")} == {"input", "output"}
    assert published_for(prod, "vllm-1000-512") == []
    assert published_for(plan_of("vllm-tp.ini"), "lmsys-2000-100") == []
    p = point(result(100, 100), None, scale_of(prod), 2.3, [])
    assert p.throughput["output"].published_percent is None


def test_cost_needs_tokens() -> None:
    assert cost_per_million(8, 2.3, 0.0) is None
    assert cost_per_million(8, 2.0, 1000.0) == pytest.approx(16 / 3.6)


def test_document_is_json_with_the_lab_notice_only_in_a_lab(prod: Plan, tmp_path: Path) -> None:
    p = point(result(1000, 2000), 4, scale_of(prod), 2.3, published_for(prod, "lmsys-2000-100"))
    doc = document(
        plan=prod,
        inventory=Path("inventory/prod.ini"),
        client=client_for(prod),
        workload=PRESETS["lmsys-2000-100"],
        num_prompts=10,
        gpu_hour_usd=2.3,
        points=[p],
        record=tmp_path,
        started_at="t",
        ok=True,
        problems=[],
    )
    again = json.loads(json.dumps(doc))
    assert again["schema"] == 1
    assert again["notice"] is None
    assert again["lab"] is False
    assert again["points"][0]["throughput"]["output"]["published_per_node"] == 24_000
    assert again["points"][0]["latency_ms"]["ttft"] == {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    lab = prod.model_copy(update={"lab": True})
    assert (
        document(
            plan=lab,
            inventory=Path("x"),
            client=client_for(lab),
            workload=PRESETS["lmsys-2000-100"],
            num_prompts=1,
            gpu_hour_usd=2.3,
            points=[],
            record=tmp_path,
            started_at="t",
            ok=True,
            problems=[],
        )["notice"]
        == LAB_NOTICE
    )


# ---------------------------------------------------------------- the stand-in's streams


def events(body: bytes) -> list[object]:
    lines = [x[6:] for x in body.decode().splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_generate_stream_has_as_many_tokens_as_asked() -> None:
    got = events(
        streaming.generate_stream(
            {
                "text": "a b c",
                "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
                "stream": True,
            }
        )
    )
    assert len(got) == 5
    last = got[-1]
    assert isinstance(last, dict)
    assert last["meta_info"]["completion_tokens"] == 5
    assert last["meta_info"]["prompt_tokens"] == 3
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert last["text"] == streaming.TOKEN_TEXT * 5  # sglang streams the whole text so far


def test_openai_streams_carry_usage_as_asked() -> None:
    chunks = events(
        streaming.completion_stream(
            {
                "prompt": "x y",
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            "kimi-k2",
        )
    )
    texts = [c["choices"][0]["text"] for c in chunks if isinstance(c, dict) and c["choices"]]
    assert texts.count(streaming.TOKEN_TEXT) == 4
    usage_only = chunks[-1]
    assert isinstance(usage_only, dict)
    assert usage_only["choices"] == []
    assert usage_only["usage"]["completion_tokens"] == 4
    chat = events(
        streaming.chat_stream(
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 3,
                "stream": True,
            },
            "kimi-k2",
        )
    )
    assert [c["choices"][0]["delta"].get("content") for c in chat if isinstance(c, dict)] == [
        streaming.TOKEN_TEXT
    ] * 3 + [None]
    assert isinstance(chat[-1], dict)
    assert chat[-1]["usage"]["completion_tokens"] == 3  # no include_usage: on the last chunk
    assert chat[-1]["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------- the command's refusals


def k2_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return k2("bench", "inventory/prod.ini", *args, runs=tmp_path / "runs", timeout=120)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--workload", "nope"), "lmsys-2000-100, vllm-1000-512"),
        (("--concurrency", "4,x"), "--concurrency"),
        (("--num-prompts", "0"), "--num-prompts 0"),
        (("--client", "controller"), "--tokenizer"),  # prod's model directory is not here
        (
            (
                "--client",
                "controller",
                "--tokenizer",
                "/tok",
                "--client-python",
                "/usr/bin/true-not-here",
            ),
            "--client-python /usr/bin/true-not-here",
        ),
        (
            (
                "--client",
                "controller",
                "--tokenizer",
                "/tok",
                "--client-python",
                "/usr/bin/python3",
            ),
            "import sglang.benchmark.serving",
        ),
        (("--client", "laptop"), "--client 'laptop': expected one of cluster, controller"),
        (("--client-python", "/usr/bin/python3"), "--client-python goes with --client controller"),
    ],
)
def test_bad_input_is_exit_2_before_any_run(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    out = k2_bench(tmp_path, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert named in " ".join(out.stderr.split())
    assert not (tmp_path / "runs").exists()  # no record: nothing ran


# ---------------------------------------------------------------- the client in the cluster


def test_the_in_cluster_client_runs_on_the_endpoints_host_in_the_engine_image(
    prod: Plan,
) -> None:
    run = cluster_run(prod)
    assert run.host == prod.endpoint_host
    engine_images = {p.image for h in prod.hosts if h.gpus for p in h.processes}
    assert run.image in engine_images


def in_cluster(tmp: Path, *, with_key: bool, ca: str | None) -> str:
    run = ClusterRun("h1", "registry/engine:1")
    return cluster_script(sglang.BENCH_CLIENT, run, spec(tmp), with_key=with_key, ca_pem=ca)


def test_the_in_cluster_script_takes_the_key_from_stdin_and_the_ca_as_a_file(
    tmp_path: Path,
) -> None:
    script = in_cluster(tmp_path, with_key=True, ca="-----BEGIN CERTIFICATE-----\nxyz\n")
    assert 'printf "OPENAI_API_KEY="; head -n 1' in script  # the key: stdin -> env file
    assert '--env-file="$d"/env' in script
    assert f"--env=SSL_CERT_FILE={CONTAINER_DIR}/ca.pem" in script
    # requests (the sglang client's readiness check) reads only its own variable
    assert f"--env=REQUESTS_CA_BUNDLE={CONTAINER_DIR}/ca.pem" in script
    assert "--volume=/tok:/tok:ro" in script  # the tokenizer, mounted read-only
    assert str(tmp_path) not in script  # the controller's directory means nothing there
    assert f"{CONTAINER_DIR}/out" in script
    assert "import sglang.benchmark.serving" in script
    keyless = in_cluster(tmp_path, with_key=False, ca=None)
    assert "OPENAI_API_KEY" not in keyless
    assert "SSL_CERT_FILE" not in keyless
    assert "REQUESTS_CA_BUNDLE" not in keyless


def fake_docker(bin_dir: Path, import_ok: bool) -> None:
    """`docker run ... IMAGE python3 ARGS`: runs ARGS on this machine's python3 with the
    --env and --volume options applied, the import check passing or failing."""
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"""#!{sys.executable}
import os, subprocess, sys
args = sys.argv[1:]
env = dict(os.environ)
volumes = {{}}
while not args[0].startswith("registry/"):
    a = args.pop(0)
    if a.startswith("--env="):
        k, _, v = a[6:].partition("=")
        env[k] = v
    elif a.startswith("--env-file="):
        for line in open(a[11:]).read().splitlines():
            if line:
                k, _, v = line.partition("=")
                env[k] = v
    elif a.startswith("--volume="):
        src, dst = a[9:].split(":")[:2]
        volumes[dst] = src
args.pop(0)
if args[:1] == ["python3"] and args[1:2] == ["-c"]:
    sys.exit(0 if {import_ok!r} else 1)
out = [a for a in args if a.startswith("/k2-bench")]
out_dir = volumes["/k2-bench"] + "/out"
with open(out_dir + "/result.jsonl", "w") as f:
    ca = env.get("SSL_CERT_FILE", "/nope").replace("/k2-bench", volumes["/k2-bench"])
    seen = str(os.path.exists(ca)).lower()
    f.write('{{"key": "%s", "ca": %s}}\\n' % (env.get("OPENAI_API_KEY"), seen))
print("client ran")
""")
    docker.chmod(0o755)


@pytest.mark.parametrize("import_ok", [True, False])
def test_the_in_cluster_script_runs_and_reports_as_split_output(
    tmp_path: Path, import_ok: bool
) -> None:
    fake_docker(tmp_path / "bin", import_ok)
    script = in_cluster(tmp_path, with_key=True, ca="CA PEM\n")
    out = subprocess.run(
        ["sh", "-c", script],
        input="s3cret\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
        check=True,
    )
    answer = split_output(out.stdout)
    if not import_ok:
        assert answer.rc == NO_CLIENT_RC
        return
    assert answer.rc == 0
    assert "client ran" in answer.log
    assert json.loads(answer.result) == {"key": "s3cret", "ca": True}
    assert "s3cret" not in script


def test_split_output_without_the_mark_is_no_rc() -> None:
    assert split_output("ssh: connect to host x port 22: refused\n").rc is None
    answer = split_output(f"log line\n\n{RESULT_MARK} rc=3@@\n{{}}\n")
    assert (answer.log, answer.rc, answer.result) == ("log line\n", 3, "{}\n")


def test_the_in_cluster_argv_writes_into_the_containers_directory(tmp_path: Path) -> None:
    argv = cluster_argv(sglang.BENCH_CLIENT, spec(tmp_path))
    assert argv[:3] == ["python3", "-m", "sglang.benchmark.serving"]
    assert opt(argv, "--output-file").startswith(f"{CONTAINER_DIR}/out/")
    assert str(tmp_path) not in " ".join(argv)
