"""What `k2provision bench` decides and computes, as pure functions of data.

- Workloads: the seeds' benchmark shapes as named presets (seed 002's LMSYS 2000 in / 100 out;
  the vLLM recipe's 1000/512 and 8000/1000, seed 003) and custom lengths.
- The engine's own pinned client and its argv: SGLang and KTransformers plans (both serve
  through `sglang.launch_server`) and TensorRT-LLM plans (an OpenAI-compatible server) run
  sglang's `python -m sglang.benchmark.serving` (sglang 0.5.23's home of `sglang.bench_serving`,
  which is a deprecated alias there); vLLM plans run `vllm bench serve`. Options as the pinned
  argparsers define them (sglang/benchmark/serving.py `cli_main`, vllm/benchmarks/serve.py
  `add_cli_args`). Prompts are random token ids, fixed lengths, so nothing is downloaded.
- The client's result file -> a typed result; from it and the plan: throughput per node and
  per GPU, TTFT / ITL / end-to-end p50, p90, p99, cost per 1M tokens at a GPU-hour price, and
  the published figure for the same engine, layout and workload where one exists.

- Where the client runs: by default inside the cluster, in the engine's own image on the
  endpoint's host (the router's, or the first host), where the pinned client and the model's
  tokenizer already are (`cluster_run`, `cluster_script`); or on the controller.

No I/O here: the command (k2provision/commands/bench.py) runs the client and writes records.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from k2provision.core.records import AccessFiles, Plan
from k2provision.engines import REGISTRY
from k2provision.engines.base import BenchClient, PublishedFigure, ResultFormat
from k2provision.errors import ArgumentError, K2Error
from k2provision.ops.endpoint_access import read_ca

SCHEMA_VERSION = 1
DEFAULT_GPU_HOUR_USD = 2.3
"""The seeds' figure: seed 002 prices an H200 at $2.3 per GPU-hour."""
DEFAULT_NUM_PROMPTS = 1000
PERCENTILES = (50, 90, 99)
LAB_NOTICE = (
    "lab plan: a stand-in answers instead of a model, so these numbers measure the plumbing "
    "(client, router, streaming), not an engine; they are meaningless as performance figures"
)


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    source: str


PRESETS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "lmsys-2000-100",
            2000,
            100,
            "seed 002: LMSYS, Kimi K2 on 128 x H200 (4P12D), 2000 in / 100 out",
        ),
        Workload(
            "vllm-1000-512", 1000, 512, "seed 003: vLLM recipe, FP8 on 16 x H800, 1000 in / 512 out"
        ),
        Workload(
            "vllm-8000-1000",
            8000,
            1000,
            "seed 003: vLLM recipe, FP8 on 16 x H200, 8000 in / 1000 out",
        ),
    )
}
CUSTOM = "custom"
# The longest prompt or output a custom workload asks for: the contract's longest context.
MAX_TOKENS = 2097152
WORKLOAD_NAMES = (*PRESETS, CUSTOM)


def workload(name: str, input_len: int | None, output_len: int | None) -> Workload:
    """A preset, or custom lengths (both needed; a preset takes none)."""
    if name == CUSTOM:
        if input_len is None or output_len is None:
            missing = [
                o
                for o, v in (("--input-len", input_len), ("--output-len", output_len))
                if v is None
            ]
            raise ArgumentError(
                [f"--workload custom needs {' and '.join(missing)} (tokens per request)"]
            )
        bad = [
            f"{o} {v}: expected a positive number of tokens, at most {MAX_TOKENS}"
            for o, v in (("--input-len", input_len), ("--output-len", output_len))
            if not 1 <= v <= MAX_TOKENS
        ]
        if bad:
            raise ArgumentError(bad)
        return Workload(CUSTOM, input_len, output_len, "custom lengths")
    if name not in PRESETS:
        raise ArgumentError([f"--workload {name!r}: expected one of {', '.join(WORKLOAD_NAMES)}"])
    if input_len is not None or output_len is not None:
        raise ArgumentError(
            [
                f"--input-len/--output-len go with --workload custom; {name} fixes "
                f"{PRESETS[name].input_len} in / {PRESETS[name].output_len} out"
            ]
        )
    return PRESETS[name]


