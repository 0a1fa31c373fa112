"""Check a KTransformers server command line with sglang-kt's own parser and
server-args logic (run in .venv-sglang-kt).

KTransformers serves through sglang-kt 0.7.2, KTransformers' fork of SGLang,
which installs as the same `sglang` package with its own arguments (`--kt-*`)
and its own resolution. The request and the result are check_sglang.py's
(``resolve``, ``fake_model``, ``config``; ``parsed``, ``resolved``,
``warnings``, ``notes``), but the pipeline is the fork's: its
``prepare_server_args`` parses and then resolves and validates in
``ServerArgs.__post_init__`` (sglang/srt/server_args.py), and
``ServerArgs.check_server_args`` runs the checks the launcher runs before
starting. So the stand-in model directory (when the model path is not a local
directory) and ``--device cuda`` go into the command line before parsing.

Stages: ``parse`` (argparse alone), ``resolve`` (``prepare_server_args``, then
``check_server_args``). A venv whose `sglang` is not the sglang-kt
distribution is an internal failure, not a verdict.

The fork's resolution imports its model config, which imports the MoE layers
and through them GPU-only extension modules (``sgl_kernel``, built for CUDA
and not installable on a CPU-only host) by name, without calling them while
resolving. Those modules are stood in by empty ones whose every attribute is a
placeholder that fails if called (KERNEL_MODULES), and the result's notes say
so. Some of those modules also ask CUDA for the device's compute capability at
import (sglang/srt/utils/common.py mxfp8_block_convert_required); with no GPU
here, torch.cuda.get_device_capability answers TARGET_CAPABILITY, the Hopper
GPUs KTransformers' AMX + GPU split is deployed on (noted in the result).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import os
import shutil
import sys
import types
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from check_sglang import FIELDS, HOST_ARTIFACTS, LAUNCHERS, _model_stand_in
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

DISTRIBUTION = "sglang-kt"
# GPU extension packages the fork's resolution imports by name only.
KERNEL_MODULES = ("sgl_kernel",)
# What torch.cuda.get_device_capability answers on this GPU-less host: Hopper (SM 9.0).
TARGET_CAPABILITY = (9, 0)


class _Placeholder:
    """A GPU kernel (or a namespace of them) by name: attributes are placeholders too, and
    calling one fails."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is a GPU kernel, not available to the parser check")


class _KernelStub(types.ModuleType):
    """An empty stand-in for a GPU extension module: every attribute is a placeholder."""

    __path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _KernelStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds KERNEL_MODULES (and their submodules) as _KernelStub modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", maxsplit=1)[0] in KERNEL_MODULES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _KernelStub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def stub_kernels(notes: list[str]) -> None:
    """Stand in for the GPU extension modules and the device's capability (once per
    process)."""
    import torch

    if not any(isinstance(f, _KernelStubs) for f in sys.meta_path):
        sys.meta_path.append(_KernelStubs())
    if not torch.cuda.is_available():
        torch.cuda.get_device_capability = lambda *_a, **_k: TARGET_CAPABILITY
        notes.append(f"no GPU here: device capability answered as {TARGET_CAPABILITY}")
    notes.append(f"GPU extension modules stood in by empty ones: {', '.join(KERNEL_MODULES)}")


def _with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag` set to `value` (replacing a given one)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return [*out, flag, value]


def _as_given(server_args_cls: Any, raw: argparse.Namespace) -> Any:
    """The fork's ServerArgs as the command line gives it: its own `from_cli_args` (which
    renames e.g. tensor_parallel_size to tp_size) without the resolution `__post_init__`
    runs."""
    post_init = server_args_cls.__post_init__
    server_args_cls.__post_init__ = lambda self: None
    try:
        return server_args_cls.from_cli_args(argparse.Namespace(**vars(raw)))
    finally:
        server_args_cls.__post_init__ = post_init


def check(argv: list[str], options: dict[str, Any], result: dict[str, Any]) -> None:
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    sink: list[str] = result["warnings"]
    notes: list[str] = result["notes"]
    stub_kernels(notes)
    with collect_warnings(["sglang"], sink, ["/sglang/"]), argparse_errors_raise():
        result["stage"] = "parse"
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        raw = parser.parse_args(argv)
        result["parsed"] = pick(_as_given(ServerArgs, raw), FIELDS)
        if not options.get("resolve", True):
            result["stage"] = None
            return

        result["stage"] = "resolve"
        resolve_argv = list(argv)
        if raw.device is None:
            resolve_argv = _with_option(resolve_argv, "--device", "cuda")
            notes.append("device: none given, resolved as cuda")
        model_path = raw.model_path
        stand_in = None
        if (
            options.get("fake_model", True)
            and model_path
            and model_path.lower() not in ("dummy", "none")
            and not Path(model_path).is_dir()
        ):
            stand_in = _model_stand_in(options.get("config"))
            resolve_argv = _with_option(resolve_argv, "--model-path", stand_in)
            if raw.served_model_name is None:
                resolve_argv = _with_option(resolve_argv, "--served-model-name", model_path)
            held = "the given" if options.get("config") else "Kimi-K2-Instruct's"
            notes.append(
                f"model path {model_path} is not a local directory: resolved with "
                f"a stand-in holding {held} config.json"
            )
        try:
            server_args = prepare_server_args(resolve_argv)
            server_args.check_server_args()
            resolved = pick(server_args, FIELDS)
            if stand_in:
                for key in ("model_path", "tokenizer_path"):
                    if resolved.get(key) == stand_in:
                        resolved[key] = model_path
            result["resolved"] = resolved
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


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one request."""
    try:
        argv = strip_launcher(request["argv"], LAUNCHERS)
        fork = version(DISTRIBUTION)
    except (BadRequest, PackageNotFoundError) as exc:
        return internal_result(exc)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(request["env"])
    result = new_result(DISTRIBUTION)
    result["version"] = f"{DISTRIBUTION} {fork}"
    return checked(result, lambda: check(argv, request["options"], result), HOST_ARTIFACTS)


def warm_up() -> None:
    """Import what parsing and resolution import, by resolving a one-GPU command line once
    in the parent."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result: dict[str, Any] = {"warnings": [], "notes": []}
    check(["--model-path", "/models/warm-up", "--tp-size", "1"], {}, result)


if __name__ == "__main__":
    run_main(handle, warm_up)
