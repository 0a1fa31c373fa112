"""The pure parts of `status` and `logs`: SSH parameters from the inventory, the probe script
and its judgement, log sources and commands. The lab test (tests/k2provision/integration/
test_day_two.py) runs the same code against real hosts."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from k2provision.commands.status import watch_args
from k2provision.core.records import HostPlan, Plan
from k2provision.errors import K2Error
from k2provision.ops.connect import (
    SshTarget,
    failure_reason,
    resolved_options,
    ssh_command,
    ssh_target,
)
from k2provision.ops.log_sources import select_sources, since_problem
from k2provision.ops.remote import run_one, ssh_inventory
from k2provision.ops.status_probe import (
    host_status,
    human_duration,
    last_error_line,
    model_ids,
    parse_time,
    probe_script,
    readiness_detail,
    router_workers,
)
from k2provision.plan.assemble import build_plan
from k2provision.plan.containers import LABEL_HASH, spec_hash
from k2provision.plan.host_questions import hq
from k2provision.plan.inventory import load_cluster
from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]
LAB_ARGS = (
    "-o UserKnownHostsFile=/lab/known_hosts -o GlobalKnownHostsFile=/dev/null "
    "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
)


@pytest.fixture(scope="module")
def prod() -> Plan:
    return build_plan(load_cluster(ROOT / "inventory" / "prod.ini"))


# ---------------------------------------------------------------- SSH parameters


def lab_target(**extra: object) -> SshTarget:
    return ssh_target(
        "lab1",
        {
            "ansible_host": "10.81.0.11",
            "ansible_port": 2222,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": "/lab/id_ed25519",
            "ansible_ssh_common_args": LAB_ARGS,
            "ansible_ssh_extra_args": "-o ProxyJump=root@bastion:22",
            "k2_unrelated": "dropped",
            **extra,
        },
    )


def option_values(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-o"]


def test_ssh_command_is_the_one_ansible_builds_for_the_host() -> None:
    argv = ssh_command(lab_target(), "uptime")
    options = option_values(argv)
    assert argv[0] == "ssh"
    assert argv[-2:] == ["10.81.0.11", "uptime"]
    for expected in (
        "Port=2222",
        'User="root"',
        'IdentityFile="/lab/id_ed25519"',
        "UserKnownHostsFile=/lab/known_hosts",
        "StrictHostKeyChecking=yes",
        "ProxyJump=root@bastion:22",
        "ControlMaster=auto",  # ansible.cfg's ssh_args
        "ConnectTimeout=20",  # ansible.cfg's timeout
    ):
        assert expected in options, (expected, argv)
    # Ansible's order: its own settings before the inventory's arguments (ssh takes the first).
    assert options.index("Port=2222") < options.index("ProxyJump=root@bastion:22")
    assert "-tt" not in argv
    assert ssh_command(lab_target(), "tail -f x", tty=True)[-3] == "-tt"


def control_path(argv: list[str]) -> str:
    (path,) = [o.split("=", 1)[1] for o in option_values(argv) if o.startswith("ControlPath=")]
    return path


def test_hosts_of_one_name_in_two_clusters_never_share_a_control_master() -> None:
    """Two inventories' `lab1` at different addresses: their commands must not ride one SSH
    master (a status of one cluster would read the other's containers), as a playbook keys the
    socket by address, port and user."""
    here = control_path(ssh_command(lab_target(), "true"))
    there = control_path(ssh_command(lab_target(ansible_host="10.82.0.11"), "true"))
    other_port = control_path(ssh_command(lab_target(ansible_port=2200), "true"))
    assert len({here, there, other_port}) == 3
    assert control_path(ssh_command(lab_target(), "uptime")) == here


def test_ssh_command_follows_ansibles_defaults_and_host_key_setting() -> None:
    argv = ssh_command(ssh_target("gpu-p01", {}), "true")
    assert argv[-2:] == ["gpu-p01", "true"]
    assert not any(o.startswith(("Port=", "User=")) for o in option_values(argv))
    assert "StrictHostKeyChecking=no" not in option_values(argv)
    relaxed = ssh_target("h", {"ansible_ssh_host": "h.example", "ansible_host_key_checking": False})
    argv = ssh_command(relaxed, "true")
    assert "StrictHostKeyChecking=no" in option_values(argv)
    assert argv[-2] == "h.example"


def test_ssh_inventory_reads_groups_and_connection_vars_through_ansible(tmp_path: Path) -> None:
    inventory = tmp_path / "pd.ini"
    inventory.write_text(
        "[prefill]\nlab1 ansible_host=10.81.0.11 ansible_port=22\n"
        "[decode]\nlab2 ansible_host=10.81.0.12\n"
        "[all:vars]\nansible_user=root\nansible_ssh_private_key_file=/k/id\n"
        f"ansible_ssh_common_args='{LAB_ARGS} -o ProxyJump=jump'\n"
    )
    groups, targets = ssh_inventory(inventory)
    assert groups["decode"] == ["lab2"]
    assert targets["lab2"].host == "10.81.0.12"
    options = option_values(ssh_command(targets["lab1"], "true"))
    assert "UserKnownHostsFile=/lab/known_hosts" in options
    assert "ProxyJump=jump" in options
    assert 'IdentityFile="/k/id"' in options


def closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_host_is_a_result_naming_its_address_and_port() -> None:
    port = closed_port()
    target = ssh_target("down", {"ansible_host": "127.0.0.1", "ansible_port": port})
    reply = run_one(target, "true", 15)
    assert not reply.reached
    assert f"ansible_host=127.0.0.1 ansible_port={port}: Connection refused" in reply.unreachable


def test_an_unreachable_jump_host_is_named_as_the_proxyjump_that_failed() -> None:
    port = closed_port()
    target = ssh_target(
        "behind",
        {"ansible_host": "10.255.0.9", "ansible_ssh_common_args": f"-o ProxyJump=127.0.0.1:{port}"},
    )
    reply = run_one(target, "true", 15)
    # ssh -G writes the jump host as [127.0.0.1]:port
    expected = f"ProxyJump=[127.0.0.1]:{port}: cannot connect to 127.0.0.1 port {port}: "
    assert reply.unreachable.startswith(expected + "Connection refused"), reply


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        (
            "No ED25519 host key is known for [10.81.0.11]:2222 and you have requested strict "
            "checking.\r\nHost key verification failed.\r\n",
            "host key verification failed (No ED25519 host key is known for [10.81.0.11]:2222 "
            "and you have requested strict checking.) with UserKnownHostsFile=/lab/known_hosts",
        ),
        (
            "root@10.81.0.11: Permission denied (publickey).\r\n",
            "authentication refused for User=root (IdentityFile=/lab/id_ed25519) via "
            "ProxyJump=root@bastion:22",
        ),
        (
            "channel 0: open failed: connect failed: Connection refused\r\n"
            "stdio forwarding failed\r\nConnection closed by UNKNOWN port 65535\r\n",
            "ProxyJump=root@bastion:22 was reached, but it cannot reach ansible_host=10.81.0.11 "
            "ansible_port=2222: channel 0: open failed",
        ),
        (
            "ssh: connect to host bastion port 22: No route to host\r\n",
            "ProxyJump=root@bastion:22: cannot connect to bastion port 22: No route to host",
        ),
    ],
)
def test_failure_reasons_name_the_setting_that_failed(stderr: str, says: str) -> None:
    options = {
        "hostname": "10.81.0.11",
        "port": "2222",
        "user": "root",
        "identityfile": "/lab/id_ed25519",
        "userknownhostsfile": "/lab/known_hosts",
        "stricthostkeychecking": "true",
        "proxyjump": "root@bastion:22",
    }
    assert says in failure_reason(lab_target(), stderr, options)


def test_ssh_resolves_the_options_it_is_given() -> None:
    options = resolved_options(ssh_command(lab_target()))
    assert options["proxyjump"] == "root@bastion:22"
    assert options["hostname"] == "10.81.0.11"
    assert options["port"] == "2222"


# ---------------------------------------------------------------- the probe


def test_probe_script_is_valid_shell_with_a_question_per_part(prod: Plan) -> None:
    host = prod.hosts[0]  # prefill rank 0 and the router
    script = probe_script(prod, host)
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    for process in host.processes:
        assert f"{hq.MARK} q state {process.name}" in script
        assert f"{hq.MARK} q log {process.name}" in script
    assert "nvidia-smi --query-gpu=index,memory.used,memory.total" in script


def inspect_json(hash_: str, *, running: bool = True, restarts: int = 0) -> str:
    return json.dumps(
        [
            {
                "State": {
                    "Status": "running" if running else "exited",
                    "Running": running,
                    "StartedAt": "2026-01-31T11:59:00.123456789Z",
                },
                "RestartCount": restarts,
                "Config": {"Labels": {LABEL_HASH: hash_}},
            }
        ]
    )


def part(key: str, *out: str, rc: int = 0, err: tuple[str, ...] = ()) -> str:
    return hq.render_answer(key, hq.Answer(out, err, rc))


def answer(
    host: HostPlan,
    plan: Plan,
    *,
    label: str | None = None,
    gate: str = "200",
    extra: str = "",
    gone: str = "",
) -> str:
    """What a host running `host`'s processes answers (2026-01-31T12:00:00Z); `extra`: more
    answers; `gone`: a process whose container is missing."""
    parts = [part("clock", "1769860800"), part("gpus", rc=127), extra]
    for p in host.processes:
        hash_ = label if label is not None else spec_hash(plan.container, p, host.files)
        if p.name == gone:
            parts.append(part(f"state {p.name}", rc=1, err=("Error: No such container: x",)))
        elif p.exec_in:
            parts.append(part(f"state {p.name}", "running 1769860740"))
        else:
            parts.append(part(f"state {p.name}", inspect_json(hash_, restarts=2)))
        if p.health is not None:
            parts.append(part(f"gate {p.name}", gate))
        parts.append(part(f"log {p.name}", "\x1b[31mERROR\x1b[0m cannot reach peer", "serving"))
    return "".join(parts) + hq.END


def test_a_converged_host_is_current_running_and_healthy(prod: Plan) -> None:
    host = prod.hosts[0]
    status = host_status(prod, host, answer(host, prod))
    assert not [p for p in status.problems if "missing" in p or "inspect" in p], status.problems
    assert status.gpus is None  # no nvidia-smi: said so, not an error
    first = status.processes[0]
    assert (first.state, first.spec, first.gate, first.restarts) == ("running", "current", "ok", 2)
    assert first.uptime_s == 60
    assert first.last_error == "ERROR cannot reach peer"


def test_drift_a_failing_gate_and_a_missing_container_are_named(prod: Plan) -> None:
    host = prod.hosts[0]
    drifted = host_status(prod, host, answer(host, prod, label="0123456789abcdef"))
    assert all(p.spec == "drift" for p in drifted.processes)
    assert any("drift: container runs spec 0123456789abcdef" in p for p in drifted.problems)
    failing = host_status(prod, host, answer(host, prod, gate="503"))
    assert any("health gate failing" in p and "503" in p for p in failing.problems)
    first = host.processes[0]
    missing = host_status(prod, host, answer(host, prod, gone=first.name))
    assert f"{host.name}: {first.name} ({first.container}): container is missing" in (
        missing.problems
    )
    cut = host_status(prod, host, answer(host, prod).removesuffix(hq.END))
    assert cut.unreachable


def test_an_execd_process_reads_as_running_with_its_uptime_or_not_running() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    host = plan.hosts[0]
    execd = next(p for p in host.processes if p.exec_in)

    def status_of(alive: str) -> tuple[str, int | None]:
        text = answer(host, plan).replace(
            part(f"state {execd.name}", "running 1769860740"), part(f"state {execd.name}", alive)
        )
        found = host_status(plan, host, text)
        proc = next(p for p in found.processes if p.process == execd.name)
        return proc.state, proc.uptime_s

    assert status_of("running 1769860740") == ("running", 60)
    assert status_of("starting") == ("not running", None)
    assert status_of("exited") == ("not running", None)


def test_the_runtimes_error_is_kept_and_a_missing_container_named(prod: Plan) -> None:
    host = prod.hosts[0]
    process = host.processes[0]
    busy = "Error: acquiring lock 3 for container: resource busy"
    failed = host_status(
        prod,
        host,
        answer(host, prod).replace(
            part(
                f"state {process.name}",
                inspect_json(spec_hash(prod.container, process, host.files), restarts=2),
            ),
            part(f"state {process.name}", rc=125, err=("WARN[0000] cgroup v1", busy)),
        ),
    )
    where = f"{host.name}: {process.name} ({process.container})"
    assert failed.processes[0].state == "unknown"
    assert f"{where}: docker container inspect failed: WARN[0000] cgroup v1 {busy}" in (
        failed.problems
    )
    assert not any("missing" in p for p in failed.problems)


def test_gpu_memory_is_read_per_gpu(prod: Plan) -> None:
    host = prod.hosts[1]
    text = answer(host, prod).replace(
        part("gpus", rc=127), part("gpus", "0, 70000, 143771", "1, 69000, 143771")
    )
    gpus = host_status(prod, host, text).gpus
    assert gpus is not None
    assert [(g.index, g.used_mib) for g in gpus] == [(0, 70000), (1, 69000)]


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-01-31T12:00:00Z", 1769860800),
        ("2026-01-31T12:00:00.123456789Z", 1769860800.123456),
        ("2026-01-31T13:00:00.5+01:00", 1769860800.5),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
    ],
)
def test_start_times_of_docker_and_podman(text: str, epoch: float | None) -> None:
    got = parse_time(text)
    assert got == (None if epoch is None else pytest.approx(epoch))


def test_small_readers() -> None:
    assert human_duration(72) == "1m12s"
    assert human_duration(90061) == "1d1h"
    assert human_duration(None) == "-"
    assert last_error_line(["ok", "all good"]) == ""
    assert model_ids({"data": [{"id": "kimi-k2"}]}) == ("kimi-k2",)
    assert model_ids("nope") == ()
    workers = router_workers(
        {"workers": [{"url": "http://a:30000", "worker_type": "decode", "is_healthy": True}]}
    )
    assert [(w.url, w.kind, w.healthy) for w in workers] == [("http://a:30000", "decode", True)]
    body = {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    assert readiness_detail(200, body) == "ready (2/2 workers healthy)"
    assert readiness_detail(None, None) == "no answer"


# ---------------------------------------------------------------- logs


def test_targets_select_hosts_pools_the_router_processes_and_groups(prod: Plan) -> None:
    groups = {"rack1": ["gpu-p02", "gpu-d01"]}
    labels = lambda t: [s.label for s in select_sources(prod, groups, t)]  # noqa: E731
    assert labels("gpu-p01") == ["gpu-p01/sglang-prefill", "gpu-p01/sglang-router"]
    assert labels("router") == ["gpu-p01/sglang-router"]
    assert len(labels("prefill")) == 4
    assert all("prefill" in x for x in labels("prefill"))
    assert len(labels("decode")) == 12
    assert labels("rack1") == ["gpu-p02/sglang-prefill", "gpu-d01/sglang-decode"]
    assert len(labels(None)) == 17
    with pytest.raises(K2Error, match="TARGET nosuch: not a host, group, pool or process"):
        select_sources(prod, groups, "nosuch")


@pytest.mark.parametrize(
    "good", ["10m", "1h30m", "2026-01-31", "2026-01-31T12:00:00Z", "1769860800"]
)
def test_since_accepts_what_docker_does(good: str) -> None:
    assert since_problem(good) == ""


def test_since_refuses_words() -> None:
    assert "expected a duration" in since_problem("yesterday")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("status", "nowhere.ini"), "no such inventory"),
        (("status", "inventory/prod.ini", "--watch", "0"), "--watch 0: expected a positive"),
        (("logs", "inventory/prod.ini", "--grep", "("), "--grep (: not a regular expression"),
        (("logs", "inventory/prod.ini", "--since", "soon"), "--since soon: expected a duration"),
        (("logs", "inventory/prod.ini", "gpu-x"), "TARGET gpu-x: not a host"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_host_is_asked(
    args: tuple[str, ...], says: str
) -> None:
    out = k2(*args)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert "Traceback" not in out.stderr


def test_watch_takes_an_optional_number_of_seconds() -> None:
    assert watch_args(["inv.ini", "--watch"]) == ["inv.ini", "--watch=5"]
    assert watch_args(["--watch", "inv.ini"]) == ["--watch=5", "inv.ini"]
    assert watch_args(["--watch", "2.5", "inv.ini"]) == ["--watch", "2.5", "inv.ini"]


def test_status_runs_the_gpu_health_checks_now(prod: Plan) -> None:
    host = prod.host("gpu-d01")
    script = probe_script(prod, host)
    assert f"{hq.MARK} q xids" in script
    assert f"{hq.MARK} q smi-xml" in script
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    kernel_log = (fixtures / "gpu_health" / "kernel-log-xid.txt").read_text()
    smi = (fixtures / "hardware" / "h200-x1" / "nvidia-smi-q-x.xml").read_text()
    failing = smi.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<", 1)
    healthy = answer(host, prod, extra=part("xids") + part("smi-xml", *smi.splitlines()))
    assert host_status(prod, host, healthy).gpu_health == ()
    sick = answer(
        host,
        prod,
        extra=part("xids", *kernel_log.splitlines()) + part("smi-xml", *failing.splitlines()),
    )
    status = host_status(prod, host, sick)
    assert len(status.gpu_health) == 2
    assert status.gpu_health[0].startswith("XID 79 on GPU 0000:bb:00")
    assert "a row remap failed" in status.gpu_health[1]
    assert status.problems[:2] == list(status.gpu_health)
    assert status.as_json()["gpu_health"] == list(status.gpu_health)


def test_status_shows_nvlinks_and_rdma_ports_now(prod: Plan) -> None:
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    down = (fixtures / "gpu_health" / "nvidia-smi-nvlink-s-hgx-h100-link-down.txt").read_text()
    ibstat = fixtures / "hardware" / "gpud-h100" / "ibstat.47.0.h100.some.down.with.polling.1"
    host = prod.host("gpu-d01").model_copy(update={"ib_devices": ("mlx5_0", "mlx5_5")})
    script = probe_script(prod, host)
    assert f"{hq.MARK} q nvlink" in script
    assert f"{hq.MARK} q ibstat" in script
    assert f"{hq.MARK} q ibstat" not in probe_script(
        prod, host.model_copy(update={"ib_devices": ()})
    )
    sick = answer(
        host,
        prod,
        extra=part("nvlink", *down.splitlines()) + part("ibstat", *ibstat.read_text().splitlines()),
    )
    status = host_status(prod, host, sick)
    assert status.gpu_health == ("GPU 3 NVLink 7 is down (nvidia-smi nvlink -s: <inactive>)",)
    (port,) = status.ib_ports
    assert port.startswith("RDMA device mlx5_5: port 1 Down, expected an Active port")
    assert status.problems[:2] == [*status.gpu_health, port]
    assert status.as_json()["ib_ports"] == [port]
