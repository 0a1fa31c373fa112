"""Errors the lab reports to people: one line each, naming the problem and the fix."""

from __future__ import annotations

from k2provision.errors import K2Error


class LabError(K2Error):
    """The lab cannot do what was asked (missing tool, bad argument, a step that failed)."""

    def __init__(self, problem: str) -> None:
        super().__init__([problem])


class NotRootError(LabError):
    """The lab needs root: it creates network namespaces, bridges and mounts."""

    def __init__(self) -> None:
        super().__init__(
            "the lab needs root (it creates network namespaces, a bridge and overlay mounts); "
            "fix: run it as root, e.g. `sudo k2provision lab up 4`"
        )
