"""The endpoint's key and TLS files are opened and judged when the plan is made: real files in
tmp_path (missing, empty, a directory, a FIFO, /dev/zero, multi-line, vault-encrypted with and
without its password, a mismatched pair, a certificate with its key in one file). Each refusal
names the inventory, the endpoint's host, the variable, what was expected and the fix, and no
byte of the secret; every refusal of the plan comes at once."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret, VaultSecretsContext

from k2provision.core.access_files import ACCESS_FILE_LIMIT
from k2provision.core.records import Cluster
from k2provision.errors import InventoryError
from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster
from tests.k2provision.access_support import (
    GuardFiles,
    certificate_pem,
    key_pem,
    new_key,
    write_guard_files,
)
from tests.runners import k2 as run_cli

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden" / "sglang-tp" / "inventory.ini"
ENDPOINT_HOST = "node-01"
SECRET = "s3cret-api-key-never-shown-7d41"
PASSWORD = "correct horse"

# How each case's file is made in a directory: (variable, maker) -> the path to set.
Maker = Callable[[Path, GuardFiles], str]


def _write(name: str, data: bytes) -> Maker:
    def make(directory: Path, _: GuardFiles) -> str:
        (directory / name).write_bytes(data)
        return str(directory / name)

    return make


def _vaulted(name: str, data: bytes) -> Maker:
    def make(directory: Path, _: GuardFiles) -> str:
        cipher = VaultLib([("default", VaultSecret(PASSWORD.encode()))]).encrypt(data)
        (directory / name).write_bytes(cipher)
        return str(directory / name)

    return make


def _missing(directory: Path, _: GuardFiles) -> str:
    return str(directory / "absent")


def _directory(directory: Path, _: GuardFiles) -> str:
    (directory / "folder").mkdir()
    return str(directory / "folder")


def _fifo(directory: Path, _: GuardFiles) -> str:
    os.mkfifo(directory / "fifo")  # opened blocking, reading it would never return
    return str(directory / "fifo")


def _dev_zero(directory: Path, _: GuardFiles) -> str:
    return "/dev/zero"


def _cert_with_its_key(directory: Path, files: GuardFiles) -> str:
    both = Path(files.cert).read_bytes() + Path(files.key).read_bytes()
    (directory / "both.pem").write_bytes(both)
    return str(directory / "both.pem")


def _other_key(directory: Path, _: GuardFiles) -> str:
    (directory / "other.pem").write_bytes(key_pem(new_key()))
    return str(directory / "other.pem")


def _passphrase_key(directory: Path, files: GuardFiles) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(files.key).read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass"),
    )
    (directory / "locked.pem").write_bytes(encrypted)
    return str(directory / "locked.pem")


def _other_ca(directory: Path, _: GuardFiles) -> str:
    (directory / "other-ca.pem").write_bytes(certificate_pem(new_key(), "k2 test CA"))
    return str(directory / "other-ca.pem")


def _cert_as_key(directory: Path, files: GuardFiles) -> str:
    return files.cert


COMMON: list[tuple[str, Maker, str]] = [
    ("missing", _missing, "cannot be read (No such file or directory)"),
    ("directory", _directory, "is not a regular file (a directory)"),
    ("fifo", _fifo, "is not a regular file (a FIFO)"),
    ("dev-zero", _dev_zero, "is not a regular file (a character device)"),
    ("too-large", _write("big", b"a" * (ACCESS_FILE_LIMIT + 1)), "over the limit"),
    (
        "vault-without-password",
        _vaulted("vaulted", SECRET.encode()),
        "is ansible-vault encrypted",
    ),
]
CASES: list[tuple[str, str, Maker, str]] = [
    *[("k2_api_key_file", case, make, says) for case, make, says in COMMON],
    *[("k2_tls_cert_file", case, make, says) for case, make, says in COMMON],
    *[("k2_tls_key_file", case, make, says) for case, make, says in COMMON],
    *[("k2_tls_ca_file", case, make, says) for case, make, says in COMMON],
    ("k2_api_key_file", "empty", _write("key", b""), "is empty (0 bytes)"),
    (
        "k2_api_key_file",
        "blank",
        _write("key", b" \n\t\n"),
        "is empty but for whitespace (4 bytes)",
    ),
    ("k2_api_key_file", "multi-line", _write("key", f"{SECRET}\n{SECRET}\n".encode()), "lines"),
    ("k2_api_key_file", "control", _write("key", f"{SECRET}\x00x".encode()), "control"),
    ("k2_api_key_file", "not-utf8", _write("key", b"\xff\xfe" + SECRET.encode()), "not UTF-8"),
    ("k2_tls_cert_file", "empty", _write("cert", b""), "holds no PEM certificate"),
    ("k2_tls_cert_file", "not-pem", _write("cert", SECRET.encode()), "holds no PEM certificate"),
    ("k2_tls_cert_file", "with-its-key", _cert_with_its_key, "holds a private key"),
    ("k2_tls_key_file", "empty", _write("key", b""), "holds 0 PEM private keys"),
    ("k2_tls_key_file", "a-certificate", _cert_as_key, "holds 0 PEM private keys"),
    ("k2_tls_key_file", "mismatched", _other_key, "the pair does not match"),
    ("k2_tls_key_file", "passphrase", _passphrase_key, "passphrase-protected"),
    ("k2_tls_ca_file", "empty", _write("ca", b""), "holds no PEM certificate"),
    ("k2_tls_ca_file", "with-a-key", _cert_with_its_key, "holds a private key"),
    ("k2_tls_ca_file", "another-ca", _other_ca, "none of which is or signed a certificate"),
]


@contextmanager
def vault_secrets(*passwords: str) -> Iterator[None]:
    """The run's vault secrets are `passwords` (none: no secret), restored after. Set after
    the inventory is read, which loads the command's own (here: none)."""
    saved = VaultSecretsContext._current
    secrets = [("default", VaultSecret(password.encode())) for password in passwords]
    VaultSecretsContext._current = VaultSecretsContext(secrets)
    try:
        yield
    finally:
        VaultSecretsContext._current = saved


