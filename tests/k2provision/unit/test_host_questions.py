"""The registry of host questions, asked for real: each question's command in one batch run by
a real shell (with a stand-in `docker` on PATH: no container runtime here), each answer read
into its record, the URL question against local HTTP and HTTPS servers (the certificate
policy: a private CA is trusted where its file is named, and only then), and the readers on
the answers the runtimes and tools give."""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.filter import (
    k2 as k2_filters,
)
from k2provision.core.records import HealthGate
from k2provision.ops import launch_gate
from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import LABEL_HASH
from k2provision.plan.host_questions import gate_ca_file, gate_question, hq, state_question
from k2provision.plan.inventory import load_cluster

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"

INSPECT = [
    {
        "Id": "f00d",
        "Name": "/k2-sglang",
        "State": {
            "Status": "exited",
            "Running": False,
            "ExitCode": 137,
            "StartedAt": "2026-01-31T11:59:00.123456789Z",
        },
        "RestartCount": 2,
        "Config": {"Labels": {LABEL_HASH: "0123456789abcdef", "other": "x"}},
    }
]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        del args


def serve(httpd: http.server.HTTPServer) -> Iterator[int]:
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    yield from serve(http.server.HTTPServer(("127.0.0.1", 0), Handler))


@pytest.fixture(scope="module")
def https_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """An HTTPS server whose certificate a private CA signed for 127.0.0.1: (port, CA file)."""
    from tests.k2provision.integration.test_bastion_lab import lab_ca_and_certificate

    files = lab_ca_and_certificate(tmp_path_factory.mktemp("tls"), "127.0.0.1")
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files["k2_tls_cert_file"], files["k2_tls_key_file"])
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    for port in serve(httpd):
        yield port, files["k2_tls_ca_file"]


def ask(*questions: hq.Question[object], env: dict[str, str] | None = None) -> list[object]:
    """Every question in one batch, run by sh; each record."""
    batch = hq.Batch()
    tickets = [batch.add(f"q{i} of {type(q).__name__}", q) for i, q in enumerate(questions)]
    out = subprocess.run(
        ["sh", "-c", batch.script()], capture_output=True, text=True, env=env, timeout=60
    ).stdout
    answers = batch.read(out)
    assert answers.complete
    return [answers[t] for t in tickets]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- health gates and the CA


def test_the_url_question_reads_the_status_or_why_none_came(http_port: int) -> None:
    base = f"http://127.0.0.1:{http_port}"
    ok, other, refused = ask(
        hq.HttpQuestion(f"{base}/health", python=sys.executable),
        hq.HttpQuestion(f"{base}/other", python=sys.executable),
        hq.HttpQuestion(f"http://127.0.0.1:{closed_port()}/", python=sys.executable, timeout_s=2),
    )
    assert ok == hq.GateAnswer(200)
    assert ok.passes(200)
    assert other == hq.GateAnswer(503)
    assert isinstance(refused, hq.GateAnswer)
    assert refused.code is None
    assert "refused" in refused.text.lower()
    assert refused.text.startswith("no answer (")


def test_an_https_gate_is_trusted_through_the_plans_private_ca_only(
    https_port: tuple[int, str], tmp_path: Path
) -> None:
    port, ca_file = https_port
    url = f"https://127.0.0.1:{port}/health"
    with_ca, without, absent = ask(
        hq.HttpQuestion(url, ca_file, sys.executable),
        hq.HttpQuestion(url, "", sys.executable),
        hq.HttpQuestion(url, str(tmp_path / "no-such-ca.pem"), sys.executable),
    )
    assert with_ca == hq.GateAnswer(200)
    for untrusted in (without, absent):
        assert isinstance(untrusted, hq.GateAnswer)
        assert untrusted.code is None
        assert untrusted.untrusted
        assert untrusted.text.startswith("certificate not trusted (")
        gate = HealthGate(url=url)
        assert "k2_tls_ca_file" in launch_gate.hopeless(gate, untrusted)
    refused = hq.GateAnswer(None, "refused")
    assert launch_gate.hopeless(HealthGate(url=url), refused) == ""


