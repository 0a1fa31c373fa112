"""Ansible Vault as ansible-playbook opens it: a vaulted secret with its password plans, without
it is exit 2 naming the variable, and its plain text is in no plan, render or error line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from contextvars import ContextVar
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from k2provision.core import vault
from k2provision.core.vault import VaultOptions
from k2provision.run.runner import PlaybookRun, runner_kwargs
from tests.runners import k2 as run_cli

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "sglang-tp" / "inventory.ini"
SECRET = "hf_plaintext_never_shown_4242"
PASSWORD = "correct horse"


def vaulted(text: str, password: str = PASSWORD) -> str:
    """`text` as `ansible-vault encrypt_string` writes it, an indented !vault block."""
    cipher = VaultLib([("default", VaultSecret(password.encode()))]).encrypt(text).decode()
    return "!vault |\n" + "".join(f"  {line}\n" for line in cipher.splitlines())


def inventory(tmp_path: Path, name: str = "k2_weights_hf_token") -> Path:
    root = tmp_path / "inv"
    (root / "group_vars").mkdir(parents=True)
    (root / "hosts.ini").write_text(GOLDEN.read_text())
    (root / "group_vars" / "all.yml").write_text(f"{name}: {vaulted(SECRET)}")
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    return root


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI with no vault password from this process's environment."""
    return run_cli(*args, cwd=cwd, timeout=120, unset_prefix="ANSIBLE_VAULT", **env)


def test_vaulted_secret_without_password_is_exit_2_naming_it(tmp_path: Path) -> None:
    out = cli("plan", str(inventory(tmp_path)), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "k2_weights_hf_token is vaulted and cannot be opened" in out.stderr
    assert "--vault-password-file" in out.stderr
    assert SECRET not in out.stdout + out.stderr


@pytest.mark.parametrize("how", ["option", "vault-id", "environment"])
def test_vaulted_secret_with_password_plans_and_renders_without_it(
    tmp_path: Path, how: str
) -> None:
    inv, pw = inventory(tmp_path), tmp_path / "pw"
    args = {
        "option": ["--vault-password-file", str(pw)],
        "vault-id": ["--vault-id", f"default@{pw}"],
        "environment": [],
    }[how]
    env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)} if how == "environment" else {}
    planned = cli("plan", str(inv), "--format", "json", *args, cwd=tmp_path, **env)
    assert planned.returncode == 0, planned.stderr
    rendered = cli("render", str(inv), "--out", "r", *args, cwd=tmp_path, **env)
    assert rendered.returncode == 0, rendered.stderr
    written = "".join(p.read_text() for p in (tmp_path / "r").rglob("*") if p.is_file())
    assert "plan.json" in os.listdir(tmp_path / "r")
    assert SECRET not in planned.stdout + planned.stderr + rendered.stdout + written


def test_wrong_password_is_exit_2(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    (tmp_path / "bad").write_text("wrong\n")
    out = cli("plan", str(inv), "--vault-password-file", str(tmp_path / "bad"), cwd=tmp_path)
    assert out.returncode == 2
    assert "k2_weights_hf_token is vaulted" in out.stderr


def test_missing_password_file_is_exit_2(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    out = cli("plan", str(inv), "--vault-password-file", str(tmp_path / "nope"), cwd=tmp_path)
    assert out.returncode == 2
    assert "vault password:" in out.stderr
    assert "fix:" in out.stderr


def test_vaulted_contract_value_is_refused_as_shown_in_the_plan(tmp_path: Path) -> None:
    inv = inventory(tmp_path, name="k2_served_model_name")
    out = cli("plan", str(inv), "--vault-password-file", str(tmp_path / "pw"), cwd=tmp_path)
    assert out.returncode == 2
    assert "k2_served_model_name is vaulted, but it is a value the plan shows" in out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_every_inventory_command_takes_the_vault_options() -> None:
    for command in ("plan", "render", "apply", "stop", "status", "logs", "restart", "verify"):
        out = cli(command, "--help", cwd=ROOT)
        for option in ("--vault-password-file", "--vault-id", "--ask-vault-pass"):
            assert option in out.stdout, (command, option)


def test_playbook_gets_the_same_vault_options(tmp_path: Path) -> None:
    options = VaultOptions(password_files=("/p",), vault_ids=("a@/q",), ask=True, password="pw")
    run = PlaybookRun("site.yml", tmp_path / "inv", tmp_path, vault=options)
    kwargs = runner_kwargs(run, {}, None)
    assert kwargs["cmdline"].split() == [
        "--vault-password-file=/p",
        "--vault-id=a@/q",
        "--ask-vault-pass",
    ]
    assert kwargs["passwords"] == {vault.ASK_PROMPT: "pw"}
    assert "pw" not in repr(options)


def test_a_prompted_vault_id_is_asked_once_for_the_inventory_and_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from k2provision.core.inventory import read_inventory

    asked: list[str] = []
    monkeypatch.setattr(vault.getpass, "getpass", lambda prompt: asked.append(prompt) or PASSWORD)
    monkeypatch.setattr(vault, "_current", ContextVar("k2_vault_options_test", default=None))
    vault.use(vault_ids=("default@prompt",))
    _, host_vars = read_inventory(inventory(tmp_path))
    options = vault.current()
    assert asked == ["Vault password (default): "]
    assert all(v["k2_weights_hf_token"] for v in host_vars.values())
    run = PlaybookRun("site.yml", tmp_path / "inv", tmp_path, vault=options)
    kwargs = runner_kwargs(run, {}, None)
    assert kwargs["cmdline"] == "--vault-id=default@prompt"
    ((prompt, answer),) = kwargs["passwords"].items()
    assert re.match(prompt, "Vault password (default): ")
    assert answer == PASSWORD
    assert PASSWORD not in repr(options)


# ---------------------------------------------------------------- files encrypted whole


def encrypt_file(path: Path, password_file: Path) -> None:
    """`ansible-vault encrypt` on `path`, the command an operator runs."""
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-vault"),
            "encrypt",
            "--vault-password-file",
            str(password_file),
            str(path),
        ],
        check=True,
        capture_output=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")},
    )
    assert path.read_text().startswith("$ANSIBLE_VAULT;")


