"""Reading the controller's input files within bounds: regular files only (a FIFO or a device
would block or never end), up to a size, and YAML whose aliases expand to a bounded size."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MIB = 1024 * 1024
INVENTORY_FILE_LIMIT = 16 * MIB
CONFIG_FILE_LIMIT = 8 * MIB
# YAML nodes a document may expand to through its aliases (a "billion laughs" file expands
# to ~10^9 from a few lines).
YAML_NODE_LIMIT = 200_000


def file_problem(path: Path, limit: int) -> str | None:
    """Why `path` is not to be read (None when it is a regular file within `limit` bytes)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return f"is not a regular file ({file_kind(info.st_mode)})"
    if info.st_size > limit:
        return f"is {info.st_size} bytes, over the limit of {limit}"
    return None


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def read_bytes(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; ValueError saying why not. The
    type is checked before the file is opened, and again on what was opened (without blocking,
    so a file swapped for a FIFO in between reads as nothing rather than waiting)."""
    if why := file_problem(path, limit):
        raise ValueError(f"{path} {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file ({file_kind(mode)})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} grew past the limit of {limit} bytes while read")
    return data


def read_text(path: Path, limit: int) -> str:
    """The text of a regular file of at most `limit` bytes; ValueError saying why not."""
    return read_bytes(path, limit).decode("utf-8")


def yaml_expansion_problem(text: str) -> str | None:
    """Why YAML `text` is not to be loaded: its aliases expand past YAML_NODE_LIMIT nodes."""
    import yaml

    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None  # malformed: the parser that reads it says so
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        sizes[id(node)] = min(total, YAML_NODE_LIMIT + 1)
        return sizes[id(node)]

    total = sum(size(doc) for doc in documents if doc is not None)
    if total > YAML_NODE_LIMIT:
        return f"its aliases expand to more than {YAML_NODE_LIMIT} nodes"
    return None
