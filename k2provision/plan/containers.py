"""Planned process -> the exact `docker run` / `docker exec` argv that starts it. Pure."""

from __future__ import annotations

import hashlib
import json
import shlex

from k2provision.core.records import ContainerOptions, Process

LABEL_HASH = "io.k2provision.hash"
LABEL_PROCESS = "io.k2provision.process"
LABEL_COMPILE_CACHE = "io.k2provision.compile-cache"
# The stand-in fault mode of a lab host (k2_lab_fault), as the stand-in reads it.
LAB_FAULT_ENV = "K2_LAB_FAULT"


def launch_path(config_dir: str, process: Process) -> str:
    """Where the process's launch script lives on the host (and, mounted, in the container)."""
    return f"{config_dir}/launch/{process.name}.sh"


def spec_hash(options: ContainerOptions, process: Process, files: dict[str, str]) -> str:
    """A digest of everything that shapes the container, the host's rendered files included
    (scripts and configs it reads at start): a change means recreate it."""
    doc = {
        "options": options.model_dump(mode="json"),
        "process": process.model_dump(mode="json"),
        "files": files,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def run_argv(
    options: ContainerOptions, process: Process, config_dir: str, files: dict[str, str]
) -> list[str]:
    """`docker run -d` for a process that is a container's main command."""
    argv = [
        "docker",
        "run",
        "--detach",
        "--name",
        process.container,
        "--label",
        f"{LABEL_HASH}={spec_hash(options, process, files)}",
        "--label",
        f"{LABEL_PROCESS}={process.name}",
        "--network",
        options.network,
        "--ipc",
        options.ipc,
    ]
    if options.gpus and process.gpus:
        argv += ["--gpus", options.gpus]
    if options.privileged:
        argv.append("--privileged")
    for cap in options.cap_add:
        argv += ["--cap-add", cap]
    for ulimit in options.ulimits:
        argv += ["--ulimit", ulimit]
    for device in options.devices if process.gpus else ():
        argv += ["--device", device]
    for volume in options.volumes:
        argv += ["--volume", volume]
    if options.compile_cache and process.gpus:
        # Read-write: the engine writes the kernels it compiles (plan/caches.py).
        cache = options.compile_cache
        argv += ["--volume", f"{cache}:{cache}", "--label", f"{LABEL_COMPILE_CACHE}={cache}"]
    if process.lab_fault:
        argv += ["--env", f"{LAB_FAULT_ENV}={process.lab_fault}"]
    argv += [process.image, "sh", launch_path(config_dir, process)]
    return argv


def exec_pid_path(process: Process) -> str:
    """Where an exec'd process's pid is kept, inside its container."""
    return f"/run/k2-{process.name}.pid"


def exec_log_path(process: Process) -> str:
    """Where an exec'd process's output goes, inside its container (`docker exec --detach`
    keeps none; `k2provision logs` and `status` read this file)."""
    return f"/run/k2-{process.name}.log"


def exec_argv(process: Process, config_dir: str) -> list[str]:
    """`docker exec -d` for a process started inside a running container; its pid is recorded
    in /run/k2-<name>.pid inside the container so a re-run can tell it is already up, and its
    output (stdout and stderr) appended to /run/k2-<name>.log."""
    return [
        "docker",
        "exec",
        "--detach",
        process.container,
        "sh",
        "-c",
        f"echo $$ > {shlex.quote(exec_pid_path(process))}; "
        f"exec sh {shlex.quote(launch_path(config_dir, process))} "
        f">> {shlex.quote(exec_log_path(process))} 2>&1",
    ]
