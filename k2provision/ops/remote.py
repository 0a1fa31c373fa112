"""Quick questions to many hosts over SSH, in parallel: the transport of `status` and `logs`.

A playbook run per question is too slow for a 16-host status; here each host gets one `ssh`
running one shell command, all hosts at once, each with its own timeout. The ssh argv is the
one Ansible would use for the host (connect.py), so bastions, ~/.ssh/config, the agent and
host key checking apply as they do for `apply`. A host that cannot be reached is a result
(`unreachable: <reason naming the setting that failed>`), never a traceback.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from k2provision.ops.connect import (
    SSH_VARS,
    SshTarget,
    ssh_command,
    ssh_target,
    unreachable_reason,
)

SSH_UNREACHABLE = 255
"""ssh's own exit status when it could not run the command (any other is the command's)."""


def ssh_inventory(inventory: Path) -> tuple[dict[str, list[str]], dict[str, SshTarget]]:
    """The inventory's groups (group -> hosts) and every host's connection settings, read
    with Ansible's own loader."""
    from k2provision.core.inventory import read_inventory

    groups, host_vars = read_inventory(inventory, extra_keys=SSH_VARS)
    return groups, {name: ssh_target(name, values) for name, values in host_vars.items()}


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


def _unreachable(target: SshTarget, argv: list[str], stderr: str) -> Reply:
    """The host as unreachable, with the setting that failed (argv ends with the command)."""
    return Reply(target.name, unreachable=unreachable_reason(target, argv, stderr))


def _started(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    """ssh in a session of its own: no terminal to prompt on, and Ctrl-C reaches it only
    through us."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)  # type: ignore[call-overload, no-any-return]


def run_one(target: SshTarget, command: str, timeout: float) -> Reply:
    """`command` on one host; any failure to reach it or to finish in time is a Reply."""
    argv = ssh_command(target, command)
    # Files, not pipes: a control master that ssh leaves behind may hold a pipe open.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = _started(argv, stdout=out, stderr=err)
        except OSError as error:
            return Reply(target.name, unreachable=f"cannot run {argv[0]}: {error.strerror}")
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return Reply(target.name, unreachable=f"no answer within {timeout:g} s")
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if code == SSH_UNREACHABLE:
        return _unreachable(target, argv, stderr)
    return Reply(target.name, stdout, stderr, code)


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
    --follow`). It runs under a pseudo-terminal (`ssh -tt`), so closing the stream ends the
    remote command (the host's sshd hangs it up)."""

    def __init__(self, target: SshTarget, command: str) -> None:
        self.target = target
        self.command = command
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = threading.Event()

    def lines(self) -> Iterator[str]:
        """The command's output lines until it ends or the stream is closed; raises
        ConnectionError (with a reason) when the host cannot be reached."""
        argv = ssh_command(self.target, self.command, tty=True)
        with tempfile.TemporaryFile() as err:
            try:
                self._process = _started(argv, stdout=subprocess.PIPE, stderr=err)
            except OSError as error:
                raise ConnectionError(f"cannot run {argv[0]}: {error.strerror}") from None
            assert self._process.stdout is not None
            seen = False
            for raw in iter(self._process.stdout.readline, b""):
                seen = True
                if self._closed.is_set():
                    break
                yield raw.decode(errors="replace").rstrip("\r\n")
            code = self._process.wait()
            if code == SSH_UNREACHABLE and not seen and not self._closed.is_set():
                err.seek(0)
                stderr = err.read().decode(errors="replace")
                raise ConnectionError(_unreachable(self.target, argv, stderr).unreachable)

    def close(self) -> None:
        """End the remote command and the connection (safe to call twice, from any thread)."""
        self._closed.set()
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                process.terminate()


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
