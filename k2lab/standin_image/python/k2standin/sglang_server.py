"""Stand-in for `python3 -m sglang.launch_server` (a test double for SGLang's GPU kernels).

Checks: --model-path (a directory), --tp-size/--tp, --tool-call-parser kimi_k2,
--trust-remote-code; with --nnodes > 1, --dist-init-addr HOST:PORT and --node-rank in range;
--disaggregation-mode prefill|decode whenever other disaggregation options or
SGLANG_DISAGGREGATION_* variables are given; the GPUs per node the layout needs; --host and
--port; no stale options. Rules SGLang applies only on GPUs, at model load:
- the physical expert slots (routed experts + --ep-num-redundant-experts) split evenly over
  the EP ranks (sglang/srt/eplb/expert_location.py, `_init_common` asserts it);
- spare expert slots come with --enable-eplb: without it they hold fixed copies of experts
  0..N-1 that nothing ever rebalances (expert_location.py `init_trivial`), GPU memory for
  nothing, so the stand-in refuses them;
- KTransformers' kt-kernel options (--kt-weight-path a directory, --kt-method one kt-kernel
  offers, --kt-cpuinfer / --kt-threadpool-count / --kt-num-gpu-experts numbers;
  sglang/srt/layers/moe/kt_ep_wrapper.py builds its KTConfig from them).

Runs: node rank 0 (or a single node) serves HTTP on --host:--port; with --nnodes > 1 it
listens on --dist-init-addr and is ready once every node rank joined (the others connect
there and then stay in the foreground). A prefill server also listens on its bootstrap port.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k2standin import faults, openai_shapes, rendezvous
from k2standin.common import (
    Checker,
    Opts,
    Runtime,
    StartError,
    gpus_per_node,
    log,
    routed_experts,
    run_entry,
    scan,
    spec_digest,
    write_record,
)
from k2standin.httpserve import Api, HttpServer, ModelServer, json_response, listen

ENTRY = "sglang.launch_server"
LAUNCHER = ("python3", "-m", "sglang.launch_server")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
DEFAULT_BOOTSTRAP_PORT = 8998
PD_MODES = ("prefill", "decode")
# CPU expert formats of kt-kernel (kvcache-ai/ktransformers kt-kernel docs).
KT_METHODS = ("FP8", "FP8_PERCHANNEL", "BF16", "RAWINT4", "AMXINT4", "AMXINT8", "LLAMAFILE")


def check_experts(c: Checker, opts: Opts, model: str | None, tp: int) -> None:
    """EP placement rules SGLang applies at model load (see the module docstring)."""
    spare = 0
    if opts.value("--ep-num-redundant-experts") not in (None, "0"):
        spare = c.positive_int(opts, "--ep-num-redundant-experts") or 0
    a2a = opts.value("--moe-a2a-backend")
    # DeepEP and the other a2a backends run EP over the whole TP group.
    ep = (
        tp
        if a2a not in (None, "none")
        else (c.positive_int(opts, "--ep-size", "--expert-parallel-size", "--ep", default=1) or 1)
    )
    if spare and not opts.has("--enable-eplb"):
        c.error(
            f"--ep-num-redundant-experts {spare} without --enable-eplb: the spare slots hold "
            f"fixed copies of experts 0..{spare - 1} and are never rebalanced "
            "(sglang/srt/eplb/expert_location.py)"
        )
    slots = routed_experts(model) + spare
    if ep > 1 and slots % ep:
        c.error(
            f"{slots} physical expert slots (routed + --ep-num-redundant-experts) do not split "
            f"over {ep} EP ranks; SGLang asserts this at model load "
            "(sglang/srt/eplb/expert_location.py)"
        )


def check_kt(c: Checker, opts: Opts) -> None:
    """KTransformers' options, when the server hands experts to kt-kernel."""
    if not opts.has("--kt-weight-path"):
        return
    c.model_dir("--kt-weight-path", opts.value("--kt-weight-path"))
    method = opts.value("--kt-method")
    if method is not None and method.upper() not in KT_METHODS:
        c.error(f"--kt-method {method!r}: kt-kernel offers {', '.join(KT_METHODS)}")
    for name in ("--kt-cpuinfer", "--kt-threadpool-count"):
        if c.required(opts, name) is not None:
            c.positive_int(opts, name)
    gpu_experts = c.required(opts, "--kt-num-gpu-experts")
    if gpu_experts is not None and not gpu_experts.isdigit():
        c.error(f"--kt-num-gpu-experts {gpu_experts!r}: expected a whole number")


