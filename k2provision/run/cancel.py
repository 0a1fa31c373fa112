"""Stopping a command: SIGTERM, SIGINT and SIGHUP end every command's work the same way.

While a command runs, `stopping()` holds the three signals. The first one marks the command
cancelled (`Cancellation.signum`): a running playbook is interrupted (SIGINT to its process
group, as Ctrl-C in its own terminal would), given `GRACE_S` seconds to stop, then killed by
ansible-runner's cancel callback (`Cancellation.give_up`); the command then ends what the run
started (SSH control masters, weights relays, a half-started launch stage), writes its
record as cancelled and exits 128 + the signal (130 SIGINT, 143 SIGTERM, 129 SIGHUP). A
second signal during that cleanup ends the command at once: the playbooks it knows of are
killed and it says what may still be running and where.

Where no playbook runs (plan loading, SSH sessions of status and logs), the first signal
raises `Interrupted` in the main thread, which the command turns into its exit code.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

from k2provision.run.events import Event, TaskStarted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 15.0
"""How long an interrupted playbook has to stop before its process group is killed."""


def exit_code(signum: int) -> int:
    """The shell's exit code for a command ended by `signum`: 128 + its number."""
    return 128 + signum


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15."""
    return signal.Signals(signum).name


class Interrupted(BaseException):
    """A stop signal arrived where nothing had to be waited for; `signum` names it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


@dataclass
class Cancellation:
    """One command's stop state: which signal, when, and what may still be running where."""

    signum: int | None = None
    requested_at: float | None = None
    cleaning: bool = False
    """Ending what a run started: a first signal is noted, not raised."""
    in_runner: bool = False
    """A playbook runs: a first signal interrupts it, the runner's callback does the rest."""
    playbooks: dict[int, str] = field(default_factory=dict)
    """Process group id -> what runs in it (the playbooks running now)."""
    running: dict[str, str] = field(default_factory=dict)
    """What may still be running -> where, kept up to date by whoever starts it."""
    grace_s: float = GRACE_S

    @property
    def requested(self) -> bool:
        """True once a stop signal has arrived."""
        return self.signum is not None

    def request(self, signum: int, now: float) -> bool:
        """Record a stop signal; True when it is the first one."""
        if self.signum is not None:
            return False
        self.signum, self.requested_at = signum, now
        return True

    def give_up(self, now: float) -> bool:
        """ansible-runner's cancel callback: kill the playbook now? True once the grace time
        after the first signal is over, or at once when the playbook's group is not known.
        A playbook that ends what a cancelled run started is never given up on."""
        if self.requested_at is None or self.cleaning:
            return False
        return not self.playbooks or now - self.requested_at >= self.grace_s

    def exit_code(self) -> int:
        """The command's exit code once stopped (130 when no signal was recorded)."""
        return exit_code(self.signum if self.signum is not None else signal.SIGINT)

    def leftovers(self) -> list[str]:
        """What may still be running, one line each, for a command that stops at once."""
        lines = [f"ansible-playbook (process group {g}): {w}" for g, w in self.playbooks.items()]
        lines += [f"{what}: {where}" for what, where in self.running.items()]
        return lines


CURRENT = Cancellation()
"""The running command's stop state (one command per process)."""


