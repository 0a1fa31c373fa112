"""Data is printed as it is: no rich markup or emoji code is read from Ansible's output, host
names, addresses, values, error lines or paths. Through the real command where the data can
be put there (a real ansible-playbook run whose ssh fails with a chosen message), and through
the display functions for the rest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from k2provision.errors import K2Error
from k2provision.run import display
from k2provision.run.events import HostResult, Tally
from k2provision.weights import progress
from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]
FATAL = "fatal: [lab1]: UNREACHABLE"
TRICKY = f"{FATAL} [/etc/x] :100: [bold]x[/bold] [WARNING]"
EMOJI = "\N{HUNDRED POINTS SYMBOL}"


def assert_plain(out: subprocess.CompletedProcess[str]) -> None:
    for stream in (out.stdout, out.stderr):
        assert "Traceback" not in stream
        assert "MarkupError" not in stream
        assert EMOJI not in stream


def unreachable_cluster(tmp_path: Path) -> Path:
    """Two lab-profile hosts whose ssh fails, saying TRICKY (a ProxyCommand that says it)."""
    proxy = tmp_path / "proxy.sh"
    proxy.write_text(f"#!/bin/sh\necho '{TRICKY}' >&2\nexit 255\n")
    proxy.chmod(0o755)
    inventory = tmp_path / "inv.ini"
    inventory.write_text(
        "[nodes]\nh1 ansible_host=192.0.2.1\nh2 ansible_host=192.0.2.2\n[all:vars]\n"
        "k2_engine=sglang\nk2_layout=tp\nk2_lab=true\n"
        f"ansible_ssh_args=-o ControlMaster=no -o ProxyCommand={proxy}\n"
    )
    return inventory


def test_ansible_failures_print_exactly_as_ansible_said_them(tmp_path: Path) -> None:
    inventory = unreachable_cluster(tmp_path)
    out = k2("apply", str(inventory), "--tags", "preflight", cwd=tmp_path, COLUMNS="250",
             K2_RUNS_DIR=str(tmp_path / "runs"))  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    assert_plain(out)
    lines = [line for line in out.stdout.splitlines() if line.startswith("unreachable h")]
    assert len(lines) == 2, out.stdout
    assert all(line.endswith(f"Failed to connect to the host via ssh: {TRICKY}") for line in lines)
    assert "2 host(s) failed or unreachable" in out.stdout
    (record,) = (tmp_path / "runs").iterdir()
    summary = json.loads((record / "summary.json").read_text())
    assert TRICKY in summary["failures"]["h1"]


def test_ansible_s_own_error_output_prints_as_it_is(tmp_path: Path) -> None:
    inventory = unreachable_cluster(tmp_path)
    out = k2("apply", str(inventory), "--limit", "x[/etc/x]:100:", cwd=tmp_path, COLUMNS="250",
             K2_RUNS_DIR=str(tmp_path / "runs"))  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    assert_plain(out)
    assert "ansible-playbook stopped before any host result:" in out.stdout
    assert "[WARNING]: Could not match supplied host pattern, ignoring: x[/etc/x]" in out.stdout


def test_addresses_and_error_lines_print_as_they_are(tmp_path: Path) -> None:
    inventory = tmp_path / "v6.ini"
    inventory.write_text(
        "[nodes]\nh1 ansible_host=fd00:100::1\nh2 ansible_host=fd00:100::2\n"
        "[all:vars]\nk2_engine=sglang\nk2_layout=tp\n"
    )
    out = k2("plan", str(inventory), cwd=tmp_path, COLUMNS="250")
    assert out.returncode == 0, out.stderr
    assert_plain(out)
    assert "fd00:100::1" in out.stdout

    missing = tmp_path / "a[" / "etc" / "x]:100:.ini"
    out = k2("plan", str(missing), cwd=tmp_path, COLUMNS="250")
    assert out.returncode == 2
    assert_plain(out)
    assert str(missing) in out.stderr
    assert "[/etc/x]:100:" in out.stderr


def captured(renderable: object) -> str:
    with display.console.capture() as capture:
        display.console.print(renderable, soft_wrap=True)
    return capture.get()


def test_run_views_and_tables_print_data_as_it_is() -> None:
    event = HostResult(host="[/etc/x]", task=":100: [red]t", status="unreachable", message=FATAL)
    line = captured(display.failure_line(event))
    assert line.strip() == f"unreachable [/etc/x]: :100: [red]t: {FATAL}"
    tally = Tally()
    tally.add(event)
    table = captured(display.host_table(["[/etc/x]"], tally))
    assert "[/etc/x]" in table
    assert f":100: [red]t: {FATAL}"[:60] in table.replace("\n", "")
    assert EMOJI not in table

    view = display.RunView(["h1"])
    with display.console.capture() as capture:
        view.on_event(event)
    assert FATAL in capture.get()


def test_weights_views_print_data_as_it_is() -> None:
    record = {
        "manifest": {"model": "m[/x]", "revision": "r", "files": [{"name": "a", "size": 3}]},
        "hosts": [{"host": "[/etc/x]", "status": "[bold]", "message": TRICKY, "files": 1}],
    }
    text = captured(progress.results_table(record)).replace("\n", " ")
    assert "[/etc/x]" in text
    assert "[bold]" in text
    assert FATAL in text
    assert EMOJI not in text
    hosts = [progress.HostProgress(name="[/etc/x]", rx=1, total=2, status=":100:")]
    text = captured(progress.progress_view(hosts, task="[/etc/x] :100:"))
    assert text.count("[/etc/x]") == 2
    assert EMOJI not in text
    assert ":100:" in text


def test_errors_and_warnings_print_as_they_are() -> None:
    with display.err_console.capture() as capture:
        display.print_errors(K2Error([f"{FATAL} [/etc/x] :100:"]))
        display.print_warnings(["[/etc/x] :100:"])
    assert capture.get().splitlines() == [
        f"error: {FATAL} [/etc/x] :100:",
        "warning: [/etc/x] :100:",
    ]
