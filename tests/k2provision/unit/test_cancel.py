"""Stopping a command: exit codes, the stop state, what a run had started, a second signal that
ends at once, and one real playbook on localhost stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from k2provision.commands.flow import record_cancelled
from k2provision.run import cancel, runner
from k2provision.run.events import HostResult, TaskStarted
from tests.runners import newest_record, start

ROOT = Path(__file__).resolve().parents[3]


def test_exit_codes_are_the_shells() -> None:
    assert cancel.exit_code(signal.SIGINT) == 130
    assert cancel.exit_code(signal.SIGTERM) == 143
    assert cancel.exit_code(signal.SIGHUP) == 129
    assert cancel.Cancellation().exit_code() == 130
    assert cancel.signal_name(signal.SIGTERM) == "SIGTERM"


def test_the_first_signal_counts_and_the_grace_time_bounds_the_playbook() -> None:
    state = cancel.Cancellation(grace_s=10)
    assert not state.give_up(100.0)  # nothing asked yet
    assert state.request(signal.SIGTERM, 100.0)
    assert not state.request(signal.SIGINT, 101.0)  # a second signal does not replace the first
    assert state.exit_code() == 143
    assert state.give_up(100.0)  # no playbook group known: the runner kills it at once
    state.playbooks[4242] = "site.yml"
    assert not state.give_up(105.0)
    assert state.give_up(110.0)
    state.cleaning = True  # a cleanup playbook runs to its own end
    assert not state.give_up(200.0)


def test_leftovers_name_what_and_where() -> None:
    state = cancel.Cancellation(playbooks={77: "site.yml"}, running={"relays": "on h1, h2"})
    assert state.leftovers() == [
        "ansible-playbook (process group 77): site.yml",
        "relays: on h1, h2",
    ]


def test_what_a_run_started_on_the_hosts() -> None:
    started = cancel.Started()
    started.observe(HostResult(host="h1", task=cancel.RELAY_TASKS[0], status="ok"))
    assert not started.anything  # results do not start tasks; task starts do
    started.observe(TaskStarted(play="Launch", name=f"{cancel.STAGE_START} (stage 0)"))
    assert started.stage == "0"
    assert started.anything
    started.observe(TaskStarted(play="Launch", name=f"{cancel.STAGE_GATED} (stage 0)"))
    assert started.stage is None
    assert not started.anything
    started.observe(TaskStarted(play="Weights", name=f"{cancel.RELAY_TASKS[1]}, host to host"))
    assert started.relays


def test_the_task_names_it_watches_are_the_roles() -> None:
    distribute = (ROOT / "roles/k2_weights/tasks/distribute.yml").read_text()
    stage = (ROOT / "roles/k2_launch/tasks/stage.yml").read_text()
    for name in cancel.RELAY_TASKS:
        assert f"- name: {name}" in distribute
    assert f'- name: "{cancel.STAGE_START}' in stage
    assert f'- name: "{cancel.STAGE_GATED}' in stage


def test_a_signal_with_nothing_to_wait_for_interrupts() -> None:
    state = cancel.Cancellation()
    with cancel.stopping(state), pytest.raises(cancel.Interrupted) as stop:
        os.kill(os.getpid(), signal.SIGHUP)
    assert stop.value.signum == signal.SIGHUP
    assert state.signum == signal.SIGHUP


def test_a_signal_during_cleanup_is_noted_not_raised() -> None:
    state = cancel.Cancellation()
    with cancel.stopping(state), cancel.cleaning(state):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
    assert state.exit_code() == 143


SECOND_SIGNAL = """
import os, signal, subprocess, sys, time
from k2provision.run import cancel

