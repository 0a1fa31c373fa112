"""The commands that ask a host about its processes, run here in a real shell: the URL probe
against a local HTTP server, the liveness check through a stand-in `docker`, and how the launch
gate and `status` read their answers."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k2provision.ops import launch_gate as lg
from k2provision.ops.host_probe import MARK, exec_liveness, parse_liveness, url_probe
from k2provision.ops.status_probe import host_status, probe_script
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        del args


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def sh(command: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True, timeout=30, env=env
    ).stdout.strip()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_url_probe_prints_the_status_or_why_none_came(server: str) -> None:
    assert sh(url_probe(f"{server}/health", sys.executable)) == "200"
    assert sh(url_probe(f"{server}/other", sys.executable)) == "503"
    refused = sh(url_probe(f"http://127.0.0.1:{closed_port()}/health", sys.executable, 2))
    assert refused.startswith("no answer ")
    assert "refused" in refused.lower()


def execd(tmp_path: Path, pid_file: str | None) -> tuple[str, dict[str, str]]:
    """The liveness command of an exec'd process, and an environment whose `docker exec C sh -c
    SCRIPT` runs SCRIPT here with the pid file at `pid_file` (None: no pid file yet)."""
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    process = next(p for h in plan.hosts for p in h.processes if p.exec_in)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_path = f"/run/k2-{process.name}.pid"
    target = pid_file or str(tmp_path / "absent.pid")
    docker = bin_dir / "docker"
    docker.write_text(
        "#!/bin/sh\n"  # docker exec CONTAINER sh -c SCRIPT: SCRIPT runs here
        f'script=$(printf %s "$5" | sed "s#{pid_path}#{target}#g")\n'
        'exec sh -c "$script"\n'
    )
    docker.chmod(0o755)
    return exec_liveness(process), {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_liveness_tells_running_starting_and_exited_apart(tmp_path: Path) -> None:
    pid_file = tmp_path / "p.pid"
    command, env = execd(tmp_path, str(pid_file))
    assert sh(command, env) == "starting"
    pid_file.write_text(f"{os.getpid()}\n")
    state, started = parse_liveness(sh(command, env))
    assert state == "running"
    assert started is not None
    assert abs(started - time.time()) < 60
    dead = subprocess.Popen(["true"])
    dead.wait()
    pid_file.write_text(f"{dead.pid}\n")
    assert sh(command, env) == "exited"
    gone = command.replace("docker ", "k2-no-such-docker ")  # the container is as good as gone
    assert sh(gone, env) == "exited"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("running 1769860740", ("running", 1769860740)), ("running", ("running", None)),
     ("starting", ("starting", None)), ("exited", ("exited", None)), ("", ("exited", None))],
)  # fmt: skip
def test_liveness_answers_are_read(answer: str, expected: tuple[str, int | None]) -> None:
    assert parse_liveness(answer) == expected


def test_the_launch_gate_and_status_ask_the_same_questions() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    host = plan.hosts[0]
    procs = list(host.processes)
    execd_proc = next(p for p in procs if p.exec_in)
    gate_probe = lg.probe_command(procs)
    status_probe = probe_script(host)
    assert exec_liveness(execd_proc) in gate_probe
    assert exec_liveness(execd_proc) in status_probe
    for p in procs:
        if p.health is not None and p.health.url is not None:
            assert url_probe(p.health.url) in gate_probe
            assert url_probe(p.health.url) in status_probe


def test_an_execd_process_reads_as_running_with_its_uptime_or_not_running() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    host = plan.hosts[0]
    execd_proc = next(p for p in host.processes if p.exec_in)

    def status_of(alive: str) -> tuple[str, int | None]:
        parts = [f"{MARK} now 1769860800", f"{MARK} no-gpus", f"{MARK} alive {execd_proc.name}",
                 alive, f"{MARK} rc 0", f"{MARK} end"]  # fmt: skip
        found = host_status(plan, host, "\n".join(parts) + "\n")
        proc = next(p for p in found.processes if p.process == execd_proc.name)
        return proc.state, proc.uptime_s

    assert status_of("running 1769860740") == ("running", 60)
    assert status_of("starting") == ("not running", None)
    assert status_of("exited") == ("not running", None)


def test_the_gate_reads_an_execd_process_without_a_code() -> None:
    states, _ = lg.parse_probe("S0 running 1769860740\nS1 exited\nS2 exited 137\n")
    assert states[0] == lg.ProcState("running", "")
    assert states[1].reason() == "exited before passing its health gate"
    assert states[2].reason() == "exited with code 137 before passing its health gate"
