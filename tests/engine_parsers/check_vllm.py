"""Check a vLLM server command line with the real parser (run in .venv-vllm).

Request (stdin, see checker_io): ``argv`` starts with ``vllm serve``,
``python -m vllm.entrypoints.cli.main serve`` or ``python -m
vllm.entrypoints.openai.api_server`` (or is the bare ``vllm serve`` argument
list: the model first, then options).

Steps:

1. ``parse``: the ``vllm`` CLI's FlexibleArgumentParser with the ``serve``
   subcommand (the api_server module: its own parser), exactly as the CLI
   builds it, then ``ServeSubcommand.validate`` (the checks vLLM runs before
   starting anything) and, unless ``--headless``, ``validate_api_server_args``
   (tool-call and reasoning parser names, checked when the API server starts).
2. ``engine_args``: ``AsyncEngineArgs.from_cli_args`` (its ``__post_init__``
   resolves the model path). When the model is not a local directory it is
   replaced by a stand-in directory holding Kimi-K2-Instruct's ``config.json``
   (kimi_k2_config.json next to this file), or ``options.config`` when given
   (the served model's own config.json as an object); ``options.fake_model =
   false`` turns that off.
3. ``launch``: ``ServeSubcommand.cmd`` itself, on a copy of the arguments,
   with the functions that would start servers replaced by recorders: its
   pre-launch checks run (e.g. ``--headless`` with ``--api-server-count``,
   conflicting data-parallel load-balancing modes) and the chosen launch mode
   is reported as ``launch`` (``single_api_server``, ``multi_api_server``,
   ``headless``, ``dp_supervisor``, ``grpc``) with ``api_server_count``.
   Not for the api_server module launcher.
4. ``config`` (only with ``options.engine_config = true``):
   ``create_engine_config(headless=...)``, as ``vllm serve`` builds it for this
   node. It runs on vLLM's CPU platform here, so results that depend on the
   platform (executor backend, kernels, quantization support) are the CPU
   platform's, not a GPU host's; the one CUDA-only gate on the way, EPLB's
   (vllm/config/parallel.py: "only supported on CUDA devices"), is answered as
   on a CUDA host. The resulting parallel config is reported as ``parallel``:
   data-parallel load-balancing mode (internal, hybrid, external), world sizes,
   ranks per node and this node's first DP rank, the all-to-all backend and
   EPLB's spare expert slots.

Result: ``ok``, ``error``, ``stage``, ``parsed`` (selected fields of the
parsed namespace), ``engine_args`` (the same fields after EngineArgs),
``parallel`` (with ``engine_config``), and ``warnings`` (vLLM log warnings,
e.g. deprecated arguments).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from checker_io import (
    BadRequest,
    Rejected,
    argparse_errors_raise,
    checked,
    clean,
    collect_warnings,
    internal_result,
    new_result,
    pick,
    run_main,
    strip_launcher,
)

SERVE_LAUNCHERS = (
    ("vllm", "serve"),
    ("python", "-m", "vllm.entrypoints.cli.main", "serve"),
)
API_SERVER_LAUNCHERS = (("python", "-m", "vllm.entrypoints.openai.api_server"),)

FIELDS = (
    "model",
    "model_tag",
    "served_model_name",
    "trust_remote_code",
    "host",
    "port",
    "headless",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_ca_certs",
    "api_server_count",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "data_parallel_size_local",
    "data_parallel_address",
    "data_parallel_rpc_port",
    "data_parallel_start_rank",
    "data_parallel_rank",
    "data_parallel_backend",
    "data_parallel_hybrid_lb",
    "data_parallel_external_lb",
    "enable_expert_parallel",
    "all2all_backend",
    "enable_eplb",
    "distributed_executor_backend",
    "mm_encoder_tp_mode",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "decode_context_parallel_size",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "gpu_memory_utilization",
    "enable_chunked_prefill",
    "enable_auto_tool_choice",
    "tool_call_parser",
    "reasoning_parser",
    "tokenizer_mode",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "language_model_only",
    "enable_log_requests",
)

CONFIG = Path(__file__).with_name("kimi_k2_config.json")
# Messages that only say this host has no GPU or no compiled vLLM kernels.
HOST_ARTIFACTS = (
    "vllm._C",
    "Triton is not installed",
    "triton-cpu",
    "Model Runner V2 requires Triton",
    "Reset SSM cache type",
    "Pin memory is not supported",
)


def _serve_parser() -> tuple[Any, Any]:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def _api_server_parser() -> Any:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="vLLM API server"))


class _Recorder:
    """Stands in for a function that would start servers."""

    def __init__(self, sink: dict[str, Any], mode: str) -> None:
        self.sink = sink
        self.mode = mode

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.sink.setdefault("mode", self.mode)
        for arg in args:
            close = getattr(arg, "close", None)  # an un-awaited coroutine
            if callable(close):
                close()


class _UvloopStub:
    def __init__(self, sink: dict[str, Any], mode: str) -> None:
        self.run = _Recorder(sink, mode)


def _launch_mode(args: Any) -> dict[str, Any]:
    from vllm.entrypoints.cli import serve

    sink: dict[str, Any] = {}
    stubs = {
        "run_dp_supervisor": _Recorder(sink, "dp_supervisor"),
        "run_headless": _Recorder(sink, "headless"),
        "run_multi_api_server": _Recorder(sink, "multi_api_server"),
        "uvloop": _UvloopStub(
            sink, "grpc" if getattr(args, "grpc", False) else "single_api_server"
        ),
    }
    saved = {name: getattr(serve, name) for name in stubs}
    launch_args = copy.copy(args)
    try:
        for name, stub in stubs.items():
            setattr(serve, name, stub)
        serve.ServeSubcommand.cmd(launch_args)
    finally:
        for name, value in saved.items():
            setattr(serve, name, value)
    return {
        "launch": sink.get("mode"),
        "api_server_count": getattr(launch_args, "api_server_count", None),
    }


def _engine_config(engine_args: Any, headless: bool, *, tokenizer: bool) -> Any:
    """``create_engine_config`` for this node, EPLB's CUDA-only gate answered as on CUDA.

    Without the model's tokenizer (a stand-in model directory holds only config.json), the
    reasoning config cannot turn its parser's start/end strings into token ids
    (vllm/config/reasoning.py ``initialize_token_ids``, called from VllmConfig): the parser
    is then looked up by name in vLLM's own registry (``list_registered``: the parser module
    itself imports tokenizer code this CPU venv lacks), which is what can be checked here."""
    from vllm.config import parallel
    from vllm.config.reasoning import ReasoningConfig
    from vllm.reasoning import ReasoningParserManager

    platform = parallel.current_platform
    real_cuda = platform.is_cuda_alike
    real_init = ReasoningConfig.initialize_token_ids

    def parser_by_name(self: Any, model_config: Any) -> None:
        known = ReasoningParserManager.list_registered()
        if self.reasoning_parser and self.reasoning_parser not in known:
            raise KeyError(f"reasoning parser {self.reasoning_parser!r} is not registered")
        self._enabled = bool(self.reasoning_parser)  # what a real tokenizer would give it

    if engine_args.enable_eplb:
        platform.is_cuda_alike = lambda: True  # type: ignore[method-assign]
    if not tokenizer:
        ReasoningConfig.initialize_token_ids = parser_by_name  # type: ignore[method-assign]
    try:
        return engine_args.create_engine_config(headless=headless)
    finally:
        platform.is_cuda_alike = real_cuda  # type: ignore[method-assign]
        ReasoningConfig.initialize_token_ids = real_init  # type: ignore[method-assign]


def _parallel(config: Any) -> dict[str, Any]:
    """What the parallel config decides: load-balancing mode, sizes, ranks, experts."""
    if config.data_parallel_external_lb:
        mode = "external"
    elif config.data_parallel_hybrid_lb:
        mode = "hybrid"
    else:
        mode = "internal"
    return {
        "lb_mode": mode,
        "world_size": config.world_size,
        "world_size_across_dp": config.world_size_across_dp,
        "data_parallel_size": config.data_parallel_size,
        "data_parallel_size_local": config.data_parallel_size_local,
        "data_parallel_rank": config.data_parallel_rank,
        "data_parallel_master_ip": config.data_parallel_master_ip,
        "data_parallel_rpc_port": config.data_parallel_rpc_port,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "enable_expert_parallel": config.enable_expert_parallel,
        "all2all_backend": config.all2all_backend,
        "enable_eplb": config.enable_eplb,
        "num_redundant_experts": config.eplb_config.num_redundant_experts,
        "distributed_executor_backend": str(config.distributed_executor_backend),
    }


def _reject(exc: BaseException) -> Rejected:
    return Rejected(f"{type(exc).__name__}: {clean(str(exc))}")


def check(
    argv: list[str], api_server: bool, options: dict[str, Any], result: dict[str, Any]
) -> None:
    notes: list[str] = result["notes"]
    with collect_warnings(["vllm"], result["warnings"], ["/vllm/"]):
        with argparse_errors_raise():
            result["stage"] = "parse"
            try:
                if api_server:
                    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

                    result["warnings"].append(
                        "DeprecationWarning: `python -m vllm.entrypoints.openai.api_server` "
                        "is deprecated (the module says so when run as a script)"
                    )
                    args = _api_server_parser().parse_args(argv)
                    validate_parsed_serve_args(args)
                else:
                    parser, command = _serve_parser()
                    args = parser.parse_args(["serve", *argv])
                    command.validate(args)
                if not getattr(args, "headless", False):
                    # What the API server checks before it binds its port.
                    from vllm.entrypoints.common.cli_args import validate_api_server_args

                    validate_api_server_args(args)
            except Rejected:
                raise
            except (ValueError, TypeError, KeyError) as exc:
                raise _reject(exc) from exc
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag  # what ServeSubcommand.cmd does first
        result["parsed"] = pick(args, FIELDS)

        result["stage"] = "engine_args"
        from vllm.engine.arg_utils import AsyncEngineArgs

        model = args.model
        stand_in = None
        if options.get("fake_model", True) and model and not Path(model).is_dir():
            stand_in = tempfile.mkdtemp(prefix="k2-model-")
            config = options.get("config")
            if config is None:
                shutil.copy(CONFIG, Path(stand_in) / "config.json")
            else:
                (Path(stand_in) / "config.json").write_text(json.dumps(config))
            args.model = stand_in
            if not args.served_model_name:
                args.served_model_name = [model]
            held = "the given" if config is not None else "Kimi-K2-Instruct's"
            notes.append(
                f"model {model} is not a local directory: EngineArgs built with a "
                f"stand-in holding {held} config.json"
            )
        try:
            engine_args = AsyncEngineArgs.from_cli_args(args)
            result["engine_args"] = pick(engine_args, FIELDS)
            if stand_in:
                result["engine_args"]["model"] = model
            if not api_server:
                result["stage"] = "launch"
                result["parsed"].update(_launch_mode(args))
            if options.get("engine_config", False):
                result["stage"] = "config"
                notes.append("engine config created on vLLM's CPU platform")
                if stand_in and getattr(args, "reasoning_parser", None):
                    notes.append(
                        "no tokenizer in the stand-in: the reasoning parser is checked by "
                        "name in vLLM's registry"
                    )
                config = _engine_config(
                    engine_args,
                    bool(getattr(args, "headless", False)),
                    tokenizer=stand_in is None,
                )
                result["parallel"] = _parallel(config.parallel_config)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:
            raise _reject(exc) from exc
        finally:
            if stand_in:
                shutil.rmtree(stand_in, ignore_errors=True)
        result["stage"] = None


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one request."""
    raw = request["argv"]
    api_server = False
    try:
        try:
            argv = strip_launcher(raw, SERVE_LAUNCHERS)
        except BadRequest:
            argv = strip_launcher(raw, API_SERVER_LAUNCHERS)
            api_server = True
    except BadRequest as exc:
        return internal_result(exc)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.update(request["env"])
    result = new_result("vllm")

    def run() -> None:
        import vllm

        result["version"] = vllm.__version__
        check(argv, api_server, request["options"], result)

    return checked(result, run, HOST_ARTIFACTS)


def warm_up() -> None:
    """Import what parsing and EngineArgs import (server mode), by checking a one-GPU command
    line once in the parent. Not the engine config: building one leaves model-config state
    behind in the parent (a later multimodal checkpoint's processor lookup then fails in the
    forked child, "treated as multimodal but has no registered multimodal processor"), so
    each child builds its own."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    result: dict[str, Any] = {"warnings": [], "notes": []}
    check(
        ["/models/warm-up", "--tensor-parallel-size", "1"], False, {"engine_config": False}, result
    )


if __name__ == "__main__":
    run_main(handle, warm_up)
