"""Run a rendered command line through a pinned engine's real argument parser.

The parsers live in their own venvs (``.venv-sglang``, ``.venv-vllm``,
``.venv-sglang-kt`` for KTransformers' sglang-kt, at the repository root,
built by ``scripts/install-engine-parsers``); each check runs
the matching checker script there in a subprocess and reads its JSON verdict.

Usage in a test (mark it ``@pytest.mark.parsers``)::

    result = check("sglang", ["python", "-m", "sglang.launch_server", ...], env)
    assert result.ok, result.error

``argv`` is the full command line as rendered, starting with the program:
``python -m sglang.launch_server`` / ``sglang serve`` (engine ``sglang``),
``python -m sglang_router.launch_router`` (``sglang-router``), ``vllm serve``
/ ``python -m vllm.entrypoints.openai.api_server`` (``vllm``). A missing venv
raises ``ParsersNotInstalled`` (a test failure, never a skip).

Each engine's checker runs as one long-lived server per test session (its
``--serve`` mode): the engine is imported once and every request is answered
by a forked child, so a check costs about a second instead of a fresh
interpreter importing the engine. The servers end when their stdin closes, at
the latest when the session ends.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent

# engine -> (venv directory name, checker script)
ENGINES: dict[str, tuple[str, str]] = {
    "sglang": (".venv-sglang", "check_sglang.py"),
    "sglang-kt": (".venv-sglang-kt", "check_sglang_kt.py"),
    "sglang-router": (".venv-sglang", "check_sglang_router.py"),
    "vllm": (".venv-vllm", "check_vllm.py"),
}

DEFAULT_TIMEOUT = 180.0


class ParsersNotInstalled(RuntimeError):
    """The engine venv is missing: run scripts/install-engine-parsers."""


class CheckerError(RuntimeError):
    """The checker itself failed (broken venv, bad request), not the engine."""


@dataclass(frozen=True)
class ParseResult:
    engine: str
    ok: bool
    error: str
    stage: str | None
    parsed: dict[str, Any]
    warnings: list[str]
    resolved: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    version: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def value(self, name: str) -> Any:
        """A field after resolution (SGLang) or EngineArgs (vLLM) where the
        checker got that far, else as parsed."""
        for source in (self.resolved, self.raw.get("engine_args") or {}, self.parsed):
            if name in source:
                return source[name]
        raise KeyError(name)

    def warned(self, text: str) -> bool:
        return any(text in w for w in self.warnings)


def venv_python(engine: str, root: Path | None = None) -> Path:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(sorted(ENGINES))}")
    venv = (root or REPO_ROOT) / ENGINES[engine][0]
    python = venv / "bin" / "python"
    if not python.exists():
        raise ParsersNotInstalled(
            f"{venv} is missing: run scripts/install-engine-parsers "
            f"(needed to check {engine} command lines against the real parser)"
        )
    return python


class _Server:
    """One checker in server mode: requests in, results out, one line each."""

    def __init__(self, engine: str, python: Path) -> None:
        self.engine = engine
        self.lock = threading.Lock()
        # Kept open for the server's lifetime (closed in close()): its log, for error reports.
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        child_env["HF_HUB_OFFLINE"] = "1"
        self.proc = subprocess.Popen(
            [str(python), str(HERE / ENGINES[engine][1]), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=child_env,
        )

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as exc:
                raise CheckerError(
                    f"{self.engine} checker server is gone ({exc}).\n{self.stderr_tail()}"
                ) from exc
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                self.close()
                raise CheckerError(f"{self.engine} checker timed out after {timeout:.0f} s")
            line = self.proc.stdout.readline()
        if not line:
            raise CheckerError(
                f"{self.engine} checker server exited ({self.proc.poll()}).\n{self.stderr_tail()}"
            )
        data: dict[str, Any] = json.loads(line)
        return data

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


_SERVERS: dict[Path, _Server] = {}
_SERVERS_LOCK = threading.Lock()


def _server(engine: str, python: Path) -> _Server:
    key = python.parent.parent / ENGINES[engine][1]
    with _SERVERS_LOCK:
        server = _SERVERS.get(key)
        if server is None or server.proc.poll() is not None:
            server = _SERVERS[key] = _Server(engine, python)
    return server


@atexit.register
def close_servers() -> None:
    """End every checker server (they also end on their own when stdin closes)."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()


def check(
    engine: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    *,
    options: dict[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    root: Path | None = None,
) -> ParseResult:
    """Parse ``argv`` (and validate it as far as the checker goes) with the
    real parser of ``engine``; ``env`` is the environment the command would
    run with. ``options`` are checker-specific (see the check_*.py files)."""
    python = venv_python(engine, root)
    request = {"argv": list(argv), "env": dict(env or {}), "options": dict(options or {})}
    server = _server(engine, python)
    data = server.ask(request, timeout)
    if data.get("internal"):
        raise CheckerError(
            f"{engine} checker failed: {data.get('error')}\n{data.get('traceback', '')}\n"
            f"stderr: {server.stderr_tail()}"
        )
    return ParseResult(
        engine=engine,
        ok=bool(data["ok"]),
        error=str(data.get("error") or ""),
        stage=data.get("stage"),
        parsed=dict(data.get("parsed") or {}),
        warnings=list(data.get("warnings") or []),
        resolved=dict(data.get("resolved") or {}),
        notes=list(data.get("notes") or []),
        version=str(data.get("version") or ""),
        raw=data,
    )