def test_every_https_gate_of_a_plan_names_the_ca_the_launch_places() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))
    assert gate_ca_file(plan.config_dir) == f"{plan.config_dir}/tls/ca.pem"
    gates = [
        gate_question(p, p.health, plan.config_dir)
        for h in plan.hosts
        for p in h.processes
        if p.health is not None
    ]
    urls = [g for g in gates if isinstance(g, hq.HttpQuestion)]
    assert urls
    assert {g.ca_file for g in urls} == {gate_ca_file(plan.config_dir)}


# ---------------------------------------------------------------- processes (a stand-in docker)


def standin_docker(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose `docker` runs `body` (a shell script; "$@" are its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + body)
    docker.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_containers_state_label_and_the_runtimes_errors_are_read(tmp_path: Path) -> None:
    (tmp_path / "inspect.json").write_text(json.dumps(INSPECT))
    env = standin_docker(
        tmp_path,
        'echo "WARN[0000] cgroup v1 is deprecated" >&2\n'
        f'case "$3" in k2-sglang) cat {tmp_path}/inspect.json ;;\n'
        '  k2-busy) echo "Error: acquiring lock 3 for container: resource busy" >&2; exit 125 ;;\n'
        '  *) echo "Error: No such container: $3" >&2; exit 1 ;; esac\n',
    )
    found, gone, busy = ask(
        hq.ContainerQuestion("k2-sglang", LABEL_HASH),
        hq.ContainerQuestion("k2-gone", LABEL_HASH),
        hq.ContainerQuestion("k2-busy", LABEL_HASH),
        env=env,
    )
    assert found == hq.ContainerState(
        found=True,
        running=False,
        status="exited",
        exit_code=137,
        started_at="2026-01-31T11:59:00.123456789Z",
        restarts=2,
        spec_hash="0123456789abcdef",
    )
    assert isinstance(gone, hq.ContainerState)
    assert (gone.found, gone.error, gone.phase) == (False, "", "missing")
    assert isinstance(busy, hq.ContainerState)
    assert not busy.found
    assert "resource busy" in busy.error


@pytest.mark.parametrize(
    ("status", "running", "phase"),
    [("running", True, "running"), ("created", False, "starting"),
     ("exited", False, "exited"), ("", False, "stopped")],
)  # fmt: skip
def test_a_containers_phase(status: str, running: bool, phase: str) -> None:
    assert hq.ContainerState(True, running, status).phase == phase


def test_liveness_tells_running_starting_and_exited_apart(tmp_path: Path) -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    process = next(p for h in plan.hosts for p in h.processes if p.exec_in)
    question = state_question(process)
    assert isinstance(question, hq.ExecQuestion)
    pid_file = tmp_path / "p.pid"
    env = standin_docker(  # docker exec CONTAINER sh -c SCRIPT: SCRIPT runs here
        tmp_path,
        f'script=$(printf %s "$5" | sed "s#{question.pid_file}#{pid_file}#g")\n'
        'exec sh -c "$script"\n',
    )
    assert ask(question, env=env) == [hq.ExecState("starting")]
    pid_file.write_text(f"{os.getpid()}\n")
    (alive,) = ask(question, env=env)
    assert isinstance(alive, hq.ExecState)
    assert alive.state == "running"
    assert alive.started is not None
    assert abs(alive.started - time.time()) < 60
    dead = subprocess.Popen(["true"])
    dead.wait()
    pid_file.write_text(f"{dead.pid}\n")
    assert ask(question, env=env) == [hq.ExecState("exited")]
    no_docker = standin_docker(tmp_path, "exit 127\n")
    assert ask(question, env=no_docker) == [hq.ExecState("exited")]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("running 1769860740", hq.ExecState("running", 1769860740)),
     ("running", hq.ExecState("running")), ("starting", hq.ExecState("starting")),
     ("exited", hq.ExecState("exited")), ("", hq.ExecState("exited"))],
)  # fmt: skip
def test_liveness_answers_are_read(answer: str, expected: hq.ExecState) -> None:
    question = hq.ExecQuestion("c", "/run/k2-x.pid")
    assert question.read(hq.Answer((answer,) if answer else (), (), 0)) == expected


