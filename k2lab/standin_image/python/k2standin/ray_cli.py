"""Stand-in for the `ray` command (part of the test double for the engines' GPU kernels).

`ray start --head [--port P] [--node-ip-address IP] --block`: the head; serves the node
table on its port and stays in the foreground.
`ray start --address HEAD:PORT [--node-ip-address IP] --block`: a worker; registers with
the head (retrying until K2_STANDIN_JOIN_TIMEOUT), heartbeats, stays in the foreground and
exits non-zero when the head is gone for K2_STANDIN_RAY_HEAD_TIMEOUT seconds (default 60).
Checks: --head or --address (not both), --block, --port/--address sane, --node-ip-address
an address of this node and equal to VLLM_HOST_IP when that is set.
`ray status [--address A]`: prints the nodes that joined and their GPUs.
`ray stop`: stops the `ray start` processes of this container.
Every node offers --num-gpus GPUs (default K2_STANDIN_GPUS_PER_NODE, 8).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from k2standin import ray_cluster
from k2standin.common import (
    Checker,
    Runtime,
    StartError,
    env_seconds,
    gpus_per_node,
    is_local_address,
    log,
    run_entry,
    scan,
    write_record,
)
from k2standin.httpserve import HttpServer
from k2standin.rendezvous import JOIN_TIMEOUT_ENV

ENTRY = "ray"
DEFAULT_PORT = 6379
HEAD_TIMEOUT_ENV = "K2_STANDIN_RAY_HEAD_TIMEOUT"
USAGE = "usage: ray start|status|stop [options]  (k2provision stand-in)"


def _default_ip() -> str:
    """The address this node reaches the outside with (as Ray picks it), else loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
            return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _float_opt(c: Checker, value: str | None, option: str, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        c.error(f"{option} {value!r}: expected a number")
        return default
    if number < 0:
        c.error(f"{option} {value}: expected at least 0")
    return number


def _pid_file() -> Path:
    return ray_cluster.ray_dir() / f"standin-start-{os.getpid()}.pid"


@dataclass
class StartArgs:
    head: bool
    head_address: tuple[str, int] | None
    port: int
    ip: str | None
    gpus: float
    cpus: float


def check_start(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, *, local: bool = True
) -> StartArgs:
    """`argv` after `ray start`; `local=False` skips the checks about this machine."""
    env = os.environ if environ is None else environ
    c = Checker(ENTRY)
    c.stale(argv)
    opts = scan(argv)
    head = opts.has("--head")
    address_text = opts.value("--address")
    head_address: tuple[str, int] | None = None
    if head and address_text is not None:
        c.error("--head and --address are exclusive: the head starts the cluster")
    elif not head and address_text is None:
        c.error("--head or --address HEAD:PORT is required")
    elif address_text is not None:
        head_address = c.address("--address", address_text)
    c.flag(
        opts,
        "--block",
        "without it ray start returns at once and the container's main process exits",
    )
    port = c.port(opts, DEFAULT_PORT)
    ip = opts.value("--node-ip-address")
    if ip is not None:
        if local and not is_local_address(ip):
            c.error(f"--node-ip-address {ip}: not an address of this node")
        host_ip = env.get("VLLM_HOST_IP")
        if host_ip and host_ip != ip:
            c.error(f"--node-ip-address {ip} differs from VLLM_HOST_IP={host_ip}")
    gpus = _float_opt(c, opts.value("--num-gpus"), "--num-gpus", float(gpus_per_node()))
    cpus = _float_opt(c, opts.value("--num-cpus"), "--num-cpus", float(os.cpu_count() or 1))
    c.done()
    return StartArgs(head, head_address, port, ip, gpus, cpus)


def start(argv: Sequence[str]) -> int:
    full_argv = ["ray", "start", *argv]
    args = check_start(argv)
    head, head_address, port, gpus = args.head, args.head_address, args.port, args.gpus
    my_ip = args.ip or _default_ip()
    me = ray_cluster.new_node(my_ip, gpus, args.cpus, head)

    rt = Runtime(ENTRY)
    rt.install_signals()
    server: HttpServer | None = None
    pid_file = _pid_file()
    try:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{os.getpid()}\n")
    except OSError:
        pass
    try:
        if head:
            cluster = ray_cluster.Head(me)
            bind = "::" if ":" in my_ip else "0.0.0.0"
            try:
                server = HttpServer(cluster.api, bind, port)
            except OSError as exc:
                raise StartError(f"--port {port}: cannot listen ({exc.strerror or exc})") from exc
            address = f"{my_ip}:{port}"
            try:
                ray_cluster.current_cluster_file().write_text(address + "\n")
            except OSError as exc:
                log(ENTRY, f"warning: cannot write {ray_cluster.current_cluster_file()}: {exc}")
            write_record(ENTRY, full_argv, ok=True, role="head", address=address)
            log(ENTRY, f"stand-in Ray head at {address}, {gpus:g} GPUs")
            return rt.wait()
        assert head_address is not None
        head_text = f"{head_address[0]}:{head_address[1]}"
        write_record(ENTRY, full_argv, ok=True, role="worker", head=head_text)
        _register(rt, head_text, me)
        if rt.stop.is_set():
            return rt.wait()
        log(ENTRY, f"stand-in Ray worker {my_ip} joined {head_text}, {gpus:g} GPUs")
        _heartbeat(rt, head_text, me)
        return rt.wait()
    finally:
        if server is not None:
            server.close()
        pid_file.unlink(missing_ok=True)


def _register(rt: Runtime, head: str, me: dict[str, object]) -> None:
    deadline = time.monotonic() + env_seconds(JOIN_TIMEOUT_ENV, 1800.0)
    attempt = 0
    while not rt.stop.is_set():
        attempt += 1
        try:
            status = ray_cluster.post(head, "/api/register", {"node": me})
            if status == 200:
                return
            problem = f"HTTP {status}"
        except OSError as exc:
            problem = str(getattr(exc, "reason", exc))
        if time.monotonic() > deadline:
            raise StartError(f"--address {head}: the Ray head never answered ({problem})")
        if attempt == 1 or attempt % 10 == 0:
            log(ENTRY, f"waiting for the Ray head at {head} ({problem})")
        rt.sleep(1.0)


def _heartbeat(rt: Runtime, head: str, me: dict[str, object]) -> None:
    timeout = env_seconds(HEAD_TIMEOUT_ENV, 60.0)
    last_ok = time.monotonic()
    while not rt.sleep(ray_cluster.HEARTBEAT_S):
        try:
            status = ray_cluster.post(head, "/api/heartbeat", {"NodeID": me["NodeID"]})
        except OSError:
            status = 0
        if status == 200:
            last_ok = time.monotonic()
        elif status == 404:
            rt.fatal(f"the Ray head at {head} restarted and no longer knows this node")
            return
        elif time.monotonic() - last_ok > timeout:
            rt.fatal(f"lost the Ray head at {head} for {timeout:g} s")
            return


def status(argv: Sequence[str]) -> int:
    opts = scan(argv)
    address = ray_cluster.resolve_address(opts.value("--address"))
    if address is None:
        print(
            "ConnectionError: Could not find any running Ray instance. "
            "Please specify the one to connect to by setting `--address`.",
            file=sys.stderr,
        )
        return 1
    try:
        nodes = ray_cluster.fetch_nodes(address)
    except ConnectionError as exc:
        print(f"ConnectionError: {exc}", file=sys.stderr)
        return 1
    alive = [n for n in nodes if n.get("Alive")]
    dead = [n for n in nodes if not n.get("Alive")]
    count, gpus = ray_cluster.alive_gpus(nodes)
    cpus = sum(float(n["Resources"].get("CPU", 0.0)) for n in alive)
    lines = [
        f"======== Cluster status (k2provision stand-in, head {address}) ========",
        "Node status",
        "-" * 63,
        "Active:",
        *[
            f" 1 node_{n['NodeID']} ({n['NodeManagerAddress']}"
            f"{', head' if n.get('IsHead') else ''})"
            for n in alive
        ],
        "Dead:" if dead else "Dead: (no dead nodes)",
        *[f" 1 node_{n['NodeID']} ({n['NodeManagerAddress']})" for n in dead],
        "",
        "Resources",
        "-" * 63,
        "Usage:",
        f" 0.0/{cpus:g} CPU",
        f" 0.0/{gpus:g} GPU",
        "",
        f"{count} node(s) alive, {gpus:g} GPUs",
    ]
    print("\n".join(lines))
    return 0


def stop(argv: Sequence[str]) -> int:
    del argv
    stopped = 0
    for pid_file in sorted(ray_cluster.ray_dir().glob("standin-start-*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            stopped += 1
        except (OSError, ValueError):
            pid_file.unlink(missing_ok=True)
    print(f"Stopped {stopped} Ray processes.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "--version":
        print("ray, version 0.0.0 (k2provision stand-in)")
        return 0
    if command == "start":
        return run_entry(ENTRY, ["ray", *args], lambda: start(rest))
    if command == "status":
        return status(rest)
    if command == "stop":
        return stop(rest)
    print(f"ray {command}: not provided by the stand-in. {USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