def concurrency_list(text: str | None) -> tuple[int | None, ...]:
    """'2,4,8' -> (2, 4, 8); None -> (None,): one run with no limit (all prompts at once)."""
    if text is None:
        return (None,)
    values = []
    for word in (w.strip() for w in text.split(",")):
        if not word.isdigit() or int(word) < 1:
            raise ArgumentError(
                [
                    f"--concurrency {text!r}: expected positive whole numbers, "
                    "comma-separated (e.g. 1,8,64)"
                ]
            )
        values.append(int(word))
    if len(set(values)) != len(values):
        raise ArgumentError([f"--concurrency {text!r}: a value is repeated"])
    return tuple(values)


# ---------------------------------------------------------------- the client


Client = BenchClient


def client_for(plan: Plan) -> Client:
    """The pinned client that fits the plan's engine (the engine declares it)."""
    return REGISTRY[plan.engine].BENCH_CLIENT


@dataclass(frozen=True)
class RunSpec:
    """One client run: everything its argv depends on."""

    base_url: str
    served_model_name: str
    tokenizer: str
    workload: Workload
    num_prompts: int
    concurrency: int | None
    out_dir: Path
    seed: int = 1


def client_argv(client: Client, python: str, spec: RunSpec) -> list[str]:
    """The client's command line: random token ids of fixed length, streamed, ignore_eos,
    the result file in `spec.out_dir`."""
    w = spec.workload
    limit = [] if spec.concurrency is None else ["--max-concurrency", str(spec.concurrency)]
    common = [
        "--backend",
        client.backend,
        "--base-url",
        spec.base_url.rstrip("/"),
        "--random-input-len",
        str(w.input_len),
        "--random-output-len",
        str(w.output_len),
        "--num-prompts",
        str(spec.num_prompts),
        *limit,
        "--tokenizer",
        spec.tokenizer,
        "--seed",
        str(spec.seed),
        "--disable-tqdm",
    ]
    values = {
        "served_model_name": spec.served_model_name,
        "tokenizer": spec.tokenizer,
        "out_dir": str(spec.out_dir),
        "result_name": client.result_name,
        "percentiles": ",".join(map(str, PERCENTILES)),
    }
    return [python, *client.command, *common, *(o.format(**values) for o in client.options)]


def ca_env(path: str) -> dict[str, str]:
    """The client's environment that makes it trust the endpoint's CA at `path`: Python's ssl
    and aiohttp read SSL_CERT_FILE; `requests` (sglang 0.5.23 benchmark/serving.py
    `wait_for_endpoint`, the readiness check before any request) reads only its own
    REQUESTS_CA_BUNDLE and otherwise trusts certifi's store alone."""
    return {"SSL_CERT_FILE": path, "REQUESTS_CA_BUNDLE": path}


def client_env() -> dict[str, str]:
    """What the client's environment adds: never the network for tokenizers or datasets."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "PYTHONUNBUFFERED": "1",
    }


# ---------------------------------------------------------------- in the cluster

CLIENT_PLACES = ("cluster", "controller")
CONTAINER_DIR = "/k2-bench"
"""Where the run's scratch directory on the host appears inside the client's container."""
CONTAINER_PYTHON = "python3"
"""The engine images' Python (every pinned engine image, and the lab's stand-in, has it)."""
RESULT_MARK = "@@k2provision-bench-result"
"""The line after the client's output on the host: `MARK rc=N@@`, then the result file."""
NO_CLIENT_RC = 97
"""The host script's status when the client's module does not import in the image."""


@dataclass(frozen=True)
class ClusterRun:
    """Where an in-cluster client runs: a host of the plan and the engine's image there."""

    host: str
    image: str


