"""A harness that drives relays directly, for the tests and benchmarks (the product drives them
through the k2_weights role): start the relays, run the seed, collect results.

One ``relay.pyz serve`` per target host, started through the target's launcher (a local
python, ``nsenter`` into a lab namespace, ``ssh``), then one ``relay.pyz send`` on the seed.
``mode="chain"`` streams down the targets in order, each host forwarding while it receives;
``mode="fanout"`` is the baseline where the seed sends the whole set to every host itself.
The relays' JSON-lines events come back as ``RelayEvent``s (for a live bar), and the end
of the run as one ``BroadcastResult``. Secrets in the environment never reach the relays.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, get_args

from pydantic import Field

from k2provision.core.records import Record
from k2provision.weights.kernel import common, synthetic
from k2provision.weights.manifest import Manifest
from k2provision.weights.relay_app import relay_app

RELAY_SCRIPT = relay_app()
DEFAULT_CHUNK = 8 << 20
SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

Launcher = Callable[[Sequence[str]], list[str]]
"""Relay arguments (``serve ...`` / ``send ...``) -> the full argv that runs relay.pyz."""

Mode = Literal["chain", "fanout"]
HostStatus = Literal["ok", "incomplete", "refused", "cancelled", "skipped", "lost"]
_STATUSES: dict[str, HostStatus] = {s: s for s in get_args(HostStatus)}


def local_launcher(python: str | None = None, script: Path = RELAY_SCRIPT) -> Launcher:
    """Run the relay here, with ``python`` (default: this interpreter)."""
    py = python or sys.executable

    def argv(args: Sequence[str]) -> list[str]:
        return [py, str(script), *args]

    return argv


def nsenter_launcher(netns: str, python: str = "python3", script: Path = RELAY_SCRIPT) -> Launcher:
    """Run the relay inside the named network namespace (/run/netns/NAME) of this machine."""

    def argv(args: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{netns}", python, str(script), *args]

    return argv


def ssh_launcher(
    host: str,
    *,
    remote_script: str,
    python: str = "python3",
    ssh: Sequence[str] = ("ssh", "-o", "BatchMode=yes"),
) -> Launcher:
    """Run a relay already copied to ``remote_script`` on ``host`` over ssh."""

    def argv(args: Sequence[str]) -> list[str]:
        return [*ssh, host, shlex.join([python, remote_script, *args])]

    return argv


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment minus anything that looks like a secret (the relays need none)."""
    env = {k: v for k, v in os.environ.items() if not SECRET_ENV.search(k)}
    for k, v in (extra or {}).items():
        if not SECRET_ENV.search(k):
            env[k] = v
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class Target:
    """One receiving host: where others reach its relay, where the weights go, how to start it."""

    host: str
    dest: str
    launcher: Launcher = field(default_factory=local_launcher)
    port: int = common.DEFAULT_PORT
    listen: str | None = None
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or common.format_address(self.host, self.port)


# ----------------------------------------------------------------------------- records


class FileFailure(Record):
    name: str
    reason: str


class SkippedHost(Record):
    address: str
    reason: str


class HostResult(Record):
    """What one host ended with."""

    name: str
    address: str
    status: HostStatus
    dest: str = ""
    verified: int = 0
    skipped: tuple[str, ...] = ()
    received: tuple[str, ...] = ()
    repaired: tuple[str, ...] = ()
    failed: tuple[FileFailure, ...] = ()
    missing: tuple[str, ...] = ()
    bytes_received: int = 0
    bytes_written: int = 0
    bytes_forwarded: int = 0
    resumed: tuple[dict[str, Any], ...] = ()
    cpu: dict[str, float] = Field(default_factory=dict)
    message: str = ""
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class BroadcastResult(Record):
    """One broadcast run: timing, what the seed sent, and every host's result."""

    mode: Mode
    seconds: float
    files: int
    manifest_bytes: int
    bytes_sent: int
    seed_status: str
    seed_message: str = ""
    files_sent: tuple[str, ...] = ()
    seed_cpu: dict[str, float] = Field(default_factory=dict)
    hosts: tuple[HostResult, ...]
    skipped_hosts: tuple[SkippedHost, ...] = ()

    @property
    def ok(self) -> bool:
        return self.seed_status == "ok" and all(h.ok for h in self.hosts)

    def host(self, name: str) -> HostResult:
        for h in self.hosts:
            if name in (h.name, h.address):
                return h
        raise KeyError(name)


class RelayEvent(Record):
    """One JSON line from a relay; ``source`` is the target's label or "seed"."""

    source: str
    event: str
    data: dict[str, Any] = Field(default_factory=dict)


