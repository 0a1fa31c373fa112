"""What to ask a host about its planned processes, in the registry's questions. Pure.

The questions themselves (commands, readers, records, the batch, the certificate policy) are
the collection's module_utils ``host_questions``, which the look module also runs on the
host; this module only says which question a planned process, its health gate and its log
are. The launch gate, ``status``, ``logs`` and the look (plan/converge.py) ask through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k2provision.ansible.collections.ansible_collections.k2.cluster.plugins.module_utils import (
    host_questions as hq,
)
from k2provision.core.endpoint_guard import TLS_CA, guard_path
from k2provision.core.records import HealthGate, Process
from k2provision.plan.containers import LABEL_HASH, exec_log_path, exec_pid_path

__all__ = [
    "container_key",
    "container_states",
    "gate_ca_file",
    "gate_question",
    "hq",
    "log_question",
    "state_question",
]


def gate_ca_file(config_dir: str) -> str:
    """The CA an https health gate is checked against besides the host's own store: the one
    the launch places on the endpoint's host where the inventory names a private CA
    (k2_tls_ca_file); asked where it exists, so a public certificate needs none."""
    return guard_path(config_dir, TLS_CA)


def state_question(process: Process) -> hq.Question[hq.ContainerState | hq.ExecState]:
    """Whether the process runs: its container's state, or an exec'd process's liveness."""
    if process.exec_in:
        return hq.ExecQuestion(process.container, exec_pid_path(process))
    return hq.ContainerQuestion(process.container, LABEL_HASH)


def gate_question(
    process: Process,
    gate: HealthGate,
    config_dir: str,
    python: str = "python3",
    command_timeout_s: float | None = None,
) -> hq.Question[hq.GateAnswer]:
    """What the process's health gate answers now: a GET of its URL on the host (under the
    one certificate policy), or its command's exit status in the process's container (within
    `command_timeout_s` where the asker must answer in time; None: the command bounds itself)."""
    if gate.url is not None:
        return hq.HttpQuestion(gate.url, gate_ca_file(config_dir), python)
    return hq.CommandQuestion(process.container, tuple(gate.command), command_timeout_s)


def log_question(
    process: Process, tail: int | None = None, since: str | None = None
) -> hq.LogQuestion:
    """The process's log: its container's, or an exec'd process's file inside it."""
    return hq.LogQuestion(
        process.container, exec_log_path(process) if process.exec_in else "", tail, since
    )


CONTAINER_KEY = "container "


def container_key(name: str) -> str:
    """The key a container's state question is asked under (``container NAME``)."""
    return f"{CONTAINER_KEY}{name}"


def container_states(answers: Mapping[str, Any]) -> dict[str, hq.ContainerState]:
    """The answers to container state questions (keys of :func:`container_key`), by container
    name; other keys, and answers that are no container's state, are left out."""
    states = {}
    for key, data in answers.items():
        state = hq.record_from_json(hq.ContainerState, data)
        if key.startswith(CONTAINER_KEY) and state is not None:
            states[key.removeprefix(CONTAINER_KEY)] = state
    return states
