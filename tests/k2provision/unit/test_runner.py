"""The runner: its arguments and environment built as data, the hub token kept out of the run
record, and one real ansible-playbook run on localhost that proves both."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from k2provision.run import runner
from k2provision.run.events import Event, HostResult

TOKEN = "hf_" + "ZyXwVuTsRqPoNmLkJiHgFeDcBaZyXwVuTs"


def test_the_token_goes_to_a_private_file_for_the_run_only() -> None:
    assert runner.hub_token({"HF_TOKEN": " ", "HUGGING_FACE_HUB_TOKEN": f"{TOKEN}\n"}) == TOKEN
    assert runner.hub_token({}) == ""
    with runner.token_file(TOKEN) as path:
        assert path is not None
        assert path.read_text() == TOKEN
        assert path.stat().st_mode & 0o077 == 0
    assert not path.exists()
    assert not path.parent.exists()
    with runner.token_file("") as none:
        assert none is None


def test_arguments_and_environment_are_data(tmp_path: Path) -> None:
    environ = {"PATH": "/usr/bin:/bin", "HF_TOKEN": TOKEN, "HOME": "/root"}
    before = dict(os.environ)
    run = runner.PlaybookRun(
        playbook="site.yml",
        inventory=tmp_path / "inv.ini",
        record_dir=tmp_path / "rec",
        extravars={"k2_expected_plan_digest": "abc"},
        tags=("launch", "verify"),
        limit="prefill",
        check=True,
    )
    kwargs = runner.runner_kwargs(run, environ, tmp_path / "token")
    assert os.environ == before  # nothing read back into, or written to, this process
    assert kwargs["playbook"] == "playbooks/site.yml"
    assert kwargs["inventory"] == str((tmp_path / "inv.ini").resolve())
    assert kwargs["tags"] == "launch,verify"
    assert kwargs["limit"] == "prefill"
    assert kwargs["cmdline"] == "--check"
    assert kwargs["extravars"] == {"k2_expected_plan_digest": "abc"}
    assert kwargs["suppress_env_files"] is True
    env = kwargs["envvars"]
    assert env[runner.TOKEN_FILE_ENV] == str(tmp_path / "token")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["ANSIBLE_ROLES_PATH"] == str(runner.PROJECT_ROOT / "roles")
    assert TOKEN not in repr(kwargs)
    assert runner.env_overrides({}, token_path=None)["PATH"].endswith("/usr/bin:/bin")

    full = {**environ, **env, "HUGGING_FACE_HUB_TOKEN": TOKEN}
    scrubbed = runner.scrubbed(full, token_path=tmp_path / "token")
    assert TOKEN not in repr(scrubbed)
    assert scrubbed[runner.TOKEN_FILE_ENV] == str(tmp_path / "token")
    # A token-file path inherited from the caller does not leak into a run without a token.
    assert runner.TOKEN_FILE_ENV not in runner.scrubbed(full, token_path=None)


PLAYBOOK = """\
- name: What a run sees
  hosts: all
  gather_facts: false
  tasks:
    - name: The token is in the file, not in the environment
      ansible.builtin.assert:
        that:
          - lookup('ansible.builtin.env', 'HF_TOKEN') == ''
          - lookup('ansible.builtin.env', 'HUGGING_FACE_HUB_TOKEN') == ''
          - lookup('ansible.builtin.file', token_file) == lookup('ansible.builtin.file', expected)
        quiet: true
      vars:
        token_file: "{{ lookup('ansible.builtin.env', 'K2_WEIGHTS_HF_TOKEN_FILE') }}"
      no_log: true
"""


def test_a_real_run_keeps_the_token_out_of_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "roles").mkdir()
    (project / "ansible.cfg").write_text("[defaults]\nstdout_callback = default\n")
    (project / "playbooks" / "t.yml").write_text(PLAYBOOK)
    inventory = tmp_path / "inv.ini"
    inventory.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    expected = tmp_path / "expected"  # outside the record: what the run must read from its file
    expected.write_text(TOKEN)
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv(runner.TOKEN_FILE_ENV, raising=False)
    seen: list[Event] = []

    def on_event(event: Event) -> None:
        # While the run goes on, this process's environment is as the caller left it.
        assert os.environ["HF_TOKEN"] == TOKEN
        assert runner.TOKEN_FILE_ENV not in os.environ
        seen.append(event)

    result = runner.run_playbook(
        runner.PlaybookRun(
            playbook="t.yml",
            inventory=inventory,
            record_dir=record,
            extravars={"expected": str(expected)},
            project_dir=project,
        ),
        on_event=on_event,
    )
    assert result.ok, (result.status, result.tally.failures, result.error_tail)
    assert [e.status for e in seen if isinstance(e, HostResult)] == ["ok"]
    assert os.environ["HF_TOKEN"] == TOKEN
    files = [p for p in record.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files)  # the record that holds the environment
    leaked = [str(p) for p in files if TOKEN in p.read_text(errors="replace")]
    assert leaked == []