class HostProgress(Record):
    name: str
    rx: int
    total: int
    rate: float
    lag: int


# ----------------------------------------------------------------------------- processes


class _Relay:
    """One relay process and what its stdout said."""

    def __init__(
        self,
        label: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path | None,
        on_line: Callable[[_Relay, dict[str, Any]], None],
        stdin: bool,
    ) -> None:
        self.label = label
        self.argv = argv
        self.on_line = on_line
        self.listening = threading.Event()
        self.port: int | None = None
        self.summary: dict[str, Any] | None = None
        self.last_progress: dict[str, Any] = {}
        self.stderr_tail = ""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)
        self._events: IO[str] | None = None
        self._errors: IO[str] | None = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._events = (log_dir / f"{safe}.events.jsonl").open("w", encoding="utf-8")
            self._errors = (log_dir / f"{safe}.stderr.log").open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.threads = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self._events is not None:
                self._events.write(line)
                self._events.flush()
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            kind = data.get("event")
            if kind == "listening":
                self.port = int(data.get("port", 0))
                self.listening.set()
            elif kind == "progress":
                self.last_progress = data
            elif kind == "summary":
                self.summary = data
            self.on_line(self, data)
        self.listening.set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if self._errors is not None:
                self._errors.write(line)
                self._errors.flush()
            self.stderr_tail = (self.stderr_tail + line)[-2000:]

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def finish(self, timeout: float) -> None:
        """Wait for the process; terminate, then kill, if it lingers."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        for t in self.threads:
            t.join(timeout=5)
        for f in (self._events, self._errors):
            if f is not None:
                f.close()


class Broadcast:
    """One broadcast run. ``start()``, optionally watch or ``kill()``, then ``wait()``."""

    def __init__(
        self,
        manifest: Manifest,
        source: Path,
        targets: Sequence[Target],
        *,
        mode: Mode = "chain",
        seed_launcher: Launcher | None = None,
        verify: bool = False,
        max_rate: float = 0.0,
        chunk_size: int = DEFAULT_CHUNK,
        io_timeout: float = 120.0,
        connect_timeout: float = 20.0,
        relink_timeout: float = 60.0,
        accept_timeout: float = 600.0,
        progress_interval: float = 1.0,
        grace: float = 30.0,
        on_event: Callable[[RelayEvent], None] | None = None,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        streams: int = 1,
    ) -> None:
        if not targets:
            raise ValueError("a broadcast needs at least one target host")
        labels = [t.label for t in targets]
        if len(set(labels)) != len(labels):
            raise ValueError(f"target labels repeat: {labels}")
        self.manifest = manifest
        self.source = source
        self.targets = list(targets)
        self.mode: Mode = mode
        self.seed_launcher = seed_launcher or local_launcher()
        self.verify = verify
        self.max_rate = max_rate
        self.chunk_size = chunk_size
        self.io_timeout = io_timeout
        self.connect_timeout = connect_timeout
        self.relink_timeout = relink_timeout
        self.accept_timeout = accept_timeout
        self.progress_interval = progress_interval
        self.grace = grace
        self.on_event = on_event
        self.log_dir = log_dir
        self.env = child_env(env)
        self.extra_args = list(extra_args)
        self.streams = streams
        self.relays: dict[str, _Relay] = {}
        self.addresses: dict[str, str] = {}
        self.seed: _Relay | None = None
        self.t0 = 0.0
        self.t_end: float | None = None
        self._lock = threading.Lock()

    # -- running

    def _common(self) -> list[str]:
        return [
            "--io-timeout", str(self.io_timeout),
            "--connect-timeout", str(self.connect_timeout),
            "--progress-interval", str(self.progress_interval),
            *self.extra_args,
        ]  # fmt: skip

    def _on_line(self, proc: _Relay, data: dict[str, Any]) -> None:
        if proc is self.seed and data.get("event") == "summary":
            self.t_end = time.monotonic()
        if self.on_event is not None:
            event = RelayEvent(source=proc.label, event=str(data.get("event", "")), data=data)
            with self._lock:
                self.on_event(event)

    def start(self) -> None:
        """Start every receiver, wait until each listens, then start the seed."""
        for t in self.targets:
            listen = common.format_address(t.listen or t.host, t.port)
            args = [
                "serve", "--listen", listen, "--dest", t.dest,
                "--accept-timeout", str(self.accept_timeout),
                "--relink-timeout", str(self.relink_timeout),
                *self._common(),
            ]  # fmt: skip
            self.relays[t.label] = _Relay(
                t.label, t.launcher(args), self.env, self.log_dir, self._on_line, stdin=False
            )
        deadline = time.monotonic() + max(30.0, self.connect_timeout)
        chain: list[str] = []
        for t in self.targets:
            proc = self.relays[t.label]
            proc.listening.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.port is None:
                continue  # never listened: reported as lost
            address = common.format_address(t.host, proc.port)
            self.addresses[t.label] = address
            chain.append(address)
        args = [
            "send", "--source", str(self.source), "--manifest", "-",
            "--chain", ",".join(chain),
            "--chunk-size", str(self.chunk_size),
            *self._common(),
        ]  # fmt: skip
        if self.mode == "fanout":
            args.append("--fanout")
        if self.verify:
            args.append("--verify")
        if self.max_rate:
            args += ["--max-rate", str(self.max_rate)]
        if self.streams > 1:
            args += ["--streams", str(self.streams)]
        self.t0 = time.monotonic()
        self.seed = _Relay(
            "seed", self.seed_launcher(args), self.env, self.log_dir, self._on_line, stdin=True
        )
        assert self.seed.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.seed.proc.stdin.write(self.manifest.model_dump_json())
            self.seed.proc.stdin.close()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one receiver's relay process (fault injection, cancel)."""
        self.relays[name].signal(sig)

    def progress(self) -> dict[str, HostProgress]:
        """Per-host bytes received, rate and lag behind the seed, from the latest events."""
        sent = int(self.seed.last_progress.get("tx", 0)) if self.seed else 0
        n = max(1, len(self.relays)) if self.mode == "fanout" else 1
        out = {}
        for label, proc in self.relays.items():
            p = proc.last_progress
            rx = int(p.get("rx", 0))
            out[label] = HostProgress(
                name=label,
                rx=rx,
                total=int(p.get("total", 0)),
                rate=float(p.get("rate", 0.0)),
                lag=max(0, sent // n - rx),
            )
        return out

    def wait(self, timeout: float | None = None) -> BroadcastResult:
        """Wait for the seed, give the receivers ``grace`` seconds, collect the results."""
        if self.seed is None:
            raise RuntimeError("start() first")
        try:
            self.seed.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.seed.signal(signal.SIGTERM)
        self.seed.finish(timeout=10)
        end = self.t_end or time.monotonic()
        grace = self.grace
        if (self.seed.summary or {}).get("status") in ("refused", None):
            grace = 0.0  # the seed contacted nobody: no receiver will ever get a stream
        deadline = time.monotonic() + grace
        for proc in self.relays.values():
            proc.finish(timeout=max(0.1, deadline - time.monotonic()))
        return self._result(end - self.t0)

    def close(self) -> None:
        """Stop anything still running (used on errors and by the context manager)."""
        for proc in [*self.relays.values(), *([self.seed] if self.seed else [])]:
            if proc.proc.poll() is None:
                proc.signal(signal.SIGTERM)
        for proc in [*self.relays.values(), *([self.seed] if self.seed else [])]:
            proc.finish(timeout=5)

    def __enter__(self) -> Broadcast:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- results

    def _result(self, seconds: float) -> BroadcastResult:
        assert self.seed is not None
        seed = self.seed.summary or {}
        reports: dict[str, dict[str, Any]] = {}
        skipped: dict[str, str] = {}
        for h in seed.get("hosts", []):
            if not isinstance(h, dict):
                continue
            if h.get("status") == "skipped":
                skipped.setdefault(str(h.get("host")), str(h.get("reason", "")))
            else:
                reports[str(h.get("host"))] = h
        for proc in self.relays.values():
            for s in (proc.summary or {}).get("skipped_hosts", []):
                if isinstance(s, dict):
                    skipped.setdefault(str(s.get("host")), str(s.get("reason", "")))
        hosts = []
        for t in self.targets:
            proc = self.relays[t.label]
            address = self.addresses.get(t.label, t.label)
            hosts.append(self._host(t, proc, address, reports.get(address), skipped.get(address)))
        seed_message = str(seed.get("message", ""))
        if not self.seed.summary:
            seed_message = (
                f"seed exited {self.seed.proc.returncode}: {self.seed.stderr_tail[-500:]}"
            )
        return BroadcastResult(
            mode=self.mode,
            seconds=round(seconds, 3),
            files=len(self.manifest.files),
            manifest_bytes=self.manifest.total_bytes,
            bytes_sent=int(seed.get("bytes_sent", 0)),
            seed_status=str(seed.get("status", "lost")),
            seed_message=seed_message,
            files_sent=tuple(seed.get("files_sent", ())),
            seed_cpu=dict(seed.get("cpu") or {}),
            hosts=tuple(hosts),
            skipped_hosts=tuple(SkippedHost(address=a, reason=r) for a, r in skipped.items()),
        )

    @staticmethod
    def _host(
        target: Target,
        proc: _Relay,
        address: str,
        report: dict[str, Any] | None,
        skip_reason: str | None,
    ) -> HostResult:
        data = proc.summary or report
        code = proc.proc.returncode
        if data is None:
            status: HostStatus = "skipped" if skip_reason is not None else "lost"
            message = skip_reason or f"relay exited {code} without a summary"
            tail = proc.stderr_tail.strip().splitlines()
            if tail and skip_reason is None:
                message += f": {tail[-1]}"
            return HostResult(
                name=target.label, address=address, status=status, message=message, exit_code=code
            )
        raw_status = str(data.get("status", "lost"))
        status = _STATUSES.get(raw_status, "lost")
        message = str(data.get("message", ""))
        if skip_reason is not None and status != "ok":
            status, message = "skipped", skip_reason
        return HostResult(
            name=target.label,
            address=address,
            status=status,
            dest=str(data.get("dest", target.dest)),
            verified=int(data.get("verified", 0)),
            skipped=tuple(data.get("skipped", ())),
            received=tuple(data.get("received", ())),
            repaired=tuple(data.get("repaired", ())),
            failed=tuple(
                FileFailure(name=str(f.get("name")), reason=str(f.get("reason", "")))
                for f in data.get("failed", ())
                if isinstance(f, dict)
            ),
            missing=tuple(data.get("missing", ())),
            bytes_received=int(data.get("bytes_received", 0)),
            bytes_written=int(data.get("bytes_written", 0)),
            bytes_forwarded=int(data.get("bytes_forwarded", 0)),
            resumed=tuple(r for r in data.get("resumed", ()) if isinstance(r, dict)),
            cpu=dict(data.get("cpu") or {}),
            message=message,
            exit_code=code,
        )


def _why(host: HostResult) -> str:
    if host.message:
        return host.message
    if host.failed:
        return f"{host.failed[0].name}: {host.failed[0].reason}"
    if host.missing:
        return f"{len(host.missing)} file(s) missing"
    return "no message"


def failure(result: BroadcastResult, hosts: int = 3) -> str:
    """Why a run is not ok, in one line: the seed's status and the first ``hosts`` hosts that
    are not ok with their messages; "" for a run that is ok."""
    parts = []
    bad = [h for h in result.hosts if not h.ok]
    if result.seed_status != "ok":
        said = result.seed_message
        if bad and said.endswith("hosts not ok"):
            said = ""  # the hosts below say it, with their reasons
        parts.append(f"seed {result.seed_status}" + (f": {said}" if said else ""))
    if bad:
        named = "; ".join(f"{h.name} {h.status}: {_why(h)}" for h in bad[:hosts])
        more = f"; {len(bad) - hosts} more" if len(bad) > hosts else ""
        parts.append(f"{len(bad)} of {len(result.hosts)} hosts not ok ({named}{more})")
    return "; ".join(parts)


def broadcast(
    manifest: Manifest, source: Path, targets: Sequence[Target], **options: Any
) -> BroadcastResult:
    """Pipelined chain through ``targets`` in order; returns when every host is done."""
    return _run_to_end("chain", manifest, source, targets, options)


def fanout(
    manifest: Manifest, source: Path, targets: Sequence[Target], **options: Any
) -> BroadcastResult:
    """Baseline: the seed streams the whole set to every host directly, all at once."""
    return _run_to_end("fanout", manifest, source, targets, options)


def _run_to_end(
    mode: Mode,
    manifest: Manifest,
    source: Path,
    targets: Sequence[Target],
    options: dict[str, Any],
) -> BroadcastResult:
    with Broadcast(manifest, source, targets, mode=mode, **options) as run:
        run.start()
        return run.wait()


# ----------------------------------------------------------------------------- synthetic sets


def write_shard(path: Path, size: int, *, seed: int = 0) -> Path:
    """A valid synthetic safetensors file of exactly ``size`` bytes."""
    synthetic.write_blocks(str(path), synthetic.shard_blocks(size, seed))
    return path


def write_shards(
    directory: Path, count: int, shard_bytes: int, *, seed: int = 0, padded: bool = False
) -> list[Path]:
    """``count`` synthetic shards of ``shard_bytes`` plus a small config.json in ``directory``."""
    config = {"model_type": "kimi_k2", "num_shards": count}
    paths = []
    for name, blocks in synthetic.synthetic_set(count, shard_bytes, seed, config, padded):
        synthetic.write_blocks(str(directory / name), blocks())
        paths.append(directory / name)
    return paths
