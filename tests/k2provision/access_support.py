"""Real access files for tests that plan a guarded endpoint: an API key, a CA, and a certificate
signed by it with its private key, made with `cryptography` at test time (the plan reads and
judges them, so a made-up path no longer plans)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

API_KEY = "k2-test-key-5f0c1e9a7b3d"
_START = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class GuardFiles:
    """Paths of a working set of k2_api_key_file, k2_tls_cert_file, k2_tls_key_file and
    k2_tls_ca_file."""

    api_key: str
    cert: str
    key: str
    ca: str


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def certificate_pem(
    key: ec.EllipticCurvePrivateKey,
    name: str,
    issuer: tuple[ec.EllipticCurvePrivateKey, str] | None = None,
) -> bytes:
    """A PEM certificate for `key`, self-signed or signed by `issuer` (its key and name)."""
    signer, issuer_name = issuer or (key, name)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_START)
        .not_valid_after(_START + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def write_guard_files(directory: Path) -> GuardFiles:
    """A key, a CA and a certificate it signed with the certificate's key, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key = new_key(), new_key()
    files = {
        "api_key": (directory / "api_key", API_KEY.encode() + b"\n"),
        "ca": (directory / "ca.pem", certificate_pem(ca_key, "k2 test CA")),
        "cert": (
            directory / "cert.pem",
            certificate_pem(server_key, "gpu-a01", issuer=(ca_key, "k2 test CA")),
        ),
        "key": (directory / "key.pem", key_pem(server_key)),
    }
    for path, data in files.values():
        path.write_bytes(data)
    return GuardFiles(**{name: str(path) for name, (path, _) in files.items()})


@pytest.fixture(scope="session")
def guard_files(tmp_path_factory: pytest.TempPathFactory) -> GuardFiles:
    """A working set of the endpoint's access files, shared by the session's tests."""
    return write_guard_files(tmp_path_factory.mktemp("guard"))
