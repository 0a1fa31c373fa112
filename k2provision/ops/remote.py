"""Quick questions to many hosts over SSH, in parallel: the transport of `status` and `logs`.

A playbook run per question is too slow for a 16-host status; here each host gets one SSH
session (fabric over paramiko) running one shell command, all hosts at once, each with its own
timeout. A host that cannot be reached is a result (`unreachable: <reason>`), never a
traceback.

Connection parameters come from the inventory exactly as Ansible reads them (`ssh_inventory`):
`ansible_host`, `ansible_port`, `ansible_user`, `ansible_ssh_private_key_file` and the
`-o Key=Value` options of `ansible_ssh_common_args` / `ansible_ssh_extra_args`
(UserKnownHostsFile, StrictHostKeyChecking, ConnectTimeout, IdentityFile, IdentitiesOnly,
Port, User; others are listed in `SshTarget.ignored`). Host keys are checked as OpenSSH
would: against the named known_hosts files (else ~/.ssh/known_hosts), unknown keys refused
unless StrictHostKeyChecking is `no`/`accept-new` or Ansible's host key checking is off. The
private key's contents are read by paramiko only; nothing here prints or records them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SSH_VARS = (
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
)
# OpenSSH options this layer honours; any other -o option is reported as ignored.
_HONOURED = {
    "userknownhostsfile",
    "globalknownhostsfile",
    "stricthostkeychecking",
    "connecttimeout",
    "identityfile",
    "identitiesonly",
    "port",
    "user",
    "batchmode",
    "serveraliveinterval",
    "serveralivecountmax",
    "controlmaster",
    "controlpersist",
    "controlpath",
}
DEFAULT_CONNECT_TIMEOUT = 10.0

# paramiko logs a failed handshake with its traceback from its transport thread; here such a
# host is a result with its reason, so its log stays out of the user's terminal.
_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False


@dataclass(frozen=True)
class SshTarget:
    """How to reach one inventory host, as Ansible's ssh connection would."""

    name: str
    host: str
    port: int = 22
    user: str | None = None
    key_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()
    """known_hosts files to trust; empty: ~/.ssh/known_hosts."""
    strict: str = "ask"
    """StrictHostKeyChecking: yes / ask (refuse unknown, nobody to ask) / accept-new / no."""
    identities_only: bool = False
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    ignored: tuple[str, ...] = field(default=())
    """SSH options in the inventory this layer does not apply (shown as a warning)."""


def _ssh_options(text: str) -> tuple[dict[str, list[str]], list[str]]:
    """`-o K=V -o K V -i F -p P -l U` -> ({lowercased key: [values]}, unparsed words)."""
    flags = {"-i": "identityfile", "-p": "port", "-l": "user"}
    options: dict[str, list[str]] = {}
    other: list[str] = []
    words = shlex.split(text)
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-o", *flags) and i + 1 < len(words):
            value = words[i + 1]
            i += 2
            if word != "-o":
                options.setdefault(flags[word], []).append(value)
                continue
            key, sep, rest = value.partition("=")
            if not sep:
                key, _, rest = value.partition(" ")
            options.setdefault(key.strip().lower(), []).append(rest.strip())
            continue
        if word.startswith("-o") and len(word) > 2:
            key, _, rest = word[2:].partition("=")
            options.setdefault(key.strip().lower(), []).append(rest.strip())
        else:
            other.append(word)
        i += 1
    return options, other


def _first(values: Mapping[str, Any], *names: str) -> Any:
    return next((values[n] for n in names if values.get(n) not in (None, "")), None)