def whole_file_inventories(tmp_path: Path) -> dict[str, Path]:
    """One inventory per place a whole file may be encrypted: the INI source itself, a YAML
    source, and a group_vars file beside a plain source."""
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    made: dict[str, Path] = {}
    ini = tmp_path / "ini" / "hosts.ini"
    ini.parent.mkdir()
    ini.write_text(GOLDEN.read_text())
    encrypt_file(ini, tmp_path / "pw")
    made["ini source"] = ini
    listed = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            "-i",
            str(GOLDEN),
            "--list",
            "--yaml",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    yml = tmp_path / "yml" / "hosts.yml"
    yml.parent.mkdir()
    yml.write_text(listed)
    encrypt_file(yml, tmp_path / "pw")
    made["yaml source"] = yml
    root = tmp_path / "gv"
    (root / "group_vars").mkdir(parents=True)
    hosts, _, variables = GOLDEN.read_text().partition("[all:vars]")
    (root / "hosts.ini").write_text(hosts)
    (root / "group_vars" / "all.yml").write_text(
        "".join(
            f"{k.strip()}: {v.strip()}\n"
            for k, _, v in (line.partition("=") for line in variables.splitlines() if "=" in line)
        )
    )
    encrypt_file(root / "group_vars" / "all.yml", tmp_path / "pw")
    made["group_vars file"] = root
    return made


@pytest.fixture
def fresh_vault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vault options of this test alone, with none from the environment."""
    monkeypatch.setattr(vault, "_current", ContextVar("k2_vault_options_test", default=None))
    for name in [k for k in os.environ if k.startswith("ANSIBLE_VAULT")]:
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("fresh_vault")
def test_a_file_encrypted_whole_is_read_as_ansible_inventory_reads_it(tmp_path: Path) -> None:
    from k2provision.plan.inventory import load_cluster

    plain = load_cluster(GOLDEN)
    vault.use(password_files=(str(tmp_path / "pw"),))
    for form, inv in whole_file_inventories(tmp_path).items():
        cluster = load_cluster(inv)
        assert cluster.model_dump(exclude={"inventory"}) == plain.model_dump(
            exclude={"inventory"}
        ), form


@pytest.mark.usefixtures("fresh_vault")
@pytest.mark.parametrize("password", [None, "wrong"])
def test_a_file_encrypted_whole_without_its_password_is_one_line_with_the_fix(
    tmp_path: Path, password: str | None
) -> None:
    from k2provision.errors import InventoryError
    from k2provision.plan.inventory import load_cluster

    inventories = whole_file_inventories(tmp_path)
    if password is not None:
        (tmp_path / "bad").write_text(password + "\n")
        vault.use(password_files=(str(tmp_path / "bad"),))
    for form, inv in inventories.items():
        with pytest.raises(InventoryError) as refused:
            load_cluster(inv)
        (line,) = refused.value.problems
        assert "is encrypted with ansible-vault and no vault secret given opens it" in line, form
        assert "fix: pass --vault-password-file FILE" in line, form
        assert PASSWORD not in line


def test_a_file_encrypted_whole_without_its_password_is_exit_2(tmp_path: Path) -> None:
    inv = whole_file_inventories(tmp_path)["ini source"]
    out = cli("plan", str(inv), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"{inv}: the inventory file is encrypted with ansible-vault" in out.stderr
    opened = cli("plan", str(inv), "--vault-password-file", str(tmp_path / "pw"), cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
