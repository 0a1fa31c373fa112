"""The endpoint's key and TLS files, read on the controller and judged before anything runs:
k2_api_key_file, k2_tls_cert_file, k2_tls_key_file and k2_tls_ca_file (the plan's access).

Each is read as the launch phase will copy it (roles/k2_launch/tasks/guard.yml): a regular file
within a size limit, never opened blocking (a FIFO or a device is refused by its type first),
decrypted in memory when it is ansible-vault encrypted (with the vault secrets of the run, as
Ansible's copy and file lookup decrypt it). What cannot serve is refused: an API key that is
empty, spans lines or holds control characters; a certificate or CA file without a
certificate, or with a private key in it (both are copied to the host readable by all); a
private key that is encrypted, missing, or not the certificate's; a CA file that vouches for
none of the certificate's chain. A refusal names the file and its length, never what it
holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k2provision.core import bounded_read
from k2provision.core.records import Cluster
from k2provision.core.vault import VAULT_FIX

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import (
        PrivateKeyTypes,
        PublicKeyTypes,
    )

ACCESS_FILE_LIMIT = bounded_read.MIB
"""The most bytes an access file may hold (a key, or a certificate chain with its CAs)."""
_PRIVATE_KEY_BLOCK = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


@dataclass(frozen=True)
class AccessFile:
    """What one access variable must name, and how to mend it."""

    variable: str
    expected: str
    fix: str


API_KEY = AccessFile(
    "k2_api_key_file",
    "a regular file holding the endpoint's API key: one line of printable ASCII characters "
    "(the file may be ansible-vault encrypted)",
    "write the key alone into the file (e.g. `openssl rand -hex 32 > FILE`) or point "
    "k2_api_key_file at the file that holds it",
)
TLS_CERT = AccessFile(
    "k2_tls_cert_file",
    "a regular PEM file of the endpoint's certificate (chain), leaf first, with no private key "
    "in it (it is copied to the host readable by all, mode 0644)",
    "point k2_tls_cert_file at the certificate's PEM file; keep its private key in its own "
    "file, named by k2_tls_key_file",
)
TLS_KEY = AccessFile(
    "k2_tls_key_file",
    "a regular PEM file of the unencrypted private key of k2_tls_cert_file's first certificate "
    "(the file may be ansible-vault encrypted)",
    "point k2_tls_key_file at the certificate's private key (remove a passphrase with "
    "`openssl pkey -in KEY -out KEY.plain`; protect it with ansible-vault instead)",
)
TLS_CA = AccessFile(
    "k2_tls_ca_file",
    "a regular PEM file of the CA certificate(s) that signed k2_tls_cert_file, with no private "
    "key in it (it is copied to the host readable by all, mode 0644)",
    "point k2_tls_ca_file at the CA's certificate, or unset it to trust the hosts' store",
)


class Refused(Exception):
    """Why an access file cannot serve (a reason that quotes no byte of the file)."""


class VaultLocked(Refused):
    """An ansible-vault file that none of the run's vault secrets opens."""


def read_access_file(path: str) -> bytes:
    """The bytes an access file holds, decrypted when it is ansible-vault encrypted; Refused
    saying why it cannot be read."""
    try:
        data = bounded_read.read_bytes(Path(path), ACCESS_FILE_LIMIT)
    except ValueError as exc:
        raise Refused(str(exc).removeprefix(f"{path} ")) from None
    from ansible.parsing.vault import is_encrypted

    return _decrypted(data) if is_encrypted(data) else data


def _decrypted(data: bytes) -> bytes:
    """A vault file's plain bytes, with the secrets the run was given."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, VaultSecretsContext

    context = VaultSecretsContext.current(optional=True)
    secrets = list(context.secrets) if context else []
    if not secrets:
        raise VaultLocked(
            f"is ansible-vault encrypted ({len(data)} bytes) and no vault secret was given"
        )
    try:
        return bytes(VaultLib(secrets).decrypt(data))
    except AnsibleError:
        raise VaultLocked(
            f"is ansible-vault encrypted ({len(data)} bytes) and none of the vault secrets "
            "given opens it"
        ) from None


def api_key_problem(data: bytes) -> str | None:
    """Why `data` is not an API key the endpoint and its clients can agree on."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"is not UTF-8 text ({len(data)} bytes)"
    key = text.strip()  # as the launch script and the roles read it
    if not key:
        what = "is empty" if not data else "is empty but for whitespace"
        return f"{what} ({len(data)} bytes), so the endpoint would serve without a key"
    if lines := len(key.splitlines()) - 1:
        return f"holds {lines + 1} lines ({len(data)} bytes); the key is one line"
    if not all(0x20 <= ord(ch) <= 0x7E for ch in key):
        return (
            f"holds a control or a non-ASCII character in its key ({len(key)} characters), "
            "which an Authorization header cannot carry as it is"
        )
    return None


