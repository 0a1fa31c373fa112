"""The command line's conventions, through a real subprocess as a user meets them: --version,
--format as a fixed choice, flags shown as flags, exit codes as docs/commands.md states them, no
traceback ever, warnings on stderr, Ansible's own notices kept out of the output, and the
command registry with its plugins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import k2provision
from k2provision.commands import flow
from k2provision.commands.flow import HostRun, RunHooks
from k2provision.run.display import err_console
from tests.runners import k2

ROOT = Path(__file__).resolve().parents[3]
PROD = str(ROOT / "inventory" / "prod.ini")


def help_lines(text: str) -> list[str]:
    """--help's lines without rich's box drawing."""
    return [line.strip(" \u2502\u256d\u2570\u2500") for line in text.splitlines()]


def commands(text: str) -> set[str]:
    """The command names a --help lists."""
    return {line.split()[0] for line in help_lines(text) if line and line.split()[0].isalpha()}


def no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in out.stdout + out.stderr
    assert 'File "' not in out.stderr


def test_version() -> None:
    out = k2("--version")
    assert out.returncode == 0
    assert out.stdout == f"k2provision {k2provision.__version__}\n"


def test_format_is_a_fixed_choice() -> None:
    out = k2("plan", PROD, "--format", "yaml")
    assert out.returncode == 2
    no_traceback(out)
    assert "'yaml' is not one of 'table', 'json'" in out.stderr
    assert out.stdout == ""
    assert "[table|json]" in k2("plan", "--help").stdout


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["apply"], ["--check", "--diff"]),
        (["weights"], ["--check", "--verify"]),
        ([], ["--version"]),
    ],
)
def test_flags_show_as_flags_in_help(command: list[str], flags: list[str]) -> None:
    out = k2(*command, "--help")
    assert out.returncode == 0, out.stderr
    for flag in flags:
        (line,) = [x for x in help_lines(out.stdout) if x.startswith(flag + " ")]
        # A flag takes no value: no metavar after it, no --no-flag twin.
        assert not re.search(r"BOOL|<bool>|TEXT|INTEGER", line), line
        assert f"--no-{flag[2:]}" not in out.stdout
    apply = k2("apply", "--help").stdout
    assert re.search(r"--limit +TEXT +only these hosts", apply)
    assert "Ansible inventory" in apply  # the argument's help is shown too


def test_exit_codes_follow_the_command_reference(tmp_path: Path) -> None:
    assert k2("plan", PROD).returncode == 0
    for bad in (
        k2("plan", str(tmp_path / "absent.ini")),  # bad input
        k2("apply", PROD, "--no-such-option"),  # bad arguments
        k2("frobnicate"),  # no such command
    ):
        assert bad.returncode == 2, bad.stderr
        no_traceback(bad)


def test_an_unexpected_error_is_one_line_naming_the_details(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.write_text("a file where the run records should go\n")
    out = k2("stop", PROD, K2_RUNS_DIR=str(runs))
    assert out.returncode == 1
    no_traceback(out)
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out.stderr
    details = Path(lines[0].rsplit("details: ", 1)[1])
    assert lines[0].startswith("error: unexpected ")
    assert "Traceback" in details.read_text()
    details.unlink()


def test_an_unexpected_error_during_a_run_names_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the runner broke")

    monkeypatch.setenv("K2_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(flow, "run_playbook", broken)
    with err_console.capture() as capture:
        code = flow.run_on_hosts(HostRun(command="stop", inventory=Path(PROD)), RunHooks())
    assert code == 1
    (record,) = tmp_path.iterdir()
    lines = [line for line in capture.get().splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: unexpected RuntimeError: the runner broke; details: {record / 'error.txt'}"
    ]
    assert "Traceback" in (record / "error.txt").read_text()
    assert (record / "plan.json").exists()


def test_warnings_go_to_stderr_in_table_mode_and_into_the_json(tmp_path: Path) -> None:
    inventory = tmp_path / "vllm.ini"
    inventory.write_text("[nodes]\na\nb\n[all:vars]\nk2_engine=vllm\nk2_layout=tp_pp\n")
    table = k2("plan", str(inventory))
    assert table.returncode == 0, table.stderr
    assert "warning:" not in table.stdout
    assert any(
        line.startswith("warning: k2_socket_ifname is unset") for line in table.stderr.splitlines()
    )
    doc = k2("plan", str(inventory), "--format", "json")
    assert doc.returncode == 0
    assert doc.stderr == ""
    assert any("k2_socket_ifname" in w for w in json.loads(doc.stdout)["warnings"])


def test_ansible_s_own_notices_stay_out_of_the_plan(tmp_path: Path) -> None:
    inventory = tmp_path / "dash.ini"
    inventory.write_text(
        "[rack-a]\nn1\n[nodes:children]\nrack-a\n[all:vars]\nk2_engine=sglang\nk2_layout=tp\n"
        "k2_gpu=b200\n"
    )
    table = k2("plan", str(inventory))
    assert table.returncode == 0, table.stderr
    assert "[WARNING]" not in table.stdout + table.stderr
    notices = [x for x in table.stderr.splitlines() if x.startswith("warning: ansible: ")]
    assert len(notices) == 1
    assert "Invalid characters were found in group names" in notices[0]
    doc = k2("plan", str(inventory), "--format", "json")
    assert doc.returncode == 0
    assert "[WARNING]" not in doc.stdout + doc.stderr
    assert json.loads(doc.stdout)["hosts"][0]["name"] == "n1"


NO_PLUGINS = (
    "import importlib.metadata as m, sys\n"
    "real = m.entry_points\n"
    "m.entry_points = lambda **kw: [] if kw.get('group') == 'k2provision.commands' "
    "else real(**kw)\n"
    "from k2provision.cli import main\n"
    "sys.argv = ['k2provision', *sys.argv[1:]]\n"
    "main()\n"
)
BROKEN_PLUGIN = (
    "import importlib.metadata as m, sys\n"
    "bad = m.EntryPoint(name='broken', value='no_such_module:register', "
    "group='k2provision.commands')\n"
    "real = m.entry_points\n"
    "m.entry_points = lambda **kw: [bad] if kw.get('group') == 'k2provision.commands' "
    "else real(**kw)\n"
    "from k2provision.cli import main\n"
    "sys.argv = ['k2provision', *sys.argv[1:]]\n"
    "main()\n"
)


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_lab_is_a_plugin_and_the_cli_works_without_it() -> None:
    builtin = {"plan", "render", "apply", "stop", "weights"}
    assert commands(k2("--help").stdout) >= {*builtin, "lab"}  # the entry point registers it
    alone = python(NO_PLUGINS, "--help")
    assert alone.returncode == 0, alone.stderr
    assert "lab" not in commands(alone.stdout)
    assert commands(alone.stdout) >= builtin
    assert python(NO_PLUGINS, "plan", PROD).returncode == 0


def test_a_broken_plugin_is_one_warning_and_the_rest_works() -> None:
    out = python(BROKEN_PLUGIN, "plan", PROD, "--format", "json")
    assert out.returncode == 0, out.stderr
    no_traceback(out)
    assert out.stderr.splitlines() == [
        "warning: command plugin broken (no_such_module:register) did not load: "
        "ModuleNotFoundError: No module named 'no_such_module'"
    ]
    assert json.loads(out.stdout)["engine"] == "sglang"
