"""The HTTP proxy on the bridge address: lab hosts have no route out, apt and pip go through it."""

from __future__ import annotations

import shlex
import time

from k2lab.config import PROXY_PORT, LabConfig
from k2lab.errors import LabError
from k2lab.fs import write_file
from k2lab.hosts import console_tail, port_open
from k2lab.proc import ProcRef, is_alive, kill, spawn_detached, wait_gone


def tinyproxy_conf(cfg: LabConfig) -> str:
    return "\n".join(
        [
            "# k2provision lab: HTTP proxy for the lab hosts, on the bridge address only.",
            "User nobody",
            "Group nogroup",
            f"Port {PROXY_PORT}",
            f"Listen {cfg.controller_ip}",
            "Timeout 600",
            "MaxClients 200",
            "LogLevel Warning",
            f"Allow {cfg.subnet}",
            "Allow 127.0.0.1",
            "ConnectPort 443",
            "DisableViaHeader Yes",
            "",
        ]
    )


def start_proxy(cfg: LabConfig, timeout: float = 10.0) -> ProcRef:
    """Start tinyproxy in the foreground, detached; returns its process once it listens."""
    conf = cfg.instance_dir / "tinyproxy.conf"
    write_file(conf, tinyproxy_conf(cfg))
    log_file = cfg.instance_dir / "tinyproxy.log"
    ref = spawn_detached(
        f'echo $$ > "$K2_PIDFILE"; exec tinyproxy -d -c {shlex.quote(str(conf))}',
        pid_file=cfg.instance_dir / "tinyproxy.pid",
        log_file=log_file,
    )
    deadline = time.monotonic() + timeout
    while not port_open(cfg.controller_ip, PROXY_PORT, timeout=0.2):
        if not is_alive(ref) or time.monotonic() > deadline:
            kill(ref)
            raise LabError(
                f"tinyproxy did not listen on {cfg.controller_ip}:{PROXY_PORT}: "
                f"{console_tail(log_file)}"
            )
        time.sleep(0.05)
    return ref


def stop_proxy(ref: ProcRef | None) -> None:
    kill(ref)
    wait_gone([ref], timeout=5)
