"""Synthetic safetensors shards: valid headers over random bytes, for tests and benchmarks."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

BLOCK = 8 << 20


def safetensors_header(data_bytes: int, tensors: int = 2) -> bytes:
    """An 8-byte length plus JSON header describing ``tensors`` U8 tensors of ``data_bytes``."""
    tensors = max(1, min(tensors, data_bytes)) if data_bytes else 1
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    start = 0
    for i in range(tensors):
        end = data_bytes if i == tensors - 1 else start + data_bytes // tensors
        header[f"model.layers.{i}.weight"] = {
            "dtype": "U8",
            "shape": [end - start],
            "data_offsets": [start, end],
        }
        start = end
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def write_synthetic_shard(path: Path, size: int, *, seed: int = 0, tensors: int = 2) -> Path:
    """Write a valid safetensors file of exactly ``size`` bytes (random tensor data)."""
    data = size
    header = safetensors_header(data, tensors)
    for _ in range(4):  # the header's digits depend on the data size; settle in a few rounds
        data = size - len(header)
        header = safetensors_header(data, tensors)
    if data < 0 or len(header) + data != size:
        raise ValueError(f"cannot make a {size}-byte safetensors file (header needs {len(header)})")
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(header)
        left = data
        while left:
            n = min(BLOCK, left)
            f.write(rng.randbytes(n))
            left -= n
    return path


def shard_name(index: int, count: int, *, padded: bool = False) -> str:
    """Shard names as Kimi-K2 repos use them: model-1-of-61 or, padded, model-00001-of-00062."""
    if padded:
        return f"model-{index:05d}-of-{count:05d}.safetensors"
    return f"model-{index}-of-{count}.safetensors"


def write_synthetic_shards(
    directory: Path, count: int, shard_bytes: int, *, seed: int = 0, padded: bool = False
) -> list[Path]:
    """``count`` shards of ``shard_bytes`` each plus a small config.json, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [
        write_synthetic_shard(
            directory / shard_name(i, count, padded=padded), shard_bytes, seed=seed * 1000 + i
        )
        for i in range(1, count + 1)
    ]
    config = directory / "config.json"
    config.write_text(json.dumps({"model_type": "kimi_k2", "num_shards": count}) + "\n")
    return [*paths, config]
