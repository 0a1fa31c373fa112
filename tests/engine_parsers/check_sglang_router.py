"""Check an sglang-router command line with the real parser (run in .venv-sglang).

Request (stdin, see checker_io): ``argv`` starts with ``python -m
sglang_router.launch_router``, ``python -m sglang_router launch`` or
``smg launch`` (or is the bare argument list).

Steps, all offline: ``parse_router_args`` (argparse + ``RouterArgs``, which
parses ``--prefill URL [BOOTSTRAP_PORT]``), ``RouterArgs._validate_router_args``
and, unless ``options.build`` is false, ``Router.from_args`` (the Rust router
object is constructed) and then, unless ``options.validate`` is false,
``Router.start`` as far as the router's own configuration validation
(``RouterConfig`` against sgl-model-gateway's config/validation.rs rules, e.g.
"Power-of-two policy for decode requires at least 2 decode workers"): that is
the first thing ``start`` does, before it installs the Prometheus exporter. The
checker points the exporter at a port it holds itself, so a configuration the
router accepts stops right there ("failed to install Prometheus metrics
exporter ... Address already in use"): no port of the command line is bound and
no worker is contacted. Only the exporter's address is changed for that; the
router does not validate it.

Result: ``ok``, ``error``, ``stage`` (``parse``/``build``/``validate`` when
rejected), ``parsed`` (selected ``RouterArgs`` fields), ``warnings``.
"""

from __future__ import annotations

import os
import socket
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
            build(router_args, result, validate=options.get("validate", True))
        result["stage"] = None


# What Router.start raises once the configuration passed validation and the exporter's port
# turns out taken: the router accepted the configuration.
EXPORTER_FAILED = "failed to install Prometheus metrics exporter"


def build(router_args: Any, result: dict[str, Any], *, validate: bool) -> None:
    """Construct the Rust router and, with `validate`, run its own configuration validation
    (the start of ``Router.start``), stopped before it serves anything by a Prometheus port
    the checker holds. ``Router.from_args`` converts `router_args` in place, so the
    exporter's address is set before it."""
    from sglang_router.router import Router

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        if validate:
            router_args.prometheus_host = "127.0.0.1"
            router_args.prometheus_port = held.getsockname()[1]
        result["stage"] = "build"
        try:
            router = Router.from_args(router_args)
        except Exception as exc:
            raise Rejected(f"{type(exc).__name__}: {clean(str(exc))}") from exc
        if not validate:
            return
        result["stage"] = "validate"
        try:
            router.start()
        except ValueError as exc:  # the validator's ConfigError
            raise Rejected(f"{type(exc).__name__}: {clean(str(exc))}") from exc
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            if EXPORTER_FAILED in str(exc):
                return
            raise RuntimeError(f"the router stopped unexpectedly: {exc}") from exc
    raise RuntimeError("the router's start returned although its exporter port was taken")


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
