"""The lab's own container registry: Debian's `docker-registry` (the registry API, v2) on the
bridge address of a lab instance, plain HTTP, storage in the instance's directory.

No public registry is reachable from the lab, so images pulled by the product in the lab
come from here: ``push()`` copies an image of the lab's store into it under a name of its
own (a name no host's store holds, so a host that runs it must pull it or get it from a
peer), and ``pulls()`` reads the registry's access log: who fetched which blob, so a test
counts real pulls. Every lab host trusts it as an insecure registry (k2lab/hosts.py writes
the registries.conf drop-in).
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from k2lab.config import REGISTRY_PORT, LabConfig
from k2lab.errors import LabError
from k2lab.fs import write_file
from k2lab.hosts import spawn_listener, stop_listener
from k2lab.images import podman
from k2lab.proc import ProcRef, proc_ref

BINARY = "docker-registry"
# Its access log, in the combined log format: CLIENT - - [TIME] "METHOD PATH PROTO" STATUS ...
_ACCESS = re.compile(
    r"^(?P<client>\S+) \S+ \S+ \[[^]]+\] "
    r'"(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) '
)


@dataclass(frozen=True)
class Fetch:
    """One request the registry answered: client address, method, path, status."""

    client: str
    method: str
    path: str
    status: int


def registry_dir(cfg: LabConfig) -> Path:
    return cfg.instance_dir / "registry"


def log_file(cfg: LabConfig) -> Path:
    return registry_dir(cfg) / f"{BINARY}.log"


def config_text(cfg: LabConfig) -> str:
    storage = registry_dir(cfg) / "data"
    return "\n".join(
        [
            "# k2provision lab registry: plain HTTP on the bridge address, storage per instance.",
            "version: 0.1",
            "log:",
            "  level: warn",
            "  accesslog:",
            "    disabled: false",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {storage}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: {cfg.controller_ip}:{REGISTRY_PORT}",
            "",
        ]
    )


def stop_stale(cfg: LabConfig) -> None:
    """Stop a registry an interrupted run left (its pidfile names it): it would hold the port."""
    pid_file = registry_dir(cfg) / f"{BINARY}.pid"
    text = pid_file.read_text().strip() if pid_file.exists() else ""
    ref = proc_ref(int(text)) if text.isdigit() else None
    cmdline = Path(f"/proc/{ref.pid}/cmdline") if ref else None
    if ref and cmdline and BINARY.encode() in cmdline.read_bytes():
        stop_listener(ref)
    pid_file.unlink(missing_ok=True)


def start_registry(cfg: LabConfig, timeout: float = 15.0) -> ProcRef:
    """Start the registry detached, on the instance's bridge address; returns it once it
    listens. Needs the lab instance up (its bridge carries the address)."""
    if shutil.which(BINARY) is None:
        raise LabError(f"{BINARY} not found; fix: apt-get install -y docker-registry")
    stop_stale(cfg)
    conf = registry_dir(cfg) / "config.yml"
    write_file(conf, config_text(cfg))
    log_file(cfg).unlink(missing_ok=True)  # its access log counts this registry's pulls only
    return spawn_listener(
        BINARY,
        f"serve {shlex.quote(str(conf))}",
        run_dir=registry_dir(cfg),
        address=cfg.controller_ip,
        port=REGISTRY_PORT,
        timeout=timeout,
    )


def push(cfg: LabConfig, image: str, name: str) -> str:
    """Push `image` of the lab's store to the registry as `name` (repository:tag); returns the
    reference hosts pull, HOST:PORT/name."""
    ref = f"{cfg.registry}/{name}"
    podman(cfg, "push", "--tls-verify=false", "--quiet", image, ref)
    return ref


def fetches(cfg: LabConfig) -> list[Fetch]:
    """Every request in the registry's access log, in order."""
    path = log_file(cfg)
    text = path.read_text(errors="replace") if path.exists() else ""
    out = []
    for line in text.splitlines():
        m = _ACCESS.match(line)
        if m:
            out.append(Fetch(m["client"], m["method"], m["path"], int(m["status"])))
    return out


def pulls(cfg: LabConfig, repository: str) -> list[Fetch]:
    """The blob downloads of `repository` (a pull fetches each layer it lacks once): GETs of
    /v2/<repository>/blobs/ that the registry answered 200."""
    prefix = f"/v2/{repository}/blobs/"
    found = fetches(cfg)
    return [f for f in found if f.method == "GET" and f.path.startswith(prefix) and f.status == 200]
