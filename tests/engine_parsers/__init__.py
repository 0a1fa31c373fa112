"""Checks of rendered engine command lines against the pinned engines' real
argument parsers (venvs built by scripts/install-engine-parsers)."""

from .runner import (
    ENGINES,
    CheckerError,
    ParseResult,
    ParsersNotInstalled,
    check,
    venv_python,
)

__all__ = [
    "ENGINES",
    "CheckerError",
    "ParseResult",
    "ParsersNotInstalled",
    "check",
    "venv_python",
]