def _signal_group(pgid: int, signum: int) -> None:
    """Signal a playbook's process group, never this process's own."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def abandon(state: Cancellation, on_abandon: Callable[[list[str]], None] | None = None) -> int:
    """A second signal: kill the playbooks, say what may still run, return the exit code."""
    for pgid in list(state.playbooks):
        _signal_group(pgid, signal.SIGKILL)
    left = [line for line in state.leftovers() if not line.startswith("ansible-playbook")]
    if on_abandon is not None:
        with contextlib.suppress(Exception):  # the record is best effort when ending at once
            on_abandon(left)
    _say("stopped at once; cleanup was not finished.")
    for line in left or ["nothing known to be running"]:
        _say(f"  may still be running: {line}")
    return state.exit_code()


def _handler(
    state: Cancellation, on_abandon: Callable[[list[str]], None] | None
) -> Callable[[int, FrameType | None], None]:
    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        if not state.request(signum, time.monotonic()):
            os._exit(abandon(state, on_abandon))
        if state.in_runner:
            _say(
                f"{signal_name(signum)}: stopping the playbook (up to {state.grace_s:g} s), then "
                "what it started; a second signal stops at once"
            )
            for pgid in list(state.playbooks):
                _signal_group(pgid, signal.SIGINT)
            return
        if not state.cleaning:
            raise Interrupted(signum)
        _say(f"{signal_name(signum)}: finishing the cleanup; a second signal stops at once")

    return handle


def end_child(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """End a child started in its own session (``start_new_session=True``) and everything it
    started: SIGTERM to its process group, SIGKILL after ``grace_s``."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def stopping(
    state: Cancellation | None = None, on_abandon: Callable[[list[str]], None] | None = None
) -> Iterator[Cancellation]:
    """For the duration of a command: SIGTERM, SIGINT and SIGHUP stop it as this module says.
    `on_abandon` is told what may still run when a second signal ends the command at once."""
    state = state if state is not None else CURRENT
    handle = _handler(state, on_abandon)
    previous = {s: signal.signal(s, handle) for s in SIGNALS}
    try:
        yield state
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextlib.contextmanager
def cleaning(state: Cancellation) -> Iterator[None]:
    """While a command ends what it started: a first signal no longer interrupts that work
    (it is noted, and the command ends as cancelled after it); a second one ends the command
    at once (`abandon`)."""
    before, state.cleaning = state.cleaning, True
    try:
        yield
    finally:
        state.cleaning = before


@contextlib.contextmanager
def running_playbook(state: Cancellation) -> Iterator[None]:
    """While ansible-runner runs a playbook: a first signal interrupts the playbook instead of
    this process, and `give_up` tells the runner when to kill it."""
    before, state.in_runner = state.in_runner, True
    try:
        yield
    finally:
        state.in_runner = before


def note_playbook(state: Cancellation, pgid: int, what: str) -> None:
    """A playbook runs in process group `pgid`: known to the stop handler from now on (until
    `forget_playbook`). A signal that came before the group was known reaches it now, unless
    the playbook is a cancelled run's cleanup."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    state.playbooks[pgid] = what
    if state.requested and not state.cleaning:  # a cleanup playbook is left to do its work
        _signal_group(pgid, signal.SIGINT)


def forget_playbook(state: Cancellation, pgid: int) -> None:
    """The playbook in `pgid` has ended."""
    state.playbooks.pop(pgid, None)


RELAY_TASKS = (
    "Distribute | Start a relay on every receiving host",
    "Distribute | Stream from the seed down the chain",
)
"""The k2_weights tasks that start relays on the hosts (a test keeps them in step)."""
STAGE_START = "Stage | Processes of this host in this stage"
STAGE_GATED = "Stage | Whether any host's processes failed"
_STAGE = re.compile(r"\(stage (\S+)\)$")


@dataclass
class Started:
    """What a run has started on the hosts that outlives its playbook, from its events."""

    relays: bool = False
    """The weights relays were started (they run detached on the hosts)."""
    stage: str | None = None
    """The launch stage started and not yet through its health gates."""

    def observe(self, event: Event) -> None:
        """Fold one runner event in."""
        if not isinstance(event, TaskStarted):
            return
        if event.name.startswith(RELAY_TASKS):
            self.relays = True
        stage = _STAGE.search(event.name)
        if event.name.startswith(STAGE_START) and stage:
            self.stage = stage.group(1)
        elif event.name.startswith(STAGE_GATED):
            self.stage = None

    @property
    def anything(self) -> bool:
        """True when a cancelled run has something on the hosts to end."""
        return self.relays or self.stage is not None
