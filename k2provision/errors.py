"""Errors for people: each problem is one line naming the value, the expectation and the fix."""

from __future__ import annotations

from collections.abc import Iterable


class K2Error(Exception):
    """Base class of every error k2provision reports to a user (exit code 2)."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))


class InventoryError(K2Error):
    """The inventory is malformed or contradicts itself."""


class PlanError(K2Error):
    """The cluster cannot run the requested model/engine/layout (fit, divisibility)."""
