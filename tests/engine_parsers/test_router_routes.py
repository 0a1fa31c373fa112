"""The routes sglang-router 0.3.2 answers without its API key, from the real router: started
with `--api-key` on the loopback address and no workers, every route of its server is asked
once without the key. Those of `ROUTER_OPEN_ROUTES` (which docs/private-clusters.md lists)
must answer; the serving and admin routes answer 401. Needs .venv-sglang."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from k2provision.engines.sglang import ROUTER_OPEN_ROUTES

from .runner import REPO_ROOT, venv_python

pytestmark = pytest.mark.parsers

# Routes of the router's server (sgl-model-gateway server.rs) that need the key, by method.
GUARDED = (
    ("POST", "/generate"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/workers"),
    ("GET", "/get_loads"),
    ("POST", "/flush_cache"),
)
# A bound, not a timing: the router's entry point imports sglang.srt (torch among it), which
# took 101 s of wall time with 8 s of CPU on a loaded 2-core machine reading a cold venv.
STARTUP_BOUND_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status(base: str, method: str, path: str) -> int:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(
        base + path, method=method, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, metrics = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("router") / "router.log"
    argv = [
        str(venv_python("sglang-router", REPO_ROOT)),
        "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
        "--api-key", "not-the-key-anyone-sends",
    ]  # fmt: skip
    with Path(log).open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_BOUND_S
        while True:
            try:
                _status(base, "GET", "/liveness")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the router did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_listed_routes_answer_without_the_key_and_the_others_do_not(router: str) -> None:
    for path in ROUTER_OPEN_ROUTES:
        assert _status(router, "GET", path) != 401, path
    for method, path in GUARDED:
        assert _status(router, method, path) == 401, path


def test_the_docs_list_every_open_route() -> None:
    text = (REPO_ROOT / "docs" / "private-clusters.md").read_text()
    assert all(f"`{path}`" in text for path in ROUTER_OPEN_ROUTES)
