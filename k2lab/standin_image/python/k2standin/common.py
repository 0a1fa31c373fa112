"""Pieces every stand-in entry point shares: option scanning, checks, records, signals.

The option scanner is deliberately loose: an option takes every following token up to the
next option as its values. It is not the engines' parser (k2provision checks rendered
argvs against the real parsers elsewhere); it only finds the options these checks need.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from k2standin import faults

if TYPE_CHECKING:
    from k2standin.drain import Drain

RECORD_DIR_ENV = "K2_STANDIN_RECORD_DIR"
DEFAULT_RECORD_DIR = "/run/k2-standin"
GPUS_PER_NODE_ENV = "K2_STANDIN_GPUS_PER_NODE"
DEFAULT_GPUS_PER_NODE = 8

# Options that engines no longer accept (or that mean something else now); a launch that
# still carries one would fail on the real image.
STALE_FLAGS: dict[str, str] = {
    "--enable-deepep-moe": "removed from SGLang; use --moe-a2a-backend deepep",
    "--enable-ep-moe": "removed from SGLang; use --ep-size",
    "--nccl-init-addr": "renamed in SGLang; use --dist-init-addr",
    "--cuda-graph-bs": "stale batch-size list; use --cuda-graph-max-bs (or the per-mode form)",
}

KIMI_TOOL_PARSER = "kimi_k2"
# Kimi-K2's routed experts, for a model directory whose config.json does not say.
KIMI_K2_ROUTED_EXPERTS = 384
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_NUMBER_RE = re.compile(r"^-\d+(\.\d+)?$")


class Rejected(Exception):
    """The argv would not start the real engine for this deployment."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


class StartError(Exception):
    """The argv was acceptable but the process cannot run here (a port is taken, a peer
    refused it, ...): exit status 1."""


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NUMBER_RE.match(token)


@dataclass
class Opts:
    """Options in order of appearance: name -> list of occurrences, each a list of values."""

    occurrences: dict[str, list[list[str]]] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def has(self, *names: str) -> bool:
        return any(n in self.occurrences for n in names)

    def name_of(self, *names: str) -> str | None:
        """The first of `names` that is present."""
        return next((n for n in names if n in self.occurrences), None)

    def values(self, *names: str) -> list[str]:
        """Every value of every occurrence of any of `names`."""
        out: list[str] = []
        for name in names:
            for occurrence in self.occurrences.get(name, []):
                out.extend(occurrence)
        return out

    def groups(self, *names: str) -> list[list[str]]:
        """Each occurrence's values, for options that repeat (`--prefill URL PORT`)."""
        out: list[list[str]] = []
        for name in names:
            out.extend(self.occurrences.get(name, []))
        return out

    def value(self, *names: str) -> str | None:
        """The first value of the last occurrence (argparse: the last one wins)."""
        for name in names:
            occ = self.occurrences.get(name)
            if occ:
                last = occ[-1]
                return last[0] if last else ""
        return None


def scan(argv: Sequence[str]) -> Opts:
    """Split argv into options and positionals.

    Tokens before the first option are positionals (`vllm serve MODEL`); after an option,
    tokens up to the next option are its values. `--name=value` is one option, one value.
    """
    opts = Opts()
    i = 0
    tokens = list(argv)
    while i < len(tokens) and not _is_option(tokens[i]):
        opts.positionals.append(tokens[i])
        i += 1
    current: str | None = None
    for token in tokens[i:]:
        if _is_option(token):
            name, eq, inline = token.partition("=")
            values = [inline] if eq else []
            opts.occurrences.setdefault(name, []).append(values)
            opts.order.append(name)
            current = name if not eq else None
        elif current is not None:
            opts.occurrences[current][-1].append(token)
        else:
            opts.positionals.append(token)
    return opts


# ---------------------------------------------------------------- checks


