"""Stand-in for the `vllm` command (a test double for vLLM's GPU kernels): `vllm serve`.

Checks: a model (positional or --model) that is a directory, --tool-call-parser kimi_k2,
--enable-auto-tool-choice, --trust-remote-code, --host/--port; data parallel across nodes
(--data-parallel-size > --data-parallel-size-local) needs --data-parallel-address and
--data-parallel-rpc-port, a --headless node needs --data-parallel-start-rank > 0 and the API
server rank 0; the GPUs the layout needs on this node (without Ray); no stale options.

Runs: the API server (not --headless) serves HTTP. With --distributed-executor-backend ray it
first waits (K2_STANDIN_RAY_WAIT seconds, default 120) for the Ray cluster of this container
to offer --tensor-parallel-size x --pipeline-parallel-size GPUs. With data parallel across
nodes it listens on --data-parallel-address:--data-parallel-rpc-port and is ready once every
--headless node joined; a --headless node joins there and stays in the foreground.

Rules vLLM applies only when the engines start, on GPUs:
- The data-parallel load-balancing mode of the head decides who may join it. A start rank on
  a node that is not headless selects hybrid load balancing (vllm/engine/arg_utils.py), and
  then the head refuses every --headless rank at the handshake and stops ("Remote engine N
  must not use --headless in external or hybrid dp lb mode",
  vllm/v1/engine/utils.py `wait_for_engine_startup`); the stand-in head does the same.
- With EPLB, the expert slots (routed experts + --eplb-config's num_redundant_experts) split
  evenly over the EP ranks (tp x dp), which vllm/model_executor/layers/fused_moe/layer.py
  checks when it builds each MoE layer.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from k2standin import openai_shapes, ray_cluster, rendezvous
from k2standin.common import (
    Checker,
    Opts,
    Runtime,
    StartError,
    env_seconds,
    gpus_per_node,
    log,
    routed_experts,
    run_entry,
    scan,
    spec_digest,
    write_record,
)
from k2standin.httpserve import HttpServer, ModelServer, listen

ENTRY = "vllm"
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
RAY_WAIT_ENV = "K2_STANDIN_RAY_WAIT"
USAGE = "usage: vllm serve MODEL [options]  (k2provision stand-in)"


@dataclass
class VllmArgs:
    model: str
    served: str
    tp: int
    pp: int
    dp: int
    dp_local: int
    start_rank: int
    dp_address: tuple[str, int] | None
    headless: bool
    backend: str | None
    host: str
    port: int
    hybrid_lb: bool = False
    experts: dict[str, Any] | None = None
    max_model_len: int | None = None
    shutdown_timeout: int = 0

    def info(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "shutdown_timeout": self.shutdown_timeout,
            "model_path": self.model,
            "served_model_name": self.served,
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "data_parallel_size": self.dp,
            "data_parallel_size_local": self.dp_local,
            "data_parallel_start_rank": self.start_rank,
            "headless": self.headless,
            "distributed_executor_backend": self.backend,
            "host": self.host,
            "port": self.port,
        }

    def fingerprint(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "data_parallel_size": self.dp,
            "experts": self.experts,
        }


def _experts(c: Checker, opts: Opts, model: str | None, tp: int, dp: int) -> dict[str, Any]:
    """Expert parallelism and EPLB as every node of the engine must see them."""
    spare = 0
    config_text = opts.value("--eplb-config")
    if config_text is not None:
        try:
            config = json.loads(config_text)
            spare = int(config.get("num_redundant_experts", 0))
        except (ValueError, TypeError, AttributeError):
            c.error(f"--eplb-config {config_text!r}: expected a JSON object")
    eplb = opts.has("--enable-eplb")
    ep = tp * dp if opts.has("--enable-expert-parallel", "-ep") else 1
    slots = routed_experts(model) + spare
    if eplb and ep > 1 and slots % ep:
        c.error(
            f"EPLB: {slots} expert slots do not split over {ep} EP ranks "
            "(vllm/model_executor/layers/fused_moe/layer.py)"
        )
    return {"ep": ep, "eplb": eplb, "redundant": spare, "all2all": opts.value("--all2all-backend")}


def _int(c: Checker, opts: Opts, names: tuple[str, ...], default: int, minimum: int) -> int:
    value = opts.value(*names)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        c.error(f"{names[0]} {value!r}: expected a whole number")
        return default
    if number < minimum:
        c.error(f"{names[0]} {number}: expected at least {minimum}")
        return default
    return number


def check(argv: Sequence[str]) -> VllmArgs:
    c = Checker(ENTRY)
    c.stale(argv)
    opts = scan(argv)
    model = opts.value("--model")
    if opts.positionals:
        if model is not None:
            c.error(f"the model is given twice: {opts.positionals[0]} and --model {model}")
        model = opts.positionals[0]
        if len(opts.positionals) > 1:
            c.error(f"unexpected arguments {opts.positionals[1:]}")
    if not model:
        c.error("a model is required: vllm serve MODEL (the model directory)")
    c.model_dir("model", model)
    c.tool_parser(opts, "--tool-call-parser")
    c.flag(opts, "--enable-auto-tool-choice", "Kimi-K2 tool calls with tool_choice=auto")
    c.flag(opts, "--trust-remote-code", "Kimi-K2's tokenizer and config are remote code")

    tp = _int(c, opts, ("--tensor-parallel-size", "-tp"), 1, 1)
    pp = _int(c, opts, ("--pipeline-parallel-size", "-pp"), 1, 1)
    dp = _int(c, opts, ("--data-parallel-size", "-dp"), 1, 1)
    dp_local = _int(c, opts, ("--data-parallel-size-local", "-dpl"), dp, 1)
    start_rank = _int(c, opts, ("--data-parallel-start-rank", "-dpr"), 0, 0)
    headless = opts.has("--headless")
    backend = opts.value("--distributed-executor-backend")
    if backend not in (None, "ray", "mp", "uni", "external_launcher"):
        c.error(
            f"--distributed-executor-backend {backend!r}: expected ray, mp, uni or "
            "external_launcher"
        )
    if dp_local > dp:
        c.error(f"--data-parallel-size-local {dp_local} exceeds --data-parallel-size {dp}")
    if start_rank + dp_local > dp:
        c.error(
            f"--data-parallel-start-rank {start_rank} + --data-parallel-size-local "
            f"{dp_local} exceeds --data-parallel-size {dp}"
        )
    dp_address: tuple[str, int] | None = None
    multi_node_dp = dp > dp_local
    if multi_node_dp or headless:
        address = c.required(opts, "--data-parallel-address", "-dpa")
        rpc = c.required(opts, "--data-parallel-rpc-port", "-dpp")
        if address is not None and rpc is not None:
            dp_address = c.address(
                "--data-parallel-address/--data-parallel-rpc-port", f"{address}:{rpc}"
            )
    if headless and start_rank == 0:
        c.error("--headless needs --data-parallel-start-rank > 0 (rank 0 is the API server's)")
    # vllm/engine/arg_utils.py: a start rank on a node that is not headless means hybrid
    # load balancing, unless this node holds every DP rank.
    # (Hybrid with one local rank is external load balancing: the same for joining nodes.)
    hybrid_lb = not headless and opts.has("--data-parallel-start-rank", "-dpr") and dp_local < dp
    experts = _experts(c, opts, model, tp, dp)
    if not headless and start_rank != 0:
        c.error(
            f"--data-parallel-start-rank {start_rank} without --headless: the API server "
            "holds data-parallel rank 0"
        )
    if backend != "ray" and tp * pp * dp_local > gpus_per_node():
        c.error(
            f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} x "
            f"--data-parallel-size-local {dp_local} needs {tp * pp * dp_local} GPUs on this "
            f"node; a node has {gpus_per_node()} (use --distributed-executor-backend ray "
            "across nodes)"
        )
    host = c.host(opts, DEFAULT_HOST)
    port = c.port(opts, DEFAULT_PORT)
    max_model_len = c.positive_int(opts, "--max-model-len")
    # vllm/engine/arg_utils.py --shutdown-timeout: 0 (the default) aborts, N > 0 drains.
    shutdown_timeout = _int(c, opts, ("--shutdown-timeout",), 0, 0)
    c.done()
    assert model is not None
    served = opts.values("--served-model-name")
    return VllmArgs(
        model,
        served[0] if served else model,
        tp,
        pp,
        dp,
        dp_local,
        start_rank,
        dp_address,
        headless,
        backend,
        host,
        port,
        hybrid_lb,
        experts,
        max_model_len,
        shutdown_timeout,
    )


def handshake_problem(head: VllmArgs, hello: dict[str, Any]) -> str | None:
    """The head's verdict on a joining node (vllm/v1/engine/utils.py wait_for_engine_startup):
    remote engines must be headless exactly when the head balances load internally."""
    remote_should_be_headless = not head.hybrid_lb
    if bool(hello.get("headless")) != remote_should_be_headless:
        first = (hello.get("ranks") or [0])[0]
        if remote_should_be_headless:
            return (
                f"Remote engine {first} must use --headless unless in external or hybrid dp lb mode"
            )
        return f"Remote engine {first} must not use --headless in external or hybrid dp lb mode"
    return None


def wait_for_ray(rt: Runtime, need: int) -> str:
    """Wait for this container's Ray cluster to offer `need` GPUs; its address."""
    wait = env_seconds(RAY_WAIT_ENV, 120.0)
    deadline = time.monotonic() + wait
    problem = ""
    while not rt.stop.is_set():
        address = ray_cluster.resolve_address(None)
        if address is None:
            problem = (
                "no Ray cluster runs in this container (start `ray start --head` "
                "first, or set RAY_ADDRESS)"
            )
        else:
            try:
                count, gpus = ray_cluster.alive_gpus(ray_cluster.fetch_nodes(address))
            except ConnectionError as exc:
                problem = str(exc)
            else:
                if gpus >= need:
                    log(ENTRY, f"Ray cluster {address}: {count} nodes, {gpus:g} GPUs")
                    return address
                problem = f"the Ray cluster at {address} has {gpus:g} GPUs on {count} alive nodes"
        if time.monotonic() > deadline:
            raise StartError(
                f"--distributed-executor-backend ray needs {need} GPUs "
                f"(--tensor-parallel-size x --pipeline-parallel-size); after {wait:g} s "
                f"{problem}"
            )
        rt.sleep(1.0)
    return ""


