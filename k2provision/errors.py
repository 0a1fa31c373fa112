"""Errors for people: each problem is one line naming the value, the expectation and the fix."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Line breaks and other control characters a value may carry into a problem: shown escaped, so
# a problem stays one line whatever value it quotes.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(problem: str) -> str:
    """A problem with its control characters escaped (a newline as \\n)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], problem)


class K2Error(Exception):
    """Base class of every error k2provision reports to a user (exit code 2)."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(one_line(p) for p in problems)
        super().__init__("\n".join(self.problems))


class ArgumentError(K2Error):
    """A command-line argument out of range or of the wrong kind (shown with the usage)."""


class InventoryError(K2Error):
    """The inventory is malformed or contradicts itself."""


class PlanError(K2Error):
    """The cluster cannot run the requested model/engine/layout (fit, divisibility)."""
