"""What the lab tests of a whole deployment share: the CLI as a user runs it, a command on a lab
host, and a 4-host 2-prefill / 2-decode SGLang PD cluster of stand-ins (real SSH, real router)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import k2lab as lab_api
from k2lab.standin import build_standin
from tests import runners
from tests.runners import on_host

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
# The CLI as a user runs it: the installed console script, a terminal wide enough for status's
# table, a Hugging Face token in the environment.
k2 = partial(runners.k2, installed=True, timeout=600, COLUMNS="250", HF_TOKEN=LAB_HF_TOKEN)


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
        on_host(state, host.name, "docker rm -f $(docker ps -aq --filter name=k2-) || true",
                check=False)
