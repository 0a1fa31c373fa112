"""What a relay tells: JSON-lines events, byte counters, CPU time by stage, progress."""

from __future__ import annotations

import contextlib
import json
import resource
import threading
import time
from typing import IO, Any

from ..common import Json

STAGES = ("receive", "hash", "write", "forward", "read")


class Emitter:
    """JSON-lines events on stdout, one lock, flushed per line."""

    def __init__(self, host: str, role: str, stream: IO[str]) -> None:
        self.host = host
        self.role = role
        self.stream = stream
        self.lock = threading.Lock()
        self.closed = False

    def __call__(self, event: str, **fields: Any) -> None:
        if self.closed:
            return  # the summary is always the last line
        self.closed = event == "summary"
        record: Json = {"event": event, "host": self.host, "role": self.role}
        record.update(fields)
        record["t"] = round(time.time(), 3)
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.stream.write(line)
            self.stream.flush()


class Counters:
    """Byte counters the progress thread reads (rx and written have one writer thread each),
    and the CPU seconds (user + system) each stage's threads spent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rx = 0
        self.tx = 0
        self.written = 0
        self.total = 0
        self.file = ""
        self.cpu: dict[str, float] = dict.fromkeys(STAGES, 0.0)

    def add(self, field: str, n: int) -> None:
        with self.lock:
            setattr(self, field, getattr(self, field) + n)

    def add_cpu(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.cpu[stage] = self.cpu.get(stage, 0.0) + seconds

    def cpu_report(self) -> Json:
        """CPU seconds by stage, and the whole process's user and system time."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with self.lock:
            out: Json = {k: round(v, 4) for k, v in self.cpu.items()}
        out["process_user"] = round(usage.ru_utime, 4)
        out["process_sys"] = round(usage.ru_stime, 4)
        return out


class StageClock:
    """Adds this thread's CPU time between ``start`` and ``stop`` to a stage's counter."""

    def __init__(self, counters: Counters, stage: str) -> None:
        self.counters = counters
        self.stage = stage
        self.t0 = 0.0

    def __enter__(self) -> StageClock:
        self.t0 = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.counters.add_cpu(self.stage, time.thread_time() - self.t0)


class ProgressThread:
    """Emits a ``progress`` event every interval while bytes move (and every 5 s when idle)."""

    def __init__(self, emit: Emitter, counters: Counters, interval: float) -> None:
        self.emit = emit
        self.counters = counters
        self.interval = interval
        self.rate = 0.0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> None:
        if self.interval > 0:
            self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join()
        self.report(final=True)

    def report(self, final: bool = False) -> None:
        c = self.counters
        self.emit(
            "progress",
            rx=c.rx,
            tx=c.tx,
            written=c.written,
            total=c.total,
            file=c.file,
            rate=round(self.rate, 1),
            final=final,
        )

    def _run(self) -> None:
        prev_t = time.monotonic()
        prev = (self.counters.rx, self.counters.tx)
        idle = 0.0
        while not self.stop_event.wait(self.interval):
            now = time.monotonic()
            cur = (self.counters.rx, self.counters.tx)
            moved = max(cur[0] - prev[0], cur[1] - prev[1])
            dt = max(now - prev_t, 1e-6)
            self.rate = moved / dt
            prev, prev_t = cur, now
            idle = 0.0 if moved else idle + dt
            if moved or idle >= 5.0:
                idle = 0.0
                self.report()