def guarded(files: GuardFiles, **paths: str) -> Cluster:
    """The sglang-tp golden cluster with all four access files, some replaced by `paths`."""
    cluster = load_cluster(GOLDEN)
    chosen = {
        "api_key_file": files.api_key,
        "tls_cert_file": files.cert,
        "tls_key_file": files.key,
        "tls_ca_file": files.ca,
    } | paths
    return cluster.model_copy(update={"tunables": cluster.tunables.model_copy(update=chosen)})


def refusals(cluster: Cluster, *passwords: str) -> tuple[str, ...]:
    """The plan's refusals of `cluster`, with `passwords` as the run's vault secrets."""
    with vault_secrets(*passwords), pytest.raises(InventoryError) as refused:
        build_plan(cluster)
    return refused.value.problems


def secrets_of(directory: Path, files: GuardFiles) -> list[str]:
    """Text that must never be echoed: the key, and every line of any private key around."""
    lines = [SECRET, Path(files.api_key).read_text().strip()]
    for path in [*directory.iterdir(), Path(files.key)]:
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            lines += [ln for ln in path.read_text().splitlines() if "-----" not in ln]
    return lines


@pytest.mark.parametrize(
    ("variable", "case", "make", "says"),
    CASES,
    ids=[f"{variable}-{case}" for variable, case, _, _ in CASES],
)
def test_an_access_file_that_cannot_serve_is_refused_naming_it_without_its_secret(
    tmp_path: Path, guard_files: GuardFiles, variable: str, case: str, make: Maker, says: str
) -> None:
    path = make(tmp_path, guard_files)
    (problem,) = refusals(guarded(guard_files, **{variable.removeprefix("k2_"): path}))
    assert problem.startswith(f"{GOLDEN}: host {ENDPOINT_HOST} (the endpoint's): ")
    assert f"{variable}={path} " in problem
    assert says in problem
    assert "; expected " in problem
    assert "; fix: " in problem
    for secret in secrets_of(tmp_path, guard_files):
        assert secret not in problem


