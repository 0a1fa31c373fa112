"""What the rendered SGLang servers' checks ask, read in sglang 0.5.23 itself: the route the
launch gate, the look and a fleet router's health checks use queues no generation and needs no
API key, and the environment rendered on every server turns the generation off on /health
too (srt/entrypoints/http_server.py, srt/environ.py, srt/utils/auth.py). Needs .venv-sglang."""

from __future__ import annotations

import ast
import json
import subprocess
from urllib.parse import urlsplit

import pytest

from tests.metric_names import site_packages

from . import goldens
from .runner import REPO_ROOT, venv_python

pytestmark = pytest.mark.parsers

CASES = ("sglang-tp", "sglang-pd-fleet-32")


def _handlers() -> dict[str, ast.AsyncFunctionDef | ast.FunctionDef]:
    """Each GET route of the pinned HTTP server -> the function that answers it."""
    source = site_packages(REPO_ROOT / ".venv-sglang") / "sglang/srt/entrypoints/http_server.py"
    tree = ast.parse(source.read_text())
    found: dict[str, ast.AsyncFunctionDef | ast.FunctionDef] = {}
    for node in tree.body:
        if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if (
                isinstance(deco, ast.Call)
                and isinstance(deco.func, ast.Attribute)
                and deco.func.attr == "get"
                and deco.args
                and isinstance(deco.args[0], ast.Constant)
            ):
                found[str(deco.args[0].value)] = node
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _servers() -> list[tuple[str, str, dict[str, str], str | None]]:
    """(case, host, env, gate path) of every SGLang server the cases render."""
    out = []
    for case in CASES:
        for launch in goldens.launches((case,), goldens.SGLANG_SERVER):
            proc = goldens.process(launch)
            path = urlsplit(proc.health.url).path if proc.health and proc.health.url else None
            out.append((case, launch.host, proc.env, path))
    return out


def test_the_gate_route_queues_no_generation_and_the_health_route_does() -> None:
    handlers = _handlers()
    gates = {path for *_, path in _servers() if path is not None}
    assert gates == {"/ready"}
    ready = _names(handlers["/ready"])
    assert "GenerateReqInput" not in ready
    assert "generate_request" not in ready
    assert "is_ready" in ready
    # /health is the generation handler; only the environment variable skips the generation.
    assert handlers["/health"] is handlers["/health_generate"]
    health = _names(handlers["/health"])
    assert {"GenerateReqInput", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"} <= health


def test_every_server_runs_without_a_generation_on_health_and_the_gate_needs_no_key() -> None:
    envs = {(case, host): env for case, host, env, _ in _servers()}
    assert envs
    values = {env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION") for env in envs.values()}
    assert values == {"false"}
    snippet = (
        "import json, os\n"
        "from sglang.srt.environ import envs\n"
        "from sglang.srt.utils.auth import AuthLevel, decide_request_auth\n"
        "open_ = decide_request_auth(method='GET', path='/ready', authorization_header=None,"
        " api_key='k', admin_api_key=None, auth_level=AuthLevel.NORMAL).allowed\n"
        "print(json.dumps({'generation': envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get(),"
        " 'ready_open': open_}))\n"
    )
    env = {"PATH": "/usr/bin:/bin", **next(iter(envs.values()))}
    out = subprocess.run(
        [str(venv_python("sglang")), "-c", snippet],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "generation": False,
        "ready_open": True,
    }