def test_a_command_gate_answers_its_exit_status_within_its_timeout(tmp_path: Path) -> None:
    env = standin_docker(tmp_path, 'shift 2; exec "$@"\n')
    passed, failed, slow = ask(
        hq.CommandQuestion("c", ("true",)),
        hq.CommandQuestion("c", ("sh", "-c", "exit 3")),
        hq.CommandQuestion("c", ("sleep", "5"), timeout_s=0.2),
        env=env,
    )
    assert passed == hq.GateAnswer(0)
    assert failed == hq.GateAnswer(3)
    assert slow == hq.GateAnswer(124)
    # A gate's own command bounds itself (vLLM's Ray check takes up to a minute): the launch
    # gate and the look wait for it; status, which must answer in time, bounds it.
    assert hq.CommandQuestion("c", ("ray", "status")).command() == "docker exec c ray status"
    assert hq.CommandQuestion("c", ("true",), 5).command() == "timeout 5 docker exec c true"


def test_a_log_keeps_lines_that_look_like_markers_and_its_readers_exit_status(
    tmp_path: Path,
) -> None:
    env = standin_docker(
        tmp_path,
        'case "$1" in logs) printf "%s\\n" "@@k2 end" "@@k2 rc 0" "|plain"; '
        'echo "on stderr" >&2; printf "no newline" ;;\n'
        '  exec) echo "tail: cannot open" >&2; exit 1 ;; esac\n',
    )
    container, execd = ask(
        hq.LogQuestion("k2-sglang", tail=5),
        hq.LogQuestion("k2-ray", "/run/k2-ray-head.log", 5),
        env=env,
    )
    assert container == hq.LogTail(
        ("@@k2 end", "@@k2 rc 0", "|plain", "on stderr", "no newline"), 0
    )
    assert execd == hq.LogTail(("tail: cannot open",), 1)


def test_log_commands_for_containers_and_exec_d_processes() -> None:
    assert hq.LogQuestion("k2-s", tail=5, since="10m").stream_command(False) == (
        "docker logs --tail 5 --since 10m k2-s"
    )
    assert hq.LogQuestion("k2-s").stream_command(True) == "docker logs --follow k2-s"
    execd = hq.LogQuestion("k2-s", "/run/k2-x.log", 5)
    assert execd.stream_command(False) == "docker exec k2-s tail -n 5 /run/k2-x.log"
    followed = execd.stream_command(True)
    assert followed.startswith("docker exec -i k2-s sh -c ")
    assert "tail -n 5 -F" in followed
    assert "kill $t" in followed
    assert execd.source == "/run/k2-x.log in container k2-s"


# ---------------------------------------------------------------- files, the clock, tools, GPUs


