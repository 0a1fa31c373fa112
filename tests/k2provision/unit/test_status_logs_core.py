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
from k2provision.core.inventory import load_cluster
from k2provision.core.records import HostPlan, Plan
from k2provision.errors import K2Error
from k2provision.ops.host_probe import MARK, log_command, parse_sections
from k2provision.ops.log_sources import select_sources, since_problem
from k2provision.ops.remote import SshTarget, host_key_policy, run_one, ssh_inventory, ssh_target
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


def test_ssh_target_reads_the_lab_inventory_settings() -> None:
    target = ssh_target(
        "lab1",
        {
            "ansible_host": "10.81.0.11",
            "ansible_port": 2222,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": "/lab/id_ed25519",
            "ansible_ssh_common_args": LAB_ARGS,
            "ansible_ssh_extra_args": "-o ConnectTimeout=3 -o ProxyJump=bastion",
        },
    )
    assert (target.host, target.port, target.user) == ("10.81.0.11", 2222, "root")
    assert target.key_files == ("/lab/id_ed25519",)
    assert target.known_hosts == ("/lab/known_hosts",)
    assert target.strict == "yes"
    assert target.identities_only
    assert target.connect_timeout == 3.0
    assert target.ignored == ("proxyjump",)


def test_ssh_target_defaults_follow_ansible() -> None:
    target = ssh_target("gpu-p01", {})
    assert (target.host, target.port, target.user, target.strict) == ("gpu-p01", 22, None, "ask")
    assert ssh_target("h", {}, host_key_checking=False).strict == "no"
    aliased = ssh_target("h", {"ansible_ssh_host": "h.example", "ansible_ssh_port": "2200"})
    assert (aliased.host, aliased.port) == ("h.example", 2200)


def test_ssh_inventory_reads_groups_and_connection_vars_through_ansible(tmp_path: Path) -> None:
    inventory = tmp_path / "pd.ini"
    inventory.write_text(
        "[prefill]\nlab1 ansible_host=10.81.0.11 ansible_port=22\n"
        "[decode]\nlab2 ansible_host=10.81.0.12\n"
        "[all:vars]\nansible_user=root\nansible_ssh_private_key_file=/k/id\n"
        f"ansible_ssh_common_args='{LAB_ARGS}'\n"
    )
    groups, targets = ssh_inventory(inventory)
    assert groups["decode"] == ["lab2"]
    assert targets["lab2"].host == "10.81.0.12"
    assert targets["lab1"].known_hosts == ("/lab/known_hosts",)
    assert targets["lab1"].key_files == ("/k/id",)


def test_an_unreachable_host_is_a_result_not_a_traceback() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reply = run_one(SshTarget("down", "127.0.0.1", port=port, connect_timeout=3), "true", 5)
    assert not reply.reached
    assert reply.unreachable  # the reason, e.g. connection refused


# ---------------------------------------------------------------- the probe


def test_probe_script_is_valid_shell_with_a_section_per_part(prod: Plan) -> None:
    host = prod.hosts[0]  # prefill rank 0 and the router
    script = probe_script(host)
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    for process in host.processes:
        assert f"{MARK} inspect {process.name}" in script
        assert f"{MARK} log {process.name}" in script
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


def answer(host: HostPlan, plan: Plan, *, label: str | None = None, gate: str = "200") -> str:
    """What a host running `host`'s processes answers (2026-01-31T12:00:00Z)."""
    parts = [f"{MARK} now 1769860800", f"{MARK} no-gpus"]
    for p in host.processes:
        hash_ = label if label is not None else spec_hash(plan.container, p, host.files)
        parts += [f"{MARK} inspect {p.name}", inspect_json(hash_, restarts=2), f"{MARK} rc 0"]
        if p.health is not None:
            parts += [f"{MARK} gate {p.name}", gate, f"{MARK} rc 0"]
        parts += [
            f"{MARK} log {p.name}",
            "|\x1b[31mERROR\x1b[0m cannot reach peer",
            "|serving",
            f"{MARK} rc 0",
        ]
    return "\n".join([*parts, f"{MARK} end"]) + "\n"