class Checker:
    """Collects problems so one run reports all of them."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        self.errors: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def done(self) -> None:
        if self.errors:
            raise Rejected(self.errors)

    # -- generic checks

    def stale(self, argv: Sequence[str]) -> None:
        for token in argv:
            name = token.partition("=")[0]
            if name in STALE_FLAGS:
                self.error(f"{name} is a stale option: {STALE_FLAGS[name]}")

    def required(self, opts: Opts, *names: str) -> str | None:
        value = opts.value(*names)
        if value is None:
            self.error(f"{' / '.join(names)} is required")
            return None
        if value == "":
            self.error(f"{names[0]} needs a value")
            return None
        return value

    def model_dir(self, option: str, value: str | None) -> None:
        if value is None:
            return
        if not Path(value).is_dir():
            self.error(f"{option} {value}: no such model directory")

    def tool_parser(self, opts: Opts, *names: str) -> None:
        value = opts.value(*names)
        if value is None:
            self.error(f"{names[0]} {KIMI_TOOL_PARSER} is required (Kimi-K2 tool calls)")
        elif value != KIMI_TOOL_PARSER:
            self.error(f"{names[0]} {value}: Kimi-K2 needs {names[0]} {KIMI_TOOL_PARSER}")

    def flag(self, opts: Opts, name: str, why: str) -> None:
        if not opts.has(name):
            self.error(f"{name} is required ({why})")

    def positive_int(self, opts: Opts, *names: str, default: int | None = None) -> int | None:
        value = opts.value(*names)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            self.error(f"{names[0]} {value!r}: expected a whole number")
            return None
        if number < 1:
            self.error(f"{names[0]} {number}: expected at least 1")
            return None
        return number

    def host(self, opts: Opts, default: str, name: str = "--host") -> str:
        value = opts.value(name)
        if value is None:
            return default
        if not is_host(value):
            self.error(f"{name} {value!r}: not an IP address or host name")
        return value

    def port(self, opts: Opts, default: int, name: str = "--port") -> int:
        value = opts.value(name)
        if value is None:
            return default
        number = parse_port(value)
        if number is None:
            self.error(f"{name} {value!r}: expected a port number 1-65535")
            return default
        return number

    def address(self, option: str, value: str) -> tuple[str, int] | None:
        """`host:port` (IPv6 as `[addr]:port`)."""
        parsed = split_host_port(value)
        if parsed is None:
            self.error(f"{option} {value!r}: expected HOST:PORT")
        return parsed


def routed_experts(model_dir: str | None) -> int:
    """n_routed_experts of the model's config.json (Kimi-K2's when it does not say)."""
    try:
        config = json.loads((Path(model_dir or "") / "config.json").read_text())
        return int(config.get("n_routed_experts", KIMI_K2_ROUTED_EXPERTS))
    except (OSError, ValueError, TypeError, AttributeError):
        return KIMI_K2_ROUTED_EXPERTS


def is_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return bool(_HOSTNAME_RE.match(value))
    return True


def parse_port(value: str) -> int | None:
    try:
        number = int(value)
    except ValueError:
        return None
    return number if 1 <= number <= 65535 else None


def split_host_port(value: str) -> tuple[str, int] | None:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        return None
    host = host.strip("[]")
    port = parse_port(port_text)
    if port is None or not is_host(host):
        return None
    return host, port


def gpus_per_node() -> int:
    try:
        return max(0, int(os.environ.get(GPUS_PER_NODE_ENV, DEFAULT_GPUS_PER_NODE)))
    except ValueError:
        return DEFAULT_GPUS_PER_NODE


def env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def is_local_address(host: str) -> bool:
    """Whether this machine can bind `host` (it is one of its addresses)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


# ---------------------------------------------------------------- records


def record_dir() -> Path:
    return Path(os.environ.get(RECORD_DIR_ENV, DEFAULT_RECORD_DIR))


