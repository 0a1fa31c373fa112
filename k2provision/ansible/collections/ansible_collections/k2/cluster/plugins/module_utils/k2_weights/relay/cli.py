"""The relay's command line: ``serve``, ``send`` and ``check``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from ..common import RelayError, describe_error
from ..manifest import load_manifest_file
from ..store import LocalStore
from .output import Emitter
from .protocol import (
    DEFAULT_BUFFERS,
    DEFAULT_CHECKPOINT,
    DEFAULT_CHUNK,
    DEFAULT_SOCKBUF,
    MAX_CHUNK,
    MIN_CHUNK,
    Options,
)
from .receiver import EXIT_CANCELLED, EXIT_INCOMPLETE, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Receiver
from .seed import Seed

DEFAULT_LISTEN = "0.0.0.0:29517"


class Cancelled(BaseException):
    """SIGTERM or SIGINT arrived."""


def run_check(args: argparse.Namespace, opts: Options, emit: Emitter) -> int:
    try:
        manifest = load_manifest_file(args.manifest)
    except RelayError as exc:
        emit("summary", status="refused", message=str(exc))
        return EXIT_REFUSED
    store = LocalStore(args.dest)
    store.adopt(manifest)
    states = store.scan(manifest, opts.verify, opts.workers(), emit)
    names = [m.name for m in manifest.files]
    ok = [n for n in names if states.get(n) == "present"]
    emit(
        "summary",
        status="ok" if len(ok) == len(names) else "incomplete",
        dest=store.dest,
        files=len(names),
        verified=len(ok),
        missing=[n for n in names if states.get(n) == "missing"],
        failed=[
            {"name": n, "reason": states[n][7:]} for n in names if states[n].startswith("wrong")
        ],
    )
    return EXIT_OK if len(ok) == len(names) else EXIT_INCOMPLETE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay.pyz",
        description="Pipelined weight relay: moves a manifest's files along a chain of hosts.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--name", default="", help="this host's name in events (default: its address)"
        )
        p.add_argument("--verify", action="store_true", help="re-hash every file already present")
        p.add_argument(
            "--io-timeout", type=float, default=120.0, help="seconds a peer may stay silent"
        )
        p.add_argument(
            "--connect-timeout", type=float, default=20.0, help="seconds to retry a connect"
        )
        p.add_argument("--sockbuf", type=int, default=DEFAULT_SOCKBUF, help="socket buffer bytes")
        p.add_argument("--buffers", type=int, default=DEFAULT_BUFFERS, help="chunks in flight")
        p.add_argument("--hash-workers", type=int, default=0, help="threads hashing local files")
        p.add_argument(
            "--progress-interval", type=float, default=1.0, help="seconds between events"
        )
        p.add_argument(
            "--checkpoint", type=int, default=DEFAULT_CHECKPOINT,
            help="bytes between syncs and resume points of a file being received",
        )  # fmt: skip
        p.add_argument(
            "--no-zero-copy", action="store_true", help="send through this process, not sendfile"
        )
        p.add_argument(
            "--keep-cache", action="store_true", help="leave received pages in the page cache"
        )

    serve = sub.add_parser("serve", help="receive, forward and verify (every receiving host)")
    serve.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT (port 0: any)")
    serve.add_argument("--dest", required=True, help="directory for the weights")
    serve.add_argument("--manifest", default="", help="refuse a stream whose manifest differs")
    serve.add_argument(
        "--accept-timeout", type=float, default=3600.0, help="wait for the first upstream"
    )
    serve.add_argument(
        "--relink-timeout", type=float, default=60.0, help="wait after a broken upstream"
    )
    common(serve)

    send = sub.add_parser("send", help="stream the files down the chain (the seed)")
    send.add_argument("--source", required=True, help="directory holding the files")
    send.add_argument("--manifest", required=True, help="manifest JSON file, or - for stdin")
    send.add_argument("--chain", required=True, help="HOST:PORT,HOST:PORT,... in chain order")
    send.add_argument("--fanout", action="store_true", help="one direct stream per host instead")
    send.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK, help="bytes per data frame")
    send.add_argument("--max-rate", type=float, default=0.0, help="cap in bytes/s (0: none)")
    send.add_argument(
        "--streams", type=int, default=1,
        help="parallel streams (lanes) per hop, each with its share of the files",
    )  # fmt: skip
    common(send)

    check = sub.add_parser("check", help="verify a destination against a manifest, no network")
    check.add_argument("--dest", required=True)
    check.add_argument("--manifest", required=True)
    common(check)
    return parser


def _cancel(signum: int, frame: Any) -> None:
    raise Cancelled()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chunk = int(getattr(args, "chunk_size", DEFAULT_CHUNK))
    if not MIN_CHUNK <= chunk <= MAX_CHUNK:
        print(f"relay.pyz: --chunk-size must be {MIN_CHUNK}..{MAX_CHUNK}", file=sys.stderr)
        return EXIT_USAGE
    if args.checkpoint < MIN_CHUNK:
        print(f"relay.pyz: --checkpoint must be at least {MIN_CHUNK}", file=sys.stderr)
        return EXIT_USAGE
    opts = Options(
        chunk=chunk,
        buffers=max(2, args.buffers),
        sockbuf=args.sockbuf,
        io_timeout=args.io_timeout,
        connect_timeout=args.connect_timeout,
        keepalive=max(0.2, min(2.0, args.io_timeout / 4)),
        hash_workers=args.hash_workers,
        verify=args.verify,
        checkpoint=args.checkpoint,
        zero_copy=not args.no_zero_copy,
        drop_cache=not args.keep_cache,
    )
    emit = Emitter(
        args.name or ("seed" if args.command == "send" else args.command), args.command, sys.stdout
    )
    signal.signal(signal.SIGTERM, _cancel)
    signal.signal(signal.SIGINT, _cancel)
    if args.command == "check":
        return run_check(args, opts, emit)
    if args.command == "send":
        seed = Seed(args, opts, emit)
        try:
            return seed.run()
        except Cancelled:
            emit(
                "summary",
                **seed.summary("cancelled", [], [], "cancelled by signal", seed.counters.tx),
            )
            return EXIT_CANCELLED
    try:
        os.makedirs(args.dest, exist_ok=True)
        receiver = Receiver(args, opts, emit)
    except (OSError, RelayError) as exc:
        emit(
            "summary",
            status="refused",
            message=f"{emit.host}: {describe_error(exc)}",
            dest=args.dest,
        )
        return EXIT_REFUSED
    try:
        return receiver.run()
    except Cancelled:
        receiver.message = "cancelled by signal"
        return receiver.finish("cancelled")
