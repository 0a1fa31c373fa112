"""Lab fault modes: how a stand-in process misbehaves on purpose, chosen by K2_LAB_FAULT.

The inventory's `k2_lab_fault` reaches a lab host's engine containers as K2_LAB_FAULT (lab
plans only), so every launch-failure path is a test on lab hosts:

- `exit_at_start`: the process writes one error line and exits 1 before it serves anything;
- `never_healthy`: it serves, but every health route answers 503, forever;
- `wrong_answer`: chat completions answer 200 with a body that has no choices (nor tool calls),
  so a smoke test fails on what came back;
- `die_after=N`: it exits 1 N seconds after it became ready (a rank lost after launch);
- `slow=N`: every chat or text completion waits N more seconds before it answers (an engine
  that passes its gates and smoke test but serves slowly: a canary to roll back).

Unset or empty: no fault. A value that is none of these refuses to start (exit 2), so a typo
cannot pass for a working fault.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

ENV = "K2_LAB_FAULT"
MODES = ("exit_at_start", "never_healthy", "wrong_answer", "die_after", "slow")
# The modes that take =<seconds>.
TIMED = ("die_after", "slow")
EXPECTED = "exit_at_start, never_healthy, wrong_answer, die_after=<seconds> or slow=<seconds>"


@dataclass(frozen=True)
class Fault:
    mode: str
    seconds: float = 0.0

    def __str__(self) -> str:
        return f"{self.mode}={self.seconds:g}" if self.mode in TIMED else self.mode


def parse(text: str | None) -> Fault | None:
    """The fault `text` names (None: no fault); ValueError naming what is expected."""
    value = (text or "").strip()
    if not value:
        return None
    mode, eq, arg = value.partition("=")
    if mode in TIMED:
        try:
            seconds = float(arg) if eq else -1.0
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(
                f"{ENV}={value!r}: {mode} needs a number of seconds > 0 (e.g. {mode}=20)"
            )
        return Fault(mode, seconds)
    if mode in MODES and not eq:
        return Fault(mode)
    raise ValueError(f"{ENV}={value!r}: expected {EXPECTED}")


def current() -> Fault | None:
    """The fault of this process's environment (a bad value raises ValueError)."""
    return parse(os.environ.get(ENV))


def active(mode: str) -> bool:
    """Whether this process runs with fault `mode` (a bad value counts as none here: the
    entry point refuses it at start)."""
    try:
        fault = current()
    except ValueError:
        return False
    return fault is not None and fault.mode == mode


def at_start(entry: str) -> int | None:
    """Called by every stand-in entry point before it starts: the exit status to stop with
    (exit_at_start: 1; a bad K2_LAB_FAULT: 2), or None to go on."""
    try:
        fault = current()
    except ValueError as exc:
        print(f"k2-standin {entry}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if fault is not None and fault.mode == "exit_at_start":
        print(
            f"k2-standin {entry}: error: fault injected ({ENV}=exit_at_start): exiting 1 at start",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return None


_armed = threading.Lock()


def on_ready(entry: str) -> None:
    """Called when the process became ready: with die_after=N, exit 1 N seconds later."""
    try:
        fault = current()
    except ValueError:
        return
    if fault is None or fault.mode != "die_after" or not _armed.acquire(blocking=False):
        return

    def die() -> None:
        print(
            f"k2-standin {entry}: error: fault injected ({ENV}={fault}): exiting 1, "
            f"{fault.seconds:g} s after becoming ready",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    timer = threading.Timer(fault.seconds, die)
    timer.daemon = True
    timer.start()


def slow_answer() -> None:
    """Called before a completion is answered: with slow=N, wait N seconds first."""
    try:
        fault = current()
    except ValueError:
        return
    if fault is not None and fault.mode == "slow":
        time.sleep(fault.seconds)


def wrong_chat_body(model: str) -> dict[str, object]:
    """A 200 chat completion a client cannot use: no choices, no message, no tool calls."""
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "model": model,
        "choices": [],
        "fault": f"{ENV}=wrong_answer",
    }
