"""The lab the Ansible-side benchmarks run on: N hosts of a vLLM DP+EP stand-in deployment.

Each benchmark gets a lab instance of its own (name, subnet), so it never resizes a lab that
tests are using.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from outcome import NotOk

import k2lab as lab
from k2lab.config import LabConfig, default_lab_dir
from k2lab.standin import build_standin

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL_DIR = "/models/k2-bench"
# The launch preflight asks for a checkpoint: the stand-in reads nothing but config.json.
WRITE_CHECKPOINT = f"mkdir -p {MODEL_DIR}; echo '{{}}' > {MODEL_DIR}/config.json"


def up(hosts: int, *, name: str, subnet: str) -> tuple[lab.LabState, Path, LabConfig]:
    """Build the lab and the stand-in image; the state, the inventory and the lab's config."""
    inventory = Path(tempfile.mkdtemp(prefix=f"{name}-")) / "bench.ini"
    cfg = LabConfig(lab_dir=default_lab_dir(), name=name, subnet=subnet)
    state = lab.up(
        hosts,
        inventory=inventory,
        groups={"nodes": hosts},
        cfg=cfg,
        all_vars={
            "k2_engine": "vllm",
            "k2_layout": "dp_ep",
            "k2_model_dir": MODEL_DIR,
            "k2_context_length": 8192,
        },
    )
    try:
        build_standin()
    except BaseException:
        lab.down(cfg)
        raise
    return state, inventory, cfg


def ansible_env(config: Path) -> dict[str, str]:
    """The environment Ansible runs in: this ansible.cfg and the project's tools first."""
    return {**os.environ, "ANSIBLE_CONFIG": str(config), "PATH": f"{BIN}:{os.environ['PATH']}"}


def on_host(state: lab.LabState, host: str, command: str) -> str:
    """Run `command` on a lab host; its stdout, NotOk if it fails."""
    out = subprocess.run(lab.ssh_command(state, host, command), capture_output=True, text=True)
    if out.returncode != 0:
        raise NotOk(f"{command!r} on {host} exited {out.returncode}: {out.stderr[-1000:]}")
    return out.stdout
