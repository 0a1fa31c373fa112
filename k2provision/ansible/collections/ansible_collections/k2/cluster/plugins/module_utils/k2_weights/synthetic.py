"""Synthetic safetensors shards (labs, tests and benchmarks only): valid headers over random
bytes from a fixed seed, so a set's manifest is known before anything is written."""

from __future__ import annotations

import json
import os
import random
import struct
from collections.abc import Callable, Iterator
from typing import Any

BLOCK = 8 << 20

Blocks = Callable[[], Iterator[bytes]]


def shard_name(index: int, count: int, padded: bool = False) -> str:
    """Shard names as Kimi-K2 repos use them: model-1-of-61 or, padded, model-00001-of-00062."""
    if padded:
        return f"model-{index:05d}-of-{count:05d}.safetensors"
    return f"model-{index}-of-{count}.safetensors"


def safetensors_header(data_bytes: int, tensors: int = 2) -> bytes:
    """An 8-byte length plus a JSON header describing ``tensors`` U8 tensors of ``data_bytes``."""
    tensors = max(1, min(tensors, data_bytes)) if data_bytes else 1
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
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


def shard_blocks(size: int, seed: int, tensors: int = 2) -> Iterator[bytes]:
    """The bytes of one valid safetensors file of exactly ``size`` bytes, block by block."""
    data = size
    header = safetensors_header(data, tensors)
    for _ in range(4):  # the header's digits depend on the data size; settle in a few rounds
        data = size - len(header)
        header = safetensors_header(data, tensors)
    if data < 0 or len(header) + data != size:
        raise ValueError(f"cannot make a {size}-byte safetensors file (header needs {len(header)})")
    yield header
    rng = random.Random(seed)
    left = data
    while left:
        n = min(BLOCK, left)
        yield rng.randbytes(n)
        left -= n


TOKENIZER_WORDS = 2048


def tokenizer_files() -> list[tuple[str, bytes]]:
    """A word-level tokenizer (the synthetic shards encode nothing, yet the benchmark clients
    need a tokenizer from the model directory): tokenizer.json, a `tokenizers` WordLevel model
    over TOKENIZER_WORDS words split on whitespace, and tokenizer_config.json naming the fast
    tokenizer class, so `AutoTokenizer.from_pretrained(model_dir)` loads it. The clients'
    random datasets (sglang 0.5.23 benchmark/datasets/random.py, vllm 0.33.0
    benchmarks/datasets/datasets.py) draw ids from `get_vocab()` and decode them to a prompt;
    N ids decode to N words, the count the lab's stand-in reports as prompt tokens."""
    vocab = {"[UNK]": 0, "k2": 1, **{f"w{i}": i + 2 for i in range(TOKENIZER_WORDS - 2)}}
    unk = {
        "id": 0,
        "content": "[UNK]",
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [unk],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "model_max_length": 1 << 21,
        "k2provision_synthetic": True,
    }
    return [
        (name, (json.dumps(doc, indent=2) + "\n").encode())
        for name, doc in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config))
    ]


def synthetic_set(
    count: int, shard_bytes: int, seed: int = 0, config: dict[str, Any] | None = None,
    padded: bool = False,
) -> list[tuple[str, Blocks]]:  # fmt: skip
    """(name, blocks) of a synthetic set in transfer order: config.json (when ``config`` is
    given), ``count`` shards, then the tokenizer's two files (with ``config``); shard i draws
    its data from seed * 1000 + i."""
    files: list[tuple[str, Blocks]] = []
    if config is not None:
        text = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
        files.append(("config.json", lambda: iter([text])))
    for i in range(1, count + 1):

        def blocks(i: int = i) -> Iterator[bytes]:
            return shard_blocks(shard_bytes, seed * 1000 + i)

        files.append((shard_name(i, count, padded), blocks))
    if config is not None:
        for name, data in tokenizer_files():

            def whole(data: bytes = data) -> Iterator[bytes]:
                return iter([data])

            files.append((name, whole))
    return files


def write_blocks(path: str, blocks: Iterator[bytes]) -> None:
    """Write ``blocks`` to ``path`` atomically (a hidden temporary file, fsync, rename)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.synthetic.tmp")
    with open(tmp, "wb") as f:
        for block in blocks:
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
