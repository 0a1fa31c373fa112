"""Stand-ins for `trtllm-llmapi-launch` and `trtllm-serve` (a test double for TensorRT-LLM's
GPU kernels).

trtllm-llmapi-launch CMD...: checks CMD is on PATH and execs it (as the real script does on
rank 0).

trtllm-serve [serve] MODEL ...: checks the model directory, --tool_parser kimi_k2,
--trust_remote_code, --host/--port, --backend, that --ep_size divides --tp_size, that
--tp_size x --pp_size x --cp_size equals the MPI world size when started under mpirun (and
fits one node otherwise), that every -H host of mpirun has --gpus_per_node slots, that
--gpus_per_node fits a node, and that --extra_llm_api_options/--config names a file. Serves
HTTP; /v1/models lists the model directory's base name, as trtllm-serve does.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2standin import openai_shapes
from k2standin.common import (
    Checker,
    Rejected,
    Runtime,
    gpus_per_node,
    log,
    run_entry,
    scan,
    write_record,
)
from k2standin.httpserve import ModelServer, listen

LAUNCH_ENTRY = "trtllm-llmapi-launch"
SERVE_ENTRY = "trtllm-serve"
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 8000
BACKENDS = ("pytorch", "tensorrt", "_autodeploy")


def llmapi_launch_main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    full_argv = [LAUNCH_ENTRY, *args]

    def body() -> int:
        if not args:
            raise Rejected(["a command to launch is required: trtllm-llmapi-launch CMD ..."])
        if shutil.which(args[0]) is None:
            raise Rejected([f"{args[0]}: not found on PATH"])
        write_record(
            LAUNCH_ENTRY, full_argv, ok=True, mpi_world_size=os.environ.get("OMPI_COMM_WORLD_SIZE")
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp(args[0], args)
        return 1  # not reached

    return run_entry(LAUNCH_ENTRY, full_argv, body)


def _int(c: Checker, value: str | None, option: str, default: int) -> int:
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        c.error(f"{option} {value!r}: expected a whole number")
        return default
    if number < 1:
        c.error(f"{option} {number}: expected at least 1")
        return default
    return number


@dataclass
class TrtllmArgs:
    model: str
    served: str
    host: str
    port: int
    info: dict[str, Any]


def check(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> TrtllmArgs:
    """`argv` after `trtllm-serve` (with or without the `serve` subcommand)."""
    env = os.environ if environ is None else environ
    rest = list(argv[1:] if argv and argv[0] == "serve" else argv)
    c = Checker(SERVE_ENTRY)
    c.stale(rest)
    opts = scan(rest)
    model = opts.positionals[0] if opts.positionals else None
    if model is None:
        c.error("a model is required: trtllm-serve serve MODEL")
    elif len(opts.positionals) > 1:
        c.error(f"unexpected arguments {opts.positionals[1:]}")
    c.model_dir("model", model)
    c.tool_parser(opts, "--tool_parser")
    c.flag(opts, "--trust_remote_code", "Kimi-K2's tokenizer and config are remote code")
    backend = opts.value("--backend")
    if backend is not None and backend not in BACKENDS:
        c.error(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    tp = _int(c, opts.value("--tp_size", "--tensor_parallel_size"), "--tp_size", 1)
    pp = _int(c, opts.value("--pp_size", "--pipeline_parallel_size"), "--pp_size", 1)
    cp = _int(c, opts.value("--cp_size", "--context_parallel_size"), "--cp_size", 1)
    ep_text = opts.value("--ep_size", "--moe_expert_parallel_size")
    ep = _int(c, ep_text, "--ep_size", 1)
    if ep_text is not None and tp % ep:
        c.error(f"--ep_size {ep} does not divide --tp_size {tp}")
    world = tp * pp * cp
    gpn_text = opts.value("--gpus_per_node")
    gpn = _int(c, gpn_text, "--gpus_per_node", gpus_per_node())
    if gpn > gpus_per_node():
        c.error(f"--gpus_per_node {gpn}: a node has {gpus_per_node()} GPUs")
    mpi_size = env.get("OMPI_COMM_WORLD_SIZE")
    if mpi_size is not None:
        if mpi_size.isdigit() and int(mpi_size) != world:
            c.error(
                f"--tp_size {tp} x --pp_size {pp} x --cp_size {cp} = {world} ranks, but "
                f"mpirun started {mpi_size} (-np)"
            )
        hosts = [h for h in env.get("K2_STANDIN_MPI_HOSTS", "").split(",") if h]
        for item in hosts:
            host, _, slots = item.rpartition(":")
            if gpn_text is not None and slots.isdigit() and int(slots) != gpn:
                c.error(f"mpirun -H {item}: {slots} slots on {host}, but --gpus_per_node {gpn}")
    elif world > gpus_per_node():
        c.error(
            f"{world} ranks (--tp_size x --pp_size x --cp_size) need more than one node: "
            "start trtllm-serve under mpirun with trtllm-llmapi-launch"
        )
    config = opts.value("--extra_llm_api_options", "--config")
    if config is not None and not Path(config).is_file():
        c.error(f"--extra_llm_api_options {config}: no such file")
    host = c.host(opts, DEFAULT_HOST)
    port = c.port(opts, DEFAULT_PORT)
    c.done()
    assert model is not None
    # trtllm-serve names the model after the directory (OpenAIServer: model_dir.name).
    served = Path(model).name if Path(model).is_dir() else model
    info: dict[str, Any] = {
        "model_path": model,
        "tp_size": tp,
        "pp_size": pp,
        "cp_size": cp,
        "ep_size": ep,
        "gpus_per_node": gpn,
        "world_size": world,
        "host": host,
        "port": port,
        "backend": backend or "pytorch",
        "extra_llm_api_options": config,
    }
    return TrtllmArgs(model, served, host, port, info)


def serve(argv: Sequence[str]) -> int:
    full_argv = [SERVE_ENTRY, *argv]
    args = check(argv)
    rt = Runtime(SERVE_ENTRY)
    rt.install_signals()
    ms = ModelServer("trtllm", args.served, args.info)
    rest = list(argv[1:] if argv and argv[0] == "serve" else argv)
    ms.flags = openai_shapes.server_flags("trtllm", rest, args.model)
    write_record(SERVE_ENTRY, full_argv, ok=True, role="http", info=args.info)
    server = listen(ms.api, args.host, args.port)
    try:
        ms.set_ready()
        log(
            SERVE_ENTRY,
            f"stand-in trtllm-serve on {args.host}:{args.port} ({args.info['world_size']} ranks)",
        )
        return rt.wait()
    finally:
        server.close()


def serve_main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--version":
        print("trtllm-serve 0.0.0 (k2provision stand-in)")
        return 0
    return run_entry(SERVE_ENTRY, [SERVE_ENTRY, *args], lambda: serve(args))