def test_a_files_digest_and_mode(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    found, missing, directory = ask(
        hq.FileQuestion(str(script)),
        hq.FileQuestion(str(tmp_path / "absent")),
        hq.FileQuestion(str(tmp_path)),
    )
    import hashlib

    assert found == hq.FileDigest(hashlib.sha256(b"#!/bin/sh\n").hexdigest(), "0755")
    assert missing is None
    assert directory is None


def test_the_clock_and_a_missing_tool() -> None:
    clock, absent, present = ask(
        hq.ClockQuestion(),
        hq.ToolQuestion(("k2-no-such-tool", "-q")),
        hq.ToolQuestion(("echo", "a b")),
    )
    assert isinstance(clock, hq.Clock)
    assert clock.now is not None
    assert abs(clock.now - time.time()) < 60
    assert absent == hq.ToolOutput(False)
    assert present == hq.ToolOutput(True, "a b")


def test_gpu_memory_is_read_per_gpu() -> None:
    question = hq.GpuMemoryQuestion()
    csv = ("0, 70000, 143771", "1, 69000, 143771", "garbage")
    assert question.read(hq.Answer(csv, (), 0)) == hq.GpuMemories(
        True, (hq.GpuMemory(0, 70000, 143771), hq.GpuMemory(1, 69000, 143771))
    )
    assert question.read(hq.Answer((), (), 127)) == hq.GpuMemories(False)


def test_a_tool_reads_a_real_captured_answer() -> None:
    smi = (FIXTURES / "hardware" / "h200-x1" / "nvidia-smi-q-x.xml").read_text()
    answer = hq.Answer(tuple(smi.splitlines()), (), 0)
    read = hq.ToolQuestion(("nvidia-smi", "-q", "-x")).read(answer)
    assert read.present
    assert read.text == "\n".join(smi.splitlines())


# ---------------------------------------------------------------- the batch


def test_a_batch_is_one_script_its_answer_cut_short_reads_as_such() -> None:
    batch = hq.Batch()
    clock = batch.add("clock", hq.ClockQuestion())
    script = batch.script()
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    whole = hq.render_answer("clock", hq.Answer(("1769860800",), (), 0)) + hq.END
    assert batch.read(whole).complete
    assert batch.read(whole)[clock] == hq.Clock(1769860800)
    cut = batch.read(whole.removesuffix(hq.END))
    assert not cut.complete
    assert batch.read("")[clock] == hq.Clock(None)
    with pytest.raises(ValueError, match="unique one-line key"):
        batch.add("clock", hq.ClockQuestion())


def test_questions_travel_to_the_look_module_and_records_back_as_json() -> None:
    for question in (
        hq.ContainerQuestion("k2-s", LABEL_HASH),
        hq.ExecQuestion("k2-s", "/run/k2-x.pid"),
        hq.HttpQuestion("https://10.0.0.1:30000/health", "/etc/k2provision/tls/ca.pem"),
        hq.CommandQuestion("k2-s", ("ray", "status")),
        hq.FileQuestion("/etc/x"),
    ):
        data = json.loads(json.dumps(hq.question_json(question)))
        assert hq.question_from_json(data) == question
    state = hq.ContainerState(True, True, "running", 0, "t", 1, "abc")
    back = json.loads(json.dumps(hq.record_json(state)))
    assert hq.record_from_json(hq.ContainerState, back) == state
    assert hq.record_from_json(hq.FileDigest, None) is None
    assert set(hq.QUESTIONS) == {
        "container", "exec", "http", "command", "log", "file", "clock", "tool", "http_body",
        "haproxy", "gpu_memory",
    }  # fmt: skip


def test_the_roles_ask_through_the_registry_and_read_its_records() -> None:
    """The launch role without a look (a restart, --full), k2_stop and the monitoring
    containers ask k2.cluster.host_ask the registry's questions; the filters read the records."""
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    host = plan.hosts[0]
    plain = plan.model_dump(mode="json")
    procs = [p.model_dump(mode="json") for p in host.processes]
    containers = [p for p in procs if not p["exec_in"]]
    execs = [p for p in procs if p["exec_in"]]
    asked = k2_filters.state_questions(procs)
    assert set(asked) == {f"state {p['name']}" for p in procs}
    assert all(hq.question_from_json(q) for q in asked.values())
    current = {
        f"state {p['name']}": hq.record_json(
            hq.ContainerState(
                True, True, "running", spec_hash=k2_filters.docker_spec_hash(p, plain, host.name)
            )
        )
        for p in containers
    }
    assert k2_filters.stale_containers(containers, current, plain, host.name) == []
    first = containers[0]
    stopped = {**current, f"state {first['name']}": {**current[f"state {first['name']}"],
                                                   "running": False}}  # fmt: skip
    assert k2_filters.stale_containers(containers, stopped, plain, host.name) == [first]
    assert k2_filters.stale_containers(containers, {}, plain, host.name) == containers
    restarted = k2_filters.stale_containers(
        containers, current, plain, host.name, [first["container"]]
    )
    assert restarted == [first]
    running = {f"state {p['name']}": hq.record_json(hq.ExecState("running", 1)) for p in execs}
    assert execs
    assert k2_filters.stopped_processes(execs, running) == []
    assert k2_filters.stopped_processes(execs, {}) == execs
    found = k2_filters.container_questions(["k2-a", "k2-b"])
    assert hq.question_from_json(found["container k2-a"]) == hq.ContainerQuestion(
        "k2-a", LABEL_HASH
    )
    answers = {
        "container k2-a": hq.record_json(hq.ContainerState(True, True, "running", image="img:1")),
        "container k2-b": hq.record_json(hq.ContainerState(False)),
    }
    assert k2_filters.found_containers(answers) == [
        {"name": "k2-a", "image": "img:1", "running": True}
    ]
    for role in ("k2_launch/tasks/stage.yml", "k2_stop/tasks/main.yml",
                 "k2_monitoring/tasks/main.yml"):  # fmt: skip
        assert "k2.cluster.host_ask:" in (ROOT / "roles" / role).read_text(), role


def test_an_http_body_is_read_on_the_host_with_the_key_from_its_file(tmp_path: Path) -> None:
    """HttpBodyQuestion, asked here (the code a host runs): the body of a GET, the bearer key
    read from its file on the host; no answer said so."""

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = b'{"workers": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = tmp_path / "api_key"
        key.write_text("sk-test\n")
        url = f"http://127.0.0.1:{server.server_port}/workers"
        batch = hq.Batch()
        keyed = batch.add("keyed", hq.HttpBodyQuestion(url, str(key)))
        plain = batch.add("plain", hq.HttpBodyQuestion(url, str(tmp_path / "none")))
        closed = batch.add("closed", hq.HttpBodyQuestion("http://127.0.0.1:9/workers"))
        answers = hq.ask_here(batch)
    finally:
        server.shutdown()
    assert answers[keyed] == hq.ToolOutput(True, '{"workers": []}')
    assert answers[plain].text == '{"workers": []}'
    assert seen == ["Bearer sk-test", ""]
    assert answers[closed].text.startswith("no answer")


STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,hrsp_5xx\n"
    "k2_routers,lab1,0,0,2,5,,60,UP,3\n"
    "k2_routers,lab2,0,0,0,4,,61,DRAIN,0\n"
    "k2_routers,BACKEND,0,0,2,9,410,121,UP,3\n"
    "other,lab1,0,0,7,9,,1,DOWN,\n"
)


