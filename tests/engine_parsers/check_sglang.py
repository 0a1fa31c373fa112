"""Check an SGLang server command line with the real parser (run in .venv-sglang).

Request (stdin, see checker_io): ``argv`` starts with ``python -m
sglang.launch_server`` or ``sglang serve`` (or is the bare argument list).
Options:

* ``resolve`` (default true): after ``prepare_server_args`` (argparse, the
  only step ``python -m sglang.launch_server`` runs before starting), also run
  ``ServerArgs.resolve_once()``, SGLang's resolution and validation pipeline.
  On this CPU-only host it runs as if on a CUDA host: ``--device cuda`` is
  assumed when the command line names no device. Checks that probe the GPU
  itself (capability, memory) see no GPU and fall back to defaults.
* ``ib_devices`` (list of names): the InfiniBand devices the target host has.
  Resolution checks ``--disaggregation-ib-device``/``--mooncake-ib-device``
  against ``/sys/class/infiniband``; where this host has none, that directory
  is shown to SGLang as holding ``ib_devices``, or when not given, every
  device name the command line mentions (then only the syntax is checked).
* ``fake_model`` (default true): resolution reads ``config.json`` from the
  model path. When the model path is not a local directory, resolution uses a
  stand-in directory holding Kimi-K2-Instruct's ``config.json``
  (kimi_k2_config.json next to this file), or ``config`` when given (the
  served model's own config.json as an object); the parse itself never reads it.
* ``expert_location`` (default false): after resolution, publish the resolved
  config as SGLang's scheduler does and build the initial expert placement
  with SGLang's own ``ExpertLocationMetadata.init_trivial``
  (sglang/srt/eplb/expert_location.py), on the CPU: it asserts that the
  physical expert slots (logical experts + ``--ep-num-redundant-experts``)
  split evenly over the EP ranks, and maps every spare slot to the logical
  expert it holds until EPLB rebalances. The model classes import GPU kernels
  and do not load here, so the three numbers DeepseekV2ForCausalLM reads for
  this (sglang/srt/models/deepseek_v2.py
  ``get_model_config_for_expert_location``) are read from config.json the same
  way. Reported as ``expert_location``; a failed assertion rejects the command
  line (stage ``expert_location``), as it would fail the launch on GPUs.

Result: ``ok``, ``error`` (the engine's message), ``stage`` (``parse``,
``resolve`` or ``expert_location`` when rejected), ``parsed`` (selected fields as given on the
command line, defaults filled), ``resolved`` (the same fields after
resolution), ``warnings`` (log warnings and Python warnings raised while
parsing and resolving), ``notes`` (what the checker assumed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
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

LAUNCHERS = (
    ("python", "-m", "sglang.launch_server"),
    ("sglang", "serve"),
)

FIELDS = (
    "model_path",
    "tokenizer_path",
    "served_model_name",
    "trust_remote_code",
    "host",
    "port",
    "api_key",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_ca_certs",
    "device",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "ep_size",
    "moe_dense_tp_size",
    "nnodes",
    "node_rank",
    "dist_init_addr",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "disaggregation_ib_device",
    "moe_a2a_backend",
    "moe_runner_backend",
    "deepep_mode",
    "ep_num_redundant_experts",
    "ep_dispatch_algorithm",
    "enable_eplb",
    "eplb_algorithm",
    "enable_dp_lm_head",
    "disable_shared_experts_fusion",
    "enable_two_batch_overlap",
    "chunked_prefill_size",
    "mem_fraction_static",
    "max_running_requests",
    "cuda_graph_bs_decode",
    "cuda_graph_bs_prefill",
    "cuda_graph_max_bs_decode",
    "cuda_graph_max_bs_prefill",
    "watchdog_timeout",
    "decode_log_interval",
    "disable_radix_cache",
    "context_length",
    "tool_call_parser",
    "reasoning_parser",
    "attention_backend",
    "kv_cache_dtype",
    "page_size",
    "quantization",
    "expert_distribution_recorder_mode",
    "eplb_rebalance_num_iterations",
    "init_expert_location",
    "kt_weight_path",
    "kt_method",
    "kt_cpuinfer",
    "kt_threadpool_count",
    "kt_num_gpu_experts",
    "max_total_tokens",
)

# Messages that only say this host has no GPU; they say nothing about the
# command line.
HOST_ARTIFACTS = (
    "Only CUDA",
    "Only CUDA, HIP and XPU",
    "is not available on this platform",
)

CONFIG = Path(__file__).with_name("kimi_k2_config.json")
IB_SYSFS = "/sys/class/infiniband"
IB_FLAGS = ("--disaggregation-ib-device", "--mooncake-ib-device")


class _SysfsPath:
    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def isdir(self, path: Any) -> bool:
        return str(path) == IB_SYSFS or bool(self._real.isdir(path))


class _SysfsOs:
    """``os`` as seen by SGLang's IB device validation, with an
    /sys/class/infiniband that lists the given devices."""

    def __init__(self, devices: list[str]) -> None:
        self._devices = devices
        self.path = _SysfsPath(os.path)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def listdir(self, path: Any) -> list[str]:
        if str(path) == IB_SYSFS:
            return list(self._devices)
        return os.listdir(path)


def _ib_names(argv: list[str]) -> list[str]:
    names: list[str] = []
    for i, arg in enumerate(argv):
        for flag in IB_FLAGS:
            value = None
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value:
                names += re.findall(r"[A-Za-z][A-Za-z0-9_.-]*", value)
    return names


@contextmanager
def _ib_sysfs(argv: list[str], options: dict[str, Any], notes: list[str]) -> Iterator[None]:
    given = options.get("ib_devices")
    if given is None and os.path.isdir(IB_SYSFS):
        yield
        return
    from sglang.srt.arg_groups import validation_hook

    devices = [str(d) for d in given] if given is not None else _ib_names(argv)
    if devices:
        shown = "given" if given is not None else "named on the command line"
        notes.append(f"{IB_SYSFS} shown as holding the devices {shown}: {','.join(devices)}")
    real_os = validation_hook.os
    validation_hook.os = _SysfsOs(devices)  # type: ignore[assignment]
    try:
        yield
    finally:
        validation_hook.os = real_os


def _model_stand_in(config: dict[str, Any] | None) -> str:
    tmp = tempfile.mkdtemp(prefix="k2-model-")
    if config is None:
        shutil.copy(CONFIG, Path(tmp) / "config.json")
    else:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
    return tmp


def check(argv: list[str], options: dict[str, Any], result: dict[str, Any]) -> None:
    from sglang.srt.server_args import prepare_server_args

    sink: list[str] = result["warnings"]
    notes: list[str] = result["notes"]
    with collect_warnings(["sglang"], sink, ["/sglang/"]), argparse_errors_raise():
        result["stage"] = "parse"
        server_args = prepare_server_args(argv)
        result["parsed"] = pick(server_args, FIELDS)
        if not options.get("resolve", True):
            result["stage"] = None
            return

        result["stage"] = "resolve"
        if server_args.device is None:
            server_args.device = "cuda"
            notes.append("device: none given, resolved as cuda")
        model_path = server_args.model_path
        stand_in = None
        if (
            options.get("fake_model", True)
            and model_path
            and model_path.lower() not in ("dummy", "none")
            and not Path(model_path).is_dir()
        ):
            stand_in = _model_stand_in(options.get("config"))
            server_args.model_path = stand_in
            if server_args.served_model_name is None:
                server_args.served_model_name = model_path
            held = "the given" if options.get("config") else "Kimi-K2-Instruct's"
            notes.append(
                f"model path {model_path} is not a local directory: resolved with "
                f"a stand-in holding {held} config.json"
            )
        try:
            with _ib_sysfs(argv, options, notes):
                server_args.resolve_once()
            from sglang.srt.arg_groups.overrides import resolving_view

            resolved = pick(resolving_view(server_args), FIELDS)
            if stand_in:
                for key in ("model_path", "tokenizer_path"):
                    if resolved.get(key) == stand_in:
                        resolved[key] = model_path
            result["resolved"] = resolved
            if options.get("expert_location", False) and (resolved.get("ep_size") or 1) > 1:
                result["stage"] = "expert_location"
                result["expert_location"] = expert_location(server_args, resolved)
        except Rejected:
            raise
        except (KeyboardInterrupt, MemoryError):
            raise
        except BaseException as exc:
            raise Rejected(f"{type(exc).__name__}: {clean(str(exc))}") from exc
        finally:
            if stand_in:
                shutil.rmtree(stand_in, ignore_errors=True)
        result["stage"] = None


def expert_location(server_args: Any, resolved: dict[str, Any]) -> dict[str, Any]:
    """SGLang's initial expert placement for rank 0 of this server (see ``expert_location``
    in the module docstring)."""
    from sglang.srt import runtime_context
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.eplb import expert_location as placement

    def from_model_config(model_config: Any) -> Any:
        config = model_config.hf_config
        return placement.ModelConfigForExpertLocation(
            num_layers=config.num_hidden_layers,
            num_logical_experts=config.n_routed_experts,
            num_groups=getattr(config, "n_group", None),
        )

    placement.ModelConfigForExpertLocation.from_model_config = staticmethod(  # type: ignore[method-assign]
        from_model_config
    )
    runtime_context.publish(server_args, role="scheduler")
    model_config = ModelConfig.from_server_args(server_args)
    try:
        with runtime_context.get_device().override(device="cpu"):
            meta = placement.ExpertLocationMetadata.init_trivial(model_config, moe_ep_rank=0)
    except AssertionError as exc:
        slots = model_config.hf_config.n_routed_experts + (
            resolved.get("ep_num_redundant_experts") or 0
        )
        raise Rejected(
            f"AssertionError{': ' + str(exc) if str(exc) else ''} in SGLang's expert "
            f"placement (sglang/srt/eplb/expert_location.py): {slots} physical expert slots "
            f"do not split over ep_size {resolved.get('ep_size')}"
        ) from exc
    physical = meta.physical_to_logical_map
    logical = model_config.hf_config.n_routed_experts
    return {
        "ep_size": meta.ep_size,
        "num_layers": int(physical.shape[0]),
        "num_physical_experts": meta.num_physical_experts,
        "num_local_physical_experts": meta.num_local_physical_experts,
        "num_logical_experts": logical,
        # What each spare slot holds (layer 0) until EPLB moves experts.
        "spare_slots_hold": [int(x) for x in physical[0, logical:].tolist()],
        "rebalanced": bool(resolved.get("enable_eplb")),
    }


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one request."""
    try:
        argv = strip_launcher(request["argv"], LAUNCHERS)
    except BadRequest as exc:
        return internal_result(exc)
    legacy_launcher = "sglang.launch_server" in request["argv"][:3]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(request["env"])
    result = new_result("sglang")
    if legacy_launcher:
        result["notes"].append(
            "python -m sglang.launch_server warns when it starts that "
            "'sglang serve' is the recommended entrypoint"
        )

    def run() -> None:
        import sglang

        result["version"] = sglang.__version__
        check(argv, request["options"], result)

    return checked(result, run, HOST_ARTIFACTS)


def warm_up() -> None:
    """Import what parsing, resolution and expert placement import (server mode), by
    resolving a one-GPU command line once in the parent."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sglang.srt.configs.model_config
    import sglang.srt.eplb.expert_location  # noqa: F401

    result: dict[str, Any] = {"warnings": [], "notes": []}
    check(["--model-path", "/models/warm-up", "--tp-size", "1"], {}, result)


if __name__ == "__main__":
    run_main(handle, warm_up)