@dataclass
class SglangArgs:
    model_path: str
    served_model_name: str
    tp: int
    pp: int
    nnodes: int
    node_rank: int
    dist: tuple[str, int] | None
    host: str
    port: int
    mode: str | None
    bootstrap_port: int
    context_length: int | None = None
    kv_cache_dtype: str | None = None
    page_size: str | None = None

    def info(self) -> dict[str, Any]:
        return {
            "context_length": self.context_length,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tp_size": self.tp,
            "pp_size": self.pp,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "dist_init_addr": f"{self.dist[0]}:{self.dist[1]}" if self.dist else None,
            "host": self.host,
            "port": self.port,
            "disaggregation_mode": self.mode or "null",
            "disaggregation_bootstrap_port": self.bootstrap_port,
        }

    def pairing(self) -> dict[str, Any]:
        """What a prefill and a decode server of one PD pair must agree on: the model and the
        KV cache's shape (a real decode would fail the transfer, or decode another model's
        cache). The prefill's bootstrap server says it; the decode compares."""
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "context_length": self.context_length,
            "kv_cache_dtype": self.kv_cache_dtype,
            "page_size": self.page_size,
        }

    def fingerprint(self) -> dict[str, Any]:
        """What every node of one server must agree on."""
        return {
            "model_path": self.model_path,
            "tp_size": self.tp,
            "pp_size": self.pp,
            "nnodes": self.nnodes,
            "disaggregation_mode": self.mode,
        }


