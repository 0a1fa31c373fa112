"""Stand-in for Open MPI's `mpirun` (part of the test double for TensorRT-LLM's GPU kernels).

It never starts remote ranks and never runs ssh. It parses -np, -H, -mca (plm_rsh_args among
them), -x and the common flags; checks that -np fits the slots of -H (unless
--oversubscribe), that root runs only with --allow-run-as-root (as Open MPI insists), that
-x names are variable names, that the ssh config file in plm_rsh_args (-F) exists and that
the sshd of every other host in -H accepts TCP connections on the plm_rsh_args port (-p),
retrying for K2_STANDIN_MPI_CONNECT_TIMEOUT seconds (default 30). Then it runs the trailing
command once, locally, as rank 0 of -np (OMPI_COMM_WORLD_* set), forwards SIGTERM/SIGINT
to it and exits with its status.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from k2standin.common import (
    Checker,
    StartError,
    env_seconds,
    is_host,
    is_local_address,
    log,
    run_entry,
    write_record,
)

ENTRY = "mpirun"
CONNECT_TIMEOUT_ENV = "K2_STANDIN_MPI_CONNECT_TIMEOUT"
# Options that take one value / two values / none, in the spellings Open MPI 4 and 5 accept.
ONE_VALUE = frozenset(
    {
        "-np",
        "--np",
        "-n",
        "-c",
        "-H",
        "-host",
        "--host",
        "-hostfile",
        "--hostfile",
        "-machinefile",
        "--machinefile",
        "-x",
        "-bind-to",
        "--bind-to",
        "-map-by",
        "--map-by",
        "-rank-by",
        "--rank-by",
        "-N",
        "-npernode",
        "--npernode",
        "-npersocket",
        "--npersocket",
        "-wdir",
        "--wdir",
        "-wd",
        "-prefix",
        "--prefix",
        "-output-filename",
        "--output-filename",
        "--output",
        "-report-uri",
        "--report-uri",
        "--timeout",
        "-timeout",
        "-launch-agent",
        "--launch-agent",
        "-tune",
        "--tune",
        "-am",
        "--am",
        "-path",
        "--path",
    }
)
TWO_VALUES = frozenset(
    {"-mca", "--mca", "-gmca", "--gmca", "-omca", "--omca", "-prtemca", "--prtemca"}
)
FLAGS = frozenset(
    {
        "--allow-run-as-root",
        "-allow-run-as-root",
        "--oversubscribe",
        "-oversubscribe",
        "--nooversubscribe",
        "-tag-output",
        "--tag-output",
        "-timestamp-output",
        "--timestamp-output",
        "-report-bindings",
        "--report-bindings",
        "-v",
        "--verbose",
        "-q",
        "--quiet",
        "-display-map",
        "--display-map",
        "-display-allocation",
        "--display-allocation",
        "-noprefix",
        "--noprefix",
        "-merge-stderr-to-stdout",
        "--merge-stderr-to-stdout",
        "-use-hwthread-cpus",
        "--use-hwthread-cpus",
        "-bind-to-core",
        "--bind-to-core",
        "-bind-to-socket",
        "--bind-to-socket",
        "-nolocal",
        "--nolocal",
        "-show-progress",
        "--show-progress",
        "-enable-recovery",
        "--enable-recovery",
        "-disable-recovery",
        "--disable-recovery",
        "--debug",
        "-d",
    }
)
_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class MpiArgs:
    np: int | None = None
    hosts: list[tuple[str, int]] = field(default_factory=list)
    mca: dict[str, str] = field(default_factory=dict)
    exports: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    command: list[str] = field(default_factory=list)

    @property
    def slots(self) -> int:
        return sum(slots for _, slots in self.hosts)


def parse(argv: Sequence[str]) -> MpiArgs:
    c = Checker(ENTRY)
    args = MpiArgs()
    i = 0
    tokens = list(argv)
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            args.command = tokens[i:]
            break
        name, eq, inline = token.partition("=")
        if name in FLAGS and not eq:
            args.flags.add(name.lstrip("-"))
            i += 1
            continue
        if name in TWO_VALUES:
            if i + 2 >= len(tokens):
                c.error(f"{name} needs KEY VALUE")
                break
            args.mca[tokens[i + 1]] = tokens[i + 2]
            i += 3
            continue
        if name in ONE_VALUE:
            if eq:
                value = inline
                i += 1
            elif i + 1 < len(tokens):
                value = tokens[i + 1]
                i += 2
            else:
                c.error(f"{name} needs a value")
                break
            _one(c, args, name, value)
            continue
        c.error(
            f"{token}: an mpirun option the stand-in does not know (add it to "
            "k2lab/standin_image if the real mpirun accepts it)"
        )
        i += 1
    if not args.command:
        c.error("no program to run after the mpirun options")
    c.done()
    return args


def _one(c: Checker, args: MpiArgs, name: str, value: str) -> None:
    if name in ("-np", "--np", "-n", "-c"):
        try:
            args.np = int(value)
            if args.np < 1:
                raise ValueError
        except ValueError:
            c.error(f"{name} {value!r}: expected a positive number of processes")
    elif name in ("-H", "-host", "--host"):
        for item in value.split(","):
            host, _, slots_text = item.partition(":")
            if not host or not is_host(host):
                c.error(f"{name} {value!r}: {item!r} is not HOST[:SLOTS]")
                continue
            try:
                slots = int(slots_text) if slots_text else 1
            except ValueError:
                c.error(f"{name} {value!r}: {item!r} has a bad slot count")
                continue
            args.hosts.append((host, slots))
    elif name == "-x":
        var = value.partition("=")[0]
        if not _VAR_RE.match(var):
            c.error(f"-x {value!r}: not an environment variable name")
        args.exports.append(value)


def check(args: MpiArgs) -> None:
    c = Checker(ENTRY)
    if (
        args.hosts
        and args.np is not None
        and args.np > args.slots
        and "oversubscribe" not in args.flags
    ):
        c.error(
            f"-np {args.np} exceeds the {args.slots} slots of -H "
            f"({','.join(f'{h}:{s}' for h, s in args.hosts)}); add slots or --oversubscribe"
        )
    if (
        os.geteuid() == 0
        and "allow-run-as-root" not in args.flags
        and not (
            os.environ.get("OMPI_ALLOW_RUN_AS_ROOT") == "1"
            and os.environ.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1"
        )
    ):
        c.error("running as root needs --allow-run-as-root (Open MPI refuses otherwise)")
    rsh = args.mca.get("plm_rsh_args")
    if rsh is not None:
        words = shlex.split(rsh)
        if "-F" in words:
            index = words.index("-F")
            config = words[index + 1] if index + 1 < len(words) else ""
            if not config or not os.path.isfile(config):
                c.error(f"-mca plm_rsh_args {rsh!r}: ssh config {config!r} does not exist")
        if "-p" in words:
            index = words.index("-p")
            port_text = words[index + 1] if index + 1 < len(words) else ""
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                c.error(f"-mca plm_rsh_args {rsh!r}: -p needs a port")
    program = args.command[0] if args.command else ""
    if program and shutil.which(program) is None:
        c.error(f"{program}: not found on PATH (mpirun would fail to launch it)")
    c.done()


def ssh_port(args: MpiArgs) -> int:
    words = shlex.split(args.mca.get("plm_rsh_args", ""))
    if "-p" in words:
        index = words.index("-p")
        if index + 1 < len(words) and words[index + 1].isdigit():
            return int(words[index + 1])
    return 22


def probe_remote(args: MpiArgs) -> None:
    """Every non-local host in -H must accept TCP on the ssh port (no ssh is run)."""
    port = ssh_port(args)
    remote = [h for h, _ in args.hosts if not is_local_address(h)]
    deadline = time.monotonic() + env_seconds(CONNECT_TIMEOUT_ENV, 30.0)
    pending = list(dict.fromkeys(remote))
    problems: dict[str, str] = {}
    while pending:
        for host in list(pending):
            try:
                socket.create_connection((host, port), timeout=3).close()
                pending.remove(host)
            except OSError as exc:
                problems[host] = exc.strerror or str(exc)
        if not pending:
            return
        if time.monotonic() > deadline:
            detail = ", ".join(f"{h}:{port} ({problems[h]})" for h in pending)
            raise StartError(
                f"cannot reach the sshd of {detail} (-mca plm_rsh_args port {port}): mpirun "
                "could not start the ranks there; is the sshd container running?"
            )
        time.sleep(1.0)


def child_env(args: MpiArgs) -> dict[str, str]:
    env = dict(os.environ)
    for item in args.exports:
        name, eq, value = item.partition("=")
        if eq:
            env[name] = value
    np = args.np if args.np is not None else max(1, args.slots)
    local = args.hosts[0][1] if args.hosts else np
    env.update(
        {
            "OMPI_COMM_WORLD_SIZE": str(np),
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(min(local, np)),
            "OMPI_COMM_WORLD_NODE_RANK": "0",
            "K2_STANDIN_MPI_HOSTS": ",".join(f"{h}:{s}" for h, s in args.hosts),
        }
    )
    return env


def run(argv: Sequence[str]) -> int:
    full_argv = ["mpirun", *argv]
    args = parse(argv)
    check(args)
    probe_remote(args)
    write_record(
        ENTRY,
        full_argv,
        ok=True,
        np=args.np,
        hosts=args.hosts,
        exports=[e.partition("=")[0] for e in args.exports],
        command=args.command,
    )
    log(
        ENTRY,
        f"stand-in: running {args.command[0]} once locally as rank 0 of "
        f"{args.np or max(1, args.slots)} (no remote ranks)",
    )
    proc = subprocess.Popen(args.command, env=child_env(args))

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = proc.wait()
    return code if code >= 0 else 128 - code


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-V"):
        print("mpirun (Open MPI) 0.0.0 (k2provision stand-in)")
        return 0
    return run_entry(ENTRY, ["mpirun", *args], lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
