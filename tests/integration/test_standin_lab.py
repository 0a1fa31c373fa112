"""The stand-in engine image (the test double for the engines' GPU kernels) on a lab host:
built into the lab image store, run the way the launch role runs engines (`docker run
--network host --ipc host IMAGE sh LAUNCH_SCRIPT`), reached from the controller.

The host belongs to a private one-host lab instance (its own name and subnet; the rootfs and
the image store are shared with the default instance). The shared `lab` of tests/lab_support
is where other suites apply and stop whole deployments, which removes containers they did
not start; a private host keeps this test independent of them. Root is required, as for
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
from k2provision.plan import LAB_IMAGE
from tests.lab_support import require_lab

pytestmark = pytest.mark.lab

HOST = "lab1"
INSTANCE = "k2sti"
SUBNET = "10.77.213.0/24"


@pytest.fixture(scope="module")
def standin_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[labapi.LabState]:
    """One running host of a private lab instance, taken down after the module."""
    require_lab()
    cfg = labapi.LabConfig(lab_dir=labapi.default_lab_dir(), name=INSTANCE, subnet=SUBNET)
    inventory: Path = tmp_path_factory.mktemp("standin-lab") / "lab.ini"
    try:
        yield labapi.up(1, cfg=cfg, inventory=inventory, log=quiet_log)
    finally:
        labapi.down(cfg=cfg, log=quiet_log)


def sh(state: labapi.LabState, command: str, timeout: float = 120, check: bool = True
       ) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(labapi.ssh_command(state, HOST, command), capture_output=True,
                         text=True, timeout=timeout, check=False)
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
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2-Instruct",
            "--served-model-name", "kimi-k2", "--trust-remote-code",
            "--tool-call-parser", "kimi_k2", "--tp-size", "8",
            "--host", "0.0.0.0", "--port", str(port)]
    script = ("#!/bin/sh\nset -eu\nexport PYTHONUNBUFFERED=1\nexport HF_TOKEN=not-recorded\n"
              f"exec {shlex.join(argv)}\n")
    sh(standin_lab, f"mkdir -p {work}/model {work}/launch {work}/records && "
            f"printf %s {shlex.quote(script)} > {work}/launch/sglang.sh")
    run = (f"docker run --detach --name {name} --network host --ipc host "
           f"--volume {work}/model:/models/Kimi-K2-Instruct:ro "
           f"--volume {work}/launch:/etc/k2provision/launch:ro "
           # The records, read from the host (not with `docker exec`, see the README).
           f"--volume {work}/records:/run/k2-standin "
           f"{STANDIN_IMAGE} sh /etc/k2provision/launch/sglang.sh")
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
            data=json.dumps({"model": "kimi-k2",
                             "messages": [{"role": "user", "content": "hi"}]}).encode(),
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
    out = sh(standin_lab, f"docker run --rm --network host {STANDIN_IMAGE} python3 -m "
                  "sglang.launch_server --model-path /models/none --tp-size 8 "
                  "--enable-ep-moe --trust-remote-code", check=False)
    assert out.returncode == 2
    assert "--enable-ep-moe" in out.stderr
    assert "--tool-call-parser" in out.stderr
    assert "/models/none" in out.stderr
