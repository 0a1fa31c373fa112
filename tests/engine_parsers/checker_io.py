"""Shared plumbing of the checker scripts (standard library only).

The checkers run inside the engine venvs (``.venv-sglang``, ``.venv-vllm``) as
scripts, so they import this module as a top-level sibling, never through the
``tests`` package.

Protocol
--------
stdin: one JSON object::

    {"argv": ["python", "-m", "sglang.launch_server", "--tp-size", "16", ...],
     "env": {"SGLANG_...": "..."},      # optional, applied before the engine imports
     "options": {...}}                  # optional, checker specific

``argv`` is the full command line as rendered, starting with the program
(``python``/``python3`` ``-m module``, or the console script such as
``vllm serve``); the checker strips that launcher prefix and hands the rest to
the engine's parser. An ``argv`` whose first element starts with ``-`` is taken
as the engine arguments alone.

stdout: one JSON object ``{"ok", "error", "parsed", "warnings", ...}``.
Exit status: 0 accepted, 1 rejected by the engine, 2 the checker itself failed
(bad request, venv broken): the result then has ``"internal": true``.

Server mode (``checker.py --serve``): the checker imports the engine once, then
reads one request per line on stdin and writes one result per line on stdout,
each request handled in a forked child (so no request sees another's state,
and none pays the engine's import again). ``env`` is applied in the child,
after the engine was imported.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Rejected(Exception):
    """The engine refused the command line; the message is the engine's."""


class BadRequest(Exception):
    """The request itself is malformed (not the engine's verdict)."""


def clean(message: str) -> str:
    return _ANSI.sub("", message).strip()


def take_stdout() -> TextIO:
    """Keep the real stdout for the result; route fd 1 to stderr.

    Engines print banners and logs to stdout while importing; the result must
    be the only thing on stdout.
    """
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return real


def read_request(stream: TextIO) -> dict[str, Any]:
    try:
        request = json.load(stream)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"stdin is not JSON: {exc}") from exc
    if not isinstance(request, dict):
        raise BadRequest("stdin must hold a JSON object")
    argv = request.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise BadRequest("'argv' must be a list of strings")
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadRequest("'env' must map strings to strings")
    options = request.get("options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'options' must be an object")
    return {"argv": list(argv), "env": dict(env), "options": options}


def strip_launcher(argv: Sequence[str], launchers: Sequence[Sequence[str]]) -> list[str]:
    """Remove the program prefix: one of ``launchers`` (a python interpreter may
    stand for ``python``), or nothing when ``argv`` starts with an option."""
    if not argv or argv[0].startswith("-"):
        return list(argv)
    for launcher in launchers:
        n = len(launcher)
        head = list(argv[:n])
        if len(head) == n and all(
            _same_program(got, want) for got, want in zip(head, launcher, strict=True)
        ):
            return list(argv[n:])
    shown = " | ".join(" ".join(x) for x in launchers)
    raise BadRequest(f"argv must start with one of: {shown} (got {' '.join(argv[:3])!r})")


def _same_program(got: str, want: str) -> bool:
    if got == want:
        return True
    base = os.path.basename(got)
    if want == "python":
        return re.fullmatch(r"python(3(\.\d+)?)?", base) is not None
    return base == want


