"""What status sends to a guarded endpoint: the API key from k2_api_key_file (plain or an
ansible-vault file, opened with the command's vault password) and the CA to check against."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from k2provision.core import vault
from k2provision.core.records import AccessFiles
from k2provision.errors import K2Error
from k2provision.ops.endpoint_access import endpoint_access, read_secret
from tests.k2provision.access_support import GuardFiles

KEY = "sk-lab-0123456789abcdef"
NONE = AccessFiles(
    api_key_file=None, tls_cert_file=None, tls_key_file=None, tls_ca_file=None, host_ca_file=None
)


def test_a_plain_key_file_becomes_the_bearer_header(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    access = endpoint_access(NONE.model_copy(update={"api_key_file": str(tmp_path / "key")}))
    assert access.headers == {"Authorization": f"Bearer {KEY}"}
    assert access.context is None
    assert KEY not in repr(access)
    assert endpoint_access(NONE).headers == {}


def test_a_vaulted_key_file_is_opened_with_the_commands_password(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("lab-password\n")
    lib = VaultLib([("default", VaultSecret(b"lab-password"))])
    (tmp_path / "key").write_bytes(lib.encrypt(KEY))
    vault.use(password_files=(str(tmp_path / "pw"),))
    try:
        assert read_secret(str(tmp_path / "key")) == KEY
    finally:
        vault.use(password_files=())


@pytest.mark.parametrize(("text", "says"), [(None, "k2_api_key_file"), ("\n", "is empty")])
def test_a_missing_or_empty_key_file_is_named(tmp_path: Path, text: str | None, says: str) -> None:
    path = tmp_path / "key"
    if text is not None:
        path.write_text(text)
    with pytest.raises(K2Error, match=says):
        read_secret(str(path))


def test_a_fifo_or_multi_line_key_file_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """Read as the plan judges it: a FIFO is refused by its type before it is opened (a
    blocking read would wait for a writer), a key of two lines names its count, not its text."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(K2Error, match=r"is not a regular file \(a FIFO\)"):
        read_secret(str(tmp_path / "fifo"))
    (tmp_path / "key").write_text(f"{KEY}\n{KEY}\n")
    with pytest.raises(K2Error, match="holds 2 lines") as refused:
        read_secret(str(tmp_path / "key"))
    assert KEY not in str(refused.value)


def test_the_ca_file_is_the_context_the_endpoint_is_checked_against(
    tmp_path: Path, guard_files: GuardFiles
) -> None:
    access = endpoint_access(NONE.model_copy(update={"tls_ca_file": guard_files.ca}))
    assert access.context is not None
    assert [dict(c["subject"][0])["commonName"] for c in access.context.get_ca_certs()] == [
        "k2 test CA"
    ]
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(K2Error, match=r"k2_tls_ca_file=.* holds no PEM certificate"):
        endpoint_access(NONE.model_copy(update={"tls_ca_file": str(tmp_path / "ca.pem")}))
