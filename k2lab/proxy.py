"""The HTTP proxy on the bridge address: lab hosts have no route out, apt and pip go through it."""

from __future__ import annotations

import shlex

from k2lab.config import PROXY_PORT, LabConfig
from k2lab.fs import write_file
from k2lab.hosts import spawn_listener
from k2lab.proc import ProcRef


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
    return spawn_listener(
        "tinyproxy",
        f"-d -c {shlex.quote(str(conf))}",
        run_dir=cfg.instance_dir,
        address=cfg.controller_ip,
        port=PROXY_PORT,
        timeout=timeout,
    )