class _Collector(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.append(f"{record.name}: {clean(record.getMessage())}")
        except Exception:  # a broken log call must not hide the verdict
            self.sink.append(f"{record.name}: {record.msg!r}")


@contextmanager
def collect_warnings(
    logger_names: Sequence[str], sink: list[str], warn_paths: Sequence[str] = ()
) -> Iterator[None]:
    """Record WARNING+ log records of the named loggers (handlers on those
    loggers survive ``logging.basicConfig(force=True)`` on the root) and
    ``warnings.warn`` calls issued from files whose path contains one of
    ``warn_paths`` (all of them when empty)."""
    handler = _Collector(sink)
    loggers = [logging.getLogger(name) for name in logger_names]
    for lg in loggers:
        lg.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for lg in loggers:
                lg.removeHandler(handler)
            for w in caught:
                if warn_paths and not any(p in str(w.filename) for p in warn_paths):
                    continue
                sink.append(f"{w.category.__name__}: {clean(str(w.message))}")


@contextmanager
def argparse_errors_raise() -> Iterator[None]:
    """Turn ``ArgumentParser.error`` (print usage, exit 2) into ``Rejected``
    carrying the parser's own message."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise Rejected(clean(message))

    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    enum_value = getattr(value, "value", None)
    if isinstance(enum_value, bool | int | float | str):
        return enum_value
    return str(value)


def pick(obj: Any, fields: Sequence[str]) -> dict[str, Any]:
    missing = object()
    out: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name, missing)
        if value is not missing:
            out[name] = jsonable(value)
    return out


def dedupe(items: Sequence[str], drop: Sequence[str] = ()) -> list[str]:
    seen: list[str] = []
    for item in items:
        if item in seen or any(pattern in item for pattern in drop):
            continue
        seen.append(item)
    return seen


def internal_result(exc: BaseException) -> dict[str, Any]:
    """The result of a checker that failed itself (not the engine's verdict)."""
    return {
        "ok": False,
        "internal": True,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
        "parsed": {},
        "warnings": [],
    }


def new_result(engine: str) -> dict[str, Any]:
    """A checker's result before its check ran: not ok, nothing parsed."""
    return {
        "ok": False,
        "error": "",
        "stage": None,
        "parsed": {},
        "warnings": [],
        "notes": [],
        "engine": engine,
    }


def checked(
    result: dict[str, Any], run: Callable[[], None], drop: Sequence[str] = ()
) -> dict[str, Any]:
    """`result` after `run` filled it: ok, or the engine's refusal (``Rejected``) as the error;
    a checker that failed itself gives `internal_result` instead. Warnings deduplicated,
    those naming any of `drop` left out."""
    try:
        run()
        result["ok"] = True
    except Rejected as exc:
        result["error"] = str(exc)
    except Exception as exc:
        return internal_result(exc)
    result["warnings"] = dedupe(result["warnings"], drop)
    return result


Handler = Callable[[dict[str, Any]], dict[str, Any]]


def run_main(handle: Handler, warm_up: Callable[[], None]) -> NoReturn:
    """A checker's entry point: one request (stdin) or, with ``--serve``, a stream."""
    if "--serve" in sys.argv[1:]:
        serve(handle, warm_up)
    out = take_stdout()
    try:
        request = read_request(sys.stdin)
    except BadRequest as exc:
        internal_failure(out, exc)
    finish(out, handle(request))


def serve(handle: Handler, warm_up: Callable[[], None]) -> NoReturn:
    """Answer one request per stdin line, each in a forked child of a warmed-up process."""
    out = take_stdout()
    pristine = dict(os.environ)  # what resolution may set while warming up is not kept
    try:
        warm_up()
    except Exception as exc:
        out.write(json.dumps(internal_result(exc)) + "\n")
        out.close()
        sys.exit(2)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = read_request(io.StringIO(line))
        except BadRequest as exc:
            result = internal_result(exc)
        else:
            result = _in_child(handle, request, pristine)
        out.write(json.dumps(result, sort_keys=True) + "\n")
        out.flush()
    sys.exit(0)


def _in_child(handle: Handler, request: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, hand the result over, leave without cleanup
        os.close(read_end)
        os.environ.clear()
        os.environ.update(environ)
        try:
            result = handle(request)
        except BaseException as exc:
            result = internal_result(exc)
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(json.dumps(result, sort_keys=True).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return internal_result(RuntimeError(f"checker child died (wait status {status})"))
    parsed: dict[str, Any] = json.loads(data)
    return parsed


def finish(out: TextIO, result: dict[str, Any]) -> NoReturn:
    out.write(json.dumps(result, sort_keys=True) + "\n")
    out.close()
    if result.get("internal"):
        sys.exit(2)
    sys.exit(0 if result.get("ok") else 1)


def internal_failure(out: TextIO, exc: BaseException) -> NoReturn:
    finish(out, internal_result(exc))
