"""What the lab tests of a whole deployment share: the CLI as a user runs it, a command on a lab
host, and a 4-host 2-prefill / 2-decode SGLang PD cluster of stand-ins (real SSH, real router)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import k2lab as lab_api
from k2lab.standin import build_standin

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL_DIR = "/models/Kimi-K2-Instruct"
# Every CLI run of the lab tests has a Hugging Face token in its environment, as a user's
# shell would: no run record may hold it.
LAB_HF_TOKEN = "hf_" + "LabTokenNeverRecorded" * 2
LAB_VARS: dict[str, lab_api.VarValue] = {
    "k2_engine": "sglang",
    "k2_layout": "pd",
    "k2_model_dir": MODEL_DIR,
    "k2_context_length": 32768,
}


def k2(*args: str, runs: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """The k2provision CLI as a user runs it (a terminal wide enough for status's table, a
    Hugging Face token in the environment)."""
    return subprocess.run(
        [str(BIN / "k2provision"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "K2_RUNS_DIR": str(runs), "COLUMNS": "250", "HF_TOKEN": LAB_HF_TOKEN},
        check=False,
    )


def on_host(state: Any, host: str, command: str) -> str:
    """`command` on a lab host over SSH; its stdout (a failure fails the test)."""
    out = subprocess.run(
        lab_api.ssh_command(state, host, command), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, (host, command, out.stderr)
    return out.stdout


def pd_cluster_up(inventory: Path) -> Any:
    """4 lab hosts as prefill 2 / decode 2, the stand-in image built, a model dir on each."""
    state = lab_api.up(
        4, inventory=inventory, groups={"prefill": 2, "decode": 2}, all_vars=LAB_VARS
    )
    build_standin()
    for host in state.hosts:
        on_host(state, host.name, f"mkdir -p {MODEL_DIR} && echo '{{}}' > {MODEL_DIR}/config.json")
    return state


def remove_engine_containers(state: Any) -> None:
    """Every k2- container on every lab host removed (best effort, for teardown)."""
    for host in state.hosts:
        subprocess.run(
            lab_api.ssh_command(
                state, host.name, "docker rm -f $(docker ps -aq --filter name=k2-) || true"
            ),
            capture_output=True,
            timeout=120,
            check=False,
        )
