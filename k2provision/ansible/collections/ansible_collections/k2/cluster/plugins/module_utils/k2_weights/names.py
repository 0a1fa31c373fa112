"""File names in a model directory: which are safe, how they sort, where their copies go."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from fnmatch import fnmatchcase

from .common import RelayError


def check_name(name: str) -> None:
    """Refuse names that could escape the destination or collide with relay files."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        raise RelayError(f"file name {name!r} is not a relative path")
    if "\x00" in name:
        raise RelayError(f"file name {name!r} contains a NUL byte")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise RelayError(f"file name {name!r} has an empty, '.' or '..' component")
        if part.startswith(".k2-") or (part.startswith(".") and part.endswith(".partial")):
            raise RelayError(f"file name {name!r} collides with the relay's own files")


def is_safetensors(name: str) -> bool:
    return name.endswith(".safetensors")


def natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key putting model-2-of-61 before model-10-of-61."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def matches(name: str, patterns: Sequence[str] | None) -> bool:
    """True when ``name`` matches any glob of ``patterns`` (or there are none)."""
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def list_files(directory: str, patterns: Sequence[str] | None) -> list[str]:
    """Relative names of the non-hidden regular files under ``directory``, naturally sorted."""
    names: list[str] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for fname in files:
            if fname.startswith("."):
                continue
            full = os.path.join(root, fname)
            if not os.path.isfile(full):
                continue
            name = os.path.relpath(full, directory).replace(os.sep, "/")
            if matches(name, patterns):
                names.append(name)
    return sorted(names, key=natural_key)


def final_path(dest: str, name: str) -> str:
    """Where a verified file lives."""
    return os.path.join(dest, *name.split("/"))


def _hidden(dest: str, name: str, prefix: str, suffix: str) -> str:
    head, _, base = name.rpartition("/")
    return os.path.join(dest, *(head.split("/") if head else []), f"{prefix}{base}{suffix}")


def partial_path(dest: str, name: str) -> str:
    """Where a file is written until it is verified: ``.<name>.partial``."""
    return _hidden(dest, name, ".", ".partial")


def resume_path(dest: str, name: str) -> str:
    """The resume checkpoint of a partial file: ``.k2-resume.<name>.json``."""
    return _hidden(dest, name, ".k2-resume.", ".json")