stubborn = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(flush=True); "
     "time.sleep(60)"],
    start_new_session=True,
    stdout=subprocess.PIPE,
)
print(stubborn.pid, flush=True)
state = cancel.Cancellation()
stubborn.stdout.readline()  # it ignores SIGINT from here on, however loaded the machine
with cancel.stopping(state, on_abandon=lambda left: print("record:", left, flush=True)):
    with cancel.running_playbook(state):
        cancel.note_playbook(state, stubborn.pid, "site.yml")
        state.running["weights relays"] = "h1, h2"
        os.kill(os.getpid(), signal.SIGTERM)  # first: SIGINT to the group, which ignores it
        time.sleep(0.5)
        print("alive after the first:", stubborn.poll() is None, flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # second: ends at once
        time.sleep(600)  # (the caller's timeout is far shorter)
print("not reached", flush=True)
"""


def test_a_second_signal_ends_at_once_and_says_what_may_still_run() -> None:
    done = subprocess.run(  # a second signal that waited would leave it asleep past this
        [sys.executable, "-c", SECOND_SIGNAL], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 143  # the first signal's code
    lines = done.stdout.splitlines()
    assert "alive after the first: True" in lines
    assert "record: ['weights relays: h1, h2']" in lines
    assert "not reached" not in done.stdout
    assert "may still be running: weights relays: h1, h2" in done.stderr
    pid = int(lines[0])
    for _ in range(50):  # killed with its group (reaped by init once its parent is gone)
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()[:64]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {pid} of the playbook group still runs")


def test_the_record_says_cancelled_and_keeps_what_was_done(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"status": "canceled", "done": {"h1": {}}}))
    record_cancelled(tmp_path, "SIGTERM", {"relays": "stopped"})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {
        "status": "cancelled",
        "done": {"h1": {}},
        "cancelled": "SIGTERM",
        "ended": {"relays": "stopped"},
    }


def test_each_run_has_its_own_short_control_master_directory(tmp_path: Path) -> None:
    one = runner.control_dir(tmp_path / "a" / "20260101T000000Z-weights")
    two = runner.control_dir(tmp_path / "b" / "20260101T000000Z-weights")
    assert one != two
    assert one.parent == two.parent == runner.CONTROL_BASE
    assert len(str(one)) + 11 < 100  # Ansible's 10-character socket name fits a socket path
    env = runner.env_overrides({}, token_path=None, masters=one)
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"] == str(one)
    assert runner.end_masters(tmp_path / "none") == []


def test_a_master_forked_just_before_the_kill_is_ended_too(tmp_path: Path) -> None:
    """A process titled as an SSH master of the run's directory, with no socket there yet
    (its client forked it an instant before the playbook was killed), is ended, and so is a
    client still connecting (it would become a master later); another run's are left alone."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()

    def master(directory: Path) -> subprocess.Popen[bytes]:
        title = f"ssh: {directory}/0123456789 [mux]"
        return subprocess.Popen(["bash", "-c", f'exec -a "{title}" sleep 60'])

    def connecting(directory: Path) -> subprocess.Popen[bytes]:
        """An SSH client still connecting, in a session of its own as Ansible starts it."""
        argv = f"ssh -o ControlMaster=auto -o ControlPath={directory}/0123456789 h true"
        return subprocess.Popen(
            ["bash", "-c", f'exec -a "{argv}" sleep 60'], start_new_session=True
        )

    late, other = master(ours), master(theirs)
    client, their_client = connecting(ours), connecting(theirs)
    try:
        for proc in (late, other, client, their_client):  # each has its title, however loaded
            wait_for_title(proc.pid, "ssh")
        assert runner.end_masters(ours, settle_s=0.5) == []
        assert late.wait(timeout=5) == -signal.SIGTERM
        assert client.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
        assert their_client.poll() is None
        assert not ours.exists()
    finally:
        for proc in (late, other, client, their_client):
            proc.kill()
            proc.wait()


def wait_for_title(pid: int, start: str) -> None:
    deadline = time.monotonic() + 60
    while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(start.encode()):
        assert time.monotonic() < deadline, f"process {pid} never took its title"
        time.sleep(0.05)


SLEEPER = """\
- name: A long task
  hosts: all
  gather_facts: false
  tasks:
    - name: Sleep
      ansible.builtin.command:
        argv: [sh, -c, "sleep 300", "k2-cancel-test-{{ marker }}"]
"""


def test_sigterm_stops_a_real_playbook_and_its_processes(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "roles").mkdir()
    (project / "ansible.cfg").write_text("[defaults]\nstdout_callback = default\n")
    (project / "playbooks" / "sleep.yml").write_text(SLEEPER)
    inventory = tmp_path / "inv.ini"
    inventory.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    record = tmp_path / "record"
    record.mkdir()
    marker = str(os.getpid())
    state = cancel.Cancellation(grace_s=5)

    def sleeping() -> bool:
        found = subprocess.run(["pgrep", "-f", f"k2-cancel-test-{marker}"], capture_output=True)
        return found.returncode == 0

    def stop_when_sleeping() -> None:
        for _ in range(300):
            if sleeping():
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_sleeping, daemon=True).start()
    began = time.monotonic()
    with cancel.stopping(state):
        result = runner.run_playbook(
            runner.PlaybookRun(
                playbook="sleep.yml",
                inventory=inventory,
                record_dir=record,
                extravars={"marker": marker},
                project_dir=project,
            ),
            cancel=state,
        )
    assert time.monotonic() - began < 60
    assert result.cancelled == "SIGTERM"
    assert not result.ok
    assert result.status == "cancelled"
    summary = json.loads((record / "summary.json").read_text())
    assert summary["cancelled"] == "SIGTERM"
    assert state.playbooks == {}
    for _ in range(50):
        if not sleeping():
            break
        time.sleep(0.2)
    else:
        pytest.fail("the playbook's command still runs after the run was cancelled")
    assert not runner.control_dir(record).exists()


def test_the_cleanup_playbook_names_what_it_includes() -> None:
    playbook = (ROOT / "playbooks/cancelled.yml").read_text()
    assert "tasks_from: stop.yml" in playbook
    assert (ROOT / "roles/k2_weights/tasks/stop.yml").exists()
    assert "tasks_from: stop_stage.yml" in playbook
    assert "include_tasks: stop_stage.yml" in (ROOT / "roles/k2_launch/tasks/stage.yml").read_text()
    assert textwrap.dedent(playbook).startswith("---")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_bench_ends_its_client_and_what_the_client_started(tmp_path: Path) -> None:
    """SIGTERM to `bench` while its client runs: the client and its own child are ended, the
    record says cancelled, exit 143. The client here is a script that only starts a child and
    waits (the engines' real clients run against the lab's endpoint elsewhere)."""
    pids = tmp_path / "pids"
    client = tmp_path / "python"
    client.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -c ]; then exit 0; fi\n'  # the import check passes
        f"sleep 300 & echo $! >> {pids}\n"
        f"echo $$ >> {pids}\n"
        "wait\n"
    )
    client.chmod(0o755)
    runs = tmp_path / "runs"
    proc = start("bench", "inventory/prod.ini", "--tokenizer", "/tok", "--client", "controller",
                 "--client-python", str(client), runs=runs)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the client never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out
    assert "bench cancelled (SIGTERM)" in out
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in started):
        assert time.monotonic() < deadline, f"still running: {started}"
        time.sleep(0.1)
    summary = json.loads((newest_record(runs) / "summary.json").read_text())
    assert summary["status"] == "cancelled"
    assert summary["cancelled"] == "SIGTERM"
