"""The safetensors header check: the header length, its JSON and the file size must agree."""

from __future__ import annotations

import json
import os
import struct

from .common import describe_error

SAFETENSORS_MAX_HEADER = 100_000_000


def check_safetensors_header(prefix: bytes | bytearray | memoryview, size: int) -> str | None:
    """Why a safetensors file is inconsistent, or None when it is fine.

    ``prefix`` holds at least the first 8 + header-length bytes; ``size`` is the file size.
    The file must start with a little-endian u64 header length, then a JSON object; the
    largest ``data_offsets`` end plus 8 plus the header length must equal the file size.
    """
    if size < 8 or len(prefix) < 8:
        return f"{size} bytes is too short for a safetensors header"
    (length,) = struct.unpack_from("<Q", prefix, 0)
    if length == 0 or length > SAFETENSORS_MAX_HEADER:
        return f"header length {length} is out of range (1..{SAFETENSORS_MAX_HEADER})"
    if 8 + length > size:
        return f"header length {length} runs past the end of the {size}-byte file"
    if len(prefix) < 8 + length:
        return f"only {len(prefix)} bytes given, the header needs {8 + length}"
    try:
        header = json.loads(bytes(prefix[8 : 8 + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"header length {length}: the header is not valid UTF-8 JSON"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data_end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            return f"tensor {key[:80]!r} has bad data_offsets"
        data_end = max(data_end, offsets[1])
    if 8 + length + data_end != size:
        return (
            f"header length {length} + 8 + data end {data_end} = {8 + length + data_end}"
            f" != file size {size}"
        )
    return None


def check_safetensors_file(path: str, size: int | None = None) -> str | None:
    """check_safetensors_header on a file (reads only the header)."""
    try:
        with open(path, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            first = f.read(8)
            if len(first) == 8:
                (length,) = struct.unpack("<Q", first)
                if 0 < length <= SAFETENSORS_MAX_HEADER and 8 + length <= actual:
                    first += f.read(length)
    except OSError as exc:
        return f"cannot read header: {describe_error(exc)}"
    return check_safetensors_header(first, actual if size is None else size)
