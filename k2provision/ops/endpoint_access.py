"""How the controller speaks to a guarded endpoint: the API key as a request header and the
CA to check its certificate against, both as the plan's access names them (the inventory's
k2_api_key_file, k2_tls_ca_file).
The key file may be ansible-vault encrypted; it is decrypted in memory with the command's vault
secrets, never written or printed."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

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


def read_secret(path: str) -> str:
    """A key file's text, decrypted when it is an ansible-vault file; K2Error naming the file
    when it cannot be read or is empty."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader

    from k2provision.core import vault

    loader = DataLoader()
    vault.open_vault(loader)
    try:
        data, _ = loader._get_file_contents(path)
    except AnsibleError as error:
        first = (str(error).strip().splitlines() or ["unreadable"])[0]
        raise K2Error(
            [f"k2_api_key_file {path}: {first}; fix: point it at the key's file"]
        ) from None
    text = str(data.decode(errors="replace")).strip()
    if not text:
        raise K2Error([f"k2_api_key_file {path} is empty; fix: put the endpoint's key in it"])
    return text


def endpoint_access(access: AccessFiles) -> EndpointAccess:
    """What requests to the endpoint carry, as the plan's access files say."""
    headers = (
        {"Authorization": f"Bearer {read_secret(access.api_key_file)}"}
        if access.api_key_file
        else {}
    )
    context = ssl.create_default_context(cafile=access.tls_ca_file) if access.tls_ca_file else None
    return EndpointAccess(headers, context)
