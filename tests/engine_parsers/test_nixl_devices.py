"""k2_pd_transfer_backend=nixl through sglang 0.5.23's own NIXL code: the rendered
--disaggregation-ib-device becomes the UCX backend's device list for every GPU of the host
(srt/disaggregation/nixl/conn.py _resolve_ucx_device_list), and nothing rendered overrides it
(UCX_NET_DEVICES would, :565). Needs .venv-sglang."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k2provision.plan.assemble import build_plan
from k2provision.plan.inventory import load_cluster

from .runner import REPO_ROOT, venv_python

pytestmark = pytest.mark.parsers


def test_the_rendered_ib_devices_are_each_gpus_ucx_devices(tmp_path: Path) -> None:
    text = (REPO_ROOT / "inventory" / "prod.ini").read_text()
    inventory = tmp_path / "prod.ini"
    inventory.write_text(text.replace("[all:vars]\n", "[all:vars]\nk2_pd_transfer_backend=nixl\n"))
    plan = build_plan(load_cluster(inventory))
    servers = [p for h in plan.hosts for p in h.processes if "sglang.launch_server" in p.argv]
    assert servers
    values = set()
    for proc in servers:
        argv = list(proc.argv)
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
        values.add(argv[argv.index("--disaggregation-ib-device") + 1])
        assert "UCX_NET_DEVICES" not in proc.env
    (value,) = values
    snippet = (
        "import json, sys\n"
        "from sglang.srt.disaggregation.nixl.conn import _resolve_ucx_device_list\n"
        "print(json.dumps([_resolve_ucx_device_list(sys.argv[1], gpu) for gpu in range(8)]))\n"
    )
    out = subprocess.run(
        [str(venv_python("sglang")), "-c", snippet, value],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    lists = json.loads(out.stdout.strip().splitlines()[-1])
    assert lists == [", ".join(value.split(","))] * 8
