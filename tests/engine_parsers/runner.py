"""Run a rendered command line through a pinned engine's real argument parser.

The parsers live in their own venvs (``.venv-sglang``, ``.venv-vllm`` at the
repository root, built by ``scripts/install-engine-parsers``); each check runs
the matching checker script there in a subprocess and reads its JSON verdict.

Usage in a test (mark it ``@pytest.mark.parsers``)::

    result = check("sglang", ["python", "-m", "sglang.launch_server", ...], env)
    assert result.ok, result.error

``argv`` is the full command line as rendered, starting with the program:
``python -m sglang.launch_server`` / ``sglang serve`` (engine ``sglang``),
``python -m sglang_router.launch_router`` (``sglang-router``), ``vllm serve``
/ ``python -m vllm.entrypoints.openai.api_server`` (``vllm``). A missing venv
raises ``ParsersNotInstalled`` (a test failure, never a skip).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent

# engine -> (venv directory name, checker script)
ENGINES: dict[str, tuple[str, str]] = {
    "sglang": (".venv-sglang", "check_sglang.py"),
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
    checker = HERE / ENGINES[engine][1]
    request = {"argv": list(argv), "env": dict(env or {}), "options": dict(options or {})}
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    child_env["HF_HUB_OFFLINE"] = "1"
    try:
        proc = subprocess.run(
            [str(python), str(checker)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckerError(f"{engine} checker timed out after {timeout:.0f} s") from exc
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise CheckerError(
            f"{engine} checker (exit {proc.returncode}) printed no JSON result.\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
        ) from exc
    if data.get("internal") or proc.returncode not in (0, 1):
        raise CheckerError(
            f"{engine} checker failed (exit {proc.returncode}): {data.get('error')}\n"
            f"{data.get('traceback', '')}\nstderr: {proc.stderr[-4000:]}"
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
