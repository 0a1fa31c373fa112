"""How the controller speaks to a guarded endpoint: the API key as a request header and the
CA to check its certificate against, both as the plan's access names them (the inventory's
k2_api_key_file, k2_tls_ca_file).
Both are read as the plan judged them (core/access_files.py: bounded, never blocking) and may be
ansible-vault encrypted; they are decrypted in memory with the command's vault secrets, the key
never written or printed."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from k2provision.core.access_files import (
    API_KEY,
    TLS_CA,
    Refused,
    VaultLocked,
    api_key_problem,
    certificate_problem,
    read_access_file,
)
from k2provision.core.records import AccessFiles
from k2provision.errors import K2Error
from k2provision.ops.forward import Dial


@dataclass(frozen=True)
class EndpointAccess:
    """The headers and TLS context of requests to the endpoint."""

    headers: dict[str, str] = field(default_factory=dict, repr=False)
    context: ssl.SSLContext | None = None
    dial: Dial | None = None
    """Set when the endpoint is reached through an SSH port forward: where to connect."""


def _opened(path: str, variable: str, fix: str) -> bytes:
    """An access file's bytes, read bounded and decrypted with the command's vault secrets;
    K2Error naming the file (never its contents) when it cannot be."""
    from ansible.parsing.dataloader import DataLoader

    from k2provision.core import vault

    vault.open_vault(DataLoader())
    try:
        return read_access_file(path)
    except VaultLocked as why:
        raise K2Error([f"{variable}={path} {why}; {vault.VAULT_FIX}"]) from None
    except Refused as why:
        raise K2Error([f"{variable}={path} {why}; fix: {fix}"]) from None


def read_secret(path: str) -> str:
    """A key file's key (stripped), decrypted when it is an ansible-vault file; K2Error naming
    the file when it cannot be read or holds no usable key."""
    data = _opened(path, API_KEY.variable, API_KEY.fix)
    if problem := api_key_problem(data):
        raise K2Error([f"{API_KEY.variable}={path} {problem}; fix: {API_KEY.fix}"])
    return data.decode().strip()


def read_ca(path: str) -> str:
    """The CA file's PEM text (decrypted when it is an ansible-vault file); K2Error naming the
    file when it cannot be read or holds no certificate."""
    data = _opened(path, TLS_CA.variable, TLS_CA.fix)
    if problem := certificate_problem(data):
        raise K2Error([f"{TLS_CA.variable}={path} {problem}; fix: {TLS_CA.fix}"])
    return data.decode("ascii", errors="replace")


def endpoint_access(access: AccessFiles) -> EndpointAccess:
    """What requests to the endpoint carry, as the plan's access files say."""
    headers = (
        {"Authorization": f"Bearer {read_secret(access.api_key_file)}"}
        if access.api_key_file
        else {}
    )
    context = (
        ssl.create_default_context(cadata=read_ca(access.tls_ca_file))
        if access.tls_ca_file
        else None
    )
    return EndpointAccess(headers, context)