def test_the_haproxy_question_asks_the_runtime_api_on_its_socket(tmp_path: Path) -> None:
    """Over a real UNIX socket: the request as HAProxy's runtime API reads it (one line), the
    reply until HAProxy closes; the batch's script and the controller's function alike. The
    other end is this test's, replying as HAProxy 2.6 does (the CSV of `show stat`)."""
    path = str(tmp_path / "admin.sock")
    heard: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def reply() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                heard.append(conn.recv(4096))
                conn.sendall(STAT.encode())

    threading.Thread(target=reply, daemon=True).start()
    try:
        (asked,) = ask(hq.HaproxyQuestion(path))
        direct = hq.haproxy_ask(path, "show stat")
    finally:
        listener.close()
    assert heard == [b"show stat\n", b"show stat\n"]
    assert isinstance(asked, hq.ToolOutput)
    assert asked.text == STAT.rstrip("\n")
    assert direct == STAT
    assert hq.haproxy_servers(asked.text, "k2_routers") == {
        "lab1": hq.BackendServer("lab1", "UP", 2, requests=60, errors=3),
        "lab2": hq.BackendServer("lab2", "DRAIN", 0, requests=61, errors=0),
    }
    (gone,) = ask(hq.HaproxyQuestion(str(tmp_path / "none.sock")))
    assert isinstance(gone, hq.ToolOutput)
    assert gone.text.startswith("no answer")
    assert hq.haproxy_servers(gone.text, "k2_routers") == {}
