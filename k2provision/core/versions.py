"""Dotted numeric versions (drivers, engine releases) and their comparison. Pure."""

from __future__ import annotations

import re

__all__ = ["version_at_least", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """``580.159.04`` -> ``(580, 159, 4)``; ValueError for anything not dotted numbers."""
    text = version.strip()
    if not re.fullmatch(r"\d+(?:\.\d+)*", text):
        raise ValueError(f"{version!r} is not a dotted numeric version")
    return tuple(int(part) for part in text.split("."))


def version_at_least(have: str, need: str) -> bool:
    """Numeric comparison, missing parts counting as 0: ``570.10 >= 570.9``, ``570 >= 570.0``."""
    a, b = version_tuple(have), version_tuple(need)
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))
