"""Running the real CLI on an inventory while proving that no host is contacted.

Hosts of the test inventories point at documentation addresses (192.0.2.N, 10.9.N.N; a
cluster of several hosts may not use loopback) with ansible_port at a local listener that
records any connection, and PATH starts with `ssh`/`scp`/`sftp` stand-ins that record being run
and fail: a command that reaches for a host through Ansible leaves a trace, and one that
connects by itself finds no host and fails the test's exit-code check.
"""

from __future__ import annotations

import os
import select
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

SSH_TOOLS = ("ssh", "scp", "sftp")


@dataclass
class HostTrap:
    """A listener every test host points at, and a PATH whose ssh records its use."""

    port: int
    ssh_log: Path
    listener: socket.socket
    runner: CliRunner = field(default_factory=CliRunner)

    def contacted(self) -> list[str]:
        """What reached for a host so far: ssh runs, then connections to the listener."""
        found = self.ssh_log.read_text().splitlines() if self.ssh_log.exists() else []
        while select.select([self.listener], [], [], 0)[0]:
            peer, address = self.listener.accept()
            peer.close()
            found.append(f"connection from {address}")
        return found

    def run(self, *args: str) -> tuple[int, str, str, BaseException | None]:
        """The real CLI in-process: (exit code, stdout, stderr, unexpected exception)."""
        from k2provision.cli import build_app

        result = self.runner.invoke(build_app(), list(args))
        unexpected = None if isinstance(result.exception, SystemExit | None) else result.exception
        return result.exit_code, result.stdout, result.stderr, unexpected


@pytest.fixture
def host_trap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostTrap]:
    """A HostTrap for one test; it fails the test if anything contacted a host."""
    bin_dir = tmp_path / "trap-bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh-runs.log"
    for tool in SSH_TOOLS:
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexit 255\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    trap = HostTrap(port=listener.getsockname()[1], ssh_log=log, listener=listener)
    try:
        yield trap
        assert trap.contacted() == [], "a host was contacted"
    finally:
        listener.close()