def ssh_target(
    name: str, host_vars: Mapping[str, Any], *, host_key_checking: bool = True
) -> SshTarget:
    """The SSH parameters of one host from its inventory variables. Pure."""
    args = " ".join(
        str(host_vars[k])
        for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")
        if host_vars.get(k)
    )
    options, other = _ssh_options(args)

    def last(key: str) -> str | None:
        return options[key][-1] if options.get(key) else None

    key_files = [str(k) for k in [_first(host_vars, "ansible_ssh_private_key_file",
                                         "ansible_private_key_file")] if k]  # fmt: skip
    key_files += options.get("identityfile", [])
    port = _first(host_vars, "ansible_port", "ansible_ssh_port") or last("port") or 22
    strict = (last("stricthostkeychecking") or ("ask" if host_key_checking else "no")).lower()
    timeout = last("connecttimeout")
    return SshTarget(
        name=name,
        host=str(_first(host_vars, "ansible_host", "ansible_ssh_host") or name),
        port=int(port),
        user=str(_first(host_vars, "ansible_user", "ansible_ssh_user") or last("user") or "")
        or None,
        key_files=tuple(os.path.expanduser(k) for k in key_files),
        known_hosts=tuple(
            os.path.expanduser(f)
            for v in options.get("userknownhostsfile", [])
            for f in v.split()
            if f != "/dev/null"
        ),
        strict={"yes": "yes", "true": "yes", "no": "no", "false": "no", "off": "no"}.get(
            strict, strict
        ),
        identities_only=(last("identitiesonly") or "no").lower() in ("yes", "true"),
        connect_timeout=float(timeout) if timeout else DEFAULT_CONNECT_TIMEOUT,
        ignored=tuple(sorted(k for k in options if k not in _HONOURED)) + tuple(other),
    )


def host_key_checking(environ: Mapping[str, str]) -> bool:
    """Ansible's host_key_checking as the environment sets it (the project's ansible.cfg
    keeps it on)."""
    value = environ.get("ANSIBLE_HOST_KEY_CHECKING", "true").strip().lower()
    return value not in ("false", "no", "0", "off")


def ssh_inventory(inventory: Path) -> tuple[dict[str, list[str]], dict[str, SshTarget]]:
    """The inventory's groups (group -> hosts) and every host's SSH parameters, read with
    Ansible's own loader."""
    from k2provision.core.inventory import read_inventory

    groups, host_vars = read_inventory(inventory, extra_keys=SSH_VARS)
    checking = host_key_checking(os.environ)
    targets = {
        name: ssh_target(name, values, host_key_checking=checking)
        for name, values in host_vars.items()
    }
    return groups, targets


def ignored_options(targets: Mapping[str, SshTarget]) -> list[str]:
    """A warning naming the inventory's SSH options this layer does not apply (none: [])."""
    ignored = sorted({o for t in targets.values() for o in t.ignored})
    return [f"SSH options not applied here: {', '.join(ignored)}"] if ignored else []


@dataclass(frozen=True)
class Reply:
    """What one host answered: its command's output and exit code, or why it could not."""

    host: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    unreachable: str = ""
    """Non-empty when the host was not reached or did not answer in time: the reason."""

    @property
    def reached(self) -> bool:
        """True when the command ran on the host (whatever its exit code)."""
        return not self.unreachable


def _reason(error: BaseException) -> str:
    """A one-line reason for a failed connection, without anything secret."""
    import paramiko

    if isinstance(error, paramiko.BadHostKeyException):
        return f"host key mismatch for {error.hostname}"
    if isinstance(error, paramiko.SSHException) and "not found in known_hosts" in str(error):
        return f"{error}; fix: add the host key to the known_hosts file the inventory names"
    if isinstance(error, paramiko.AuthenticationException):
        return "authentication failed (check ansible_user and ansible_ssh_private_key_file)"
    if isinstance(error, socket.timeout | TimeoutError):
        return "timed out"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def host_key_policy(strict: str) -> Any:
    """OpenSSH's StrictHostKeyChecking as a paramiko policy for unknown host keys: refused,
    unless `no`/`accept-new`, where the key is trusted for this connection only (known_hosts
    files are never written: many hosts at once would race on them)."""
    import paramiko

    if strict not in ("no", "accept-new"):
        return paramiko.RejectPolicy()

    class AcceptUnsaved(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
            del client, hostname, key

    return AcceptUnsaved()


def connection(target: SshTarget) -> Any:
    """A fabric Connection for `target` (not yet open), with OpenSSH's host key rules."""
    import paramiko
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False})
    connect_kwargs: dict[str, Any] = {
        "key_filename": list(target.key_files),
        "look_for_keys": not target.identities_only,
        "allow_agent": not target.identities_only,
        "banner_timeout": target.connect_timeout,
        "auth_timeout": target.connect_timeout,
    }
    conn = Connection(
        target.host,
        user=target.user,
        port=target.port,
        config=config,
        connect_timeout=max(1, round(target.connect_timeout)),
        connect_kwargs=connect_kwargs,
    )
    client: paramiko.SSHClient = conn.client
    known = target.known_hosts or (os.path.expanduser("~/.ssh/known_hosts"),)
    for path in known:
        if os.path.exists(path):
            client.load_host_keys(path)
    client.set_missing_host_key_policy(host_key_policy(target.strict))
    return conn