def serve(argv: Sequence[str]) -> int:
    full_argv = ["vllm", "serve", *argv]
    args = check(argv)
    rt = Runtime(ENTRY)
    rt.install_signals()
    server: HttpServer | None = None
    leader: rendezvous.Leader | None = None
    try:
        if args.headless:
            assert args.dp_address is not None
            write_record(ENTRY, full_argv, ok=True, role="headless", info=args.info())
            problem = rendezvous.join(
                rt,
                "data-parallel rank",
                args.dp_address,
                (args.start_rank, args.start_rank + args.dp_local),
                args.fingerprint(),
                hello={"headless": True},
            )
            if problem is not None:
                raise StartError(f"--data-parallel-address: {problem}")
            if rt.stop.is_set():
                return rt.wait()
            log(
                ENTRY,
                f"stand-in headless engines {args.start_rank}.."
                f"{args.start_rank + args.dp_local - 1} up (no HTTP)",
            )
            return rt.wait()
        if args.backend == "ray":
            args_ray = wait_for_ray(rt, args.tp * args.pp)
            if rt.stop.is_set():
                return rt.wait()
            info_ray = {"ray_address": args_ray}
        else:
            info_ray = {}
        ms = ModelServer(
            "vllm",
            args.served,
            {**args.info(), **info_ray, "standin_spec": spec_digest(full_argv)},
            strict_model=True,
        )
        rt.drain_on_sigterm(ms.api.drain, float(args.shutdown_timeout))
        ms.flags = openai_shapes.server_flags("vllm", argv, args.model)
        write_record(ENTRY, full_argv, ok=True, role="http", info=args.info())
        server = listen(ms.api, args.host, args.port)
        if args.dp > args.dp_local and args.dp_address is not None:
            ms.set_not_ready(f"waiting for data-parallel ranks {args.dp_local}..{args.dp - 1}")
            head = args
            leader = rendezvous.start_leader(
                rt,
                "--data-parallel-address/--data-parallel-rpc-port",
                args.dp_address,
                args.dp,
                args.fingerprint(),
                ms,
                own=(0, args.dp_local),
                what="data-parallel rank",
                admit=lambda hello: handshake_problem(head, hello),
            )
        else:
            ms.set_ready()
        log(ENTRY, f"stand-in vLLM API server on {args.host}:{args.port}")
        return rt.wait()
    finally:
        if leader is not None:
            leader.close()
        if server is not None:
            server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] in ("--version", "-v"):
        print("0.0.0 (k2provision stand-in)")
        return 0
    if args[0] != "serve":
        print(f"vllm {args[0]}: not provided by the stand-in. {USAGE}", file=sys.stderr)
        return 2
    rest = args[1:]
    return run_entry(ENTRY, ["vllm", *args], lambda: serve(rest))


if __name__ == "__main__":
    sys.exit(main())
