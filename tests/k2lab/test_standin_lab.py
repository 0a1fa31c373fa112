"""The stand-in engine image (the test double for the engines' GPU kernels) on lab hosts:
built into the lab image store, run the way the launch role runs engines (`docker run
--network host --ipc host IMAGE sh LAUNCH_SCRIPT`), reached from the controller. Whole
TensorRT-LLM deployments (sshd mesh on port 2233, mpirun from each instance's rank 0) are taken
through apply and day two by tests/k2provision/integration/test_fleet_engines_lab.py.

The hosts belong to a private two-host lab instance (its own name and subnet; the rootfs and
the image store are shared with the default instance). The shared `lab` of tests/lab_support
is where other suites apply and stop whole deployments, which removes containers they did
not start; private hosts keep this test independent of them. Root is required, as for
every lab test (`require_lab`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import k2lab as labapi
from k2lab.proc import quiet_log
from k2lab.standin import STANDIN_IMAGE, build_standin, image_key
from k2provision.core import catalog
from k2provision.plan.images import LAB_IMAGE
from tests.lab_support import require_lab

pytestmark = [pytest.mark.lab, pytest.mark.lab_other]

HOST = "lab1"
INSTANCE = "k2sti"
SUBNET = "10.77.213.0/24"
ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = "/models/Kimi-K2-Instruct"
TRTLLM_VARS: dict[str, labapi.VarValue] = {
    "k2_engine": "trtllm",
    "k2_layout": "tp_ep",
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}


@pytest.fixture(scope="module")
def lab_inventory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[labapi.LabState, Path]]:
    """Two running hosts of a private lab instance as a TensorRT-LLM cluster, taken down
    after the module."""
    require_lab()
    cfg = labapi.LabConfig(lab_dir=labapi.default_lab_dir(), name=INSTANCE, subnet=SUBNET)
    inventory: Path = tmp_path_factory.mktemp("standin-lab") / "lab.ini"
    try:
        yield (
            labapi.up(2, cfg=cfg, inventory=inventory, all_vars=TRTLLM_VARS, log=quiet_log),
            inventory,
        )
    finally:
        labapi.down(cfg=cfg, log=quiet_log)


@pytest.fixture(scope="module")
def standin_lab(lab_inventory: tuple[labapi.LabState, Path]) -> labapi.LabState:
    return lab_inventory[0]


def sh(
    state: labapi.LabState, command: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        labapi.ssh_command(state, HOST, command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
    return out


def get_json(url: str, timeout: float = 3) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def test_build_is_idempotent(standin_lab: labapi.LabState) -> None:
    del standin_lab  # the image store is shared by every instance's hosts
    assert STANDIN_IMAGE == LAB_IMAGE
    assert build_standin() == STANDIN_IMAGE
    key = image_key(labapi.LabConfig.default())
    started = time.monotonic()
    assert build_standin() == STANDIN_IMAGE
    assert time.monotonic() - started < 10  # current: no rebuild
    assert image_key(labapi.LabConfig.default()) == key


def test_sglang_standin_serves_from_a_lab_host(standin_lab: labapi.LabState) -> None:
    build_standin()
    address = next(h.address for h in standin_lab.hosts if h.name == HOST)
    name = f"k2-standin-test-{uuid.uuid4().hex[:8]}"
    work = f"/tmp/{name}"
    port = 39000 + uuid.uuid4().int % 900
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Kimi-K2-Instruct",
        "--served-model-name",
        "kimi-k2",
        "--trust-remote-code",
        "--tool-call-parser",
        "kimi_k2",
        "--tp-size",
        "8",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    script = (
        "#!/bin/sh\nset -eu\nexport PYTHONUNBUFFERED=1\nexport HF_TOKEN=not-recorded\n"
        f"exec {shlex.join(argv)}\n"
    )
    sh(
        standin_lab,
        f"mkdir -p {work}/model {work}/launch {work}/records && "
        f"printf %s {shlex.quote(script)} > {work}/launch/sglang.sh",
    )
    run = (
        f"docker run --detach --name {name} --network host --ipc host "
        f"--volume {work}/model:/models/Kimi-K2-Instruct:ro "
        f"--volume {work}/launch:/etc/k2provision/launch:ro "
        # The records, read from the host (not with `docker exec`, see the README).
        f"--volume {work}/records:/run/k2-standin "
        f"{STANDIN_IMAGE} sh /etc/k2provision/launch/sglang.sh"
    )
    try:
        sh(standin_lab, run)
        deadline = time.monotonic() + 60
        models: Any = None
        while time.monotonic() < deadline:
            try:
                models = get_json(f"http://{address}:{port}/v1/models")
                break
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        logs = sh(standin_lab, f"docker logs {name} 2>&1", check=False).stdout
        assert models is not None, logs
        assert [m["id"] for m in models["data"]] == ["kimi-k2"]

        request = urllib.request.Request(
            f"http://{address}:{port}/v1/chat/completions",
            data=json.dumps(
                {"model": "kimi-k2", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            reply = json.loads(resp.read())
        assert "stand-in" in reply["choices"][0]["message"]["content"]

        records = sh(standin_lab, f"cat {work}/records/*.json").stdout
        record = json.loads(records)
        assert record["argv"][:3] == ["python3", "-m", "sglang.launch_server"]
        assert "HF_TOKEN" in record["env_keys"]
        assert "not-recorded" not in records

        # SIGTERM (docker stop) ends the stand-in cleanly.
        sh(standin_lab, f"docker stop --time 10 {name}")
        code = sh(standin_lab, f"docker inspect --format '{{{{.State.ExitCode}}}}' {name}").stdout
        assert code.strip() == "0"
    finally:
        sh(standin_lab, f"docker rm --force {name}; rm -rf {work}", check=False)


def test_a_bad_launch_fails_in_the_container(standin_lab: labapi.LabState) -> None:
    build_standin()
    out = sh(
        standin_lab,
        f"docker run --rm --network host {STANDIN_IMAGE} python3 -m "
        "sglang.launch_server --model-path /models/none --tp-size 8 "
        "--enable-ep-moe --trust-remote-code",
        check=False,
    )
    assert out.returncode == 2
    assert "--enable-ep-moe" in out.stderr
    assert "--tool-call-parser" in out.stderr
    assert "/models/none" in out.stderr


def test_the_lab_image_runs_the_real_pinned_router(standin_lab: labapi.LabState) -> None:
    """The PD router is not stood in for: the image carries sglang-router itself."""
    build_standin()
    out = sh(
        standin_lab,
        f"docker run --rm --network host {STANDIN_IMAGE} python3 -c "
        + shlex.quote(
            "import importlib.metadata as m, sglang_router, os; "
            "print(m.version('sglang-router'), os.path.dirname("
            "sglang_router.__file__))"
        ),
    )
    version, where = out.stdout.split()
    assert version == catalog.ROUTER.version
    assert not where.startswith("/opt/standin")  # the installed package, not a stand-in
    parsed = sh(
        standin_lab,
        f"docker run --rm --network host {STANDIN_IMAGE} python3 -m "
        "sglang_router.launch_router --help",
        check=False,
    )
    assert parsed.returncode == 0, parsed.stderr
    assert "--pd-disaggregation" in parsed.stdout