def run_one(target: SshTarget, command: str, timeout: float) -> Reply:
    """`command` on one host; any failure to reach it or to finish in time is a Reply."""
    conn = connection(target)
    try:
        result = conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        return Reply(target.name, result.stdout, result.stderr, int(result.exited))
    except Exception as error:  # every failure of one host is that host's result
        from invoke.exceptions import CommandTimedOut

        if isinstance(error, CommandTimedOut):
            return Reply(target.name, unreachable=f"no answer within {timeout:g} s")
        return Reply(target.name, unreachable=_reason(error))
    finally:
        conn.close()


def run_all(
    commands: Mapping[str, tuple[SshTarget, str]], timeout: float = 20.0
) -> dict[str, Reply]:
    """Each host's command, every host at once (one thread and one session per host)."""
    if not commands:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(commands))) as pool:
        futures = {
            name: pool.submit(run_one, target, command, timeout)
            for name, (target, command) in commands.items()
        }
        return {name: future.result() for name, future in futures.items()}


class Stream:
    """A long-running command on one host whose output arrives line by line (`logs
    --follow`). It runs under a pseudo-terminal, so closing the stream ends the remote command
    (the host's sshd hangs it up)."""

    def __init__(self, target: SshTarget, command: str) -> None:
        self.target = target
        self.command = command
        self._conn: Any = None
        self._channel: Any = None
        self._closed = threading.Event()

    def lines(self) -> Iterator[str]:
        """The command's output lines until it ends or the stream is closed; raises
        ConnectionError (with a reason) when the host cannot be reached."""
        try:
            self._conn = connection(self.target)
            self._conn.open()
            self._channel = self._conn.client.get_transport().open_session()
            self._channel.get_pty(width=500)
            self._channel.exec_command(self.command)
        except Exception as error:  # the host's reason, as one line
            self.close()
            raise ConnectionError(_reason(error)) from None
        pending = b""
        while not self._closed.is_set():
            try:
                chunk = self._channel.recv(65536)
            except (OSError, EOFError):
                break
            if not chunk:
                break
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                yield raw.decode(errors="replace").rstrip("\r")
        if pending and not self._closed.is_set():
            yield pending.decode(errors="replace").rstrip("\r")

    def close(self) -> None:
        """End the remote command and the connection (safe to call twice, from any thread)."""
        self._closed.set()
        for closing in (self._channel, self._conn):
            if closing is not None:
                with contextlib.suppress(Exception):  # closing what is already gone is fine
                    closing.close()


def follow_all(
    streams: Mapping[str, Stream], on_line: Callable[[str, str], None]
) -> dict[str, str]:
    """Read every stream at once (a thread each), passing (name, line) to `on_line`, until
    all end or Ctrl-C; returns per stream the reason it could not start or ended with an
    error ("" when it ended cleanly). Ctrl-C closes every stream, then returns."""
    errors: dict[str, str] = dict.fromkeys(streams, "")

    def pump(name: str, stream: Stream) -> None:
        try:
            for line in stream.lines():
                on_line(name, line)
        except ConnectionError as error:
            errors[name] = f"unreachable: {error}"

    threads = [
        threading.Thread(target=pump, args=(n, s), daemon=True, name=f"follow-{n}")
        for n, s in streams.items()
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for stream in streams.values():
            stream.close()
        for thread in threads:
            thread.join(5)
    return errors
