"""The stand-in engines (k2lab/standin_image), run directly on this machine as subprocesses.

The stand-in is the test double for the engines' GPU kernels that the lab image carries; here
each entry point runs from the source tree (PYTHONPATH/PATH into k2lab/standin_image) with
loopback addresses and free ports, and its records go to a temporary directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k2lab.errors import LabError
from k2lab.standin import content_hash, standin_dir
from k2provision.engines import REGISTRY
from k2provision.ops import smoke
from k2provision.plan.images import LAB_IMAGE

REPO = Path(__file__).resolve().parents[2]
STANDIN = standin_dir()
PYTHON = sys.executable
SECRET = "s3cret-value-never-recorded"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Env:
    vars: dict[str, str]
    records: Path
    model: Path
    tmp: Path

    def record_files(self, entry: str) -> list[Path]:
        return sorted(self.records.glob(f"{entry}-*.json"))

    def record(self, entry: str, pid: int) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.records / f"{entry}-{pid}.json").read_text())
        return doc


@pytest.fixture
def env(tmp_path: Path) -> Env:
    model = tmp_path / "models" / "Kimi-K2-Instruct"
    model.mkdir(parents=True)
    records = tmp_path / "records"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # `python3` in the wrappers is this interpreter, so the tests run where pytest runs.
    (bindir / "python3").symlink_to(PYTHON)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SGLANG_", "K2_STANDIN_", "OMPI_", "VLLM_", "RAY_"))
    }
    variables = {
        **base,
        "PYTHONPATH": str(STANDIN / "python"),
        "PATH": f"{bindir}:{STANDIN / 'bin'}:{base.get('PATH', '/usr/bin:/bin')}",
        "K2_STANDIN_RECORD_DIR": str(records),
        "K2_STANDIN_RAY_DIR": str(tmp_path / "ray"),
        "K2_STANDIN_JOIN_TIMEOUT": "20",
        "K2_STANDIN_PEER_TIMEOUT": "5",
        "K2_STANDIN_RAY_WAIT": "20",
        "K2_STANDIN_MPI_CONNECT_TIMEOUT": "1",
        "HF_TOKEN": SECRET,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return Env(variables, records, model, tmp_path)


class Proc:
    def __init__(self, argv: list[str], env: Env, extra_env: dict[str, str] | None = None):
        self.argv = argv
        self.log = env.tmp / f"proc-{time.monotonic_ns()}.log"
        self.handle = self.log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            env={**env.vars, **(extra_env or {})},
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self.handle.flush()
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout: float = 15) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.argv[:4]} still running after {timeout} s:\n{self.output()}")

    def terminate(self, timeout: float = 5) -> int:
        """SIGTERM; the exit status (a stand-in exits 0 promptly)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)
        self.handle.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def start(
    procs: list[Proc], env: Env, argv: list[str], extra: dict[str, str] | None = None
) -> Proc:
    proc = Proc(argv, env, extra)
    procs.append(proc)
    return proc


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 5) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def wait_status(
    url: str, proc: Proc, want: int = 200, timeout: float = 15, containing: bytes = b""
) -> bytes:
    """The body of the first answer from `url` with status `want` (and `containing` in it: a
    server answers 503 while starting before it answers 503 for what it waits on)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            pytest.fail(f"exited {proc.popen.returncode} before {url} answered:\n{proc.output()}")
        try:
            status, body = http(url, timeout=2)
            if status == want and containing in body:
                return body
            last = (status, body[:200])
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    pytest.fail(f"{url} did not answer {want} within {timeout} s (last: {last}):\n{proc.output()}")


def get_json(url: str) -> Any:
    status, body = http(url)
    assert status == 200, body
    return json.loads(body)


def run(
    env: Env, argv: list[str], extra: dict[str, str] | None = None, timeout: float = 15
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env={**env.vars, **(extra or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def sglang_argv(env: Env, port: int, *extra: str) -> list[str]:
    return [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(env.model),
        "--served-model-name",
        "kimi-k2",
        "--trust-remote-code",
        "--tool-call-parser",
        "kimi_k2",
        "--tp-size",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def assert_serves(base: str, proc: Proc, model_id: str, gates: tuple[str, ...] = ()) -> None:
    """`base` serves `model_id`: its health routes (`gates`, default the stand-ins' common
    set) answer 200, /v1/models lists it, a chat completion answers."""
    wait_status(f"{base}/health", proc)
    for path in gates or ("/health_generate", "/liveness", "/readiness"):
        assert http(f"{base}{path}")[0] == 200, path
    models = get_json(f"{base}/v1/models")
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [model_id]
    assert models["data"][0]["object"] == "model"
    assert get_json(f"{base}/standin/info")["standin"] is True
    status, body = http(
        f"{base}/v1/chat/completions",
        {
            "model": model_id,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        },
    )
    assert status == 200, body
    reply = json.loads(body)
    assert reply["object"] == "chat.completion"
    assert reply["model"] == model_id
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert "ready (stand-in)" in reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["total_tokens"] > 0


# ---------------------------------------------------------------- SGLang


def test_sglang_serves_and_records(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    began = time.monotonic()
    proc = start(procs, env, sglang_argv(env, port))
    assert_serves(f"http://127.0.0.1:{port}", proc, "kimi-k2")
    assert time.monotonic() - began < 5
    record_text = (env.records / f"sglang.launch_server-{proc.pid}.json").read_text()
    record = json.loads(record_text)
    assert record["ok"] is True
    assert record["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--tool-call-parser" in record["argv"]
    assert "HF_TOKEN" in record["env_keys"]
    assert SECRET not in record_text
    assert proc.terminate() == 0


def test_sglang_stream_and_unknown_route(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    proc = start(procs, env, sglang_argv(env, port))
    base = f"http://127.0.0.1:{port}"
    wait_status(f"{base}/health", proc)
    status, body = http(
        f"{base}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4},
    )
    assert status == 200
    events = [line for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum("content" in c["choices"][0]["delta"] for c in chunks) == 4  # as many as asked
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    status, body = http(
        f"{base}/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": True}
    )
    assert status == 200
    last = json.loads(body.decode().split("data: ")[-2])
    assert last["meta_info"]["completion_tokens"] == 3
    assert http(f"{base}/v1/chat/completions", {"messages": []})[0] == 400
    assert http(f"{base}/nope")[0] == 404


@pytest.mark.parametrize(
    ("drop", "add", "named"),
    [
        (("--tool-call-parser", "kimi_k2"), (), "--tool-call-parser"),
        ((), ("--tool-call-parser", "qwen25"), "--tool-call-parser"),
        (("--trust-remote-code",), (), "--trust-remote-code"),
        (("--tp-size", "8"), (), "--tp-size"),
        ((), ("--enable-deepep-moe",), "--enable-deepep-moe"),
        ((), ("--enable-ep-moe",), "--enable-ep-moe"),
        ((), ("--nccl-init-addr", "127.0.0.1:5000"), "--nccl-init-addr"),
        ((), ("--cuda-graph-bs", "1", "2", "4"), "--cuda-graph-bs"),
        ((), ("--nnodes", "2", "--node-rank", "0"), "--dist-init-addr"),
        ((), ("--nnodes", "2", "--dist-init-addr", "127.0.0.1:5757"), "--node-rank"),
        ((), ("--disaggregation-transfer-backend", "mooncake"), "--disaggregation-mode"),
        ((), ("--disaggregation-mode", "both"), "--disaggregation-mode"),
        ((), ("--port", "70000"), "--port"),
        ((), ("--host", "not a host"), "--host"),
        ((), ("--tp-size", "16"), "GPUs per node"),
    ],
)
def test_sglang_rejects(env: Env, drop: tuple[str, ...], add: tuple[str, ...], named: str) -> None:
    argv = sglang_argv(env, free_port())
    if drop:
        index = argv.index(drop[0])
        del argv[index : index + len(drop)]
    result = run(env, [*argv, *add])
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    (record,) = env.record_files("sglang.launch_server")
    doc = json.loads(record.read_text())
    assert doc["ok"] is False
    assert any(named in e for e in doc["errors"])


def test_sglang_rejects_missing_model_dir(env: Env) -> None:
    argv = sglang_argv(env, free_port())
    argv[argv.index("--model-path") + 1] = str(env.tmp / "no-such-model")
    result = run(env, argv)
    assert result.returncode == 2
    assert "--model-path" in result.stderr
    assert "no-such-model" in result.stderr


def test_sglang_pd_env_needs_mode(env: Env) -> None:
    result = run(
        env, sglang_argv(env, free_port()), {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "600"}
    )
    assert result.returncode == 2
    assert "--disaggregation-mode" in result.stderr
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in result.stderr


def test_sglang_port_in_use_exits_1(env: Env) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run(env, sglang_argv(env, port))
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr


def test_sglang_two_nodes_rendezvous(env: Env, procs: list[Proc]) -> None:
    port, dist = free_port(), free_port()
    multi = ("--tp-size", "16", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist}")
    argv0 = sglang_argv(env, port)
    del argv0[argv0.index("--tp-size") : argv0.index("--tp-size") + 2]
    rank0 = start(procs, env, [*argv0, *multi, "--node-rank", "0"])
    base = f"http://127.0.0.1:{port}"
    body = wait_status(f"{base}/health", rank0, want=503, containing=b"node ranks")
    assert b"node ranks 1..1" in body
    # The server says it waits before its rendezvous listens (and reports the ranks it lacks).
    deadline = time.monotonic() + 10
    while "missing_ranks" not in (info := get_json(f"{base}/server_info")):
        assert time.monotonic() < deadline, info
        time.sleep(0.1)
    assert info["missing_ranks"] == [1]

    # A node with other settings is refused and exits non-zero, naming the difference.
    odd = [
        *argv0,
        "--tp-size",
        "8",
        "--nnodes",
        "2",
        "--dist-init-addr",
        f"127.0.0.1:{dist}",
        "--node-rank",
        "1",
        "--port",
        str(free_port()),
    ]
    refused = run(env, odd)
    assert refused.returncode == 1
    assert "tp_size" in refused.stderr

    rank1 = start(procs, env, [*argv0, *multi, "--node-rank", "1", "--port", str(free_port())])
    wait_status(f"{base}/health", rank0)
    assert get_json(f"{base}/server_info")["missing_ranks"] == []
    assert env.record("sglang.launch_server", rank1.pid)["role"] == "rank"
    assert http(f"http://127.0.0.1:{port}/v1/models")[0] == 200

    # Like NCCL, losing a node breaks the group: rank 0 exits non-zero.
    os.killpg(rank1.pid, signal.SIGKILL)
    assert rank0.wait_exit(10) == 1
    assert "went away" in rank0.output()


# ---------------------------------------------------------------- SGLang expert rules


def pd_argv(env: Env, port: int, *extra: str) -> list[str]:
    return sglang_argv(
        env,
        port,
        "--moe-a2a-backend",
        "deepep",
        "--attn-dp-size",
        "8",
        "--disaggregation-mode",
        "decode",
        *extra,
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        # The PD decode render of old: spare slots that nothing rebalances.
        (("--ep-num-redundant-experts", "8"), "fixed copies of experts 0..7"),
        # SGLang asserts an even split of the slots over the EP ranks at model load.
        (
            ("--ep-num-redundant-experts", "6", "--enable-eplb"),
            "390 physical expert slots (routed + --ep-num-redundant-experts) do not split over 8",
        ),
        (
            (
                "--kt-weight-path",
                "/absent",
                "--kt-cpuinfer",
                "8",
                "--kt-threadpool-count",
                "1",
                "--kt-num-gpu-experts",
                "0",
            ),
            "--kt-weight-path /absent",
        ),
    ],
)
def test_sglang_refuses_what_fails_or_wastes_a_gpu_launch(
    env: Env, extra: tuple[str, ...], named: str
) -> None:
    result = run(env, pd_argv(env, free_port(), *extra))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_sglang_accepts_eplb_spares_and_kt_kernel(env: Env) -> None:
    items = [
        {"argv": pd_argv(env, 1, "--ep-num-redundant-experts", "8", "--enable-eplb")},
        {
            "argv": sglang_argv(
                env,
                2,
                "--kt-weight-path",
                str(env.model),
                "--kt-method",
                "FP8",
                "--kt-cpuinfer",
                "56",
                "--kt-threadpool-count",
                "2",
                "--kt-num-gpu-experts",
                "0",
            )
        },
    ]
    checked = subprocess.run(
        ["python3", "-m", "k2standin.dispatch"],
        input=json.dumps({"items": items}),
        env=env.vars,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert [r["errors"] for r in json.loads(checked.stdout)["results"]] == [[], []]


# ---------------------------------------------------------------- the real PD router

ROUTER_PYTHON = REPO / ".venv-sglang" / "bin" / "python"


def real_router(procs: list[Proc], env: Env, *argv: str) -> Proc:
    """The pinned sglang-router itself (from the parser venv), not a stand-in; its Prometheus
    exporter on a free port (its default, 29000 on every interface, may be taken here)."""
    if not ROUTER_PYTHON.exists():
        pytest.fail(f"{ROUTER_PYTHON} is missing: run scripts/install-engine-parsers")
    vars_ = {k: v for k, v in env.vars.items() if k != "PYTHONPATH"}
    router_env = Env(vars_, env.records, env.model, env.tmp)
    metrics = ("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()))
    return start(
        procs,
        router_env,
        [str(ROUTER_PYTHON), "-m", "sglang_router.launch_router", *argv, *metrics],
    )


@pytest.mark.parsers
def test_real_router_serves_in_front_of_the_standins(env: Env, procs: list[Proc]) -> None:
    """The router the lab runs (sglang-router, pinned in the catalog): its CLI as rendered,
    its /readiness once both pools answer, and a chat completion through it."""
    from k2provision.core import catalog

    p_port, d_port, boot, r_port = free_port(), free_port(), free_port(), free_port()
    pd = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "600"}
    prefill = start(
        procs,
        env,
        sglang_argv(
            env,
            p_port,
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            str(boot),
        ),
        pd,
    )
    decode = start(procs, env, sglang_argv(env, d_port, "--disaggregation-mode", "decode"), pd)
    version = subprocess.run(
        [
            str(ROUTER_PYTHON),
            "-c",
            "import importlib.metadata as m; print(m.version('sglang-router'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert version == catalog.ROUTER.version
    router = real_router(
        procs,
        env,
        "--pd-disaggregation",
        "--prefill",
        f"http://127.0.0.1:{p_port}",
        str(boot),
        "--decode",
        f"http://127.0.0.1:{d_port}",
        "--policy",
        "round_robin",
        "--host",
        "127.0.0.1",
        "--port",
        str(r_port),
    )
    base = f"http://127.0.0.1:{r_port}"
    wait_status(f"{base}/readiness", router, timeout=120)
    models = get_json(f"{base}/v1/models")
    assert [m["id"] for m in models["data"]] == ["kimi-k2"]
    status, body = http(
        f"{base}/v1/chat/completions",
        {
            "model": "kimi-k2",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
        },
        timeout=30,
    )
    assert status == 200, body
    assert "ready (stand-in)" in json.loads(body)["choices"][0]["message"]["content"]
    # A `tools` definition passes through the router; the decode server's parsed call comes back.
    status, body = http(
        f"{base}/v1/chat/completions",
        {
            "model": "kimi-k2",
            "messages": [{"role": "user", "content": smoke.TOOL_PROMPT}],
            "tools": [smoke.weather_tool()],
            "tool_choice": "auto",
            "max_tokens": 64,
        },
        timeout=30,
    )
    assert status == 200, body
    check = smoke.check_tool_call(200, body)
    assert check.ok, (check.problems, body)
    assert str(check.tool_call) == 'get_weather({"city": "Paris"}) [id functions.get_weather:0]'
    # sglang's benchmark client (backend sglang): a streamed /generate, which the router sends
    # to a prefill and a decode worker with bootstrap fields, streaming back the decode's
    status, body = http(
        f"{base}/generate",
        {
            "text": "a b c",
            "sampling_params": {"max_new_tokens": 7, "ignore_eos": True},
            "stream": True,
        },
        timeout=30,
    )
    assert status == 200, body
    last = json.loads(body.decode().split("data: ")[-2])
    assert last["meta_info"]["completion_tokens"] == 7
    for proc in (prefill, decode):
        assert proc.terminate() == 0


def test_a_pd_decode_refuses_and_counts_a_prefill_of_another_generation(
    env: Env, procs: list[Proc]
) -> None:
    """sglang-router adds the prefill's bootstrap address to the request it sends a decode
    server (as the router test above shows); the decode stand-in asks that bootstrap server
    for its pairing (model, context length, KV dtype and page size) and refuses a request
    whose prefill differs, counting it (k2_standin_mixed_pairs_total)."""
    pd = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "600"}
    ports = {n: (free_port(), free_port()) for n in ("old", "new")}
    prefills = []
    for name, context in (("old", "32768"), ("new", "16384")):
        port, boot = ports[name]
        prefills.append(
            start(
                procs,
                env,
                sglang_argv(
                    env, port, "--disaggregation-mode", "prefill",
                    "--disaggregation-bootstrap-port", str(boot), "--context-length", context,
                ),
                pd,
            )
        )  # fmt: skip
    # A prefill whose bootstrap server does not answer yet is no verdict for the decode (its
    # check counts nothing): both answer before the first request, however loaded the machine.
    for (_, boot), prefill in zip(ports.values(), prefills, strict=True):
        wait_status(f"http://127.0.0.1:{boot}/route", prefill, timeout=60)
    d_port = free_port()
    decode = start(
        procs,
        env,
        sglang_argv(env, d_port, "--disaggregation-mode", "decode", "--context-length", "16384"),
        pd,
    )
    base = f"http://127.0.0.1:{d_port}"
    wait_status(f"{base}/health", decode)

    def ask(prefill: str) -> tuple[int, bytes]:
        return http(
            f"{base}/v1/chat/completions",
            {
                "model": "kimi-k2",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 4,
                "bootstrap_host": "127.0.0.1",
                "bootstrap_port": ports[prefill][1],
                "bootstrap_room": 7,
            },
            timeout=30,
        )

    def counted(name: str) -> float:
        text = http(f"{base}/metrics")[1].decode()
        line = next(x for x in text.splitlines() if x.startswith(f"k2_standin_{name}_total"))
        return float(line.rsplit(" ", 1)[1])

    assert ask("new")[0] == 200
    assert (counted("checked_pairs"), counted("mixed_pairs")) == (1, 0)
    status, body = ask("old")
    assert status == 500, body
    assert b"context_length=32768; this decode has context_length=16384" in body
    assert (counted("checked_pairs"), counted("mixed_pairs")) == (2, 1)
    assert ask("new")[0] == 200
    assert (counted("checked_pairs"), counted("mixed_pairs")) == (3, 1)


@pytest.mark.parsers
def test_real_router_is_not_ready_without_workers(env: Env, procs: list[Proc]) -> None:
    r_port = free_port()
    router = real_router(
        procs,
        env,
        "--pd-disaggregation",
        "--prefill",
        f"http://127.0.0.1:{free_port()}",
        "8998",
        "--decode",
        f"http://127.0.0.1:{free_port()}",
        "--host",
        "127.0.0.1",
        "--port",
        str(r_port),
    )
    wait_status(f"http://127.0.0.1:{r_port}/liveness", router, timeout=120)
    assert http(f"http://127.0.0.1:{r_port}/readiness")[0] == 503


# ---------------------------------------------------------------- vLLM and Ray


def vllm_argv(env: Env, port: int, *extra: str) -> list[str]:
    return [
        "vllm",
        "serve",
        str(env.model),
        "--served-model-name",
        "kimi-k2",
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "kimi_k2",
        "--tensor-parallel-size",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def test_vllm_serves(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    proc = start(procs, env, vllm_argv(env, port))
    base = f"http://127.0.0.1:{port}"
    assert_serves(base, proc, "kimi-k2")
    status, _ = http(
        f"{base}/v1/chat/completions",
        {"model": "other", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    assert env.record("vllm", proc.pid)["argv"][:2] == ["vllm", "serve"]
    assert proc.terminate() == 0


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda a: a[:2] + a[3:], "a model is required"),
        (
            lambda a: [x for x in a if x not in ("--tool-call-parser", "kimi_k2")],
            "--tool-call-parser",
        ),
        (lambda a: [x for x in a if x != "--enable-auto-tool-choice"], "--enable-auto-tool-choice"),
        (lambda a: [*a, "--headless"], "--data-parallel-address"),
        (
            lambda a: [*a, "--data-parallel-size", "2", "--data-parallel-size-local", "1"],
            "--data-parallel-address",
        ),
        (lambda a: [*a, "--tensor-parallel-size", "16"], "--distributed-executor-backend ray"),
        (lambda a: [*a, "--nccl-init-addr", "x:1"], "--nccl-init-addr"),
    ],
)
def test_vllm_rejects(env: Env, mutate: Any, named: str) -> None:
    result = run(env, mutate(vllm_argv(env, free_port())))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_vllm_missing_model_dir(env: Env) -> None:
    argv = vllm_argv(env, free_port())
    argv[2] = str(env.tmp / "absent")
    result = run(env, argv)
    assert result.returncode == 2
    assert "absent: no such model directory" in result.stderr


def test_vllm_data_parallel_across_nodes(env: Env, procs: list[Proc]) -> None:
    port, rpc = free_port(), free_port()
    dp = (
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "4",
        "--data-parallel-size-local",
        "2",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc),
        "--enable-expert-parallel",
    )
    head = start(procs, env, [*vllm_argv(env, port), *dp])
    base = f"http://127.0.0.1:{port}"
    wait_status(f"{base}/health", head, want=503)
    headless = start(
        procs,
        env,
        [*vllm_argv(env, free_port()), *dp, "--data-parallel-start-rank", "2", "--headless"],
    )
    wait_status(f"{base}/health", head)
    assert env.record("vllm", headless.pid)["role"] == "headless"
    assert get_json(f"{base}/standin/info")["joined"][1]["ranks"] == [2, 4]
    assert headless.terminate() == 0


def test_vllm_head_with_a_start_rank_refuses_headless_ranks(env: Env, procs: list[Proc]) -> None:
    """vllm/v1/engine/utils.py: a head in hybrid load-balancing mode (a start rank on a node
    that is not headless) refuses headless ranks at the handshake, and its start fails."""
    port, rpc = free_port(), free_port()
    dp = (
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "4",
        "--data-parallel-size-local",
        "2",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(rpc),
        "--enable-expert-parallel",
    )
    head = start(procs, env, [*vllm_argv(env, port), *dp, "--data-parallel-start-rank", "0"])
    wait_status(f"http://127.0.0.1:{port}/health", head, want=503)
    headless = start(
        procs,
        env,
        [*vllm_argv(env, free_port()), *dp, "--data-parallel-start-rank", "2", "--headless"],
    )
    assert headless.wait_exit(20) == 1
    assert head.wait_exit(20) == 1
    message = "Remote engine 2 must not use --headless in external or hybrid dp lb mode"
    assert message in head.output()
    assert message in headless.output()


def test_vllm_eplb_slots_must_split_over_the_ep_ranks(env: Env) -> None:
    argv = [
        *vllm_argv(env, free_port()),
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "8",
        "--enable-expert-parallel",
        "--enable-eplb",
        "--eplb-config",
        '{"num_redundant_experts": 4}',
    ]
    result = run(env, argv)
    assert result.returncode == 2
    assert "EPLB: 388 expert slots do not split over 8 EP ranks" in result.stderr


def test_ray_cluster_and_vllm_on_ray(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--num-gpus", "8"]
    head = start(
        procs,
        env,
        ["ray", "start", "--head", "--port", str(port), *common, "--block"],
        {"VLLM_HOST_IP": "127.0.0.1"},
    )
    status_cmd = ["ray", "status", "--address", f"127.0.0.1:{port}"]
    deadline = time.monotonic() + 10
    while run(env, status_cmd).returncode != 0:
        assert time.monotonic() < deadline, head.output()
        time.sleep(0.05)
    worker = start(
        procs, env, ["ray", "start", "--address", f"127.0.0.1:{port}", *common, "--block"]
    )
    # The health check k2provision plans for Ray (python3 -c "import ray; ray.init(...)").
    check = (
        "import sys, ray\naddress, nodes, gpus = sys.argv[1], int(sys.argv[2]), "
        "float(sys.argv[3])\nray.init(address=address, logging_level='ERROR', "
        "log_to_driver=False)\nalive = [n for n in ray.nodes() if n['Alive']]\n"
        "have = sum(n['Resources'].get('GPU', 0.0) for n in alive)\n"
        "sys.exit(0 if len(alive) >= nodes and have >= gpus else 1)\n"
    )
    deadline = time.monotonic() + 10
    while run(env, ["python3", "-c", check, f"127.0.0.1:{port}", "2", "16"]).returncode != 0:
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.1)
    status = run(env, status_cmd)
    assert "2 node(s) alive, 16 GPUs" in status.stdout
    assert env.record("ray", head.pid)["role"] == "head"

    # vLLM with the Ray backend finds the head of "its container" and its 16 GPUs.
    v_port = free_port()
    vllm = start(
        procs,
        env,
        [
            *vllm_argv(env, v_port),
            "--tensor-parallel-size",
            "16",
            "--distributed-executor-backend",
            "ray",
        ],
    )
    wait_status(f"http://127.0.0.1:{v_port}/health", vllm)
    assert get_json(f"http://127.0.0.1:{v_port}/standin/info")["ray_address"] == f"127.0.0.1:{port}"
    assert vllm.terminate() == 0
    assert worker.terminate() == 0
    assert head.terminate() == 0


def test_vllm_on_ray_without_enough_gpus(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    head = start(
        procs,
        env,
        [
            "ray",
            "start",
            "--head",
            "--port",
            str(port),
            "--node-ip-address",
            "127.0.0.1",
            "--num-gpus",
            "8",
            "--block",
        ],
    )
    deadline = time.monotonic() + 10
    while not (env.tmp / "ray" / "ray_current_cluster").exists():
        assert time.monotonic() < deadline, head.output()
        time.sleep(0.05)
    result = run(
        env,
        [
            *vllm_argv(env, free_port()),
            "--tensor-parallel-size",
            "16",
            "--distributed-executor-backend",
            "ray",
        ],
        {"K2_STANDIN_RAY_WAIT": "1"},
    )
    assert result.returncode == 1
    assert "needs 16 GPUs" in result.stderr
    assert "8 GPUs on 1 alive nodes" in result.stderr


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["start", "--head", "--port", "6379"], "--block"),
        (["start", "--block"], "--address"),
        (["start", "--head", "--address", "127.0.0.1:1", "--block"], "--address"),
        (["start", "--address", "nowhere", "--block"], "--address"),
        (["start", "--head", "--node-ip-address", "192.0.2.77", "--block"], "--node-ip-address"),
    ],
)
def test_ray_rejects(env: Env, argv: list[str], named: str) -> None:
    result = run(env, ["ray", *argv])
    assert result.returncode == 2
    assert named in result.stderr


def test_ray_node_ip_must_match_vllm_host_ip(env: Env) -> None:
    result = run(
        env,
        ["ray", "start", "--head", "--node-ip-address", "127.0.0.1", "--block"],
        {"VLLM_HOST_IP": "127.0.0.2"},
    )
    assert result.returncode == 2
    assert "VLLM_HOST_IP" in result.stderr


def test_ray_status_without_cluster(env: Env) -> None:
    result = run(env, ["ray", "status"])
    assert result.returncode == 1
    assert "Could not find any running Ray instance" in result.stderr


# ---------------------------------------------------------------- TensorRT-LLM via mpirun


def trtllm_argv(
    env: Env,
    port: int,
    np: int = 16,
    tp: int = 16,
    hosts: str = "127.0.0.1:8,127.0.0.1:8",
    *extra: str,
) -> list[str]:
    ssh_config = env.tmp / "ssh_config"
    ssh_config.write_text("Host *\n    Port 2233\n")
    options = env.tmp / "extra-llm-api-config.yml"
    options.write_text("enable_attention_dp: true\n")
    return [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(np),
        "-H",
        hosts,
        "-mca",
        "plm_rsh_args",
        f"-p 2233 -F {ssh_config}",
        "-x",
        "PATH",
        "-x",
        "PYTHONUNBUFFERED",
        "trtllm-llmapi-launch",
        "trtllm-serve",
        "serve",
        str(env.model),
        "--backend",
        "pytorch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp_size",
        str(tp),
        "--ep_size",
        "8",
        "--gpus_per_node",
        "8",
        "--trust_remote_code",
        "--tool_parser",
        "kimi_k2",
        "--extra_llm_api_options",
        str(options),
        *extra,
    ]


def test_mpirun_trtllm_serves(env: Env, procs: list[Proc]) -> None:
    port = free_port()
    proc = start(procs, env, trtllm_argv(env, port))
    # trtllm-serve names the model after its directory.
    base = f"http://127.0.0.1:{port}"
    assert_serves(base, proc, "Kimi-K2-Instruct", gates=("/health_generate",))
    # trtllm-serve 1.2's routes only: no SGLang or vLLM introspection, /metrics is JSON.
    for path in ("/liveness", "/readiness", "/model_info", "/get_server_info", "/ready"):
        assert http(f"{base}{path}")[0] == 404, path
    assert get_json(f"{base}/server_info") == {"disaggregated_params": None}
    assert get_json(f"{base}/metrics") == []
    mpi = env.record("mpirun", proc.pid)
    assert mpi["np"] == 16
    assert mpi["command"][:2] == ["trtllm-llmapi-launch", "trtllm-serve"]
    (serve_record,) = env.record_files("trtllm-serve")
    (launch_record,) = env.record_files("trtllm-llmapi-launch")
    assert json.loads(launch_record.read_text())["mpi_world_size"] == "16"
    assert json.loads(serve_record.read_text())["info"]["world_size"] == 16
    assert proc.terminate() == 0


@pytest.mark.parametrize(
    ("kwargs", "extra", "named"),
    [
        ({"np": 24}, (), "-np 24 exceeds"),
        ({"tp": 8}, (), "--tp_size 8"),
        ({"hosts": "127.0.0.1:4,127.0.0.1:12"}, (), "--gpus_per_node 8"),
        ({}, ("--tool_parser", "deepseekv3"), "--tool_parser"),
        ({}, ("--cuda-graph-bs", "8"), "--cuda-graph-bs"),
    ],
)
def test_mpirun_trtllm_rejects(
    env: Env, kwargs: dict[str, Any], extra: tuple[str, ...], named: str
) -> None:
    result = run(env, trtllm_argv(env, free_port(), **kwargs) + list(extra))
    assert result.returncode == 2, result.stderr
    assert named in result.stderr


def test_mpirun_requires_allow_run_as_root(env: Env) -> None:
    if os.geteuid() != 0:
        pytest.skip("Open MPI's root check applies to root only")
    argv = [a for a in trtllm_argv(env, free_port()) if a != "--allow-run-as-root"]
    result = run(env, argv)
    assert result.returncode == 2
    assert "--allow-run-as-root" in result.stderr


def test_mpirun_probes_remote_sshd(env: Env) -> None:
    result = run(env, trtllm_argv(env, free_port(), hosts="127.0.0.1:8,192.0.2.1:8"))
    assert result.returncode == 1
    assert "192.0.2.1:2233" in result.stderr
    assert "sshd" in result.stderr


def test_mpirun_rejects_unknown_option_and_missing_ssh_config(env: Env) -> None:
    argv = trtllm_argv(env, free_port())
    result = run(env, [argv[0], "--no-such-option", *argv[1:]])
    assert result.returncode == 2
    assert "--no-such-option" in result.stderr
    (env.tmp / "ssh_config").unlink()
    result = run(env, argv)
    assert result.returncode == 2
    assert "ssh config" in result.stderr


# ---------------------------------------------------------------- rendered plans


EXAMPLES = [
    *sorted((REPO / "inventory" / "examples").glob("*.ini")),
    REPO / "inventory" / "prod.ini",
]
HOST_VALUES = {
    "ifname-of": "bond0",
    "cidr-of": "10.0.0.0/16",
    "physical-cores-minus": "56",
    "numa-nodes": "2",
}


@pytest.mark.parametrize("inventory", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_launches_pass_the_standin_checks(env: Env, inventory: Path) -> None:
    """Every process of a real render passes the stand-in's checks (model dir and config
    files pointed at local copies; the machine-dependent checks skipped)."""
    out = env.tmp / "render"
    rendered = subprocess.run(
        [str(REPO / ".venv" / "bin" / "k2provision"), "render", str(inventory), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert rendered.returncode == 0, f"{inventory.name} does not render: {rendered.stderr[-2000:]}"
    plan = json.loads((out / "plan.json").read_text())
    images = {p["image"] for h in plan["hosts"] for p in h["processes"]}
    # The stand-in is never the default: only a k2_lab=true plan uses it.
    assert (LAB_IMAGE in images) == bool(plan["lab"])
    config_dir = plan["config_dir"]
    items = []
    for host in plan["hosts"]:
        local_config = str(out / host["name"]) + config_dir
        for process in host["processes"]:
            argv = [
                a.replace(plan["model_dir"], str(env.model)).replace(config_dir, local_config)
                for a in process["argv"]
            ]
            # What the launch script finds on the host, as a host would answer.
            for value in process.get("resolve", []):
                found = HOST_VALUES[value["kind"]]
                argv = [a.replace("${" + value["name"] + "}", found) for a in argv]
            items.append({"argv": argv, "env": process["env"]})
    assert items
    checked = subprocess.run(
        ["python3", "-m", "k2standin.dispatch"],
        input=json.dumps({"items": items}),
        env=env.vars,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    results = json.loads(checked.stdout)["results"]
    problems = {
        f"{r['entry']} {i['argv'][:3]}": r["errors"]
        for i, r in zip(items, results, strict=True)
        if r["errors"]
    }
    assert problems == {}


# ---------------------------------------------------------------- image key


def test_content_hash_tracks_the_sources(tmp_path: Path) -> None:
    copy = tmp_path / "standin"
    subprocess.run(["cp", "-a", str(STANDIN), str(copy)], check=True)
    first = content_hash(copy)
    assert content_hash(STANDIN) == first
    cache = copy / "python" / "k2standin" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "x.cpython-311.pyc").write_bytes(b"junk")
    assert content_hash(copy) == first
    (copy / "python" / "k2standin" / "common.py").write_text("# changed\n")
    assert content_hash(copy) != first
    (copy / "Containerfile").unlink()
    with pytest.raises(LabError, match="no Containerfile"):
        content_hash(copy)


# ---------------------------------------------------------------- pins


@pytest.mark.parametrize(
    ("containerfile", "arg", "pinned"),
    [
        ("k2lab/standin_image", "SGLANG_ROUTER_VERSION", "router"),
        ("containers/router", "SGLANG_ROUTER_VERSION", "router"),
        ("containers/ktransformers", "KT_KERNEL_VERSION", "ktransformers"),
    ],
)
def test_images_carry_the_catalogs_pins(containerfile: str, arg: str, pinned: str) -> None:
    from k2provision.core import catalog

    text = (REPO / containerfile / "Containerfile").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith(f"ARG {arg}=")]
    release = REGISTRY["ktransformers"].RELEASE
    want = catalog.ROUTER.version if pinned == "router" else release.version
    assert line == f"ARG {arg}={want}"


# ---------------------------------------------------------------- draining on SIGTERM
# The stand-ins drain on SIGTERM as SGLang and vLLM do (k2standin.drain), run directly on this
# machine: a request in flight is answered whole, new ones and the health routes get 503, and
# the process exits 0 once nothing is left; vLLM's default (`--shutdown-timeout 0`) cuts the
# request off instead. Each server reports the spec it runs (`/standin/info` standin_spec, and
# `/v1/models` max_model_len as the engines do), so a smoke test can tell a new spec from the
# old.

# 1,500 tokens at 2 ms each: a stream about 3 s in flight.
LONG_STREAM = {"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 1500}}
PACE = {"K2_STANDIN_TOKEN_SECONDS": "0.002"}


def send_in_background(url: str, body: dict[str, object]) -> tuple[threading.Thread, list[object]]:
    """POST `body` from a thread; its (status, body) or the error lands in the list."""
    outcome: list[object] = []

    def send() -> None:
        try:
            outcome.append(http(url, body, timeout=30))
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, outcome


def wait_in_flight(base: str, proc: Proc) -> None:
    """Until the server has begun answering (the background request is in flight)."""
    time.sleep(0.5)
    assert proc.popen.poll() is None, proc.output()
    assert http(f"{base}/health")[0] == 200


def test_sglang_answers_what_is_in_flight_refuses_the_rest_then_exits(
    env: Env, procs: list[Proc]
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(procs, env, sglang_argv(env, port), PACE)
    wait_status(f"{base}/health", proc)
    began = time.monotonic()
    thread, outcome = send_in_background(f"{base}/generate", LONG_STREAM)
    wait_in_flight(base, proc)
    proc.popen.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.popen.poll() is None, "exited with a request in flight:\n" + proc.output()
    assert http(f"{base}/health")[0] == 503
    refused, body = http(f"{base}/generate", {"text": "new", "sampling_params": {}})
    assert refused == 503
    assert b"draining" in body
    thread.join(30)
    status, stream = outcome[0]  # type: ignore[misc]
    assert status == 200
    events = [line for line in stream.decode().splitlines() if line.startswith("data: {")]
    assert len(events) == 1500
    assert json.loads(events[-1][6:])["meta_info"]["completion_tokens"] == 1500
    assert time.monotonic() - began >= 3.0
    assert proc.wait_exit(10) == 0
    assert "draining 1 request(s) in flight" in proc.output()


def test_vllm_cuts_off_by_default_and_drains_with_a_shutdown_timeout(
    env: Env, procs: list[Proc]
) -> None:
    chat = {
        "model": "kimi-k2",
        "stream": True,
        "max_tokens": 1500,
        "messages": [{"role": "user", "content": "hi"}],
    }
    for extra, drains in (((), False), (("--shutdown-timeout", "20"), True)):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start(procs, env, vllm_argv(env, port, *extra), PACE)
        wait_status(f"{base}/health", proc)
        thread, outcome = send_in_background(f"{base}/v1/chat/completions", chat)
        wait_in_flight(base, proc)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait_exit(10) == 0
        thread.join(30)
        if drains:
            status, body = outcome[0]  # type: ignore[misc]
            assert status == 200
            assert body.rstrip().endswith(b"data: [DONE]")
        else:
            assert isinstance(outcome[0], OSError), outcome


def test_a_server_reports_the_spec_it_runs(env: Env, procs: list[Proc]) -> None:
    specs = []
    for length in ("32768", "65536"):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start(procs, env, sglang_argv(env, port, "--context-length", length))
        wait_status(f"{base}/health", proc)
        assert get_json(f"{base}/v1/models")["data"][0]["max_model_len"] == int(length)
        specs.append(get_json(f"{base}/standin/info")["standin_spec"])
        assert proc.terminate() == 0
    assert specs[0] != specs[1]
    port = free_port()
    proc = start(procs, env, vllm_argv(env, port, "--max-model-len", "4096"))
    wait_status(f"http://127.0.0.1:{port}/health", proc)
    assert get_json(f"http://127.0.0.1:{port}/v1/models")["data"][0]["max_model_len"] == 4096
