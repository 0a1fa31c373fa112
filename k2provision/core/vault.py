"""Ansible Vault, as ansible-playbook opens it: the vault options of a command, the secrets they
load, and the one rule for vaulted values (the plan never holds a decrypted one).

A command's options are set once per invocation (`use`), read wherever an inventory is loaded
(`open_vault`) and handed to ansible-playbook (`playbook_args`), so the inventory the plan reads
and the inventory the playbook reads are opened with the same secrets. ANSIBLE_VAULT_PASSWORD_FILE
and ANSIBLE_VAULT_IDENTITY_LIST apply as they do to ansible-playbook (Ansible's own config).
"""

from __future__ import annotations

import getpass
import re
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from k2provision.errors import InventoryError

# How a vaulted value is shown anywhere the product writes or prints it.
VAULTED = "(vaulted)"
# ansible-playbook's prompt for --ask-vault-pass, which a run answers with the password given.
ASK_PROMPT = r"^Vault password:\s*?$"
# --vault-id LABEL@prompt: asked for by this wording, here and by ansible-playbook.
PROMPT_SOURCE = "prompt"
VAULT_FIX = (
    "fix: pass --vault-password-file FILE, --vault-id ID@FILE or --ask-vault-pass (or set "
    "ANSIBLE_VAULT_PASSWORD_FILE), the password the value was encrypted with"
)


@dataclass(frozen=True)
class VaultOptions:
    """--vault-password-file, --vault-id and --ask-vault-pass of one command."""

    password_files: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()
    ask: bool = False
    password: str | None = field(default=None, repr=False)
    """The password typed for --ask-vault-pass (asked once, for the inventory and the run)."""
    prompted: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """(label, password) typed for each --vault-id LABEL@prompt, asked once likewise."""

    def prompted_labels(self) -> tuple[str, ...]:
        """The labels of the --vault-id LABEL@prompt options."""
        return tuple(
            label
            for label, _, source in (v.rpartition("@") for v in self.vault_ids)
            if source == PROMPT_SOURCE and label
        )


_current: ContextVar[VaultOptions | None] = ContextVar("k2_vault_options", default=None)


def use(**changes: Any) -> None:
    """Set some of the current command's vault options (each option's parser sets its own)."""
    _current.set(replace(_current.get() or VaultOptions(), **changes))


def current() -> VaultOptions:
    """The current command's vault options; with --ask-vault-pass, the password is asked here,
    once, and kept for the inventory and the run."""
    options = _current.get() or VaultOptions()
    if options.ask and options.password is None:
        options = replace(options, password=getpass.getpass("Vault password: "))
        _current.set(options)
    if len(options.prompted) < len(options.prompted_labels()):
        typed = tuple(
            (label, getpass.getpass(f"Vault password ({label}): "))
            for label in options.prompted_labels()
        )
        options = replace(options, prompted=typed)
        _current.set(options)
    return options


def open_vault(loader: Any) -> None:
    """Load the current secrets into `loader` and into Ansible's vault context (which decrypts
    vaulted values when they are read); InventoryError when a password file cannot be read."""
    from ansible import constants as C
    from ansible.cli import CLI
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecret, VaultSecretsContext

    options = current()
    asked = {f"{label}@{PROMPT_SOURCE}" for label, _ in options.prompted}
    vault_ids = [*C.DEFAULT_VAULT_IDENTITY_LIST, *(v for v in options.vault_ids if v not in asked)]
    try:
        secrets: list[tuple[str, Any]] = CLI.setup_vault_secrets(
            loader,
            vault_ids,
            list(options.password_files),
            ask_vault_pass=False,
            auto_prompt=False,
            initialize_context=False,
        )
    except AnsibleError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InventoryError(
            [f"vault password: {first}; expected a readable password file or script; {VAULT_FIX}"]
        ) from None
    if options.password is not None:
        secrets.append((C.DEFAULT_VAULT_IDENTITY, VaultSecret(options.password.encode())))
    secrets += [(label, VaultSecret(password.encode())) for label, password in options.prompted]
    loader.set_vault_secrets(secrets)
    # One process may read several inventories (tests, a command that reads twice): the context
    # holds the secrets of the latest read, as one ansible-playbook run holds its own.
    VaultSecretsContext._current = VaultSecretsContext(secrets)


def is_vaulted(value: Any) -> bool:
    """True for a value that came out of Ansible Vault (encrypted, or decrypted from it)."""
    from ansible.parsing.vault import EncryptedString, VaultHelper

    return (
        isinstance(value, EncryptedString)
        or VaultHelper.get_ciphertext(value, with_tags=False) is not None
    )


def decrypted(value: Any) -> str:
    """A vaulted value's plain text; ValueError (the reason) when no secret given opens it."""
    from ansible.module_utils._internal._datatag import AnsibleTagHelper

    try:
        return str(
            AnsibleTagHelper.untag(
                value._native_copy() if hasattr(value, "_native_copy") else value
            )
        )
    except Exception as exc:  # Ansible's reason: no secrets, or none that matches
        raise ValueError((str(exc).strip().splitlines() or [type(exc).__name__])[0]) from None


def prompt_answers(options: VaultOptions) -> dict[str, str]:
    """ansible-playbook's vault prompts (as patterns) and the passwords typed for them."""
    answers = {ASK_PROMPT: options.password} if options.password is not None else {}
    answers |= {
        rf"^Vault password \({re.escape(label)}\):\s*?$": password
        for label, password in options.prompted
    }
    return answers


def playbook_args(options: VaultOptions) -> list[str]:
    """ansible-playbook's vault arguments for `options` (the environment carries the rest)."""
    args = [f"--vault-password-file={path}" for path in options.password_files]
    args += [f"--vault-id={vault_id}" for vault_id in options.vault_ids]
    if options.password is not None:
        args.append("--ask-vault-pass")
    return args
