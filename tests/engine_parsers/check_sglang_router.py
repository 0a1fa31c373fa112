"""Check an sglang-router command line with the real parser (run in .venv-sglang).

Request (stdin, see checker_io): ``argv`` starts with ``python -m
sglang_router.launch_router``, ``python -m sglang_router launch`` or
``smg launch`` (or is the bare argument list).

Steps, all offline: ``parse_router_args`` (argparse + ``RouterArgs``, which
parses ``--prefill URL [BOOTSTRAP_PORT]``), ``RouterArgs._validate_router_args``
and, unless ``options.build`` is false, ``Router.from_args``: the Rust router
object is constructed (its own config validation) but never started, so no
port is bound and no worker is contacted.

Result: ``ok``, ``error``, ``stage`` (``parse``/``build`` when rejected),
``parsed`` (selected ``RouterArgs`` fields), ``warnings``.
"""

from __future__ import annotations

import os
from typing import Any

from checker_io import (
    BadRequest,
    Rejected,
    argparse_errors_raise,
    checked,
    clean,
    collect_warnings,
    internal_result,
    new_result,
    pick,
    run_main,
    strip_launcher,
)

LAUNCHERS = (
    ("python", "-m", "sglang_router.launch_router"),
    ("python", "-m", "sglang_router", "launch"),
    ("smg", "launch"),
)

FIELDS = (
    "host",
    "port",
    "worker_urls",
    "pd_disaggregation",
    "mini_lb",
    "prefill_urls",
    "decode_urls",
    "policy",
    "prefill_policy",
    "decode_policy",
    "dp_aware",
    "worker_startup_timeout_secs",
    "health_check_endpoint",
    "prometheus_host",
    "prometheus_port",
    "request_timeout_secs",
    "tool_call_parser",
    "model_path",
)


def check(argv: list[str], options: dict[str, Any], result: dict[str, Any]) -> None:
    from sglang_router.launch_router import parse_router_args

    with collect_warnings(["sglang_router", "router"], result["warnings"], ["/sglang_router/"]):
        with argparse_errors_raise():
            result["stage"] = "parse"
            try:
                router_args = parse_router_args(argv)
            except (ValueError, TypeError) as exc:  # RouterArgs' own parsing
                raise Rejected(f"{type(exc).__name__}: {clean(str(exc))}") from exc
        result["parsed"] = pick(router_args, FIELDS)
        router_args._validate_router_args()
        if options.get("build", True):
            from sglang_router.router import Router

            result["stage"] = "build"
            try:
                Router.from_args(router_args)
            except Exception as exc:
                raise Rejected(f"{type(exc).__name__}: {clean(str(exc))}") from exc
        result["stage"] = None


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict on one request."""
    try:
        argv = strip_launcher(request["argv"], LAUNCHERS)
    except BadRequest as exc:
        return internal_result(exc)
    os.environ.update(request["env"])
    result = new_result("sglang-router")

    def run() -> None:
        from importlib.metadata import version

        result["version"] = version("sglang-router")
        check(argv, request["options"], result)

    return checked(result, run)


def warm_up() -> None:
    """Import the router once (server mode)."""
    import sglang_router.launch_router
    import sglang_router.router  # noqa: F401


if __name__ == "__main__":
    run_main(handle, warm_up)