def cluster_run(plan: Plan) -> ClusterRun:
    """The endpoint's host (the router's, or the single engine's) and the engine image: the
    image of a GPU host's process (a router may run in an image without the client)."""
    names = [h.name for h in plan.hosts]
    host = plan.endpoint_host if plan.endpoint_host in names else names[0]
    images = [p.image for h in plan.hosts if h.gpus > 0 for p in h.processes]
    if not images:
        raise K2Error(
            [
                f"{plan.engine} {plan.layout}: no engine process in the plan, so no "
                "image to run the benchmark client in; fix: --client controller"
            ]
        )
    return ClusterRun(host, images[0])


def cluster_argv(client: Client, spec: RunSpec) -> list[str]:
    """The client's argv inside its container on the cluster's host."""
    inside = RunSpec(
        spec.base_url,
        spec.served_model_name,
        spec.tokenizer,
        spec.workload,
        spec.num_prompts,
        spec.concurrency,
        Path(CONTAINER_DIR, "out"),
        spec.seed,
    )
    return client_argv(client, CONTAINER_PYTHON, inside)


def cluster_script(
    client: Client,
    run: ClusterRun,
    spec: RunSpec,
    *,
    with_key: bool,
    ca_pem: str | None,
) -> str:
    """The shell command that runs the client on `run.host` in the engine's image, with the
    model's tokenizer mounted read-only. The API key comes on stdin into an env file of a
    private scratch directory (never an argv); the CA, public, comes in the command. The
    host prints the client's output, then `RESULT_MARK rc=N@@` and the result file."""
    argv = cluster_argv(client, spec)
    env = [f"--env={k}={v}" for k, v in client_env().items()]
    if ca_pem is not None:
        env += [f"--env={k}={v}" for k, v in ca_env(f"{CONTAINER_DIR}/ca.pem").items()]
    tokenizer = spec.tokenizer
    mounts = [f"--volume={tokenizer}:{tokenizer}:ro"] if tokenizer.startswith("/") else []
    docker = [
        "docker",
        "run",
        "--rm",
        "--network=host",
        "--env-file={d}/env",
        *env,
        "--volume={d}:" + CONTAINER_DIR,
        *mounts,
        run.image,
    ]
    # "{d}" stands for the scratch directory: fixed text of ours, left unquoted around "$d".
    quoted = " ".join(a.replace("{d}", '"$d"') if "{d}" in a else shlex.quote(a) for a in docker)
    check = shlex.join([CONTAINER_PYTHON, "-c", f"import {client.module}"])
    lines = [
        "umask 077",
        "d=$(mktemp -d /tmp/k2-bench.XXXXXX) || exit 70",
        "trap 'rm -rf \"$d\"' EXIT",
        'mkdir "$d/out" && chmod 0777 "$d/out"',
        (
            '{ printf "OPENAI_API_KEY="; head -n 1; echo; } > "$d/env"'
            if with_key
            else ': > "$d/env"'
        ),
    ]
    if ca_pem is not None:
        encoded = base64.b64encode(ca_pem.encode()).decode()
        lines.append(f'echo {encoded} | base64 -d > "$d/ca.pem" && chmod 0644 "$d/ca.pem"')
    lines += [
        f'{quoted} {check} > "$d/check.log" 2>&1 || {{ tail -n 5 "$d/check.log"; '
        f"echo '{RESULT_MARK} rc={NO_CLIENT_RC}@@'; exit 0; }}",
        f"{quoted} {shlex.join(argv)} 2>&1",
        f'echo; echo "{RESULT_MARK} rc=$?@@"',
        f'cat "$d/out/{client.result_name}" 2>/dev/null',
        "exit 0",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ClusterOutput:
    """The host's answer split: the client's log, its exit status and its result file
    (rc None: the host script never got there, e.g. ssh could not connect)."""

    log: str
    rc: int | None
    result: str


def split_output(text: str) -> ClusterOutput:
    """The host script's output -> the client's log, rc and result text."""
    head, mark, tail = text.partition(RESULT_MARK)
    if not mark:
        return ClusterOutput(text, None, "")
    status, _, rest = tail.partition("\n")
    word = status.strip().removeprefix("rc=").removesuffix("@@")
    rc = int(word) if word.lstrip("-").isdigit() else None
    return ClusterOutput(head.rstrip("\n") + "\n", rc, rest)


def ca_text(access: AccessFiles) -> str | None:
    """The endpoint's CA certificate as the client must trust it (None: the default store).
    Reads the controller's file."""
    if not access.tls_ca_file:
        return None
    return read_ca(access.tls_ca_file)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float | None
    """None where the client writes no 90th percentile (sglang-kt 0.7.2 for TTFT and ITL)."""
    p99: float


@dataclass(frozen=True)
class ClientResult:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles

    def per_s(self, tokens: int) -> float:
        return tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def input_tps(self) -> float:
        return self.per_s(self.input_tokens)

    @property
    def output_tps(self) -> float:
        return self.per_s(self.output_tokens)

    @property
    def total_tps(self) -> float:
        return self.per_s(self.input_tokens + self.output_tokens)


def _number(doc: dict[str, Any], key: str, where: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise K2Error([f"{where}: {key!r} is {value!r}, expected a number"])
    return float(value)


def _percentiles(
    doc: dict[str, Any], metric: str, where: str, p50_key: str, fmt: ResultFormat
) -> Percentiles:
    p90 = f"p90_{metric}_ms"
    return Percentiles(
        p50=_number(doc, p50_key.format(metric=metric), where),
        p90=None if metric in fmt.no_p90 else _number(doc, p90, where),
        p99=_number(doc, f"p99_{metric}_ms", where),
    )


def parse_result(fmt: ResultFormat, text: str, num_prompts: int, where: str) -> ClientResult:
    """A client's result file, in the format its client declares -> ClientResult (K2Error
    naming `where` if it is not one)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise K2Error([f"{where}: empty; the client wrote no result"])
    try:
        doc = json.loads(lines[-1] if fmt.json_lines else text)
    except ValueError as error:
        raise K2Error([f"{where}: not JSON ({error})"]) from None
    if not isinstance(doc, dict):
        raise K2Error([f"{where}: expected a JSON object"])
    completed = int(_number(doc, "completed", where))
    failed = (
        int(_number(doc, "failed", where)) if fmt.counts_failed else max(0, num_prompts - completed)
    )
    e2e = fmt.e2e_metric
    p50 = fmt.median
    return ClientResult(
        completed=completed,
        failed=failed,
        duration_s=_number(doc, "duration", where),
        input_tokens=int(_number(doc, "total_input_tokens", where)),
        output_tokens=int(_number(doc, "total_output_tokens", where)),
        ttft_ms=_percentiles(doc, "ttft", where, p50, fmt),
        itl_ms=_percentiles(doc, "itl", where, p50, fmt),
        e2e_ms=_percentiles(doc, e2e, where, p50, fmt),
    )


def sanitized(fmt: ResultFormat, text: str) -> str:
    """The client's result file as the run record keeps it: without the keys its format
    drops (a copy of the server's settings)."""
    if not fmt.dropped:
        return text
    out = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            for key in fmt.dropped:
                doc.pop(key, None)
            out.append(json.dumps(doc))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- figures


@dataclass(frozen=True)
class Scale:
    nodes: int
    gpus: int


def scale_of(plan: Plan) -> Scale:
    """Nodes and GPUs that serve: hosts with GPUs in the plan (a router-only host has none)."""
    serving = [h for h in plan.hosts if h.gpus > 0 and h.pool != "spare"]
    return Scale(nodes=len(serving), gpus=sum(h.gpus for h in serving))


def published_for(plan: Plan, workload_name: str) -> list[PublishedFigure]:
    """The published figures measured with the plan's engine and layout on this workload
    (the engine declares them)."""
    return [
        p
        for p in REGISTRY[plan.engine].PUBLISHED_FIGURES
        if (p.layout, p.workload) == (plan.layout, workload_name)
    ]


@dataclass(frozen=True)
class Throughput:
    total: float
    per_node: float
    per_gpu: float
    published_per_node: float | None = None
    published_percent: float | None = None
    published_source: str | None = None


@dataclass(frozen=True)
class Point:
    """One concurrency's result with everything derived from it."""

    concurrency: int | None
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    throughput: dict[str, Throughput]
    latency_ms: dict[str, Percentiles]
    cost_usd_per_1m: dict[str, float | None]
    argv: list[str] = field(default_factory=list)


def cost_per_million(gpus: int, gpu_hour_usd: float, tokens_per_s: float) -> float | None:
    """USD per 1M tokens when the whole cluster's GPU-hours go to these tokens."""
    if tokens_per_s <= 0:
        return None
    return gpus * gpu_hour_usd / (tokens_per_s * 3600) * 1_000_000


def _throughput(rate: float, scale: Scale, published: PublishedFigure | None) -> Throughput:
    per_node = rate / scale.nodes if scale.nodes else 0.0
    if published is None:
        return Throughput(rate, per_node, rate / scale.gpus if scale.gpus else 0.0)
    return Throughput(
        rate,
        per_node,
        rate / scale.gpus if scale.gpus else 0.0,
        published_per_node=published.per_node,
        published_percent=100 * per_node / published.per_node,
        published_source=published.source,
    )


def point(
    result: ClientResult,
    concurrency: int | None,
    scale: Scale,
    gpu_hour_usd: float,
    published: list[PublishedFigure],
    argv: list[str] | None = None,
) -> Point:
    """A client result, per node and per GPU, priced, beside the published figures."""
    by_metric = {p.metric: p for p in published}
    return Point(
        concurrency=concurrency,
        completed=result.completed,
        failed=result.failed,
        duration_s=result.duration_s,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        throughput={
            "input": _throughput(result.input_tps, scale, by_metric.get("input")),
            "output": _throughput(result.output_tps, scale, by_metric.get("output")),
            "total": _throughput(result.total_tps, scale, None),
        },
        latency_ms={"ttft": result.ttft_ms, "itl": result.itl_ms, "e2e": result.e2e_ms},
        cost_usd_per_1m={
            "output": cost_per_million(scale.gpus, gpu_hour_usd, result.output_tps),
            "input": cost_per_million(scale.gpus, gpu_hour_usd, result.input_tps),
        },
        argv=list(argv or []),
    )


def document(
    *,
    plan: Plan,
    inventory: Path,
    client: Client,
    workload: Workload,
    num_prompts: int,
    gpu_hour_usd: float,
    points: list[Point],
    record: Path,
    started_at: str,
    ok: bool,
    problems: list[str],
) -> dict[str, Any]:
    """bench.json (schema 1; documented in docs/day-two.md)."""
    scale = scale_of(plan)
    return {
        "schema": SCHEMA_VERSION,
        "inventory": str(inventory),
        "started_at": started_at,
        "engine": plan.engine,
        "layout": plan.layout,
        "model": plan.model,
        "gpu": plan.gpu,
        "endpoint": plan.endpoint,
        "served_model_name": plan.served_model_name,
        "lab": plan.lab,
        "notice": LAB_NOTICE if plan.lab else None,
        "client": {"kind": client.kind, "command": client.label, "backend": client.backend},
        "workload": asdict(workload),
        "num_prompts": num_prompts,
        "gpu_hour_usd": gpu_hour_usd,
        "nodes": scale.nodes,
        "gpus": scale.gpus,
        "ok": ok,
        "problems": problems,
        "points": [asdict(p) for p in points],
        "record": str(record),
    }