def _certificates(data: bytes) -> tuple[list[x509.Certificate], str | None]:
    """The PEM certificates in `data`, or why there are none to use."""
    from cryptography import x509

    if _PRIVATE_KEY_BLOCK.search(data):
        return [], f"holds a private key ({len(data)} bytes)"
    try:
        return list(x509.load_pem_x509_certificates(data)), None
    except ValueError:
        return [], f"holds no PEM certificate that can be read ({len(data)} bytes)"


def _public_key_bytes(key: PublicKeyTypes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def certificate_problem(data: bytes) -> str | None:
    """Why `data` is not a certificate chain to serve (or a CA file to trust)."""
    return _certificates(data)[1]


def private_key_problem(data: bytes, certificate: bytes | None) -> str | None:
    """Why `data` is not the unencrypted private key of `certificate`'s first certificate
    (None: unknown, as when the certificate is refused itself)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    blocks = len(_PRIVATE_KEY_BLOCK.findall(data))
    if blocks != 1:
        return f"holds {blocks} PEM private keys ({len(data)} bytes); expected exactly one"
    try:
        key: PrivateKeyTypes = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        return (
            f"holds a passphrase-protected private key ({len(data)} bytes), which no server "
            "can open unattended"
        )
    except (ValueError, UnsupportedAlgorithm) as exc:
        kind = type(exc).__name__
        return f"holds a private key that cannot be read ({kind}, {len(data)} bytes)"
    if certificate is None:
        return None
    certificates, why = _certificates(certificate)
    if why or not certificates:
        return None
    if _public_key_bytes(key.public_key()) != _public_key_bytes(certificates[0].public_key()):
        return (
            f"holds a private key ({len(data)} bytes) whose public key is not that of "
            "k2_tls_cert_file's first certificate: the pair does not match"
        )
    return None


def ca_problem(data: bytes, certificate: bytes | None) -> str | None:
    """Why `data` is not a CA file that vouches for `certificate`'s chain: no certificate, a
    private key, or no certificate that is one of the chain's or signed one of them (None:
    unknown, as when the certificate is refused itself)."""
    authorities, why = _certificates(data)
    if why or certificate is None:
        return why
    chain, refused = _certificates(certificate)
    if refused or not chain:
        return None
    if any(_issued(link, authority) for link in chain for authority in authorities):
        return None
    return (
        f"holds {len(authorities)} certificate(s), none of which is or signed a certificate "
        "of k2_tls_cert_file: verify would not trust the endpoint"
    )


def _issued(certificate: x509.Certificate, authority: x509.Certificate) -> bool:
    """`certificate` is `authority`, or `authority` signed it."""
    if certificate == authority:
        return True
    try:
        certificate.verify_directly_issued_by(authority)
    except Exception:  # another issuer, a bad signature or a key type it cannot check
        return False
    return True


def endpoint_host(cluster: Cluster) -> str:
    """The host the endpoint runs on, where the launch phase copies these files: [router],
    else the first host of the first pool."""
    return cluster.router or cluster.hosts[0].name


def access_file_problems(cluster: Cluster) -> list[str]:
    """One line per access file of the inventory that cannot serve, naming the inventory, the
    endpoint's host, the variable, the path (never the contents), what it must be and the
    fix."""
    t = cluster.tunables
    where = f"{cluster.inventory}: host {endpoint_host(cluster)} (the endpoint's)"
    read: dict[str, bytes] = {}
    problems = []

    def judge(spec: AccessFile, path: str | None, problem: Callable[[bytes], str | None]) -> None:
        if not path:
            return
        fix = f"fix: {spec.fix}"
        try:
            data = read[path] if path in read else read_access_file(path)
        except VaultLocked as why:
            reason: str | None = str(why)
            fix = VAULT_FIX
        except Refused as why:
            reason = str(why)
        else:
            read[path] = data
            reason = problem(data)
        if reason:
            problems.append(
                f"{where}: {spec.variable}={path} {reason}; expected {spec.expected}; {fix}"
            )

    judge(API_KEY, t.api_key_file, api_key_problem)
    judge(TLS_CERT, t.tls_cert_file, certificate_problem)
    cert_ok = t.tls_cert_file in read and not certificate_problem(read[t.tls_cert_file])
    certificate = read[t.tls_cert_file] if cert_ok and t.tls_cert_file else None
    judge(TLS_KEY, t.tls_key_file, lambda data: private_key_problem(data, certificate))
    judge(TLS_CA, t.tls_ca_file, lambda data: ca_problem(data, certificate))
    return problems
