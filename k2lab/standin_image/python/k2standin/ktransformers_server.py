"""Stand-in for `python3 -m ktransformers.server.main` (a test double for KTransformers'
GPU/CPU kernels).

Checks: --model_path and --gguf_path are directories, --cache_lens (when given) a positive
number, --host/--port, no stale options. KTransformers has no tool-call-parser option, so
none is required. Serves HTTP; /v1/models lists --model_name.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k2standin.common import Checker, Runtime, log, run_entry, scan, write_record
from k2standin.httpserve import ModelServer, listen

ENTRY = "ktransformers.server.main"
LAUNCHER = ("python3", "-m", "ktransformers.server.main")
DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 10002


@dataclass
class KtArgs:
    served: str
    host: str
    port: int
    info: dict[str, Any]


def check(argv: Sequence[str]) -> KtArgs:
    c = Checker(ENTRY)
    c.stale(argv)
    opts = scan(argv)
    if opts.positionals:
        c.error(f"unexpected arguments {opts.positionals}")
    model = c.required(opts, "--model_path", "--model_dir")
    c.model_dir("--model_path", model)
    gguf = c.required(opts, "--gguf_path")
    c.model_dir("--gguf_path", gguf)
    cache_lens = c.positive_int(opts, "--cache_lens")
    host = c.host(opts, DEFAULT_HOST)
    port = c.port(opts, DEFAULT_PORT)
    c.done()
    assert model is not None
    served = opts.value("--model_name") or Path(model).name
    info: dict[str, Any] = {"model_path": model, "gguf_path": gguf, "cache_lens": cache_lens,
                            "model_name": served, "host": host, "port": port}
    return KtArgs(served, host, port, info)


def serve(argv: Sequence[str]) -> int:
    full_argv = [*LAUNCHER, *argv]
    args = check(argv)
    rt = Runtime(ENTRY)
    rt.install_signals()
    ms = ModelServer("ktransformers", args.served, args.info)
    write_record(ENTRY, full_argv, ok=True, role="http", info=args.info)
    server = listen(ms.api, args.host, args.port)
    try:
        ms.set_ready()
        log(ENTRY, f"stand-in KTransformers server on {args.host}:{args.port}")
        return rt.wait()
    finally:
        server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry(ENTRY, [*LAUNCHER, *args], lambda: serve(args))