def test_a_converged_host_is_current_running_and_healthy(prod: Plan) -> None:
    host = prod.hosts[0]
    status = host_status(prod, host, answer(host, prod))
    assert status.problems == []
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
    gone = answer(host, prod).replace(
        f"{MARK} rc 0", f"{MARK} rc 1", 1
    )  # the first inspect fails: no such container
    missing = host_status(prod, host, gone)
    name = host.processes[0].container
    assert f"{host.name}: {host.processes[0].name} ({name}): container is missing" in (
        missing.problems
    )
    cut = host_status(prod, host, answer(host, prod).replace(f"{MARK} end", ""))
    assert cut.unreachable


def test_gpu_memory_is_read_per_gpu(prod: Plan) -> None:
    host = prod.hosts[1]
    text = answer(host, prod).replace(
        f"{MARK} no-gpus", f"{MARK} gpus\n0, 70000, 143771\n1, 69000, 143771"
    )
    gpus = host_status(prod, host, text).gpus
    assert gpus is not None
    assert [(g.index, g.used_mib) for g in gpus] == [(0, 70000), (1, 69000)]


def test_sections_keep_log_lines_that_look_like_markers() -> None:
    sections = parse_sections(f"{MARK} log x\n|{MARK} end\n|plain\n{MARK} rc 3\n")
    assert sections[("log", "x")].text == [f"{MARK} end", "plain"]
    assert sections[("log", "x")].rc == 3
    assert ("end", "") not in sections


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


def test_log_commands_for_containers_and_exec_d_processes() -> None:
    plan = build_plan(load_cluster(ROOT / "inventory" / "examples" / "trtllm-tp-ep.ini"))
    serve = next(p for h in plan.hosts for p in h.processes if p.exec_in)
    sshd = next(p for h in plan.hosts for p in h.processes if not p.exec_in)
    assert log_command(sshd, 5, "10m") == f"docker logs --tail 5 --since 10m {sshd.container}"
    assert log_command(sshd, None, None, True) == f"docker logs --follow {sshd.container}"
    assert log_command(serve, 5) == (
        f"docker exec {serve.container} tail -n 5 /run/k2-{serve.name}.log"
    )
    followed = log_command(serve, 5, None, True)
    assert followed.startswith(f"docker exec -i {serve.container} sh -c ")
    assert "tail -n 5 -F" in followed
    assert "kill $t" in followed


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


def test_unknown_host_keys_are_refused_unless_the_inventory_says_otherwise() -> None:
    import paramiko

    assert isinstance(host_key_policy("yes"), paramiko.RejectPolicy)
    assert isinstance(host_key_policy("ask"), paramiko.RejectPolicy)
    lenient = host_key_policy("accept-new")
    assert not isinstance(lenient, paramiko.RejectPolicy | paramiko.AutoAddPolicy)
    client = paramiko.SSHClient()
    lenient.missing_host_key(client, "h", None)
    assert len(client.get_host_keys()) == 0  # trusted once, never recorded


def test_status_runs_the_gpu_health_checks_now(prod: Plan) -> None:
    host = prod.host("gpu-d01")
    script = probe_script(host)
    assert f"{MARK} xids" in script
    assert f"{MARK} smi-xml" in script
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    kernel_log = (fixtures / "gpu_health" / "kernel-log-xid.txt").read_text()
    smi = (fixtures / "hardware" / "h200-x1" / "nvidia-smi-q-x.xml").read_text()
    failing = smi.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<", 1)
    healthy = answer(host, prod).replace(
        f"{MARK} end", f"{MARK} xids\n{MARK} smi-xml\n{smi}\n{MARK} end"
    )
    assert host_status(prod, host, healthy).gpu_health == ()
    sick = answer(host, prod).replace(
        f"{MARK} end", f"{MARK} xids\n{kernel_log}{MARK} smi-xml\n{failing}\n{MARK} end"
    )
    status = host_status(prod, host, sick)
    assert len(status.gpu_health) == 2
    assert status.gpu_health[0].startswith("XID 79 on GPU 0000:bb:00")
    assert "a row remap failed" in status.gpu_health[1]
    assert status.problems[:2] == list(status.gpu_health)
    assert status.as_json()["gpu_health"] == list(status.gpu_health)
