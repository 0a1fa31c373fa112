"""Whether a model directory holds a loadable checkpoint (read-only; headers only).

A loadable checkpoint has a parseable config.json and, when model.safetensors.index.json is
there, every shard its weight_map names, each with a safetensors header whose data ends where
the file ends (a truncated or half-copied shard fails here, not minutes into the engine's
load). Without an index, a single model.safetensors is checked the same way when present.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from .safetensors import check_safetensors_file

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
NAMES_SHOWN = 5
# config.json and the index are read whole: only regular files, and none larger than this (a
# Kimi-K2 index, about 140k weight_map entries, is near 12 MB).
JSON_LIMIT = 64 << 20


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (f", … ({len(names)} in all)" if len(names) > NAMES_SHOWN else "")


def _json_object(path: str, what: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{what} is not a regular file"
        if st.st_size > JSON_LIMIT:
            return None, f"{what} holds {st.st_size} bytes, more than the {JSON_LIMIT} read"
        with open(path, "rb") as f:
            doc = json.loads(f.read(JSON_LIMIT + 1).decode("utf-8"))
    except OSError as exc:
        return None, f"{what} cannot be read ({exc.strerror or exc})"
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{what} is not valid JSON ({str(exc)[:120]})"
    if not isinstance(doc, dict):
        return None, f"{what} is not a JSON object"
    return doc, None


def checkpoint_problems(directory: str) -> list[str]:
    """What keeps `directory` from being a loadable checkpoint (empty: nothing)."""
    if not os.path.exists(directory):
        return [f"{directory} does not exist"]
    if not os.path.isdir(directory):
        return [f"{directory} is not a directory"]
    problems: list[str] = []
    config = os.path.join(directory, CONFIG)
    if not os.path.isfile(config):
        problems.append(f"{CONFIG} is missing")
    else:
        problem = _json_object(config, CONFIG)[1]
        if problem:
            problems.append(problem)
    index_path = os.path.join(directory, INDEX)
    if os.path.exists(index_path):
        index, problem = _json_object(index_path, INDEX)
        weight_map = (index or {}).get("weight_map")
        if problem:
            problems.append(problem)
        elif not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            problems.append(f"{INDEX} has no weight_map of tensor -> shard file")
        else:
            problems.extend(shard_problems(directory, sorted(set(weight_map.values()))))
    elif os.path.exists(os.path.join(directory, SINGLE)):
        problems.extend(shard_problems(directory, [SINGLE]))
    return problems


def shard_problems(directory: str, shards: list[str]) -> list[str]:
    """Missing shards (one line) and each shard whose header does not match its size."""
    missing: list[str] = []
    broken: list[str] = []
    for name in shards:
        path = os.path.join(directory, name)
        if os.path.isabs(name) or ".." in name.split("/"):
            broken.append(f"{name}: not a file name inside the directory")
        elif not os.path.isfile(path):
            missing.append(name)
        else:
            problem = check_safetensors_file(path)
            if problem:
                broken.append(f"{name}: {problem}")
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {len(shards)} shards named by {INDEX} are missing: "
            f"{_names(missing)}"
        )
    problems.extend(broken[:NAMES_SHOWN])
    if len(broken) > NAMES_SHOWN:
        problems.append(f"… and {len(broken) - NAMES_SHOWN} more shards with a bad header")
    return problems
