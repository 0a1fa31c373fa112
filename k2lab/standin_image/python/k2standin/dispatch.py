"""Check a whole launch argv the way the stand-in entry points would, without running it.

The PD router is not stood in for: the lab image carries the real, pinned sglang-router, so
its argv passes here unchecked (the real parser checks it in the test suite).

`check_argv(argv, env)` picks the entry point from the launcher (`python3 -m
sglang.launch_server`, `vllm serve`, `ray start`, `mpirun ... trtllm-llmapi-launch
trtllm-serve serve`, ...) and returns the problems its checks find (empty: accepted).
`local=False` skips what depends on this machine (its addresses, reachable sshds).

`python3 -m k2standin.dispatch` reads {"items": [{"argv": [...], "env": {...}}]} on stdin
and prints {"results": [{"entry": ..., "errors": [...]}]}.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from k2standin import mpirun, ray_cli, sglang_server, trtllm, vllm_cli
from k2standin.common import Rejected, StartError

PYTHON = ("python3", "python")
# Modules the lab image runs for real, not as stand-ins.
REAL_MODULES = frozenset({"sglang_router.launch_router"})


def _module(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    if len(argv) >= 3 and argv[0] in PYTHON and argv[1] == "-m":
        return argv[2], list(argv[3:])
    return None


def check_argv(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *, local: bool = False
) -> tuple[str, list[str]]:
    """(entry point, problems) for one launch argv."""
    environ = dict(env or {})
    module = _module(argv)
    try:
        if module is not None:
            name, rest = module
            if name == "sglang.launch_server":
                sglang_server.check(rest, environ)
            elif name in REAL_MODULES:
                return name, []
            else:
                return name, [f"python3 -m {name}: no stand-in for this module"]
            return name, []
        if not argv:
            return "", ["empty argv"]
        program, rest = argv[0].rsplit("/", 1)[-1], list(argv[1:])
        if program == "vllm":
            if not rest or rest[0] != "serve":
                return "vllm", ["only `vllm serve` is provided"]
            vllm_cli.check(rest[1:])
        elif program == "ray":
            if rest and rest[0] == "start":
                ray_cli.check_start(rest[1:], environ, local=local)
        elif program == "mpirun":
            args = mpirun.parse(rest)
            mpirun.check(args)
            if local:
                mpirun.probe_remote(args)
            inner_env = {
                **environ,
                **{
                    k: v
                    for k, v in mpirun.child_env(args).items()
                    if k.startswith(("OMPI_", "K2_STANDIN_"))
                },
            }
            entry, problems = check_argv(args.command, inner_env, local=local)
            return f"mpirun/{entry}", problems
        elif program == "trtllm-llmapi-launch":
            if not rest:
                return program, ["a command to launch is required"]
            entry, problems = check_argv(rest, environ, local=local)
            return f"{program}/{entry}", problems
        elif program == "trtllm-serve":
            trtllm.check(rest, environ)
        elif program in ("sh", "bash", "sshd"):
            return program, []
        else:
            return program, [f"{program}: no stand-in for this program"]
        return program, []
    except Rejected as exc:
        return (module[0] if module else argv[0]), exc.errors
    except StartError as exc:  # the mpirun probe (local=True)
        return (module[0] if module else argv[0]), [str(exc)]


def main() -> int:
    request: dict[str, Any] = json.load(sys.stdin)
    results = []
    for item in request.get("items", []):
        entry, errors = check_argv(
            item["argv"], item.get("env") or {}, local=bool(item.get("local", False))
        )
        results.append({"entry": entry, "errors": errors})
    json.dump({"results": results}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