def check(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> SglangArgs:
    env = os.environ if environ is None else environ
    c = Checker(ENTRY)
    c.stale(argv)
    opts = scan(argv)
    if opts.positionals:
        c.error(f"unexpected arguments {opts.positionals}")
    model = c.required(opts, "--model-path", "--model")
    c.model_dir("--model-path", model)
    if not opts.has("--tp-size", "--tp"):
        c.error("--tp-size (or --tp) is required: the tensor-parallel size of this server")
    tp = c.positive_int(opts, "--tp-size", "--tp", default=1) or 1
    pp = c.positive_int(opts, "--pp-size", "--pp", default=1) or 1
    c.tool_parser(opts, "--tool-call-parser")
    c.flag(opts, "--trust-remote-code", "Kimi-K2's tokenizer and config are remote code")

    nnodes = c.positive_int(opts, "--nnodes", default=1) or 1
    node_rank = 0
    dist: tuple[str, int] | None = None
    rank_text = opts.value("--node-rank")
    if rank_text is not None:
        try:
            node_rank = int(rank_text)
        except ValueError:
            c.error(f"--node-rank {rank_text!r}: expected a whole number")
    if nnodes > 1:
        dist_text = c.required(opts, "--dist-init-addr")
        if dist_text is not None:
            dist = c.address("--dist-init-addr", dist_text)
        if rank_text is None:
            c.error(f"--node-rank is required with --nnodes {nnodes}")
        if (tp * pp) % nnodes:
            c.error(f"--tp-size {tp} x --pp-size {pp} does not split over --nnodes {nnodes}")
    if not 0 <= node_rank < nnodes:
        c.error(f"--node-rank {node_rank}: expected 0..{nnodes - 1} for --nnodes {nnodes}")
    per_node = (tp * pp) // nnodes if (tp * pp) % nnodes == 0 else tp * pp
    if per_node > gpus_per_node():
        c.error(
            f"--tp-size {tp} x --pp-size {pp} over --nnodes {nnodes} needs {per_node} GPUs "
            f"per node; a node has {gpus_per_node()}"
        )

    mode = opts.value("--disaggregation-mode")
    pd_options = sorted(
        n
        for n in opts.occurrences
        if n.startswith("--disaggregation-") and n != "--disaggregation-mode"
    )
    pd_env = sorted(k for k in env if k.startswith("SGLANG_DISAGGREGATION_"))
    if mode in (None, "null"):
        if pd_options or pd_env:
            c.error(
                "--disaggregation-mode prefill|decode is required: prefill/decode settings "
                f"are given ({', '.join(pd_options + pd_env)})"
            )
        mode = None
    elif mode not in PD_MODES:
        c.error(f"--disaggregation-mode {mode!r}: expected prefill or decode")
    bootstrap = c.port(opts, DEFAULT_BOOTSTRAP_PORT, "--disaggregation-bootstrap-port")
    check_experts(c, opts, model, tp)
    check_kt(c, opts)
    host = c.host(opts, DEFAULT_HOST)
    port = c.port(opts, DEFAULT_PORT)
    c.done()
    assert model is not None
    return SglangArgs(
        model_path=model,
        served_model_name=opts.value("--served-model-name") or model,
        tp=tp,
        pp=pp,
        nnodes=nnodes,
        node_rank=node_rank,
        dist=dist,
        host=host,
        port=port,
        mode=mode,
        bootstrap_port=bootstrap,
        context_length=c.positive_int(opts, "--context-length"),
        kv_cache_dtype=opts.value("--kv-cache-dtype"),
        page_size=opts.value("--page-size"),
    )


def _bootstrap_api(args: SglangArgs) -> Api:
    api = Api("sglang-bootstrap")
    doc = {
        "bootstrap": True,
        "disaggregation_mode": args.mode,
        "standin": True,
        "pairing": args.pairing(),
    }
    api.get["/health"] = lambda: json_response(200, doc)
    api.get["/route"] = lambda: json_response(200, doc)
    return api


def _pair_check(args: SglangArgs) -> Callable[[dict[str, Any]], str | None]:
    """A decode server's check of each request's prefill: sglang-router adds the prefill's
    `bootstrap_host` and `bootstrap_port` to the request it sends both; the prefill's bootstrap
    server says its pairing, which must be this server's ("": it is; else why not). A prefill
    that does not answer is no verdict (None: the request fails or succeeds on its own)."""
    mine = args.pairing()

    def check(doc: dict[str, Any]) -> str | None:
        host, port = doc.get("bootstrap_host"), doc.get("bootstrap_port")
        if not host or not port:
            return None
        where = f"{host}:{port}"
        try:
            url = f"http://{where}/route"
            with urllib.request.urlopen(url, timeout=2) as answer:
                theirs = json.loads(answer.read()).get("pairing")
        except (OSError, ValueError):
            return None
        if theirs is None:
            return None
        if theirs == mine:
            return ""
        differ = sorted(k for k in mine if theirs.get(k) != mine[k])
        return (
            f"the prefill at {where} has "
            + ", ".join(f"{k}={theirs.get(k)}" for k in differ)
            + "; this decode has "
            + ", ".join(f"{k}={mine[k]}" for k in differ)
        )

    return check


def serve(argv: Sequence[str]) -> int:
    full_argv = [*LAUNCHER, *argv]
    args = check(argv)
    rt = Runtime(ENTRY)
    rt.install_signals()
    servers: list[HttpServer] = []
    leader: rendezvous.Leader | None = None
    role = "http" if args.node_rank == 0 else "rank"
    # The record is written before any port opens: once a port answers, it is there.
    write_record(ENTRY, full_argv, ok=True, role=role, info=args.info())
    try:
        if args.node_rank == 0:
            ms = ModelServer(
                "sglang",
                args.served_model_name,
                {**args.info(), "standin_spec": spec_digest(full_argv)},
            )
            # SGLang drains with no time limit of its own (k2standin.drain).
            rt.drain_on_sigterm(ms.api.drain, None)
            ms.flags = openai_shapes.server_flags("sglang", argv, args.model_path)
            servers.append(listen(ms.api, args.host, args.port))
            if args.mode == "decode":
                ms.pair_check = _pair_check(args)
            if args.mode == "prefill":
                servers.append(
                    listen(
                        _bootstrap_api(args),
                        args.host,
                        args.bootstrap_port,
                        "--host/--disaggregation-bootstrap-port",
                    )
                )
            if args.nnodes > 1 and args.dist is not None:
                ms.set_not_ready(
                    f"waiting for node ranks 1..{args.nnodes - 1} at --dist-init-addr "
                    f"{args.dist[0]}:{args.dist[1]}"
                )
                leader = rendezvous.start_leader(
                    rt, "--dist-init-addr", args.dist, args.nnodes, args.fingerprint(), ms
                )
            else:
                ms.set_ready()
        if args.node_rank > 0 and args.dist is not None:
            problem = rendezvous.join(
                rt,
                "node rank",
                args.dist,
                (args.node_rank, args.node_rank + 1),
                args.fingerprint(),
            )
            if problem is not None:
                raise StartError(f"--dist-init-addr: {problem}")
            if rt.stop.is_set():
                return rt.wait()
            faults.on_ready(ENTRY)
        where = f"{args.host}:{args.port}" if args.node_rank == 0 else "no HTTP (rank > 0)"
        log(ENTRY, f"stand-in up: node rank {args.node_rank}/{args.nnodes}, {where}")
        return rt.wait()
    finally:
        if leader is not None:
            leader.close()
        for server in servers:
            server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry(ENTRY, [*LAUNCHER, *args], lambda: serve(args))