def test_a_vaulted_file_without_its_password_names_the_vault_options(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    path = _vaulted("key", SECRET.encode())(tmp_path, guard_files)
    (problem,) = refusals(guarded(guard_files, api_key_file=path))
    assert "no vault secret was given" in problem
    assert "fix: pass --vault-password-file FILE" in problem


def test_a_vaulted_file_is_refused_with_the_wrong_password(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    path = _vaulted("key", SECRET.encode())(tmp_path, guard_files)
    (problem,) = refusals(guarded(guard_files, api_key_file=path), "wrong")
    assert "none of the vault secrets given opens it" in problem
    assert SECRET not in problem


def test_vaulted_files_that_open_with_the_runs_password_plan(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    """A key and a private key kept with ansible-vault plan, as the launch role decrypts them
    when it copies them; the plan holds their paths, never what they hold."""
    key = _vaulted("key", SECRET.encode() + b"\n")(tmp_path, guard_files)
    tls_key = _vaulted("tls.pem", Path(guard_files.key).read_bytes())(tmp_path, guard_files)
    cluster = guarded(guard_files, api_key_file=key, tls_key_file=tls_key)
    with vault_secrets(PASSWORD):
        plan = build_plan(cluster)
    assert (plan.access.api_key_file, plan.access.tls_key_file) == (key, tls_key)
    assert SECRET not in plan.model_dump_json()


def test_a_mismatched_pair_made_by_openssl_is_refused(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    """The pair as an operator makes it with openssl: a certificate of one key, another key."""
    for name in ("a", "b"):
        subprocess.run(
            ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(tmp_path / f"{name}.key")],
            check=True,
            capture_output=True,
        )  # fmt: skip
    subprocess.run(
        ["openssl", "req", "-x509", "-new", "-key", str(tmp_path / "a.key"), "-subj", "/CN=k2",
         "-days", "30", "-out", str(tmp_path / "a.crt")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    cert, wrong = str(tmp_path / "a.crt"), str(tmp_path / "b.key")
    # A self-signed certificate is its own CA.
    pair = {"tls_cert_file": cert, "tls_ca_file": cert}
    (problem,) = refusals(guarded(guard_files, **pair, tls_key_file=wrong))
    assert f"k2_tls_key_file={wrong} " in problem
    assert "the pair does not match" in problem
    right = str(tmp_path / "a.key")
    plan = build_plan(guarded(guard_files, **pair, tls_key_file=right))
    assert plan.access.tls_key_file == right


def test_a_certificate_chain_with_its_ca_plans(tmp_path: Path, guard_files: GuardFiles) -> None:
    """A chain file (leaf first, then the CA) is a certificate file: the key matches its
    first certificate."""
    chain = Path(guard_files.cert).read_bytes() + Path(guard_files.ca).read_bytes()
    path = _write("chain.pem", chain)(tmp_path, guard_files)
    assert build_plan(guarded(guard_files, tls_cert_file=path)).access.tls_cert_file == path
    reversed_chain = Path(guard_files.ca).read_bytes() + Path(guard_files.cert).read_bytes()
    backwards = _write("backwards.pem", reversed_chain)(tmp_path, guard_files)
    (problem,) = refusals(guarded(guard_files, tls_cert_file=backwards))
    assert "k2_tls_key_file=" in problem
    assert "the pair does not match" in problem


def test_a_key_with_spaces_or_a_trailing_line_end_plans(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    """The key is read stripped, as the launch script and the roles read it."""
    for text in (b"  key with spaces: ok \n", b"k2-key\r\n"):
        path = _write("key", text)(tmp_path, guard_files)
        assert build_plan(guarded(guard_files, api_key_file=path)).access.api_key_file == path


def test_every_refusal_comes_at_once(tmp_path: Path, guard_files: GuardFiles) -> None:
    """Bad access files, a setting the engine refuses and a model problem, in one error."""
    key = _write("key", b"")(tmp_path, guard_files)
    cluster = guarded(guard_files, api_key_file=key, tls_ca_file=str(tmp_path / "absent"))
    cluster = cluster.model_copy(update={"context_length": 10_000_000})
    problems = refusals(cluster)
    assert [p for p in problems if "k2_api_key_file=" in p and "is empty" in p]
    assert [p for p in problems if "k2_tls_ca_file=" in p and "cannot be read" in p]
    assert [p for p in problems if p.startswith("k2_context_length=10000000 exceeds")]


def _inventory(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "inv.ini"
    path.write_text(GOLDEN.read_text() + extra)
    return path


@pytest.mark.parametrize(
    ("given", "missing"),
    [("k2_tls_cert_file", "k2_tls_key_file"), ("k2_tls_key_file", "k2_tls_cert_file")],
)
def test_half_a_tls_pair_is_refused_naming_both_variables_beside_other_errors(
    tmp_path: Path, given: str, missing: str
) -> None:
    """The pair rule names its variables (not `k2_`), and a field's error (k2_api_port) or a
    cluster field's (k2_gpus_per_node) hides neither it nor the checks after it
    (k2_instances that does not split [nodes])."""
    extra = f"{given}=/etc/k2/half.pem\nk2_api_port=abc\nk2_gpus_per_node=zz\nk2_instances=3\n"
    path = _inventory(tmp_path, extra)
    with pytest.raises(InventoryError) as refused:
        load_cluster(path)
    problems = refused.value.problems
    (pair,) = [p for p in problems if "is set without" in p]
    assert pair.startswith(f"{path}: {given}=/etc/k2/half.pem is set without {missing}; ")
    assert "expected both" in pair
    assert f"fix: set {missing} to the " in pair
    assert "k2_=" not in "\n".join(problems)
    assert [p for p in problems if p.startswith(f"{path}: k2_api_port=abc is refused")]
    assert [p for p in problems if p.startswith(f"{path}: k2_gpus_per_node=zz is refused")]
    assert [p for p in problems if "k2_instances=3 does not split" in p]
    alone = _inventory(tmp_path, f"{given}=/etc/k2/half.pem\n")
    with pytest.raises(InventoryError) as refused:
        load_cluster(alone)
    assert refused.value.problems == (pair,)  # the rule, once


def test_the_cli_opens_a_vaulted_key_file_with_the_runs_password(tmp_path: Path) -> None:
    """Through the command line: the vault password given to the run opens a vaulted
    k2_api_key_file; without it the plan is exit 2 naming the variable and the vault options."""
    key = _vaulted("key", SECRET.encode())(tmp_path, write_guard_files(tmp_path / "g"))
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    inventory = _inventory(tmp_path, f"k2_api_key_file={key}\n")
    unset = "ANSIBLE_VAULT"  # no vault password from this process's environment
    locked = run_cli("plan", str(inventory), cwd=tmp_path, timeout=120, unset_prefix=unset)
    assert locked.returncode == 2, locked.stderr
    assert f"k2_api_key_file={key} is ansible-vault encrypted" in locked.stderr
    assert "--vault-password-file" in locked.stderr
    opened = run_cli(
        "plan", str(inventory), "--vault-password-file", str(tmp_path / "pw"),
        cwd=tmp_path, timeout=120, unset_prefix=unset,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    assert SECRET not in locked.stdout + locked.stderr + opened.stdout + opened.stderr


def test_the_certificate_helpers_make_a_matching_pair() -> None:
    """The test's own pair matches (else every refusal above could be the helper's fault)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = new_key()
    cert = x509.load_pem_x509_certificate(certificate_pem(key, "x"))
    loaded = serialization.load_pem_private_key(key_pem(key), password=None)
    assert cert.public_key() == loaded.public_key()
