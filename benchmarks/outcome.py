"""The one rule every benchmark here follows: a run that is not ok gives no figure.

A run (or a sub-run: one N, one mode, one round) that is not ok prints ``NOT OK: <what>:
<reason>`` and nothing measured from it (no time, ratio or table row); the others still print
theirs, and the script exits 1 at the end. A benchmark that cannot go on after a failure
raises ``NotOk``; ``finish`` (or ``run``) turns it into the same line and exit code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO


class NotOk(Exception):
    """A run that is not ok and ends the benchmark: ``str()`` is what and why."""


@dataclass
class Outcome:
    """Which runs were not ok, and why; the exit code follows from it."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def not_ok(self, what: str, reason: str) -> None:
        """Record a run that is not ok and say so now, in place of its figures."""
        self.failed.append((what, reason))
        print(f"NOT OK: {what}: {reason}", file=self.out, flush=True)

    @property
    def ok(self) -> bool:
        return not self.failed

    def finish(self) -> int:
        """The exit code: 0 when every run was ok, else 1 after a line naming the failures."""
        if self.ok:
            return 0
        names = ", ".join(what for what, _ in self.failed)
        print(f"NOT OK: {len(self.failed)} run(s) gave no figure: {names}", file=self.out,
              flush=True)  # fmt: skip
        return 1


def run(main: Callable[[], int], out: TextIO | None = None) -> int:
    """Call a benchmark's ``main``; a ``NotOk`` it raises is printed and exits 1."""
    try:
        return main()
    except NotOk as exc:
        print(f"NOT OK: {exc}", file=out or sys.stdout, flush=True)
        return 1
