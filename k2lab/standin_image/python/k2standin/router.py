"""Stand-in for `python3 -m sglang_router.launch_router` (part of the test double for
SGLang's GPU kernels: the router itself runs no kernels, but it ships in the same image).

Checks: with --pd-disaggregation, at least one `--prefill URL [BOOTSTRAP_PORT]` and one
`--decode URL`; without it, --worker-urls; every URL http(s)://HOST:PORT; --host, --port;
no stale options.

Runs: serves HTTP at once. /health and /liveness answer 200; /readiness turns 200 once every
worker answered /health, each prefill worker reports disaggregation_mode prefill (decode
workers decode) in /server_info and each prefill bootstrap port accepts connections. A worker
that does not within --worker-startup-timeout-secs (default 600) is fatal. /workers lists the
workers and their state; /v1/models is the first worker's (or K2_STANDIN_SERVED_MODEL_NAME);
/v1/chat/completions is forwarded to a decode worker (round robin), proving the wiring.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from k2standin.common import (
    Checker,
    Runtime,
    is_host,
    log,
    run_entry,
    scan,
    write_record,
)
from k2standin.httpserve import ModelServer, Response, error_response, json_response, listen

ENTRY = "sglang_router.launch_router"
LAUNCHER = ("python3", "-m", "sglang_router.launch_router")
SERVED_NAME_ENV = "K2_STANDIN_SERVED_MODEL_NAME"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
DEFAULT_STARTUP_TIMEOUT = 600
RECHECK_S = 5.0


@dataclass
class Worker:
    role: str  # prefill | decode | regular
    url: str
    bootstrap_port: int | None = None
    healthy: bool = False
    problem: str = "not checked yet"
    info: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "role": self.role,
            "bootstrap_port": self.bootstrap_port,
            "healthy": self.healthy,
            "status": "healthy" if self.healthy else self.problem,
        }


@dataclass
class RouterArgs:
    pd: bool
    workers: list[Worker]
    host: str
    port: int
    startup_timeout: int


def _check_url(c: Checker, option: str, url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or not is_host(parts.hostname):
        c.error(f"{option} {url!r}: expected http://HOST:PORT")
    elif port is None:
        c.error(f"{option} {url!r}: the worker URL needs its port")


def check(argv: Sequence[str]) -> RouterArgs:
    c = Checker(ENTRY)
    c.stale(argv)
    opts = scan(argv)
    if opts.positionals:
        c.error(f"unexpected arguments {opts.positionals}")
    pd = opts.has("--pd-disaggregation")
    workers: list[Worker] = []
    for group in opts.groups("--prefill"):
        if not group or len(group) > 2:
            c.error(f"--prefill {' '.join(group)!r}: expected URL [BOOTSTRAP_PORT]")
            continue
        _check_url(c, "--prefill", group[0])
        bootstrap: int | None = None
        if len(group) == 2 and group[1].lower() != "none":
            try:
                bootstrap = int(group[1])
            except ValueError:
                c.error(f"--prefill {group[0]} {group[1]!r}: bootstrap port must be a number")
        workers.append(Worker("prefill", group[0], bootstrap))
    for url in opts.values("--decode"):
        _check_url(c, "--decode", url)
        workers.append(Worker("decode", url))
    for url in opts.values("--worker-urls"):
        _check_url(c, "--worker-urls", url)
        workers.append(Worker("regular", url))
    roles = {w.role for w in workers}
    if pd:
        if "prefill" not in roles:
            c.error("--pd-disaggregation needs at least one --prefill URL [BOOTSTRAP_PORT]")
        if "decode" not in roles:
            c.error("--pd-disaggregation needs at least one --decode URL")
        if "regular" in roles:
            c.error("--worker-urls cannot be mixed with --pd-disaggregation")
    else:
        if roles & {"prefill", "decode"}:
            c.error("--prefill/--decode are given without --pd-disaggregation")
        if not workers:
            c.error("--worker-urls is required (or --pd-disaggregation with --prefill/--decode)")
    host = c.host(opts, DEFAULT_HOST)
    port = c.port(opts, DEFAULT_PORT)
    timeout = c.positive_int(
        opts, "--worker-startup-timeout-secs", default=DEFAULT_STARTUP_TIMEOUT
    )
    c.done()
    return RouterArgs(pd, workers, host, port, timeout or DEFAULT_STARTUP_TIMEOUT)


def _get_json(url: str, timeout: float = 3.0) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
        status = int(resp.status)
    try:
        return status, json.loads(body) if body.strip() else None
    except ValueError:
        return status, None


class Router:
    def __init__(self, rt: Runtime, args: RouterArgs) -> None:
        self.rt = rt
        self.args = args
        self.lock = threading.Lock()
        fixed_name = os.environ.get(SERVED_NAME_ENV)
        self.ms = ModelServer(
            "sglang-router",
            fixed_name,
            {"pd_disaggregation": args.pd, "host": args.host, "port": args.port},
        )
        self.ms.set_not_ready("waiting for workers")
        self.ms.api.get["/health"] = self.ms.liveness
        self.ms.api.get["/readiness"] = self.ms.health
        self.ms.api.get["/workers"] = self.workers
        self.ms.api.get["/list_workers"] = self.workers
        self.ms.api.post["/v1/chat/completions"] = self.forward
        self.ms.api.post["/v1/completions"] = self.forward_completion
        self.ms.api.post["/generate"] = self.forward_generate
        self.ms.info_hooks.append(lambda: {"workers": [w.as_json() for w in args.workers]})
        self.decode_cycle = itertools.cycle(
            [w for w in args.workers if w.role in ("decode", "regular")]
        )

    # ---------------------------------------------------------------- worker checks

    def probe(self, worker: Worker) -> str | None:
        """None when the worker is usable, else what is wrong."""
        base = worker.url.rstrip("/")
        try:
            status, _ = _get_json(f"{base}/health")
        except (OSError, urllib.error.URLError) as exc:
            return f"/health: {getattr(exc, 'reason', exc)}"
        if status != 200:
            return f"/health answered {status}"
        try:
            _, info = _get_json(f"{base}/server_info")
        except (OSError, urllib.error.URLError):
            info = None
        if isinstance(info, dict):
            worker.info = info
            mode = info.get("disaggregation_mode")
            if worker.role in ("prefill", "decode") and mode is not None and mode != worker.role:
                return (f"is configured as --{worker.role} but the server there runs "
                        f"--disaggregation-mode {mode}")
            advertised = info.get("disaggregation_bootstrap_port")
            if (worker.role == "prefill" and worker.bootstrap_port is not None
                    and advertised is not None and int(advertised) != worker.bootstrap_port):
                return (f"bootstrap port {worker.bootstrap_port} given, but the prefill server "
                        f"uses --disaggregation-bootstrap-port {advertised}")
        if worker.role == "prefill" and worker.bootstrap_port is not None:
            host = urlsplit(worker.url).hostname or ""
            try:
                socket.create_connection((host, worker.bootstrap_port), timeout=3).close()
            except OSError as exc:
                return f"bootstrap port {host}:{worker.bootstrap_port}: {exc.strerror or exc}"
        return None

    def check_all(self) -> list[Worker]:
        """Probe every worker; the ones that failed."""
        failed = []
        for worker in self.args.workers:
            problem = self.probe(worker)
            with self.lock:
                worker.healthy = problem is None
                worker.problem = problem or "healthy"
            if problem is not None:
                failed.append(worker)
        return failed

    def _model_name(self) -> None:
        if self.ms.model_id is not None:
            return
        for worker in self.args.workers:
            try:
                _, doc = _get_json(f"{worker.url.rstrip('/')}/v1/models")
                self.ms.model_id = str(doc["data"][0]["id"])
                return
            except (OSError, urllib.error.URLError, KeyError, IndexError, TypeError):
                continue

    def _usable(self) -> bool:
        healthy = {w.role for w in self.args.workers if w.healthy}
        return {"prefill", "decode"} <= healthy if self.args.pd else "regular" in healthy

    def watch(self) -> None:
        """Wait for the workers at startup (fatal after the timeout), then keep checking."""
        deadline = time.monotonic() + self.args.startup_timeout
        while not self.rt.stop.is_set():
            failed = self.check_all()
            if not failed:
                break
            if time.monotonic() > deadline:
                detail = "; ".join(f"{w.role} {w.url} {w.problem}" for w in failed)
                self.rt.fatal(f"workers not usable after --worker-startup-timeout-secs "
                              f"{self.args.startup_timeout}: {detail}")
                return
            wrong_role = [w for w in failed if "is configured as" in w.problem]
            if wrong_role:
                w = wrong_role[0]
                self.rt.fatal(f"{w.role} worker {w.url} {w.problem}")
                return
            self.ms.set_not_ready(
                "waiting for workers: " + "; ".join(f"{w.url} {w.problem}" for w in failed)
            )
            if self.rt.sleep(0.5):
                return
        self._model_name()
        log(ENTRY, f"all {len(self.args.workers)} workers usable; model {self.ms.model_id}")
        self.ms.set_ready()
        while not self.rt.sleep(RECHECK_S):
            failed = self.check_all()
            if self._usable():
                self._model_name()
                self.ms.set_ready()
            else:
                self.ms.set_not_ready(
                    "no usable workers: " + "; ".join(f"{w.url} {w.problem}" for w in failed)
                )

    # ---------------------------------------------------------------- routes

    def workers(self) -> Response:
        with self.lock:
            docs = [w.as_json() for w in self.args.workers]
        return json_response(200, {
            "pd_disaggregation": self.args.pd,
            "prefill": [d for d in docs if d["role"] == "prefill"],
            "decode": [d for d in docs if d["role"] == "decode"],
            "workers": docs,
            "ready": self.ms.ready.is_set(),
        })

    def _forward(self, path: str, body: bytes) -> Response:
        if not self.ms.ready.is_set():
            return error_response(503, f"router not ready: {self.ms.reason}",
                                  "ServiceUnavailableError")
        with self.lock:
            target = next(self.decode_cycle)
        url = f"{target.url.rstrip('/')}{path}"
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return Response(int(resp.status), resp.read(),
                                resp.headers.get("Content-Type", "application/json"))
        except urllib.error.HTTPError as exc:
            return Response(exc.code, exc.read(), "application/json")
        except (OSError, urllib.error.URLError) as exc:
            return error_response(502, f"worker {target.url} failed: {exc}", "BadGatewayError")

    def forward(self, body: bytes) -> Response:
        return self._forward("/v1/chat/completions", body)

    def forward_completion(self, body: bytes) -> Response:
        return self._forward("/v1/completions", body)

    def forward_generate(self, body: bytes) -> Response:
        return self._forward("/generate", body)


def serve(argv: Sequence[str]) -> int:
    full_argv = [*LAUNCHER, *argv]
    args = check(argv)
    rt = Runtime(ENTRY)
    rt.install_signals()
    router = Router(rt, args)
    write_record(ENTRY, full_argv, ok=True, role="http",
                 workers=[w.as_json() for w in args.workers])
    server = listen(router.ms.api, args.host, args.port)
    try:
        threading.Thread(target=router.watch, daemon=True).start()
        log(ENTRY, f"stand-in router up on {args.host}:{args.port}, "
                   f"{len(args.workers)} workers")
        return rt.wait()
    finally:
        server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run_entry(ENTRY, [*LAUNCHER, *args], lambda: serve(args))