def write_record(entry: str, argv: Sequence[str], **extra: Any) -> Path | None:
    """Write `<record dir>/<entry>-<pid>.json`: the argv and the environment's keys (never
    its values, which may hold secrets). Returns the path, or None when it cannot be written."""
    directory = record_dir()
    path = directory / f"{entry}-{os.getpid()}.json"
    doc: dict[str, Any] = {
        "entry": entry,
        "pid": os.getpid(),
        "argv": list(argv),
        "env_keys": sorted(os.environ),
        "cwd": os.getcwd(),
        "time": time.time(),
        **extra,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:
        log(entry, f"warning: cannot write record {path}: {exc}")
        return None
    return path


def spec_digest(argv: Sequence[str]) -> str:
    """A short digest of a launch argv: the spec a server runs, as `/standin/info` reports it
    (`standin_spec`), so a smoke test tells a new spec from the old."""
    return hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]


def log(entry: str, message: str) -> None:
    print(f"[k2-standin {entry}] {message}", file=sys.stderr, flush=True)


def reject(entry: str, argv: Sequence[str], errors: Iterable[str]) -> int:
    """Report rejected options; the exit status of an argument error (2)."""
    problems = list(errors)
    for problem in problems:
        print(f"k2-standin {entry}: error: {problem}", file=sys.stderr, flush=True)
    print(
        f"k2-standin {entry}: refusing to start (this stand-in replaces only the GPU kernels; "
        "the real engine would refuse or misbehave with this command line)",
        file=sys.stderr,
        flush=True,
    )
    write_record(entry, argv, ok=False, errors=problems)
    return 2


def run_entry(entry: str, full_argv: Sequence[str], body: Callable[[], int]) -> int:
    """Run an entry point: Rejected -> exit 2 with the problems, StartError -> exit 1."""
    stop = faults.at_start(entry)
    if stop is not None:
        return stop
    try:
        return body()
    except Rejected as exc:
        return reject(entry, full_argv, exc.errors)
    except StartError as exc:
        print(f"k2-standin {entry}: error: {exc}", file=sys.stderr, flush=True)
        write_record(entry, full_argv, ok=False, errors=[str(exc)])
        return 1


# ---------------------------------------------------------------- lifetime


class Runtime:
    """Stop on SIGTERM/SIGINT (exit 0) or on a fatal error from any thread (exit 1)."""

    def __init__(self, entry: str) -> None:
        self.entry = entry
        self.stop = threading.Event()
        self.fatal_message: str | None = None
        self._lock = threading.Lock()

    def install_signals(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            del frame
            log(self.entry, f"received {signal.Signals(signum).name}, exiting")
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def drain_on_sigterm(self, drain: Drain, timeout: float | None) -> None:
        """On SIGTERM, drain first (k2standin.drain): stop taking requests, then stop once
        those in flight are answered or `timeout` seconds passed (None: no limit; 0: at
        once, the in-flight ones cut off). SIGINT, or a second SIGTERM, stops at once."""

        def finish() -> None:
            if not drain.wait_idle(timeout):
                log(
                    self.entry,
                    f"drain timeout {timeout:g} s passed with {drain.inflight} "
                    "request(s) in flight, exiting",
                )
            self.stop.set()

        def handler(signum: int, frame: FrameType | None) -> None:
            del frame
            if signum != signal.SIGTERM or drain.draining or timeout == 0:
                log(self.entry, f"received {signal.Signals(signum).name}, exiting")
                self.stop.set()
                return
            inflight = drain.start()
            limit = "no time limit" if timeout is None else f"at most {timeout:g} s"
            log(
                self.entry,
                f"received SIGTERM, draining {inflight} request(s) in flight "
                f"({limit}), refusing new ones",
            )
            threading.Thread(target=finish, daemon=True).start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def fatal(self, message: str) -> None:
        with self._lock:
            if self.fatal_message is None:
                self.fatal_message = message
        self.stop.set()

    def wait(self) -> int:
        """Block until stopped; the exit status."""
        while not self.stop.wait(0.5):
            pass
        if self.fatal_message is not None:
            log(self.entry, f"fatal: {self.fatal_message}")
            return 1
        return 0

    def sleep(self, seconds: float) -> bool:
        """Sleep unless stopped first; True when stopped."""
        return self.stop.wait(seconds)
